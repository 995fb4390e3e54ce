"""`python -m harness bench` on the cpu platform: the ZeRO 1/2/3 suite end to end.

The micro-step pattern is what DeepSpeed does at each stage (see DEEPSPEED_NOTES in the README):
ZeRO-1 communicates gradients only at the accumulation boundary, ZeRO-2 in every micro-step,
ZeRO-3 all-gathers parameters for forward and backward and reduce-scatters gradients.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from benchmarks.node.machine import cpu_kind
from contract.metrics import METRICS
from harness.held_up import comm_held_up_for_peer_pct, comm_held_up_pct
from harness.probe import PACE_NOISE_PCT, best_figure
from harness.verdict.explained import STEAL_NAMED_CPUS
from harness.record import validate_record

pytestmark = pytest.mark.integration

GRADIENT_OPS = {"all_reduce", "reduce_scatter"}


def ops(microstep: dict, phase: str | None = None) -> Counter:
    return Counter(c["op"] for c in microstep["collectives"] if phase is None or c["phase"] == phase)


def gradient_bytes(microstep: dict) -> int:
    """Bytes of gradient reduction in a micro-step's backward (small norm reductions excluded)."""
    return sum(c["bytes"] for c in microstep["collectives"]
               if c["phase"] == "backward" and c["op"] in GRADIENT_OPS)


def training(run) -> dict[str, dict]:
    """The suite's own training records (a regression's reruns aside: conftest.default_suite)."""
    return {k: r for k, r in run.first_records().items() if r["kind"] == "training"}


def records_by_stage(run) -> dict[int, list[dict]]:
    """The llama-tiny runs by ZeRO stage (the distillation run is tested in test_distillation.py)."""
    by_stage: dict[int, list[dict]] = {}
    for rec in training(run).values():
        if rec["benchmark"] != "llama-tiny":
            continue
        by_stage.setdefault(rec["config"]["zero"]["stage"], []).append(rec)
    return by_stage


def test_suite_completes_with_valid_ok_records(default_suite):
    assert default_suite.returncode == 0, default_suite.stderr[-3000:]
    records = training(default_suite)
    assert len(records) == 7
    assert Counter(r["benchmark"] for r in records.values()) == {"llama-tiny": 6, "llama-tiny-kd": 1}
    for run_id, rec in records.items():
        assert validate_record(rec) == [], run_id
        assert rec["status"] == "ok", (run_id, rec["reason"])
        assert rec["kind"] == "training" and rec["platform"] == "cpu"
        for name in ("samples_per_s", "tokens_per_s", "tokens_per_s_per_device", "step_time_s",
                     "peak_mem_gib", "mfu_pct"):
            assert rec["metrics"][name]["value"] > 0, (run_id, name)
            assert rec["metrics"][name]["mode"] == "throughput"
        assert rec["metrics"]["step_time_s"]["n"] == 2
        assert rec["metrics"]["profile_step_time_s"]["mode"] == "profile"
        assert len(rec["microsteps"]) == 2  # profiled optimizer steps
        assert rec["flops"]["formula"] == "6*N + 12*L*h*s"
        assert rec["flops"]["peak_tflops_per_device"] == 0.1
        assert [s["warmup"] for s in rec["steps"]] == [True, False, False, False, False]
        assert all(s["loss"] > 0 for s in rec["steps"])
        env = rec["environment"]
        assert env["torch"].startswith("2.13.0") and env["deepspeed"] == "0.19.8"
        assert env["hosts"] and env["suite_commit"]
        assert env["env"]["OMP_NUM_THREADS"] == "1"
        assert f"workload.micro_batch_size={rec['config']['workload']['micro_batch_size']}" in rec["overrides"]
        ds = rec["config"]["deepspeed"]
        assert ds["zero_optimization"]["stage"] == rec["config"]["zero"]["stage"]


def test_suite_covers_zero_1_2_3_at_one_c_with_two_splits(default_suite):
    by_stage = records_by_stage(default_suite)
    assert sorted(by_stage) == [1, 2, 3]
    for stage, recs in by_stage.items():
        splits = {(r["config"]["workload"]["micro_batch_size"], r["config"]["workload"]["grad_acc_steps"])
                  for r in recs}
        assert len(splits) >= 2, stage
        assert {mb * ga for mb, ga in splits} == {8}
        assert all(ga >= 2 for _, ga in splits)


