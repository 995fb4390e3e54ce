"""Result records (harness.record): percentiles, metrics from step events, a run's status and
reason, schema validation and atomic writes."""
from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from unit_helpers import REPO_ROOT

from contract import events as ev
from harness.launch.local import LaunchResult
from harness.model.flops import llama_param_count, mfu_pct, training_flops_per_token
from harness.plan import plan_run
from harness.record import build_record, status_of, validate_record, write_json_atomic, write_record
from harness.training_metrics import compute_metrics, percentile

_rng = random.Random(7)
SAMPLES = [[1.0], [1.0, 2.0], [3.0, 1.0, 2.0], [5.0, 1.0, 10.0, 2.5, 7.0],
           [_rng.uniform(0, 100) for _ in range(17)]]


@pytest.mark.parametrize("values", SAMPLES, ids=lambda v: f"n{len(v)}")
@pytest.mark.parametrize("q", [0, 10, 33.3, 50, 90, 100])
def test_percentile_matches_numpy_default(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)


# --- compute_metrics -----------------------------------------------------------------------

def microsteps(comm_s: float, n: int = 4) -> list[dict]:
    return [{"index": i, "total_s": 1.0, "compute_s": 1.0 - comm_s, "comm_s": comm_s,
             "collectives": [{"op": "all_reduce", "bytes": 4096, "time_s": comm_s, "api": "all_reduce",
                              "phase": "backward"}]} for i in range(n)]


def steps() -> list[dict]:
    return [
        {"index": 0, "mode": "throughput", "warmup": True, "step_time_s": 100.0, "loss": 9.0},
        {"index": 1, "mode": "throughput", "warmup": False, "step_time_s": 1.0, "loss": 8.0},
        {"index": 2, "mode": "throughput", "warmup": False, "step_time_s": 4.0, "loss": 7.0},
        {"index": 3, "mode": "throughput", "warmup": False, "step_time_s": 2.0, "loss": 6.0},
        {"index": 4, "mode": "profile", "warmup": False, "step_time_s": 3.0, "loss": 5.0,
         "microsteps": microsteps(0.1)},
        {"index": 5, "mode": "profile", "warmup": False, "step_time_s": 5.0, "loss": float("nan"),
         "microsteps": microsteps(0.1)},
    ]


RANKS = [{"rank": 0, "host": "a", "peak_mem_gib": 1.5, "mem_source": "rss"},
         {"rank": 1, "host": "a", "peak_mem_gib": 2.5, "mem_source": "rss"}]


@pytest.mark.parametrize("gpus_per_node", [2, 4])
def test_compute_metrics_from_step_events(tiny_cfg, gpus_per_node):
    tiny_cfg.platform.gpus_per_node = gpus_per_node  # mb 2, ga 4, seq 128, fp32 peak 0.1 TFLOP/s
    w = tiny_cfg.workload
    num_params = llama_param_count(w)
    metrics, flops = compute_metrics(tiny_cfg, steps(), RANKS, num_params)

    median = 2.0  # of the measured throughput steps 1, 4, 2 (warm-up's 100 s excluded)
    samples_per_s = 2 * 4 * gpus_per_node / median
    tokens_per_s = samples_per_s * 128
    per_device = tokens_per_s / gpus_per_node
    fpt = training_flops_per_token(w, num_params).flops_per_token
    expected = {
        "samples_per_s": (samples_per_s, "samples/s", "throughput"),
        "tokens_per_s": (tokens_per_s, "tokens/s", "throughput"),
        "tokens_per_s_per_device": (per_device, "tokens/s", "throughput"),
        "step_time_s": (median, "s", "throughput"),
        "mfu_pct": (100 * per_device * fpt / 0.1e12, "%", "throughput"),
        "peak_mem_gib": (2.5, "GiB", "throughput"),
        "final_loss": (5.0, "nats", "throughput"),  # the NaN of the last step is skipped
        "profile_step_time_s": (4.0, "s", "profile"),
        "instrumentation_overhead_pct": (100.0, "%", "profile"),
        "comm_time_s": (0.4, "s", "profile"),
        "comm_fraction_pct": (10.0, "%", "profile"),
        "comm_held_up_pct": (0.0, "%", "profile"),      # every call alike: none held up
    }
    assert set(metrics) == set(expected)
    for name, (value, unit, mode) in expected.items():
        m = metrics[name]
        assert m["value"] == pytest.approx(value), name
        assert m["unit"] == unit, name
        assert m["mode"] == mode, name
    st = metrics["step_time_s"]
    assert (st["p10"], st["p90"], st["n"]) == (pytest.approx(1.2), pytest.approx(3.6), 3)
    assert metrics["peak_mem_gib"]["source"] == "rss"
    assert metrics["mfu_pct"]["value"] == pytest.approx(mfu_pct(per_device, fpt, 0.1))

    assert flops["num_params"] == num_params
    assert flops["flops_per_token"] == fpt
    assert flops["peak_tflops_per_device"] == 0.1
    assert flops["dtype"] == "fp32"
    assert flops["formula"] == "6*N + 12*L*h*s"


