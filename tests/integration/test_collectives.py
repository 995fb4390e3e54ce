"""Two gloo ranks sweep every collective with nccl-tests semantics and its correctness check."""
from __future__ import annotations

import pytest

from harness.collectives import OPS, busbw_factor
from harness.record import validate_record

from .conftest import run_bench

pytestmark = pytest.mark.integration


def test_every_collective_on_two_gloo_ranks(tmp_path):
    run = run_bench(tmp_path / "out", "suite=single", "kind=collective", "collective=all",
                    "collective.min_bytes=8", "collective.max_bytes=65536", "collective.step_factor=8",
                    "collective.warmup_iters=1", "collective.iters=3")
    assert run.returncode == 0, run.stderr[-3000:]
    records = run.records()
    assert {r["benchmark"] for r in records.values()} == set(OPS)
    for run_id, rec in records.items():
        assert validate_record(rec) == [], run_id
        assert rec["kind"] == "collective" and rec["status"] == "ok", (run_id, rec["reason"])
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
