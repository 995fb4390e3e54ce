"""The performance model calibrated across platforms of one machine (harness.model.compute_calibration,
`model --compute-records`) and checked against measured runs (harness.model.check, `model --against`):
small synthetic records, the cpu-cluster platform predicted from the cpu platform's compute."""
from __future__ import annotations

import dataclasses
import json

import pytest

from unit_helpers import as_record, typed
from harness.config.split import with_split
from harness.errors import HarnessError
from harness.model.calibration import calibrate
from harness.model.check import check_step_times, record_config
from harness.model.comm_layout import prefetch_exposed
from harness.model.compute_calibration import Machine, record_machine
from harness.model.perfmodel import executed_flops_per_step, predict
from harness.model.traffic import comm_traffic

EPYC, XEON = "AMD EPYC 7763 64-Core Processor", "Intel Xeon Platinum 8480+"
PEAK = 0.1e12     # both cpu platforms declare 0.1 TFLOP/s fp32


def _env(cpu_model=EPYC, cores=2, ranks=2, load=0.5, nodes=None):
    env = {"num_ranks": ranks, "cpu_model": cpu_model,
           "machine": {"cpu": {"model": cpu_model, "usable_cpus": cores, "load_avg_1_5_15": [load, load, load]}}}
    if nodes:
        env["nodes"] = [{"host": f"node{i + 1}", "machine": {"cpu": {"model": m, "usable_cpus": cores}}}
                        for i, m in enumerate(nodes)]
    return env


def _training(cfg, *, platform="cpu", stage=1, mb=4, compute_s=None, step_time_s=1.0, benchmark="llama-tiny",
              device="cpu", run_id="t", overrides=None, **env):
    """A training record of llama-tiny; profile micro-steps whose compute sums to compute_s per step."""
    w = cfg.workload
    ga = w.samples_per_step // mb
    micro = [[{"index": i, "total_s": compute_s / ga, "compute_s": compute_s / ga, "comm_s": 0.0, "collectives": []}
              for i in range(ga)]] * 2 if compute_s else []
    return as_record({"kind": "training", "platform": platform, "benchmark": benchmark, "status": "ok", "run_id": run_id,
            "created_utc": "2026-11-24T00:00:00+00:00", "environment": _env(**env),
            "overrides": overrides or [], "microsteps": micro,
            "config": {"platform": {"device": device},
                       "workload": {"micro_batch_size": mb, "grad_acc_steps": ga, "seq_len": w.seq_len,
                                    "precision": w.precision.value, "activation_checkpointing": False},
                       "zero": {"stage": stage}},
            "metrics": {"step_time_s": {"value": step_time_s, "p10": step_time_s * 0.9, "p90": step_time_s * 1.1}}})


def _collective(op="all_reduce", busbw=0.12, platform="cpu-cluster", **env):
    rows = [{"size_bytes": s, "out_of_place": {"busbw_gbps": b}, "in_place": {"busbw_gbps": b}}
            for s, b in ((1 << 20, busbw), (16 << 20, busbw))]
    return as_record({"kind": "collective", "platform": platform, "benchmark": op, "status": "ok", "run_id": f"c-{op}",
                      "environment": _env(**env), "config": {}, "metrics": {}, "rows": rows})


@pytest.fixture
def cluster(composed):
    """cpu-cluster, llama-tiny ZeRO-1, mb 4 x ga 2: 2 nodes x 1 rank."""
    return composed(["platform=cpu-cluster", "workload=llama-tiny", "zero=stage1", "workload.micro_batch_size=4"])


def _compute_for(cfg, efficiency):
    """The profile compute_s per step of a run at `efficiency` of the 0.1 TFLOP/s peak."""
    return executed_flops_per_step(cfg) / (efficiency * PEAK)


# ---- which records calibrate the computation ---------------------------------------------------

@pytest.mark.parametrize("changes,reason", [
    ({}, None),
    ({"platform": "cpu-cluster"}, None),                     # the platform itself is no obstacle
    ({"cpu_model": XEON}, "another machine (cpu: Intel Xeon"),
    ({"cores": 4}, "another machine (cpu: AMD EPYC 7763 64-Core Processor, 4 usable cores)"),
    ({"ranks": 4}, "not 2 ranks"),
    ({"benchmark": "llama-440m"}, "not llama-tiny at seq 128 fp32"),
    ({"device": "cuda"}, "another machine"),
    ({"compute_s": None}, "no profile-mode compute"),        # throughput only: its comm is another platform's
], ids=["same machine", "same platform", "other cpu model", "other core count", "other ranks", "other workload",
        "gpu record", "no profile"])
