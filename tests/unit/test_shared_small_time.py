"""The small sizes' time across two size ranges (harness/verdict/by_size.py SHARED_SMALL, shared_small_time_us):
a by-size reference keeps each run's time per size up to 64 KiB, so a latency regression in tonight's sweep of
another -b/-e than the reference's is judged over the small sizes both ran, as the busbw is over every shared
size. A text output prints a small size's busbw as 0.00 but its time in full: the time is what is kept."""
from __future__ import annotations

import json

import pytest
from unit_helpers import REPO_ROOT

from harness.__main__ import main
from harness.verdict.ab import against
from harness.verdict.by_size import SHARED, SHARED_SMALL, SMALL, restrict, time_by_size
from harness.verdict.compare import compare
from harness.verdict.references import load_references, validate_reference_file
from test_acceptance_log import imported
from test_by_size import curve, narrowed_output, refs_of, sweep

DATA = REPO_ROOT / "tests" / "data" / "nccl_tests"


def runs(prefix: str, lo: int, hi: int, late: float = 1.0, n: int = 3):
    return [sweep(f"{prefix}{i}", curve(lo, hi, scale=1 + i / 100), lo, hi, late=late * (1 + i / 100))
            for i in range(n)]


def test_a_reference_keeps_each_runs_time_per_small_size():
    recs = runs("r", 256, 1 << 22)
    assert time_by_size(recs[0]) == {s: pytest.approx(10.1) for s in (256, 1024, 4096, 16384, 65536)}
    (small,) = [r for r in refs_of(recs) if r.metric == SHARED_SMALL]
    assert "min_bytes" not in small.config and small.unit == "us" and small.direction == "lower"
    assert small.num_samples == len(small.by_size) == 3 and list(small.by_size[0]) == ["256", "1024", "4096",
                                                                                       "16384", "65536"]
    data = json.loads(json.dumps({"schema_version": "1.0", "references": [r.to_dict() for r in refs_of(recs)]}))
    assert validate_reference_file(data) == []


def test_a_latency_regression_in_a_sweep_of_another_range_is_caught_over_the_small_sizes_both_ran():
    old = runs("old", 256, 1 << 24)
    new = runs("new", 1024, 1 << 20, late=2.0)   # twice the time up to 64 KiB, the same busbw
    got = {v.metric: v for v in compare(new, refs_of(old))}
    assert sorted(got) == [SHARED, SHARED_SMALL]   # neither range's own metric is 'new' or 'missing'
    assert got[SHARED].verdict == "pass", got[SHARED].reason
    small = got[SHARED_SMALL]
    assert small.verdict == "regression", small.reason
    assert small.reason.startswith("over the 4 sizes (1K-64K) both ran, time 2.00x the reference's at each size: "
                                   "gain -100.0% against 10.201"), small.reason
    assert small.value == pytest.approx(20.402) and [f["size_bytes"] for f in small.sizes] == [1024, 4096, 16384, 65536]


def test_a_sweep_without_small_sizes_is_judged_on_its_busbw_alone():
    (v,) = compare(runs("new", 1 << 20, 1 << 24), refs_of(runs("old", 256, 1 << 24)))
    assert v.metric == SHARED and v.verdict == "pass"   # no small-time row, and its reference is not 'missing'


def test_small_sizes_that_do_not_meet_are_insufficient_data_naming_both():
    old = runs("old", 16384, 1 << 24)     # 16K, 64K small
    new = runs("new", 256, 4096)          # 256 .. 4K
    got = {v.metric: v for v in compare(new, refs_of(old))}
    assert got[SHARED_SMALL].verdict == "insufficient data"
    assert got[SHARED_SMALL].reason == ("no message size up to 64K that both ran: this run's 3 sizes (256-4K), "
                                        "the reference's 2 sizes (16K-64K)")
    ref = [r for r in refs_of(old) if r.metric == SHARED_SMALL][0]
    assert restrict(ref, runs("big", 1 << 20, 1 << 22)).words == ""   # no small size at all: nothing to say


