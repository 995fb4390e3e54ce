"""Collectives judged over the message sizes both sides ran (harness/verdict/by_size.py): an acceptance
log's `-b 8 -e 1G` against tonight's `-b 2K -e 128M`, a nightly's sweep against a reference of another
range. nccl-tests' "Avg bus bandwidth" of two ranges is never compared; the average over the shared sizes
is, run by run, as any other metric (bootstrap, tolerance, pace, machines)."""
from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

import pytest
from unit_helpers import REPO_ROOT

from contract.metrics import tolerances_for
from harness.__main__ import main
from harness.collectives import SMALL_BYTES, Row, small_time_us
from harness.record import ResultRecord, validate_record
from harness.verdict.ab import against
from harness.verdict.by_size import (AVERAGE, BY_SIZE, SHARED, SHARED_SMALL, SMALL, busbw_by_size, restrict,
                                     size_text, sizeless)
from harness.verdict.compare import compare
from harness.verdict.references import Reference, references_from_records, validate_reference_file

DATA = REPO_ROOT / "tests" / "data" / "nccl_tests"
TEMPLATE = (REPO_ROOT / "reference_results" / "sources" / "cluster-scale" / "2026-11-26-avx2-epyc" / "n3-0"
            / "00-collectives-all_reduce.json")
"""A real built-in all_reduce record (3 gloo ranks): its environment and config carry the sweeps below."""


def sweep(run_id: str, busbw: dict[int, float], min_bytes: int, max_bytes: int, late: float = 1.0) -> ResultRecord:
    """The template record as a sweep of min_bytes..max_bytes whose sizes read `busbw` (both placements) and
    take 10 us each up to 64 KiB (`late` times that), and its metrics as harness/record.py makes them."""
    d = json.loads(TEMPLATE.read_text(encoding="utf-8"))
    d["run_id"] = run_id
    d["config"]["collective"].update(min_bytes=min_bytes, max_bytes=max_bytes)
    row = d["rows"][0]
    d["rows"] = []
    for size, bw in sorted(busbw.items()):
        us = 10.0 * late if size <= SMALL_BYTES else 1e3
        placement = {"time_us": us, "algbw_gbps": bw, "busbw_gbps": bw, "num_wrong": 0}
        d["rows"].append({**copy.deepcopy(row), "size_bytes": size, "count": size // 4,
                          "out_of_place": placement, "in_place": {**placement, "busbw_gbps": bw * 1.02,
                                                                   "time_us": us * 1.02}})
    d["metrics"]["avg_busbw_gbps"]["value"] = sum(busbw.values()) / len(busbw) * 1.01
    small = small_time_us([Row.from_dict(r) for r in d["rows"]])
    if small is not None:
        d["metrics"]["small_time_us"] = {"value": small, "unit": "us", "mode": "throughput",
                                         "n": sum(1 for s in busbw if s <= SMALL_BYTES)}
    assert validate_record(d) == []
    return ResultRecord.from_dict(d)


def curve(lo: int, hi: int, scale: float = 1.0, slow_from: int = 1 << 62, slow: float = 1.0) -> dict[int, float]:
    """busbw by size, 4x steps from lo to hi: rising with the size; `slow` from `slow_from` on."""
    out, size = {}, lo
    while size <= hi:
        out[size] = scale * (0.02 + size / 2 ** 22) * (slow if size >= slow_from else 1.0)
        size *= 4
    return out


def refs_of(records):
    return references_from_records(records, source="test", submitter="test", date="2026-12-03",
                                   system="test", tolerance_pct=tolerances_for("cpu-cluster"))