def test_a_compute_record_qualifies_only_on_the_same_machine(cluster, changes, reason):
    good = _training(cluster, compute_s=_compute_for(cluster, 0.5), run_id="good-z1")
    probe = _training(cluster, **{"compute_s": _compute_for(cluster, 0.25), "run_id": "probe", **changes})
    cal = calibrate([_collective()], cluster, compute_records=[good, probe])
    if reason is None:
        assert cal.efficiency(4) == pytest.approx((0.5 + 0.25) / 2)           # the median of both
        assert "left out" not in cal.efficiency_source
    else:
        assert cal.efficiency(4) == pytest.approx(0.5)
        assert f"left out: 1 {reason}" in cal.efficiency_source


def test_the_source_names_the_platform_machine_and_runs(cluster):
    cal = calibrate([_collective()], cluster, compute_records=[
        _training(cluster, compute_s=_compute_for(cluster, 0.4), run_id="02-z1-mb4-ga2"),
        _training(cluster, stage=2, compute_s=_compute_for(cluster, 0.2), run_id="04-z2-mb4-ga2"),
        dataclasses.replace(_training(cluster, compute_s=1.0), status="error"),   # not ok: not even counted
        _collective(platform="cpu")])                                        # not training: ignored
    src = cal.efficiency_source
    assert src.startswith("measured on platform cpu, the machine of cpu-cluster (cpu: AMD EPYC 7763 64-Core "
                          "Processor, 2 usable cores)")
    assert "02-z1-mb4-ga2" in src and "04-z2-mb4-ga2" not in src            # on cpu, ZeRO-1's own runs only
    assert "left out" not in src and cal.efficiency(4) == pytest.approx(0.4)


def test_the_computation_carries_over_in_seconds_and_the_network_is_the_clusters(cluster):
    """The predicted compute equals the single-node profile compute; the busbw is the cluster's
    curve (a cpu-platform sweep at loopback speed is ignored); the step adds the two (gloo: ZeRO-1
    blocks on every collective)."""
    compute_s = 0.31
    cal = calibrate([_collective(busbw=0.12), _collective("all_gather", busbw=0.08),
                     _collective(busbw=5.0, platform="cpu")], cluster,
                    compute_records=[_training(cluster, compute_s=compute_s)])
    p = predict(cluster, cal)
    assert p.compute_s == pytest.approx(compute_s)
    grads = [c for c in p.comm if c.op == "all_reduce" and c.phase == "backward"]
    assert grads and grads[0].busbw_gbps == pytest.approx(0.12) and "c-all_reduce" in grads[0].source
    assert p.step_time_s == pytest.approx(compute_s + p.comm_s) and p.exposed_comm_s == pytest.approx(p.comm_s)


@pytest.mark.parametrize("records,match", [
    ([], "no record of platform cpu-cluster with 2 ranks states its machine"),
    ([_collective(platform="cpu")], "no record of platform cpu-cluster"),            # the other platform's
    ([_collective(), _collective("all_gather", cpu_model=XEON)], "ran on different machines"),
], ids=["no records", "only the other platform", "two machines"])
def test_the_predicted_platform_must_show_its_machine(cluster, records, match):
    with pytest.raises(HarnessError, match=match):
        calibrate(records, cluster, compute_records=[_training(cluster, compute_s=1.0)])


def test_nothing_qualifying_is_an_error_that_says_why(cluster):
    with pytest.raises(HarnessError, match=r"left out: 1 another machine .*Xeon.*; 1 not 2 ranks"):
        calibrate([_collective()], cluster, compute_records=[_training(cluster, compute_s=1.0, cpu_model=XEON),
                                                            _training(cluster, compute_s=1.0, ranks=4)])
    with pytest.raises(HarnessError, match="none given"):
        calibrate([_collective()], cluster, compute_records=[])


