"""A one-rank collective sweep is a smoke run (issue 14): every op through the real backend with
the correctness check, records marked `smoke` that claim no bandwidth (no rows, no avg_busbw_gbps,
the smoke's rows with algbw/busbw null). Nothing that reads collective records (compare,
references, nightly series, calibration, tuning, the plot, the summary, submit) takes one for a
bandwidth figure or crashes on it; submit refuses it by name."""
from __future__ import annotations

import copy
import json

import pytest
from unit_helpers import REPO_ROOT

from benchmarks.comm.collectives import CHUNKED
from contract import events as ev
from contract.collectives import OPS
from harness.collectives import SMOKE_REASON, Row, format_table
from harness.launch.local import LaunchResult
from harness.plan import plan_run
from harness.record import ResultRecord, build_collective_records, validate_record

CUDA_ENV = {"python": "3.11.7", "torch": "2.13.0", "deepspeed": "0.19.8", "transformers": "5.23.0",
            "cuda": "12.8", "nccl": "2.27.3", "driver": "570.86.15", "gpu_model": "NVIDIA H100 80GB HBM3",
            "gpu_count": 1, "container_image": None, "env": {"NCCL_DEBUG": "WARN"}, "host": "gpu01"}


def row_event(op: str, size: int, n: int) -> dict:
    """A collective_row event as rank 0 of benchmarks.comm.collectives emits it (float32, sum, root 0)."""
    in_place = None if op in ("all_to_all", "sendrecv") else {"time_us": 12.5, "num_wrong": 0}
    return {"op": op, "size_bytes": size, "count": size // 4 // (n if op in CHUNKED else 1), "dtype": "float",
            "redop": "sum" if op in ("all_reduce", "reduce_scatter", "reduce") else "none",
            "root": 0 if op in ("broadcast", "reduce") else -1,
            "out_of_place": {"time_us": 10.0, "num_wrong": 0}, "in_place": in_place, "num_ranks": n}


def sweep_records(cfg, tmp_path, env=None) -> list[ResultRecord]:
    """The records harness.record builds from a clean built-in sweep's events."""
    run = plan_run(cfg, "collectives", 0, [], tmp_path / "out", REPO_ROOT, REPO_ROOT / ".cache")
    n = run.num_ranks
    events = ([(ev.ENVIRONMENT, env)] if env else []) + [(ev.RUN_START, None)]
    events += [(ev.COLLECTIVE_ROW, row_event(op, size, n)) for op in run.spec.ops for size in run.spec.sizes]
    events += [(ev.RUN_STOP, None)]
    run.run_dir.mkdir(parents=True)
    with open(run.run_dir / ev.EVENTS_FILE, "w", encoding="utf-8") as f:
        for i, (key, value) in enumerate(events):
            f.write(json.dumps({"time_ms": 1000 + i, "key": key, "value": value, "metadata": {}}) + "\n")
    return build_collective_records(run, cfg, LaunchResult({r: 0 for r in range(n)}, False, 3.0))


@pytest.fixture
def h100_cfg(composed):
    return composed(["platform=h100", "kind=collective", "collective=smoke"])


@pytest.fixture
def smoke(h100_cfg, tmp_path) -> list[ResultRecord]:
    """The records of the one-GPU default suite's nccl smoke run."""
    return sweep_records(h100_cfg, tmp_path, CUDA_ENV)


def test_one_rank_records_are_smoke_runs_without_bandwidth(smoke):
    assert [r.benchmark for r in smoke] == list(OPS)
    for rec in smoke:
        d = rec.to_dict()
        assert validate_record(d) == [], rec.run_id
        assert (d["kind"], d["status"], d["reason"], d["source"]) == ("collective", "ok", None, "builtin")
        assert d["smoke"]["reason"] == SMOKE_REASON == "one rank: no bus bandwidth can be measured"
        assert d["rows"] is None and d["metrics"] == {}  # no nccl-tests rows, no avg_busbw_gbps
        assert [r["size_bytes"] for r in d["smoke"]["rows"]] == [1024, 32768, 1048576]
        for row in d["smoke"]["rows"]:
            for p in (row["out_of_place"], row["in_place"]):
                if p is not None:
                    assert (p["algbw_gbps"], p["busbw_gbps"]) == (None, None)  # null: not 0, not a number
                    assert p["time_us"] > 0 and p["num_wrong"] == 0
            assert (row["in_place"] is None) == (rec.benchmark in ("all_to_all", "sendrecv"))
        assert d["environment"]["num_ranks"] == 1


def test_two_rank_records_are_unchanged_and_not_smoke(composed, tmp_path):
    cfg = composed(["kind=collective", "collective=cpu-short"])
    for rec in sweep_records(cfg, tmp_path):
        d = rec.to_dict()
        assert validate_record(d) == [] and d["smoke"] is None
        assert d["metrics"]["avg_busbw_gbps"]["value"] > 0
        assert all(r["out_of_place"]["busbw_gbps"] > 0 for r in d["rows"])


def _claims_bandwidth(d):
    d["metrics"]["avg_busbw_gbps"] = {"value": 0.0, "unit": "GB/s", "mode": "throughput"}


def _has_rows(d):
    d["rows"] = copy.deepcopy(d["smoke"]["rows"])


def _zero_busbw(d):
    d["smoke"]["rows"][0]["out_of_place"]["busbw_gbps"] = 0.0


def _training(d):
    d["kind"] = "training"


def _no_rows(d):
    d["smoke"]["rows"] = []