def test_a_size_is_the_mean_of_its_placements_and_a_reference_keeps_every_run_by_size():
    runs = [sweep(f"r{i}", curve(1024, 1 << 20, scale=1 + i / 100), 1024, 1 << 20) for i in range(3)]
    assert busbw_by_size(runs[0])[1024] == pytest.approx((0.02 + 1024 / 2 ** 22) * 1.01)
    (shared,) = [r for r in refs_of(runs) if r.metric == SHARED]
    assert "min_bytes" not in shared.config and "max_bytes" not in shared.config
    assert shared.config == sizeless([r for r in refs_of(runs) if r.metric == AVERAGE][0].config)
    assert len(shared.by_size) == shared.num_samples == 3
    assert list(shared.by_size[0]) == [str(s) for s in sorted(curve(1024, 1 << 20))]
    data = {"schema_version": "1.0", "references": [r.to_dict() for r in refs_of(runs)]}
    assert validate_reference_file(json.loads(json.dumps(data))) == []
    assert Reference.from_dict(json.loads(json.dumps(shared.to_dict()))) == shared
    assert all("by_size" not in r.to_dict() for r in refs_of(runs) if r.metric not in BY_SIZE)   # older entries as they were
    broken = json.loads(json.dumps(data))
    broken["references"][-1]["by_size"].pop()
    assert any("2 runs in by_size but 3 samples" in p for p in validate_reference_file(broken))


def test_runs_of_two_ranges_are_pooled_into_one_by_size_reference():
    runs = [sweep("a", curve(1024, 1 << 20), 1024, 1 << 20), sweep("b", curve(256, 1 << 22), 256, 1 << 22)]
    refs = refs_of(runs)
    assert len([r for r in refs if r.metric == AVERAGE]) == 2   # the averages stay one per range
    (shared,) = [r for r in refs if r.metric == SHARED]
    assert shared.num_samples == 2 and shared.provenance.note.endswith("runs: a, b")


def test_a_sweep_of_another_range_is_judged_over_the_shared_sizes_and_the_slowdown_named():
    old = [sweep(f"old{i}", curve(256, 1 << 24, scale=1 + 0.01 * i), 256, 1 << 24) for i in range(3)]
    new = [sweep(f"new{i}", curve(1024, 1 << 20, scale=1 - 0.01 * i, slow_from=1 << 16, slow=0.4), 1024, 1 << 20)
           for i in range(3)]
    verdicts = compare(new, refs_of(old))
    assert {v.metric for v in verdicts} == {SHARED, SHARED_SMALL}   # no 'new' range metric, no 'missing' one
    (v,) = [v for v in verdicts if v.metric == SHARED]
    assert v.verdict == "regression", v.reason
    assert re.match(r"over the 6 sizes \(1K-1M\) both ran, busbw from 0\.\d\dx the reference's at (64K|256K|1M) "
                    r"to 0\.9\dx at (1K|4K): gain -5\d\.\d% against", v.reason), v.reason
    shared = sorted(curve(1024, 1 << 20))
    ref_mean = sum(busbw_by_size(old[1])[s] for s in shared) / len(shared)
    assert v.reference == pytest.approx(ref_mean)   # the reference's average over the shared sizes alone


def test_the_same_range_keeps_its_average_verdict_and_uses_the_by_size_reference_up():
    old = [sweep(f"old{i}", curve(1024, 1 << 20, scale=1 + 0.01 * i), 1024, 1 << 20) for i in range(3)]
    new = [sweep(f"new{i}", curve(1024, 1 << 20, scale=1 - 0.01 * i), 1024, 1 << 20) for i in range(3)]
    verdicts = compare(new, refs_of(old))
    assert [(v.metric, v.verdict) for v in verdicts] == [(AVERAGE, "pass"), (SMALL, "pass")]


def test_sizes_that_do_not_meet_are_insufficient_data_naming_both_ranges():
    old = [sweep(f"old{i}", curve(1 << 20, 1 << 24), 1 << 20, 1 << 24) for i in range(2)]
    new = [sweep(f"new{i}", curve(256, 4096), 256, 4096) for i in range(2)]
    (v,) = compare(new, refs_of(old))
    assert (v.metric, v.verdict) == (SHARED, "insufficient data")
    assert v.reason == ("no message size that both ran: this run's 3 sizes (256-4K), "
                        "the reference's 3 sizes (1M-16M)")