def test_without_compute_records_another_platforms_runs_never_calibrate(cluster):
    cal = calibrate([_collective(), _training(cluster, compute_s=1.0)], cluster)     # a cpu-platform run
    assert cal.efficiency_source.startswith("uncalibrated")


@pytest.mark.parametrize("env,expected", [
    (_env(), Machine("cpu", EPYC, 2)),
    (_env(nodes=[EPYC, EPYC]), Machine("cpu", EPYC, 2)),
    (_env(nodes=[EPYC, XEON]), Machine("cpu", f"{EPYC} | {XEON}", None)),           # unlike nodes: no one machine
    ({"cpu_model": "x86_64", "machine": {"cpu": {"model": None}}}, Machine("cpu", "x86_64", None)),
    ({"gpu_model": "NVIDIA H100 80GB HBM3"}, Machine("cuda", "NVIDIA H100 80GB HBM3", None)),
    ({}, None),
])
def test_record_machine(env, expected):
    device = "cuda" if env.get("gpu_model") else "cpu"
    assert record_machine(typed([{"environment": env, "config": {"platform": {"device": device}}}])[0]) == expected


# ---- ZeRO-3 on gloo: the async parameter gathers overlap -----------------------------------------

def test_on_gloo_only_zero3s_async_gathers_hide_behind_compute(composed):
    """DeepSpeed issues ZeRO-3's parameter gathers with async_op=True (partition_parameters.py
    _dist_allgather_fn), which a gloo worker thread carries while the rank computes; its reduce-scatter
    (async_op=False) and ZeRO-1/2's all-reduce block."""
    z3 = composed(["platform=cpu-cluster", "workload=llama-tiny", "zero=stage3", "workload.micro_batch_size=4",
                   "zero.stage3_param_persistence_threshold=0", "zero.stage3_max_reuse_distance=0",
                   "zero.stage3_prefetch_bucket_size=200000"])
    assert {t.op: t.async_op for t in comm_traffic(z3)} == {"all_gather": True, "reduce_scatter": False,
                                                            "all_reduce": False}
    cal = calibrate([_collective(op, 0.1) for op in ("all_reduce", "all_gather", "reduce_scatter")], z3,
                    compute_records=[_training(z3, stage=3, compute_s=0.4)])
    p = predict(z3, cal)
    blocking = sum(c.total_time_s for c in p.comm if c.op != "all_gather")
    gathers = p.comm_s - blocking
    assert blocking < p.exposed_comm_s < p.comm_s - 0.5 * gathers
    z2 = predict(with_split(z3, 2, 4), calibrate([_collective()], with_split(z3, 2, 4),
                                                 compute_records=[_training(z3, stage=2, compute_s=0.4)]))
    assert z2.exposed_comm_s == pytest.approx(z2.comm_s)


def test_a_prefetched_gather_hides_only_behind_the_module_before_it():
    """One prefetch bucket ahead: the first gather is exposed whole; each later one hides behind
    the compute of the message before it, and only the excess shows (a small module before a big
    one, like llama's last layer before its 4 MB lm_head, exposes most of the big gather), where
    the phase-wide rule would hide the whole sum behind the phase's compute."""
    assert prefetch_exposed([0.02, 0.005, 0.005], (0.5, 0.25, 0.25), 0.04) == pytest.approx(0.02)
    assert prefetch_exposed([0.02, 0.005, 0.03], (0.5, 0.4, 0.1), 0.04) == pytest.approx(0.02 + 0.03 - 0.016)


def test_zero3_gathers_carry_their_modules_compute_share(composed):
    """The messages are prefetch buckets of the parameters in fetch order; their compute share is
    FLOP-proportional, so the input embedding (a lookup) carries none and the shares sum to 1."""
    z3 = composed(["platform=cpu-cluster", "workload=llama-tiny", "zero=stage3", "zero.stage3_param_persistence_threshold=0",
                   "zero.stage3_max_reuse_distance=0", "zero.stage3_prefetch_bucket_size=200000"])
    forward, backward = [t for t in comm_traffic(z3) if t.op == "all_gather"]
    vocab, hidden = z3.workload.vocab_size, z3.workload.hidden_size
    assert forward.sizes[0] == 4 * vocab * hidden and forward.compute_share[0] == 0.0
    for t in (forward, backward):
        assert len(t.compute_share) == len(t.sizes) and sum(t.compute_share) == pytest.approx(1.0)
    assert backward.compute_share[0] > 0      # the input embedding is not gathered for backward