def test_zero1_reduces_gradients_only_in_the_last_microstep(default_suite):
    for rec in records_by_stage(default_suite)[1]:
        num_params = rec["flops"]["num_params"]
        for step in rec["microsteps"]:
            *inner, last = step
            assert len(step) == rec["config"]["workload"]["grad_acc_steps"]
            for ms in inner:
                assert ms["collectives"] == [], ms
                assert ms["comm_s"] == 0
            assert ops(last, "backward")["all_reduce"] >= 1
            assert gradient_bytes(last) >= 4 * num_params  # every fp32 gradient, once
            assert ops(last, "step")["all_gather"] >= 1      # updated parameters
            assert ops(last, "backward")["reduce_scatter"] == 0  # DeepSpeed's ZeRO-1 never issues one


def test_zero2_reduces_gradients_in_every_microstep(default_suite):
    for rec in records_by_stage(default_suite)[2]:
        num_params = rec["flops"]["num_params"]
        for step in rec["microsteps"]:
            for ms in step:
                assert ops(ms, "backward")["all_reduce"] >= 1, ms["index"]
                assert gradient_bytes(ms) >= 4 * num_params
                assert ops(ms)["reduce_scatter"] == 0
                assert ms["comm_s"] > 0
            assert ops(step[-1], "step")["all_gather"] >= 1
            assert all(ops(ms, "step")["all_gather"] == 0 for ms in step[:-1])


def test_zero3_gathers_parameters_for_forward_and_backward_and_reduce_scatters(default_suite):
    for rec in records_by_stage(default_suite)[3]:
        num_params = rec["flops"]["num_params"]
        for step in rec["microsteps"]:
            for ms in step:
                assert ops(ms, "forward")["all_gather"] >= 2, ms["index"]
                assert ops(ms, "backward")["all_gather"] >= 1
                assert ops(ms, "backward")["reduce_scatter"] >= 1
                assert ops(ms, "backward")["all_reduce"] == 0
                gathered = sum(c["bytes"] for c in ms["collectives"]
                               if c["op"] == "all_gather" and c["phase"] == "forward")
                assert gathered >= 4 * num_params * 0.9  # (nearly) every parameter, for forward
            assert ops(step[-1], "step")["all_gather"] == 0  # parameters stay partitioned


def test_microstep_times_add_up(default_suite):
    for rec in training(default_suite).values():
        for step in rec["microsteps"]:
            for ms in step:
                assert ms["total_s"] > 0
                assert abs(ms["compute_s"] + ms["comm_s"] - ms["total_s"]) < 1e-6
                assert abs(ms["comm_s"] - sum(c["time_s"] for c in ms["collectives"])) < 1e-6


def test_the_waiting_in_the_measured_communication_is_recorded_from_the_runs_own_calls(default_suite):
    for run_id, rec in training(default_suite).items():
        held = rec["metrics"]["comm_held_up_pct"]
        assert held["mode"] == "profile" and 0 <= held["value"] < 100, run_id
        assert held["value"] == comm_held_up_pct(rec["microsteps"]), run_id
        # of it, the waiting for the other rank: every call matched with the other rank's, its wait within the call
        peer = rec["metrics"]["comm_held_up_for_peer_pct"]
        assert peer["value"] == comm_held_up_for_peer_pct(rec["microsteps"]) <= held["value"], run_id
        calls = [c for step in rec["microsteps"] for m in step for c in m["collectives"]]
        assert calls and all(0 <= c["peer_wait_s"] <= c["time_s"] for c in calls), run_id
        came = [s["arrivals"] for s in rec["steps"] if s["mode"] == "profile"]
        assert len(came) == len(rec["microsteps"]), run_id
        for one, step in zip(came, rec["microsteps"]):
            assert one["calls"] == sum(len(m["collectives"]) for m in step), run_id
            assert [r["rank"] for r in one["ranks"]] == [0, 1] and "clock_offset_s" not in one, run_id  # one kernel