def test_a_time_reads_without_an_exponent():
    from harness.report.sizes import time_us
    assert [time_us(1 << 20, bw, 1.0) for bw in (0.02972, 1.0, 1e3)] == ["35,282", "1,049", "1.049"]
    assert time_us(1024, 0.0, 1.0) == "-" and time_us(1024, 1.0, None) == "-"


def test_a_size_off_the_binary_steps_is_written_in_bytes():
    assert [size_text(s) for s in (8, 1020, 1024, 4092, 1 << 30)] == ["8", "1020", "1K", "4092 B", "1G"]


def test_restrict_takes_only_sizes_every_run_of_both_sides_has():
    ref = [r for r in refs_of([sweep("a", curve(256, 1 << 20), 256, 1 << 20),
                               sweep("b", curve(1024, 1 << 22), 1024, 1 << 22)]) if r.metric == SHARED][0]
    narrowed, samples, words, sizes = restrict(ref, [sweep("n", curve(4096, 1 << 24), 4096, 1 << 24)])
    assert [f["size_bytes"] for f in sizes] == [4096, 16384, 65536, 262144, 1048576]
    assert words == "over the 5 sizes (4K-1M) both ran, busbw 1.00x the reference's at each size"
    assert narrowed.num_samples == 2 and len(samples) == 1


# --- nccl-tests outputs of two ranges: an acceptance log against tonight's ------------------------

ROW = re.compile(r"^(\s+)(\d+)(\s+\d+\s+\S+\s+\S+\s+-?\d+\s+)(.*)$")


def narrowed_output(lo: int, hi: int, slow_from: int, slow: float, source: str = "new_all_reduce.txt") -> str:
    """new_all_reduce.txt (-b 8 -e 1G -f 4), or another output of that sweep, as a run of -b lo -e hi whose busbw
    is `slow`x from slow_from on."""
    lines, kept = [], []
    for line in (DATA / source).read_text(encoding="utf-8").splitlines():
        m = ROW.match(line)
        if line.startswith("$ "):
            line = line.replace("-b 8 -e 1G", f"-b {lo} -e {hi}")
        elif line.startswith("# nThread"):
            line = line.replace("minBytes 8 maxBytes 1073741824", f"minBytes {lo} maxBytes {hi}")
        elif m:
            size = int(m.group(2))
            if not lo <= size <= hi:
                continue
            cols = m.group(4).split()   # time algbw busbw #wrong, twice
            factor = slow if size >= slow_from else 1.0
            for i in (1, 2, 5, 6):
                cols[i] = f"{float(cols[i]) * factor:.2f}"
            kept += [float(cols[2]), float(cols[6])]
            line = m.group(1) + m.group(2) + m.group(3) + "  ".join(cols)
        elif line.startswith("# Avg bus bandwidth"):
            line = f"# Avg bus bandwidth    : {sum(kept) / len(kept):g} "
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_tonights_nccl_tests_run_against_the_acceptance_log_is_judged_by_size(tmp_path, capsys):
    (tmp_path / "acceptance").mkdir()
    (tmp_path / "tonight").mkdir()
    (tmp_path / "acceptance" / "all_reduce_perf.txt").write_text(
        (DATA / "new_all_reduce.txt").read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "tonight" / "all_reduce_perf.txt").write_text(
        narrowed_output(2048, 134217728, slow_from=8388608, slow=0.5), encoding="utf-8")
    for side in ("acceptance", "tonight"):
        assert main(["import-nccl-tests", str(tmp_path / side / "all_reduce_perf.txt"),
                     "--out", str(tmp_path / f"{side}-records"), "--platform", "h100"]) == 0
    verdicts, left = against([str(tmp_path / "tonight-records")], [str(tmp_path / "acceptance-records")],
                             min_samples=1)
    assert left == ""   # the acceptance log is paired, by size
    assert [v.metric for v in verdicts] == [SHARED, SHARED_SMALL]
    v = verdicts[0]
    assert (v.metric, v.verdict) == (SHARED, "regression"), v.reason
    assert v.reason.startswith("over the 9 sizes (2K-128M) both ran, busbw from 0.50x the reference's at 8M to "
                               "1.00x at 2K: gain -41.4% against 156.576 GB/s"), v.reason
    capsys.readouterr()
    rc = main(["compare", str(tmp_path / "tonight-records"), "--against", str(tmp_path / "acceptance-records"),
               "--min-samples", "1"])
    out = capsys.readouterr().out
    assert rc == 1 and "regression" in out and "shared_busbw_gbps" in out and "no counterpart" not in out


