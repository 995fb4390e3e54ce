"""The small sizes' time (harness/collectives.py small_time_us, the metric small_time_us): the mean time per
call of a sweep's sizes up to 64 KiB, where a collective's time is its latency. nccl-tests' average busbw
weighs the bandwidth-bound sizes, so a latency regression (a protocol turned off) passed by it; judged
against a sweep of the same range, as the average."""
from __future__ import annotations

import json

import pytest
from unit_helpers import REPO_ROOT

from contract.metrics import METRICS, tolerances_for
from harness.__main__ import main
from harness.collectives import SMALL_BYTES, Placement, Row, small_time_us
from harness.verdict.ab import against
from test_acceptance_log import imported
from test_by_size import narrowed_output

DATA = REPO_ROOT / "tests" / "data" / "nccl_tests"


def row(size: int, us: float, busbw=1.0) -> Row:
    return Row(size, size // 4, "float", "sum", -1, Placement(us, busbw, busbw, 0), Placement(us + 2, busbw, busbw, 0))


def test_the_small_sizes_time_is_the_mean_over_their_placements():
    rows = [row(0, 0.1), row(8, 10.0), row(SMALL_BYTES, 20.0), row(SMALL_BYTES * 4, 500.0)]
    assert small_time_us(rows) == pytest.approx((10 + 12 + 20 + 22) / 4)   # 0 B and 256 KiB left out
    assert small_time_us([row(1 << 20, 50.0)]) is None                      # no small size: no figure
    smoke = Row(8, 2, "float", "sum", -1, Placement.smoke(9.0, 0), None)
    assert small_time_us([smoke]) is None                                  # a one-rank sweep claims no time
    assert METRICS["small_time_us"].direction == "lower" and METRICS["small_time_us"].reference_kind == "collective"
    assert tolerances_for("cpu")["small_time_us"] == 150.0 and tolerances_for("h100").get("small_time_us", tolerances_for("h100")["default"]) == 10.0


def _records(tmp_path, name: str, source: str) -> str:
    return imported(tmp_path, name, (DATA / source).read_text(encoding="utf-8"))


def test_a_protocol_turned_off_is_a_regression_the_average_passes(tmp_path, capsys):
    """8 H100s' all_reduce -b 8 -e 1G, then the same with NCCL_PROTO=^LL (tests/data/nccl_tests: the small
    messages' latency 14 -> 20 us): the average busbw reads 0.94x and passes its 10 %; the small sizes' time
    is 1.42x, a regression."""
    ll = _records(tmp_path, "all_reduce_perf.txt", "new_all_reduce.txt")
    no_ll = _records(tmp_path, "no_ll.txt", "new_all_reduce_no_ll.txt")
    (rec,) = [json.loads(p.read_text()) for p in (tmp_path / "no_ll-records").glob("*.json")]
    assert rec["metrics"]["small_time_us"]["n"] == 7                        # 8 B .. 32 KiB
    verdicts, left = against([no_ll], [ll], min_samples=1)
    got = {v.metric: v for v in verdicts}
    assert got["avg_busbw_gbps"].verdict == "pass" and left == ""
    assert got["avg_busbw_gbps"].value / got["avg_busbw_gbps"].reference == pytest.approx(0.94, abs=0.01)
    small = got["small_time_us"]
    assert small.verdict == "regression" and small.value / small.reference == pytest.approx(1.42, abs=0.02)
    assert small.value == pytest.approx(20.0, rel=0.05) and small.reference == pytest.approx(14.2, rel=0.05)
    rc = main(["compare", no_ll, "--against", ll, "--min-samples", "1"])
    out = capsys.readouterr().out
    assert rc == 1 and "small_time_us" in out and "regression" in out


def test_a_sweep_of_another_range_is_judged_on_the_small_sizes_both_ran(tmp_path):
    """The acceptance log (-b 8 -e 1G) against tonight's -b 2K -e 128M: the busbw is judged over the shared sizes,
    the small sizes' time over the shared ones up to 64 KiB (tests/unit/test_shared_small_time.py); neither
    range's own figure is 'new' nor 'missing'."""
    log = _records(tmp_path, "all_reduce_perf.txt", "new_all_reduce.txt")
    tonight = imported(tmp_path, "tonight.txt", narrowed_output(2048, 134217728, slow_from=1 << 62, slow=1.0))
    verdicts, left = against([tonight], [log], min_samples=1)
    assert [(v.metric, v.verdict) for v in verdicts] == [("shared_busbw_gbps", "pass"),
                                                         ("shared_small_time_us", "pass")] and left == ""