def test_compute_metrics_without_a_parameter_count_has_no_mfu(tiny_cfg):
    metrics, flops = compute_metrics(tiny_cfg, steps(), RANKS, None)
    assert "mfu_pct" not in metrics
    assert flops is None
    assert metrics["samples_per_s"]["value"] == pytest.approx(8.0)


# --- status_of -----------------------------------------------------------------------------

@pytest.fixture
def run(tiny_cfg, tmp_path):
    return plan_run(tiny_cfg, "tiny", 0, [], tmp_path / "out", REPO_ROOT, REPO_ROOT / ".cache")


def step_events(n: int) -> list[dict]:
    return [{"key": ev.TRAIN_STEP, "value": {"index": i}} for i in range(n)]


STOP = [{"key": ev.RUN_STOP, "value": None, "metadata": {"status": "success"}}]
OOM = {"status": "oom", "reason": "rank 0: OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"}
ERR = {"status": "error", "reason": "rank 1: RuntimeError: connection reset by peer"}

STATUS_CASES = [
    pytest.param(LaunchResult({0: None, 1: None}, True, 900.0, [0, 1]), step_events(3), [],
                 "timeout", ["measure.timeout_s=900", "3 optimizer steps", "[0, 1]"], id="timeout"),
    pytest.param(LaunchResult({0: 4, 1: 1}, False, 10.0), step_events(1), [ERR, OOM],
                 "oom", ["OutOfMemoryError", "rank 0"], id="failure-event-oom-wins"),
    pytest.param(LaunchResult({0: 1, 1: None}, False, 10.0, [1]), step_events(1), [ERR],
                 "error", ["connection reset by peer"], id="failure-event-error"),
    pytest.param(LaunchResult({0: 0, 1: -9}, False, 10.0), step_events(2), [],
                 "error", ["rank 1", "SIGKILL", "2 optimizer steps"], id="rank-killed-by-signal"),
    pytest.param(LaunchResult({0: 0, 1: 3}, False, 10.0), step_events(2), [],
                 "error", ["rank 1", "exited with code 3"], id="rank-exit-code"),
    pytest.param(LaunchResult({0: 0, 1: 0}, False, 10.0), step_events(7), [],
                 "error", ["run_stop"], id="exit-0-without-run_stop"),
    pytest.param(LaunchResult({0: 0, 1: 0}, False, 10.0), step_events(7) + STOP, [],
                 "ok", None, id="clean"),
]


@pytest.mark.parametrize("launch,events,failures,status,reason", STATUS_CASES)
def test_status_and_reason_of_a_run(run, launch, events, failures, status, reason):
    got_status, got_reason = status_of(run, launch, events, failures)
    assert got_status == status
    if reason is None:
        assert got_reason is None
    else:
        for fragment in reason:
            assert fragment in got_reason