def test_terminal_and_markdown_summary(default_suite):
    out = default_suite.stdout
    assert "step 1/5 (warm-up)" in out
    assert "samples/s" in out and "MFU %" in out
    assert "Micro-step breakdown" in out and "comm ms" in out and "held up ms" in out and "for a peer ms" in out
    ran = sum(1 for r in default_suite.records().values() if r["kind"] == "training")   # 7, and any reruns
    assert out.count("last to reach the profiled calls") == ran
    for run_id in default_suite.records():
        assert run_id in out
    assert "# Avg bus bandwidth" in out and "Collectives (nccl-tests semantics" in out
    md = (default_suite.out / "summary.md").read_text()
    assert md.count("| micro-step |") == ran
    assert "| run | status | ZeRO |" in md
    assert "teacher fwd ms" in out and "MFU+teacher %" in out  # the distillation run's columns


def test_mllog_lines_carry_the_standard_keys(default_suite):
    rec_id = next(iter(training(default_suite)))
    lines = (default_suite.out / "runs" / rec_id / "mllog.log").read_text().splitlines()
    assert lines and all(line.startswith(":::MLLOG {") for line in lines)
    events = [json.loads(line[len(":::MLLOG "):]) for line in lines]
    keys = {e["key"] for e in events}
    assert {"run_start", "run_stop", "global_batch_size", "gradient_accumulation_steps", "seed",
            "max_sequence_length", "opt_base_learning_rate", "opt_name"} <= keys
    stop = next(e for e in events if e["key"] == "run_stop")
    assert stop["metadata"]["status"] == "success"
    gbs = next(e for e in events if e["key"] == "global_batch_size")["value"]
    assert gbs == 8 * 2  # C x ranks