def test_references_made_before_the_time_by_size_judge_no_small_time_of_another_range():
    """A reference file written before shared_small_time_us (busbw by size only): tonight's other range is judged
    on its busbw, and its small sizes' time is neither 'new' nor judged, as before."""
    refs = [r for r in refs_of(runs("old", 256, 1 << 24)) if r.metric != SHARED_SMALL]
    got = [(v.metric, v.verdict) for v in compare(runs("new", 1024, 1 << 20, late=2.0), refs)]
    assert got == [(SHARED, "pass")]


def test_the_same_range_judges_its_own_small_time_and_uses_the_by_size_time_up():
    got = [(v.metric, v.verdict) for v in compare(runs("new", 256, 1 << 24, late=2.0), refs_of(runs("old", 256, 1 << 24)))]
    assert got == [("avg_busbw_gbps", "pass"), (SMALL, "regression")]


def test_a_protocol_turned_off_in_tonights_range_is_caught_against_the_acceptance_log(tmp_path, capsys):
    """The acceptance log (-b 8 -e 1G, LL on) submitted as the reference; tonight's -b 2K -e 128M with
    NCCL_PROTO=^LL (the small messages 14 -> 20 us): busbw over the 9 shared sizes passes, the small sizes'
    time over the 3 both ran (2K, 8K, 32K) is a regression. The busbw of those sizes prints as 0.10-2.88 GB/s."""
    log = imported(tmp_path, "all_reduce_perf.txt", (DATA / "new_all_reduce.txt").read_text(encoding="utf-8"))
    tonight = imported(tmp_path, "tonight.txt", narrowed_output(2048, 134217728, slow_from=1 << 62, slow=1.0,
                                                                source="new_all_reduce_no_ll.txt"))
    table = tmp_path / "h100.json"
    assert main(["submit", log, "--reference-file", str(table), "--min-repeats", "1", "--submitter", "ops"]) == 0
    (small,) = [r for r in load_references([table]) if r.metric == SHARED_SMALL]
    assert list(small.by_size[0]) == ["8", "32", "128", "512", "2048", "8192", "32768"]
    capsys.readouterr()
    rc = main(["compare", tonight, "--reference", str(table), "--min-samples", "1", "--json"])
    got = {v["metric"]: v for v in json.loads(capsys.readouterr().out)}
    assert rc == 1 and sorted(got) == [SHARED, SHARED_SMALL]
    assert got[SHARED]["verdict"] == "pass", got[SHARED]["reason"]
    assert got[SHARED_SMALL]["verdict"] == "regression", got[SHARED_SMALL]["reason"]
    assert got[SHARED_SMALL]["reason"].startswith("over the 3 sizes (2K-32K) both ran, time 1.43x the reference's at "
                                                  "each size: 20.342 us against 14.253 us: 0.70x (1.43x slower)")
    assert got[SHARED_SMALL]["value"] == pytest.approx(20.35, abs=0.05)
    verdicts, left = against([tonight], [log], min_samples=1)   # the log as --against: the same verdicts
    assert [(v.metric, v.verdict) for v in verdicts] == [(SHARED, "pass"), (SHARED_SMALL, "regression")] and left == ""


def test_a_second_range_pools_into_the_by_size_time_too(tmp_path, capsys):
    log = imported(tmp_path, "all_reduce_perf.txt", (DATA / "new_all_reduce.txt").read_text(encoding="utf-8"))
    tonight = imported(tmp_path, "tonight.txt", narrowed_output(2048, 134217728, slow_from=1 << 62, slow=1.0))
    table = tmp_path / "h100.json"
    for side in (log, tonight):
        assert main(["submit", side, "--reference-file", str(table), "--min-repeats", "1", "--submitter", "ops"]) == 0
    out = capsys.readouterr().out
    pooled = [line.split() for line in out.splitlines() if line.startswith("pooled into ")]
    assert sorted(r[3] for r in pooled) == ["shared_busbw_gbps", "shared_small_time_us"], out
    (small,) = [r for r in load_references([table]) if r.metric == SHARED_SMALL]
    assert small.num_samples == 2 and [len(d) for d in small.by_size] == [7, 3]
