"""Two gloo ranks sweep every collective with nccl-tests semantics and its correctness check; one
rank is a smoke run (every op through gloo, checked, no bandwidth claimed)."""
from __future__ import annotations

import statistics

import pytest

from contract.collectives import OPS
from harness.collectives import SMOKE_REASON, busbw_factor
from harness.record import validate_record

from .conftest import run_bench

pytestmark = pytest.mark.integration


def test_every_collective_on_two_gloo_ranks(tmp_path):
    run = run_bench(tmp_path / "out", "suite=single", "kind=collective", "collective=all",
                    "collective.min_bytes=8", "collective.max_bytes=65536", "collective.step_factor=8",
                    "collective.warmup_iters=1", "collective.iters=3", "collective.small_iters=9")
    assert run.returncode == 0, run.stderr[-3000:]
    records = run.records()
    assert {r["benchmark"] for r in records.values()} == set(OPS)
    for run_id, rec in records.items():
        assert validate_record(rec) == [], run_id
        assert rec["kind"] == "collective" and rec["status"] == "ok", (run_id, rec["reason"])
        assert rec["smoke"] is None and rec["metrics"]["avg_busbw_gbps"]["value"] > 0  # not a smoke
        # each call timed on its own (gloo on cpu): the median call beside nccl-tests' average, and their metric
        medians = [p["median_us"] for row in rec["rows"] if row["size_bytes"] <= 65536
                   for p in (row["out_of_place"], row["in_place"]) if p]
        assert medians and all(m > 0 for m in medians)
        assert rec["metrics"]["small_median_us"]["value"] == pytest.approx(statistics.median(medians))
        # and the same calls' lower quartile and share held up (contract/collectives.py call_figures)
        small = [p for row in rec["rows"] if row["size_bytes"] <= 65536 for p in (row["out_of_place"], row["in_place"]) if p]
        assert all(0 < p["p25_us"] and 0 <= p["stalled_pct"] <= 100 for p in small)
        assert rec["metrics"]["small_p25_us"]["value"] == pytest.approx(statistics.median(p["p25_us"] for p in small))
        assert rec["metrics"]["small_stalled_pct"]["value"] == pytest.approx(statistics.mean(p["stalled_pct"] for p in small))
        assert [row["size_bytes"] for row in rec["rows"]] == [8, 64, 512, 4096, 32768]
        for row in rec["rows"]:
            oop, ip = row["out_of_place"], row["in_place"]
            assert oop["num_wrong"] == 0 and oop["time_us"] > 0
            assert oop["busbw_gbps"] == pytest.approx(oop["algbw_gbps"] * busbw_factor(rec["benchmark"], 2))
            assert (ip is None) == (rec["benchmark"] in ("all_to_all", "sendrecv"))
            if ip:
                assert ip["num_wrong"] == 0
    assert "#       size        count     type  redop   root" in run.stdout
    assert run.stdout.count("# Avg bus bandwidth") == len(OPS)


def test_a_one_rank_sweep_is_a_smoke_run_with_no_bandwidth(tmp_path):
    ops = [op for op in OPS if op != "sendrecv"]  # gloo cannot send to its own rank (validation says so)
    run = run_bench(tmp_path / "out", "suite=single", "kind=collective", "collective=smoke",
                    "platform.gpus_per_node=1", f"collective.ops=[{','.join(ops)}]")
    assert run.returncode == 0, run.stderr[-3000:]
    records = run.records()
    assert sorted(r["benchmark"] for r in records.values()) == sorted(ops)
    for run_id, rec in records.items():
        assert validate_record(rec) == [], run_id
        assert rec["status"] == "ok", (run_id, rec["reason"])
        assert rec["environment"]["num_ranks"] == 1 and rec["config"]["platform"]["gpus_per_node"] == 1
        assert rec["smoke"]["reason"] == SMOKE_REASON
        assert rec["rows"] is None and rec["metrics"] == {}  # no bandwidth figure anywhere
        rows = rec["smoke"]["rows"]
        assert [row["size_bytes"] for row in rows] == [1024, 32768, 1048576]
        for row in rows:
            for p in (row["out_of_place"], row["in_place"]):
                if p is not None:
                    assert p["num_wrong"] == 0 and p["time_us"] > 0
                    assert p["algbw_gbps"] is None and p["busbw_gbps"] is None
            assert (row["in_place"] is None) == (rec["benchmark"] == "all_to_all")
    assert not list(run.out.glob("*.png"))  # nothing to plot