def _no_reason(d):
    del d["smoke"]["reason"]


@pytest.mark.parametrize("mutate", [_claims_bandwidth, _has_rows, _zero_busbw, _training, _no_rows, _no_reason])
def test_the_schema_refuses_a_smoke_record_that_claims_bandwidth_or_lacks_its_rows(smoke, mutate):
    d = smoke[0].to_dict()
    mutate(d)
    assert validate_record(d) != []


def test_an_ok_collective_record_without_rows_is_still_refused_when_not_a_smoke(smoke):
    d = smoke[0].to_dict()
    d["smoke"] = None
    assert any("rows" in p for p in validate_record(d))


def test_readers_take_no_bandwidth_from_a_smoke_record(smoke, h100_cfg, tmp_path):
    from harness.bench import plot_collectives
    from harness.verdict.compare import compare
    from harness.model.calibration import busbw_curves
    from harness.nightly import series
    from harness.verdict.references import references_from_records
    from harness.report.summary import collective_table, summary
    from harness.tune.outcome import allreduce_busbw

    assert compare(smoke, []) == []                     # no verdict: nothing to compare
    assert references_from_records(smoke, source="s", submitter="t", date="2026-11-23", system="x",
                                   tolerance_pct={"default": 10.0}) == []
    assert series([("2026-11-23", r) for r in smoke]) == {}
    assert busbw_curves(smoke, h100_cfg) == {}          # the performance model gets no curve
    assert all(allreduce_busbw(r) is None for r in smoke)
    png = tmp_path / "busbw.png"
    plot_collectives(smoke, h100_cfg, png)             # no point to draw: no picture
    assert not png.exists() and all(r.plot is None for r in smoke)
    table = collective_table(smoke)
    assert all(line.split()[4:6] == ["-", "-"] for line in table.splitlines()[2:])  # peak, avg busbw
    assert "all_reduce" in summary(smoke, markdown=True)
    rows = [Row.from_dict(r) for r in smoke[0].smoke["rows"]]
    text = format_table("all_reduce", rows, 1)
    assert "# Avg bus bandwidth    : N/A" in text and "# Out of bounds values : 0 OK" in text
    assert " 0.00 " not in text                          # no bandwidth column printed as 0


def test_submit_refuses_a_smoke_record_by_name(smoke, tmp_path):
    from harness.verdict.submit import SubmissionRejected, submit

    results, refs = tmp_path / "res", tmp_path / "refs"
    results.mkdir()
    for i, rec in enumerate(smoke[:1] * 3):  # three repeats of the all_reduce smoke
        d = rec.to_dict()
        d["run_id"] = f"{d['run_id']}-{i}"
        d["environment"]["machine"] = {"cpu": {"model": "AMD EPYC", "logical_cpus": 2}}  # the one other check
        (results / f"{d['run_id']}.json").write_text(json.dumps(d), encoding="utf-8")
    with pytest.raises(SubmissionRejected) as err:
        submit([results], reference_dir=refs, today="2026-11-23", submitter="tester")
    assert len(err.value.reasons) == 3
    assert all(f"a smoke run ({SMOKE_REASON}): it measures no bandwidth" in r for r in err.value.reasons)
    assert not refs.exists() or not any(refs.iterdir())


@pytest.mark.parametrize("platform", ["h100", "h200"])
def test_the_one_gpu_default_suites_exercise_nccl_with_a_smoke_run(platform):
    from harness.bench import plan_suite

    _, planned = plan_suite([f"platform={platform}"])
    first, *training = planned
    assert first.cfg.suite.name == f"default-{platform}"
    assert first.cfg.kind.value == "collective" and first.run.num_ranks == 1
    spec = first.run.spec
    assert (spec.device, spec.dist_backend, spec.check) == ("cuda", "nccl", True)
    assert spec.ops == list(OPS)                        # every collective, sendrecv to itself too
    assert spec.sizes == [1024, 32768, 1048576] and spec.iters == 1
    assert training and all(p.cfg.kind.value == "training" for p in training)


ONE_GPU_NCCL_TESTS = """# nThread 1 nGpus 1 minBytes 1024 maxBytes 4096 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid   1187 on h100-node-01 device  0 [0x18] NVIDIA H100 80GB HBM3
NCCL version 2.27.3+cuda13.0
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024           256     float     sum      -1     5.10    0.20    0.00      0     5.00    0.20    0.00      0
        4096          1024     float     sum      -1     5.20    0.79    0.00      0     5.10    0.80    0.00      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0
#
"""


def test_a_one_gpu_nccl_tests_output_is_a_smoke_record_too():
    """nccl-tests on one GPU prints busbw 0 for all_reduce (algbw for broadcast): no bandwidth to claim."""
    from harness.nccl_tests.importer import records_from_output
    from harness.nccl_tests.output import parse_text
    from harness.record import validate_record

    rec = records_from_output(parse_text(ONE_GPU_NCCL_TESTS, "one-gpu.txt", op="all_reduce"), run_id="r", platform="h100",
                              source_file="f")
    assert rec.smoke and rec.smoke["reason"] == "one rank: no bus bandwidth can be measured"
    assert rec.rows is None and rec.metrics == {}
    assert [r["out_of_place"]["busbw_gbps"] for r in rec.smoke["rows"]] == [None, None]
    assert [r["in_place"]["time_us"] for r in rec.smoke["rows"]] == [5.00, 5.10]
    assert validate_record(rec.to_dict()) == []