# --- build_record: events file -> a record that matches the schema -------------------------

def write_events(path, events: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i, (key, value) in enumerate(events):
            f.write(json.dumps({"time_ms": 1000 + i, "key": key, "value": value, "metadata": {}}) + "\n")


def finite_steps() -> list[dict]:
    return [{**s, "loss": 4.0} if not math.isfinite(s["loss"]) else s for s in steps()]


def write_clean_run(run, tiny_cfg, run_steps) -> None:
    run.run_dir.mkdir(parents=True)
    write_events(run.run_dir / ev.EVENTS_FILE,
                 [(ev.NUM_PARAMS, llama_param_count(tiny_cfg.workload)), (ev.RUN_START, None)]
                 + [(ev.TRAIN_STEP, s) for s in run_steps]
                 + [(ev.RANK_SUMMARY, RANKS), (ev.RUN_STOP, None)])


def test_build_record_of_a_clean_run_is_valid_and_complete(tiny_cfg, run):
    write_clean_run(run, tiny_cfg, finite_steps())
    record = build_record(run, tiny_cfg, LaunchResult({0: 0, 1: 0}, False, 12.5))
    assert (record.status, record.reason) == ("ok", None)
    assert record.run_id == "00-tiny"
    assert record.benchmark == "llama-tiny"
    assert record.platform == "cpu"
    assert record.config["deepspeed"]["train_batch_size"] == 16
    assert len(record.microsteps) == 2 and len(record.microsteps[0]) == 4
    assert [s["index"] for s in record.steps] == [0, 1, 2, 3, 4, 5]
    assert record.metrics["samples_per_s"]["value"] == pytest.approx(8.0)
    assert record.environment["num_ranks"] == 2
    assert record.environment["hosts"] == ["a"]
    assert record.wall_s == 12.5
    assert validate_record(json.loads(json.dumps(record.to_dict()))) == []
    assert record.metrics["final_loss"]["value"] == 4.0
    path = write_record(record, run.run_dir.parent.parent)
    assert json.loads(path.read_text(encoding="utf-8"))["status"] == "ok"


def test_a_nan_loss_step_still_gives_a_writable_record(tiny_cfg, run):
    write_clean_run(run, tiny_cfg, steps())  # the last (profile) step's loss is NaN
    record = build_record(run, tiny_cfg, LaunchResult({0: 0, 1: 0}, False, 12.5))
    path = write_record(record, run.run_dir.parent.parent)
    assert validate_record(json.loads(path.read_text(encoding="utf-8"))) == []


def test_build_record_of_an_oom_on_another_rank(tiny_cfg, run):
    run.run_dir.mkdir(parents=True)
    write_events(run.run_dir / ev.EVENTS_FILE, [(ev.RUN_START, None)]
                 + [(ev.TRAIN_STEP, s) for s in steps()[:2]] + [(ev.RUN_STOP, None)])
    write_events(run.run_dir / "events.rank1.jsonl", [(ev.FAILURE, {**OOM, "reason": "rank 1: OOM"})])
    record = build_record(run, tiny_cfg, LaunchResult({0: None, 1: 4}, False, 3.0, [0]))
    assert (record.status, record.reason) == ("oom", "rank 1: OOM")
    assert record.metrics == {}
    assert validate_record(record.to_dict()) == []


# --- validate_record -----------------------------------------------------------------------

def minimal_record() -> dict:
    env = {"python": "3.11.7", "torch": "2.13.0", "deepspeed": "0.19.8", "transformers": None,
           "cuda": None, "nccl": None, "driver": None, "gpu_model": None, "gpu_count": 0,
           "container_image": None, "env": {}, "hosts": ["h"], "suite_commit": None}
    metrics = {name: {"value": 1.0, "unit": unit, "mode": "throughput"} for name, unit in (
        ("samples_per_s", "samples/s"), ("tokens_per_s", "tokens/s"), ("step_time_s", "s"),
        ("peak_mem_gib", "GiB"), ("mfu_pct", "%"))}
    return {"schema_version": "1.0", "run_id": "00-x", "kind": "training", "benchmark": "llama-tiny",
            "platform": "cpu", "status": "ok", "reason": None, "config": {}, "overrides": [],
            "environment": env, "metrics": metrics, "microsteps": []}


def test_a_valid_minimal_record_passes():
    assert validate_record(minimal_record()) == []


def _without(key):
    def change(r):
        del r[key]
    return change


def _set(**kv):
    def change(r):
        r.update(kv)
    return change


@pytest.mark.parametrize("change,expected", [
    pytest.param(_without("run_id"), "<root>: 'run_id' is a required property", id="missing-run_id"),
    pytest.param(_set(status="crashed"), "status: 'crashed' is not one of ['ok', 'oom', 'error', 'timeout']",
                 id="bad-status"),
    pytest.param(_set(metrics={}), "metrics: 'samples_per_s' is a required property", id="ok-without-metrics"),
    pytest.param(_set(status="error", reason=None), "reason: None is not of type 'string'",
                 id="error-without-reason"),
    pytest.param(_set(reason="but it was fine"), "reason: 'but it was fine' is not of type 'null'",
                 id="ok-with-reason"),
])
def test_invalid_record_gives_a_readable_error(change, expected):
    record = minimal_record()
    change(record)
    problems = validate_record(record)
    assert expected in problems, problems


# --- write_json_atomic ---------------------------------------------------------------------

def test_write_json_atomic_writes_the_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "sub" / "record.json"
    write_json_atomic(path, {"a": 1, "b": [1.5, None]})
    write_json_atomic(path, {"a": 2})
    assert json.loads(path.read_text(encoding="utf-8")) == {"a": 2}
    assert sorted(p.name for p in path.parent.iterdir()) == ["record.json"]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), object()], ids=["nan", "inf", "object"])