def json_record(folder: str, run_id: str) -> ResultRecord:
    return ResultRecord.from_dict(json.loads((Path(folder) / f"{run_id}.json").read_text(encoding="utf-8")))


def test_compare_sizes_prints_the_figures_behind_the_verdict_and_json_carries_them(tmp_path, capsys):
    def folder(name, records):
        (tmp_path / name).mkdir()
        for r in records:
            (tmp_path / name / f"{r.run_id}.json").write_text(json.dumps(r.to_dict()), encoding="utf-8")
        return str(tmp_path / name)
    old = folder("old", [sweep(f"old{i}", curve(256, 1 << 22), 256, 1 << 22) for i in range(2)])
    new = folder("new", [sweep(f"new{i}", curve(1024, 1 << 20, slow_from=1 << 20, slow=0.5), 1024, 1 << 20)
                         for i in range(2)])
    main(["compare", new, "--against", old, "--sizes"])
    out = capsys.readouterr().out
    assert ("cpu-cluster/all_reduce (dtype=float32 max_bytes=1048576 min_bytes=1024 nodes=3 num_ranks=3 redop=sum "
            "source=builtin): regression on shared_busbw_gbps; by message size") in out
    assert re.search(r"^1M +0\.1\d+ +0\.2\d+ +0\.50x +(\S+) +(\S+)", out, re.M), out
    now_us, ref_us = (float(x.replace(",", "")) for x in re.search(r"^1M +\S+ +\S+ +\S+ +(\S+) +(\S+)", out, re.M).groups())
    assert now_us == pytest.approx(2 * ref_us, rel=1e-3)   # half the busbw: twice the time
    busbw = busbw_by_size(json_record(old, "old0"))[1 << 20]   # all_reduce on 3 ranks: 2(n-1)/n = 4/3
    assert ref_us == pytest.approx((1 << 20) * (4 / 3) / (busbw * 1e3), rel=1e-3)
    assert re.search(r"^1K +\S+ +\S+ +1\.000x", out, re.M)
    assert re.search(r"pass on shared_small_time_us; by message size\nsize +time us now +OLD +now/OLD\n", out), out
    assert re.search(r"^64K +10\.1 +10\.1 +1\.000x *$", out, re.M), out   # each size's time as the rows carry it
    main(["compare", new, "--against", old, "--json"])
    v, small = json.loads(capsys.readouterr().out)
    assert small["sizes"][0] == {"size_bytes": 1024, "now_us": 10.1, "reference_us": 10.1}
    assert [f["size_bytes"] for f in v["sizes"]] == sorted(curve(1024, 1 << 20))
    main(["compare", new, "--reference", str(REPO_ROOT / "reference_results" / "cpu.json"), "--sizes"])
    assert "no collective result has a by-size reference to show" in capsys.readouterr().out


def test_the_nightly_baseline_judges_a_night_of_another_range_by_size():
    """A nightly whose collective sweep changed its range (cpu-short -> main) is judged against its rolling
    baseline's earlier nights over the sizes they share, not 'new' against nothing."""
    from harness.nightly import baseline_references

    earlier = [(f"night{i}", sweep(f"n{i}", curve(1024, 1 << 22, scale=1 + i / 100), 1024, 1 << 22)) for i in range(3)]
    refs = baseline_references(earlier, "cpu-cluster", ["night0", "night1", "night2"])
    tonight = [sweep(f"t{i}", curve(1024, 1 << 24, slow_from=1 << 20, slow=0.5), 1024, 1 << 24) for i in range(3)]
    v, small = compare(tonight, refs)
    assert (small.metric, small.verdict) == (SHARED_SMALL, "pass"), small.reason
    assert (v.metric, v.verdict) == (SHARED, "regression"), v.reason
    assert v.reason.startswith("over the 7 sizes (1K-4M) both ran")


