"""nccl-tests' run cycles (`-N k`, harness/nccl_tests/cycles.py): one output of k sweeps in one table (or one
-J "results" array) is imported as k records of one configuration, so an acceptance log run with `-N 3` is
three samples: submit takes it without --min-repeats 1 and compare's bootstrap has runs to resample."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from unit_helpers import REPO_ROOT

from harness.__main__ import main
from harness.nccl_tests.cycles import rows_per_cycle, split_cycles
from harness.nccl_tests.importer import import_files
from harness.nccl_tests.json_format import parse_file
from harness.nccl_tests.output import RunConfig, parse_text
from harness.record import ResultRecord, validate_record
from harness.verdict.by_size import SHARED
from harness.verdict.compare import compare, load_records
from harness.verdict.references import load_references, record_config

DATA = REPO_ROOT / "tests" / "data" / "nccl_tests"
TEXT, JSON = DATA / "new_all_reduce_cycles.txt", DATA / "json_all_reduce_cycles.json"


def imported(tmp_path, source: Path, name: str = "") -> list[dict]:
    src = tmp_path / (name or source.name)
    src.write_text(source.read_text(encoding="utf-8") if isinstance(source, Path) else source, encoding="utf-8")
    out = tmp_path / f"{src.stem}-records"
    paths = import_files([str(src)], out, "h100")
    return [json.loads(p.read_text(encoding="utf-8")) for p in paths]


def config(min_bytes: int, max_bytes: int, factor=None, step=None) -> RunConfig:
    return RunConfig(1, 8, min_bytes, max_bytes, factor, step, 5, 20, 1, 1, 0)


def test_a_sweeps_sizes_are_counted_as_common_cu_steps_them():
    assert rows_per_cycle(config(8, 1 << 30, factor=4)) == 14            # 8 B .. 512 MiB
    assert rows_per_cycle(config(1 << 30, 1 << 30, factor=2)) == 1       # -b = -e
    assert rows_per_cycle(config(1024, 4096, step=1024)) == 4            # -i 1024
    assert rows_per_cycle(config(8, 64, factor=1, step=0)) is None       # no step: not believed
    assert rows_per_cycle(config(0, 64, factor=2)) is None               # 0 x 2 never grows
    assert rows_per_cycle(None) is None


@pytest.mark.parametrize("source, rows", [(TEXT, 14), (JSON, 13)])
def test_an_output_of_three_cycles_is_three_records_of_one_configuration(tmp_path, source, rows):
    recs = imported(tmp_path, source)
    stem = source.stem
    assert [r["run_id"] for r in recs] == [f"nccl-tests-{stem}-cycle{i}" for i in (1, 2, 3)]
    assert all(validate_record(r) == [] and r["status"] == "ok" and r["complete"] for r in recs)
    assert [len(r["rows"]) for r in recs] == [rows] * 3
    assert [r["config"]["run_cycle"] for r in recs] == [{"cycle": i, "of": 3} for i in (1, 2, 3)]
    for r in recs:   # each cycle's average is its own rows' (the footer's is every cycle's)
        busbw = [p["busbw_gbps"] for row in r["rows"] for p in (row["out_of_place"], row["in_place"])]
        avg = r["metrics"]["avg_busbw_gbps"]
        assert avg["value"] == pytest.approx(statistics.mean(busbw))
        assert avg["source"] == "mean of this cycle's printed rows (the footer averages all 3 cycles)"
        assert "small_time_us" in r["metrics"]
    printed = recs[0]["config"]["printed_avg_busbw_gbps"]
    assert statistics.mean(r["metrics"]["avg_busbw_gbps"]["value"] for r in recs) == pytest.approx(printed, rel=1e-3)
    assert len({r["rows"][-1]["out_of_place"]["time_us"] for r in recs}) == 3   # three measurements, not one
    keys = {json.dumps(record_config(ResultRecord.from_dict(r)), sort_keys=True) for r in recs}
    assert len(keys) == 1   # one configuration: three samples of it


def test_the_cycles_are_a_submission_of_three_runs_and_judge_a_later_run_with_their_spread(tmp_path, capsys):
    recs = tmp_path / "new_all_reduce_cycles-records"
    imported(tmp_path, TEXT)
    table = tmp_path / "h100.json"
    assert main(["submit", str(recs), "--reference-file", str(table), "--submitter", "ops"]) == 0   # 3 runs
    refs = load_references([table])
    assert {r.metric: r.num_samples for r in refs} == {"avg_busbw_gbps": 3, "large_busbw_gbps": 3, "small_time_us": 3,
                                                      SHARED: 3, "shared_small_time_us": 3}
    later = tmp_path / "later"
    import_files([str(DATA / "new_all_reduce.txt")], later, "h100")
    verdicts = compare(load_records([str(later)]), refs, min_samples=1)
    got = {v.metric: v for v in verdicts}
    assert got["avg_busbw_gbps"].verdict == "pass" and got["avg_busbw_gbps"].num_reference_samples == 3
    lo, hi = got["avg_busbw_gbps"].interval_pct
    assert lo < hi   # the reference's runs resampled: an interval, not a point
    capsys.readouterr()
    assert main(["import-nccl-tests", str(TEXT), "--out", str(tmp_path / "again"), "--platform", "h100"]) == 0
    out = capsys.readouterr().out
    assert out.count("(run cycle ") == 3 and "all_reduce, 14 rows (run cycle 2 of 3), ok" in out


def test_one_size_a_cycle_is_split_by_the_headers_sweep():
    """-b 512M -e 512M -N 3: the same size three times; the header's sweep has one size, so three cycles."""
    lines = TEXT.read_text(encoding="utf-8").splitlines()
    rows = [ln for ln in lines if ln.strip().startswith("536870912 ")]
    head = [ln.replace("minBytes 8 ", "minBytes 536870912 ") for ln in lines
            if not ln.strip()[:1].isdigit() and not ln.startswith("# Out") and not ln.startswith("# Avg")
            and ln not in ("#", "")]
    text = "\n".join(head + rows + ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 450.1 ", "#", ""])
    cycles = split_cycles(parse_text(text, "one.txt"))
    assert [len(c.rows) for c in cycles] == [1, 1, 1] and all(c.complete for c in cycles)


def test_an_output_cut_in_its_last_cycle_keeps_the_whole_ones(tmp_path):
    text = TEXT.read_text(encoding="utf-8")
    lines = text.splitlines()
    rows = [i for i, ln in enumerate(lines) if ln[:1] == " " and ln.split()[0].isdigit()]
    cut = "\n".join(lines[:rows[14 * 2 + 5] + 1]) + "\n"   # 5 rows into the third cycle, no footer
    recs = imported(tmp_path, cut, "cut.txt")
    assert [(r["status"], len(r["rows"]), r["complete"]) for r in recs] == [
        ("ok", 14, True), ("ok", 14, True), ("error", 6, False)]
    assert recs[2]["reason"] == "cycle 3 of 3 cut short after 6 complete rows"


def test_a_single_sweep_is_one_record_as_before(tmp_path):
    (rec,) = imported(tmp_path, DATA / "new_all_reduce.txt")
    assert rec["run_id"] == "nccl-tests-new_all_reduce" and "run_cycle" not in rec["config"]
    assert rec["metrics"]["avg_busbw_gbps"]["source"] == "nccl-tests footer"
    assert len(split_cycles(parse_file(DATA / "new_all_gather.txt"))) == 1   # its 0-byte rows repeat, in one cycle