def test_the_suite_starts_with_a_short_collective_sweep(default_suite):
    collectives = {k: r for k, r in default_suite.first_records().items() if r["kind"] == "collective"}
    assert {r["benchmark"] for r in collectives.values()} >= {"all_reduce", "all_gather", "reduce_scatter"}
    for run_id, rec in collectives.items():
        assert validate_record(rec) == [], run_id
        assert rec["status"] == "ok" and rec["complete"] is True and rec["source"] == "builtin"
        assert rec["metrics"]["avg_busbw_gbps"]["value"] > 0
        assert all(row["out_of_place"]["num_wrong"] == 0 for row in rec["rows"])
    assert max(r["wall_s"] for r in collectives.values()) < 30  # the budget on cpu
    (plot,) = {r["plot"] for r in collectives.values()}
    assert (default_suite.out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"![busbw by message size]({plot})" in (default_suite.out / "summary.md").read_text()


def _measured_slower_than_the_references(records) -> list[str]:
    """The probe figures of this bench that read this box slower than the cpu references' box by more
    than the pace's noise. Seen in CI on the AVX2 EPYC the references came from: triad 13.1 against
    their 18.4 GB/s (within the probe's 60 % on one VM) while its fp32 pulse read 81 against 71
    GFLOP/s per core, and llama-tiny ZeRO-1 mb 4 ran 0.59x their samples/s: memory the pulse cannot
    see. On such a box the default suite's speed is not the references' to judge; only its paced
    metrics (speed and time) may read slower, and where the triad reads slower, matmul_eff_pct too:
    it is model FLOP/s over the probe's matmul figure, which has no memory term. Seen in CI the next
    day: triad 11.8 against 18.4 GB/s, fp32 matmul 81 against 71, ZeRO-1 mb 2 at 0.69x the
    references' samples/s and 0.59x their matmul_eff_pct. The same holds where the matmul alone is
    faster: on a 2-core AVX-512 BF16/AMX Xeon (fp32 matmul 148 against 71, triad 22.5 against 18.4:
    6.6 FLOP a byte against 3.9) the ZeRO-3 runs read 0.57x the references' matmul_eff_pct, a
    regression across machines (issue 39 item 2 judges efficiency there), in one of two CI runs; the
    machines' balance now explains that (harness/verdict/explained.py at_balance: the same software reads
    0.59-1x there), while on one machine whose triad read slower within the probe's tolerance the
    efficiency is still judged. Memory and loss may never read worse."""
    table = json.loads((Path(__file__).resolve().parents[2] / "reference_results" / "cpu.json").read_text())
    machines = [r["provenance"]["environment"]["machine"] for r in table["references"]
                if r["benchmark"] == "llama-tiny"]   # each machine's (the table keeps a reference per machine)
    probes = [m["probe"] for m in machines]
    floor = 1 - PACE_NOISE_PCT["cpu"] / 100
    out = []
    for rec in records:
        probe = (rec["environment"].get("machine") or {}).get("probe") or {}
        isa = (probe.get("isa") or {}).get("class")
        kind = cpu_kind((rec["environment"].get("machine") or {}).get("cpu"))
        ref = next((m["probe"] for m in machines if kind and cpu_kind(m.get("cpu")) == kind),   # its kind's,
                   next((p for p in probes if (p.get("isa") or {}).get("class") == isa), probes[0]))  # else its ISA's
        for name, path in (("fp32 matmul", ("matmul", "fp32")), ("triad", ("triad",))):
            now, then = best_figure(probe, *path), best_figure(ref, *path)
            if now and then and now < then * floor:
                out.append(f"{name} {now:.3g} vs the references' {then:.3g}")
        balance = [(best_figure(p, "matmul", "fp32"), best_figure(p, "triad")) for p in (probe, ref)]
        if all(a and b for a, b in balance):
            now, then = (a / b for a, b in balance)
            if now * floor > then:   # its matmul faster against its memory than the references' box
                out.append(f"triad per fp32 matmul: balance {now:.3g} vs the references' {then:.3g} FLOP/B a core")
    return sorted(set(out))


def test_the_first_bench_on_any_box_calls_no_regression_and_says_what_the_machine_measured(default_suite):
    """Issue 26 items 1 and 4: a fresh clone's first bench prints its machine's probe (one line, its
    time) and no regression against the shipped cpu references: on the box kinds they came from (the
    2-core EPYC with AVX2 only and with AVX-512, each its own) they are comparable and within tolerance;
    on another box they are "not comparable", naming why."""
    out = default_suite.stdout
    probe = [line for line in out.splitlines() if line.startswith("probe (")]
    assert len(probe) == 1 and "GFLOP/s per core" in probe[0] and " s a node)" in probe[0], probe
    compared = out[out.index("Compared with reference_results/"):]
    rows = [line for line in compared.splitlines() if line.startswith("regression ")]
    slower = _measured_slower_than_the_references(default_suite.records().values())
    stolen = [f"the hypervisor took {r['environment']['load']['steal_cpus']:.2f} CPUs during {r['run_id']}"
              for r in default_suite.records().values()
              if ((r["environment"].get("load") or {}).get("steal_cpus") or 0) >= STEAL_NAMED_CPUS]
    slower += stolen[:1]   # seen in CI on the AVX-512 EPYC: 0.77 CPUs stolen through the collective sweep,
    # whose gloo ranks then read 0.19-0.35x the references' busbw (explained.at_busy_host now reads such a sweep
    # not comparable; one slower still stays a regression); the pulse and probe read the triad at 0.74x
    if slower:   # a VM whose host is busier now: its runs' speed is its own (the pulse reads matmul alone);
        # on one cpu host that is the collectives' too (contract/metrics.py host_paced)
        speed = {m for m, metric in METRICS.items() if metric.paced or metric.host_paced}
        if any(s.startswith("triad") for s in slower):   # efficiency over the matmul figure is blind to memory
            speed.add("matmul_eff_pct")               # (a slower triad, or a matmul faster against the triad)
        assert all(row.split()[2] in speed for row in rows), (slower, compared)
    else:
        assert not rows, compared
    for record in default_suite.records().values():
        machine = record["environment"]["machine"]
        assert machine["probe"]["matmul"]["fp32"]["best"] > 0 and machine["probe"]["isa"]["class"]
        if record["kind"] == "training":
            assert record["metrics"]["matmul_eff_pct"]["value"] > 0