def test_write_json_atomic_never_leaves_a_partial_file(tmp_path, bad):
    path = tmp_path / "record.json"
    write_json_atomic(path, {"a": 1})
    before = path.read_bytes()
    with pytest.raises((ValueError, TypeError)):
        write_json_atomic(path, {"big": list(range(10_000)), "bad": bad})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_a_distillation_run_reports_mfu_with_and_without_the_teacher_and_its_memory(composed):
    cfg = composed(["workload=llama-tiny-kd"])  # student fp32, teacher bf16 of the same shape
    w = cfg.workload
    num_params = llama_param_count(w)
    teacher = {"placement": "zero3", "dtype": "bf16", "num_params": num_params,
               "bytes_per_rank": num_params, "checkpoint": None, "alpha": 0.5, "temperature": 2.0}
    metrics, flops = compute_metrics(cfg, steps(), RANKS, num_params, teacher)

    student = training_flops_per_token(w, num_params).flops_per_token
    n_matmul = num_params - w.vocab_size * w.hidden_size
    teacher_fpt = 2 * n_matmul + 4 * w.num_layers * w.hidden_size * w.seq_len
    assert teacher_fpt == pytest.approx(student / 3)  # a forward is a third of forward + backward
    assert flops["flops_per_token"] == student  # the student's training FLOPs, as without a teacher
    assert flops["teacher"]["flops_per_token"] == teacher_fpt
    assert flops["teacher"]["formula"] == "2*N_t + 4*L_t*h_t*s" and flops["teacher"]["dtype"] == "bf16"
    assert flops["flops_per_token_with_teacher"] == student + teacher_fpt
    per_device = 2 * 4 * 2 / 2.0 * 128 / 2
    assert metrics["mfu_pct"]["value"] == pytest.approx(mfu_pct(per_device, student, 0.1))
    assert metrics["mfu_with_teacher_pct"]["value"] == pytest.approx(mfu_pct(per_device, student + teacher_fpt, 0.1))
    assert metrics["mfu_with_teacher_pct"]["value"] == pytest.approx(metrics["mfu_pct"]["value"] * 4 / 3)
    assert metrics["teacher_mem_gib"]["value"] == pytest.approx(num_params / 2**30)
    assert "zero3, bf16" in metrics["teacher_mem_gib"]["source"]
    assert "teacher_mem_gib" not in compute_metrics(cfg, steps(), RANKS, num_params)[0]