# ---- the model against measured runs -------------------------------------------------------------

def test_check_step_times_reports_the_error_and_never_calibrates_on_the_checked_run(cluster):
    measured = _training(cluster, platform="cpu-cluster", compute_s=0.3, step_time_s=0.6, run_id="01-z1-mb4-ga2",
                         load=1.9)
    single = _training(cluster, compute_s=0.3, run_id="cpu-z1")
    (row,) = check_step_times([(measured, cluster)], [_collective(), measured], compute_records=[single, measured])
    assert row.run_id == "01-z1-mb4-ga2" and row.zero_stage == 1 and (row.micro_batch_size, row.grad_acc_steps) == (4, 2)
    assert row.compute_s == pytest.approx(0.3) and row.measured_step_time_s == 0.6 and row.load_avg_1m == 1.9
    assert row.error_pct == pytest.approx((row.predicted_step_time_s - 0.6) / 0.6 * 100)
    assert "cpu-z1" in row.efficiency_source and "01-z1-mb4-ga2" not in row.efficiency_source
    with pytest.raises(HarnessError, match="none given"):      # only the checked run could have calibrated it
        check_step_times([(measured, cluster)], [_collective()], compute_records=[measured])


def test_record_config_recomposes_the_run_and_refuses_a_mismatch(composed):
    cfg = composed(["platform=cpu-cluster", "workload=llama-tiny", "zero=stage2", "workload.micro_batch_size=2"])
    overrides = ["platform=cpu-cluster", "out=/tmp/x", "workload=llama-tiny", "zero=stage2", "workload.micro_batch_size=2"]
    rec = _training(cfg, platform="cpu-cluster", stage=2, mb=2, overrides=overrides)
    seen = []

    def compose(o):
        seen.append(o)
        return composed(o)
    got = record_config(rec, compose)
    assert seen == [[o for o in overrides if not o.startswith("out=")]]
    assert (got.zero.stage, got.workload.micro_batch_size, got.workload.grad_acc_steps) == (2, 2, 4)
    rec.config["workload"]["micro_batch_size"] = 4
    with pytest.raises(HarnessError, match="micro_batch_size 4 .recomposed: 2."):
        record_config(rec, compose)


def test_cli_against_prints_model_vs_measured_and_fails_above_the_limit(capsys, tmp_path, cluster):
    from harness.__main__ import main

    runs, single = tmp_path / "cluster", tmp_path / "cpu"
    runs.mkdir(), single.mkdir()
    overrides = ["platform=cpu-cluster", "workload=llama-tiny", "zero=stage1", "workload.micro_batch_size=4"]
    z1 = _training(cluster, platform="cpu-cluster", compute_s=0.3, step_time_s=0.6, run_id="01-z1-mb4-ga2",
                   overrides=overrides)
    for op in ("all_reduce", "all_gather"):
        (runs / f"00-{op}.json").write_text(json.dumps(_collective(op, 0.12).to_dict()))
    (runs / "01.json").write_text(json.dumps(z1.to_dict()))
    (single / "02.json").write_text(json.dumps(_training(cluster, compute_s=0.3, run_id="cpu-z1").to_dict()))
    assert main(["model", "--against", str(runs), "--compute-records", str(single)]) == 0
    out = capsys.readouterr().out
    assert "01-z1-mb4-ga2" in out and "measured on platform cpu" in out and "|error| median" in out
    assert main(["model", "--against", str(runs), "--compute-records", str(single), "--max-error-pct", "0.001"]) == 1
    assert " !" in capsys.readouterr().out
    assert main(["model", "--against", str(runs), "--compute-records", str(single), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["run_id"] == "01-z1-mb4-ga2" and row["measured_step_time_s"] == 0.6
    assert main(["model", "--against", str(runs), "zero=stage2"]) == 2
    assert "--against takes no overrides" in capsys.readouterr().err
    assert main(["model", "platform=cpu-cluster", "workload=llama-tiny", "--compute-records", str(single),
                 "--records", str(runs)]) == 0
    assert "measured on platform cpu, the machine of cpu-cluster" in capsys.readouterr().out