def test_the_nightly_report_shows_the_sizes_of_a_collectives_change():
    """nightly.md: under a comparison's table, each collective regression or improvement by message size."""
    from harness.nightly import baseline_references
    from harness.report.nightly import nightly_markdown

    earlier = [(f"night{i}", sweep(f"n{i}", curve(1024, 1 << 22, scale=1 + i / 100), 1024, 1 << 22)) for i in range(3)]
    tonight = [sweep(f"t{i}", curve(1024, 1 << 22, slow_from=1 << 20, slow=0.5), 1024, 1 << 22) for i in range(3)]
    verdicts = compare(tonight, baseline_references(earlier, "cpu-cluster", ["night0", "night1", "night2"]))
    assert [(v.metric, v.verdict) for v in verdicts] == [(AVERAGE, "regression"), (SMALL, "pass")]   # its own range
    text = nightly_markdown("cpu-cluster", "2026-12-03", {"baseline": verdicts}, tonight)
    assert "**cpu-cluster/all_reduce (" in text and "): regression on avg_busbw_gbps; by message size**" in text
    assert re.search(r"^\| 4M \| \S+ \| \S+ \| 0\.50x \|", text, re.M), text
    passed = [dataclasses.replace(v, verdict="pass") for v in verdicts]   # a pass shows no sizes
    assert "by message size" not in nightly_markdown("cpu-cluster", "2026-12-03", {"baseline": passed}, tonight)


def test_the_nightly_page_shows_the_sizes_of_a_collectives_change():
    from harness.nightly import baseline_references
    from harness.report.nightly_page import nightly_page

    earlier = [(f"night{i}", sweep(f"n{i}", curve(1024, 1 << 22, scale=1 + i / 100), 1024, 1 << 22)) for i in range(3)]
    tonight = [sweep(f"t{i}", curve(1024, 1 << 22, slow_from=1 << 20, slow=0.5), 1024, 1 << 22) for i in range(3)]
    verdicts = compare(tonight, baseline_references(earlier, "cpu-cluster", ["night0", "night1", "night2"]))
    page = nightly_page("cpu-cluster", "2026-12-03", {"baseline": verdicts}, tonight, {})
    assert "<b>c1</b> regression on avg_busbw_gbps, by message size</p>" in page
    assert re.search(r"<tr><td>4M</td><td>[^<]+</td><td>[^<]+</td><td>0\.50x</td>", page), page


def test_benchs_compare_md_shows_the_sizes_of_a_collectives_change(tmp_path, capsys):
    """compare.md: under the machine's-baseline table, a collective's regression by message size (the
    terminal gets the tables alone)."""
    from harness.bench import compare_with_references

    old = [sweep(f"old{i}", curve(1024, 1 << 22, scale=1 + i / 100), 1024, 1 << 22) for i in range(3)]
    new = [sweep(f"new{i}", curve(1024, 1 << 22, slow_from=1 << 20, slow=0.5), 1024, 1 << 22) for i in range(3)]
    for name, records in (("a", old), ("b", new)):
        (tmp_path / name).mkdir()
        compare_with_references(records, tmp_path / name, "auto")   # one history store beside both
    printed, md = capsys.readouterr().out, (tmp_path / "b" / "compare.md").read_text(encoding="utf-8")
    assert "# This machine's baseline" in md and "regression on avg_busbw_gbps; by message size**" in md
    assert re.search(r"^\| 4M \| \S+ \| \S+ \| 0\.50x \|", md, re.M), md
    assert "by message size" not in printed