# --- every node's machine: rank 0's ENVIRONMENT, the others' NODE events (issue 15) ----------

def test_every_nodes_machine_and_link_rates_are_in_the_record(tiny_cfg, run):
    from unit_helpers import node

    write_clean_run(run, tiny_cfg, finite_steps())
    with open(run.run_dir / ev.EVENTS_FILE, "a", encoding="utf-8") as f:   # rank 0 on node1
        f.write(json.dumps({"key": ev.ENVIRONMENT, "value": {"host": "node1", **node("node1")}}) + "\n")
    write_events(run.run_dir / "events.rank1.jsonl", [(ev.NODE, node("node1", 0.5))])   # no LOCAL_RANK: same node
    write_events(run.run_dir / "events.rank2.jsonl", [(ev.NODE, node("node2", 0.25))])
    write_events(run.run_dir / "events.rank3.jsonl", [(ev.FAILURE, {"status": "error", "reason": "x"})])
    record = build_record(run, tiny_cfg, LaunchResult({0: 0, 1: 0}, False, 1.0)).to_dict()
    env = record["environment"]
    assert [n["host"] for n in env["nodes"]] == ["node1", "node2"]
    assert env["nodes"][0]["machine"] == node("node1")["machine"]                  # rank 0's own view
    assert env["links"] == {"node1/eth0": 1.0, "node2/eth0": 0.25}   # no container bridge port, no rateless bridge
    assert validate_record(json.loads(json.dumps(record))) == []


def test_a_run_whose_ranks_never_reported_has_no_nodes(tiny_cfg, run):
    write_clean_run(run, tiny_cfg, finite_steps())
    env = build_record(run, tiny_cfg, LaunchResult({0: 0, 1: 0}, False, 1.0)).environment
    assert "nodes" not in env and "links" not in env and env["hosts"] == ["a"]


def test_links_hold_infiniband_ports_and_never_a_zero_rate():
    from harness.nodes import links

    ports = [{"name": "mlx5_0/1", "kind": "ib", "rate_gbps": 400.0}, {"name": "mlx5_1/1", "kind": "ib", "rate_gbps": 0.0},
             {"name": "eth0", "kind": "physical", "rate_gbps": None}]
    assert links([{"host": "gpu1", "machine": {"nics": ports}}, {"host": "gpu2", "machine": None}]) == {
        "gpu1/mlx5_0/1": 400.0}


def test_a_run_folder_s_spec_and_config_are_written_whole_or_not_at_all(tmp_path, monkeypatch, composed):
    """spec.json and config.yaml are read by the ranks and by people while a suite runs: a failed
    rewrite leaves the old file, never a part of the new one."""
    import os

    from harness.bench import prepare_run_dir
    from harness.plan import plan_run

    cfg = composed([])
    run = plan_run(cfg, "run", 1, [], tmp_path / "out", tmp_path, tmp_path / "cache")
    prepare_run_dir(run)
    before = {name: (run.run_dir / name).read_bytes() for name in ("spec.json", "config.yaml")}
    run.config["workload"]["seq_len"] = 4096
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        prepare_run_dir(run)
    assert {name: (run.run_dir / name).read_bytes() for name in before} == before
    assert sorted(p.name for p in run.run_dir.iterdir()) == ["config.yaml", "spec.json"]
