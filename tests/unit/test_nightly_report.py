"""write_reports: Markdown, one self-contained HTML page and JUnit XML for a night's verdicts."""
from __future__ import annotations

import base64
import html
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import unit_helpers  # noqa: F401  (puts the repository root on sys.path)

from harness.held_up import night_stragglers
from harness.verdict.compare import VERDICTS, Verdict
from harness.report.nightly import _ORDER, write_reports
from harness.report.nightly_page import microstep_pair_png, trend_panels_png
from unit_helpers import schema_valid, typed

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
CFG = {"zero_stage": 1, "micro_batch_size": 2, "grad_acc_steps": 4}
SERIES = "cpu/llama-tiny z1-mb2-ga4 samples_per_s"


def _verdict(kind: str, metric: str, reason: str, **kw) -> Verdict:
    return Verdict("cpu", "llama-tiny", CFG, metric, kind, reason, unit="1/s", **kw)


def _verdicts() -> dict[str, list[Verdict]]:
    references = [
        _verdict("regression", "samples_per_s", "gain -12.0% against 40 1/s", value=35.2, reference=40.0,
                 worse_pct=12.0, environment_diff={"nccl": ["2.20.5", "2.21.5"], "env.NCCL_ALGO": [None, "Tree"]}),
        _verdict("pass", "tokens_per_s", "gain +0.5%", value=4520.0, reference=4500.0, worse_pct=-0.5),
        _verdict("improvement", "mfu_pct", "gain +9.0%", value=1.09, reference=1.0, worse_pct=-9.0),
        _verdict("new", "peak_mem_gib", "no reference (status ok)", value=1.5),
        _verdict("missing", "step_time_s", "the reference has this metric; the results do not"),
        _verdict("insufficient data", "comm_pct", "one sample on each side <script>alert(1)</script>"),
    ]
    baseline = [
        Verdict("cpu", "llama-tiny", {**CFG, "zero_stage": 3}, "samples_per_s", "status changed",
                "ok -> oom: CUDA out of memory", environment_diff={"torch": ["2.3.1", "2.4.0"]}),
        _verdict("pass", "samples_per_s", "gain -1.0%", value=35.2, reference=35.5, worse_pct=1.0),
    ]
    return {"references": references, "baseline": baseline}


def _records() -> list:
    micro = [{"index": i, "total_s": 0.05 + 0.02 * (i == 3), "compute_s": 0.04, "comm_s": 0.01 + 0.02 * (i == 3),
              "collectives": [{"op": "all_reduce", "bytes": 1 << 20, "time_s": 0.01, "phase": "backward"}]}
             for i in range(4)]
    ok = {"run_id": "z1-mb2-ga4", "kind": "training", "platform": "cpu", "benchmark": "llama-tiny",
          "status": "ok", "reason": None, "metrics": {"samples_per_s": {"value": 35.2, "unit": "1/s"}},
          "microsteps": [micro, micro], "environment": {}}
    oom = {"run_id": "z3-mb8-ga1", "kind": "training", "platform": "cpu", "benchmark": "llama-tiny",
           "status": "oom", "reason": "CUDA out of memory <tried 2 GiB>", "metrics": {}, "microsteps": [],
           "environment": {}}
    return typed([schema_valid(ok), schema_valid(oom)])


def _history() -> dict[str, list[tuple[str, float]]]:
    return {SERIES: [("2026-05-08", 40.1), ("2026-05-09", 39.8), ("2026-05-10", 35.2)],
            "cpu/llama-tiny z1-mb2-ga4 mfu_pct": [("2026-05-08", 1.0), ("2026-05-09", 1.01), ("2026-05-10", 1.09)]}


def _write(tmp_path: Path) -> dict[str, Path]:
    return write_reports(tmp_path / "night", platform="cpu", night="2026-05-10", verdicts=_verdicts(),
                         records=_records(), history=_history())


def test_every_verdict_kind_has_a_place_in_the_summary_order():
    assert sorted(_ORDER) == sorted(VERDICTS)


def test_three_files_are_written_and_nothing_else(tmp_path):
    paths = _write(tmp_path)
    assert {p.name for p in paths.values()} == {"nightly.md", "nightly.html", "junit.xml"}
    assert sorted(os.listdir(tmp_path / "night")) == ["junit.xml", "nightly.html", "nightly.md"]  # no temp files


def test_junit_has_one_suite_per_comparison_with_matching_counts(tmp_path):
    root = ET.parse(_write(tmp_path)["junit"]).getroot()
    assert (tmp_path / "night" / "junit.xml").read_text().startswith("<?xml")
    suites = {s.get("id"): s for s in root.iter("testsuite")}
    assert list(suites) == ["references", "baseline"]
    for name, (tests, failures, skipped) in {"references": (6, 1, 2), "baseline": (2, 1, 0)}.items():
        suite = suites[name]
        cases = suite.findall("testcase")
        assert suite.get("name") == "nightly-cpu"
        assert (int(suite.get("tests")), int(suite.get("failures")), int(suite.get("skipped"))) == (tests, failures, skipped)
        assert (len(cases), len(suite.findall("testcase/failure")), len(suite.findall("testcase/skipped"))) \
            == (tests, failures, skipped)
    regression = suites["references"].find("testcase[failure]")
    assert regression.get("classname") == "cpu.llama-tiny"
    assert regression.get("name") == "zero_stage=1,micro_batch_size=2,grad_acc_steps=4 samples_per_s"
    failure = regression.find("failure")
    # the change in the reports' one convention (harness/report/verdicts.py): now/ref of the better-is-higher quantity
    assert failure.get("message").startswith("regression: 35.200 1/s against 40.000 1/s: 0.88x (1.14x slower)")
    assert "nccl: 2.20.5 -> 2.21.5" in failure.text and "env.NCCL_ALGO: None -> Tree" in failure.text
    status = suites["baseline"].find("testcase/failure")
    assert "ok -> oom" in status.get("message") and "torch: 2.3.1 -> 2.4.0" in status.text
    skipped = {c.get("name").split()[-1]: c.find("skipped").get("message")
               for c in suites["references"].findall("testcase[skipped]")}
    assert skipped["step_time_s"].startswith("missing:") and skipped["comm_pct"].startswith("insufficient data:")


def test_html_is_self_contained_escaped_and_has_one_image_per_chart(tmp_path):
    page = _write(tmp_path)["html"].read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;tried 2 GiB&gt;" in page  # a failed run's reason, escaped
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 2  # one panel figure for the two series' configuration + the record with microsteps
    assert all(base64.b64decode(img)[:8] == PNG_SIGNATURE for img in images)
    assert '<tr class="regression">' in page and "<style>" in page
    # the first screen: the count of each verdict per comparison, then the problems with what changed
    counts = page.split("<h2>", 1)[0]
    assert "<th>against the reference table</th><td>1</td><td></td><td>1</td><td>1</td>" in counts
    problems = page.split("<h2>Regressions and status changes</h2>", 1)[1].split("<h2>", 1)[0]
    assert "what changed: <b>nccl: 2.20.5 -&gt; 2.21.5; env.NCCL_ALGO: None -&gt; Tree</b>" in problems
    assert "<b>regression</b> c1 (cpu/llama-tiny ZeRO-1 mb 2 x ga 4): samples_per_s 0.88x (1.14x slower)" in problems
    assert "<b>status changed</b> c2 (cpu/llama-tiny ZeRO-3 mb 2 x ga 4)" in problems


def test_markdown_has_title_summary_tables_and_failed_runs(tmp_path):
    text = _write(tmp_path)["markdown"].read_text()
    assert text.startswith("# Nightly report: cpu, 2026-05-10\n")
    assert "- baseline (against the rolling baseline of earlier nights): 1 status changed, 1 pass (2 verdicts)" in text
    assert text.count("| verdict | platform/benchmark |") == 2
    assert "| regression | cpu/llama-tiny |" in text and "| status changed | cpu/llama-tiny |" in text
    assert "- z3-mb8-ga1 (llama-tiny): oom: CUDA out of memory <tried 2 GiB>" in text
    assert "z1-mb2-ga4 (llama-tiny)" not in text  # an ok run is not a failed one


def test_charts_render_as_png_bytes(tmp_path):
    """Also writes the two charts beside the test's temporary files (nightly-report-*.png), to look at them."""
    panels = [("c1: cpu/llama-tiny ZeRO-1", {n.rsplit(" ", 1)[1]: pts for n, pts in _history().items()})]
    trend = trend_panels_png(panels, "2026-05-10", {(panels[0][0], "samples_per_s"): 5.0},
                             {(panels[0][0], "samples_per_s"): 40.0})
    micro = microstep_pair_png(_records()[0], ("2026-05-09", _records()[0]), "2026-05-10")
    matched = _records()[0]     # each call's wait for the later rank known: the peer's part hatched apart
    for step in matched.microsteps:
        for m in step:
            m["collectives"][0]["peer_wait_s"] = 0.004
    split = microstep_pair_png(matched, ("2026-05-09", _records()[0]), "2026-05-10")
    assert split != micro
    for name, png in (("trend", trend), ("microsteps", micro), ("microsteps-peer", split)):
        assert png[:8] == PNG_SIGNATURE and len(png) > 10_000
        (tmp_path / f"nightly-report-{name}.png").write_bytes(png)


def test_a_night_on_a_slower_link_than_the_baseline_nights_names_the_link(tmp_path):
    """Baseline nights on a 1 Gbit/s link, tonight node2's link shaped to 250 Mbit/s: the report
    says which link changed, not just that all_reduce got slower (issue 15)."""
    from unit_helpers import node

    from harness.verdict.compare import compare
    from harness.nightly import baseline_references
    from harness.nodes import links

    def record(run_id: str, node2_gbps: float, busbw: float):
        nodes = [node("node1"), node("node2", node2_gbps)]
        return typed([schema_valid({"run_id": run_id, "kind": "collective", "platform": "cpu", "benchmark": "all_reduce",
                "status": "ok", "reason": None, "source": "builtin", "microsteps": [],
                "config": {"platform": {"nodes": 2}, "collective": {"min_bytes": 1 << 20, "max_bytes": 1 << 26,
                                                                   "dtype": "float", "redop": "sum"}},
                "metrics": {"avg_busbw_gbps": {"value": busbw, "unit": "GB/s"}},
                "environment": {"num_ranks": 2, "num_nodes": 2, "host": "node1", "nodes": nodes,
                                "machine": nodes[0]["machine"], "links": links(nodes), "env": {}}})])[0]

    nights = ["2026-05-08", "2026-05-09"]
    earlier = [(night, record(f"{night}-{i}", 1.0, 0.118 + 0.001 * i)) for night in nights for i in range(3)]
    tonight = [record(f"tonight-{i}", 0.25, 0.030 + 0.001 * i) for i in range(3)]
    verdicts = {"references": [], "baseline": compare(tonight, baseline_references(earlier, "cpu", nights))}
    (v,) = verdicts["baseline"]
    assert v.verdict == "regression" and v.environment_diff == {"links.node2/eth0": [1.0, 0.25]}
    paths = write_reports(tmp_path / "night", platform="cpu", night="2026-05-10", verdicts=verdicts,
                          records=tonight, history={})
    assert "links.node2/eth0: 1.0 -> 0.25" in paths["markdown"].read_text()
    assert "links.node2/eth0: 1.0 -&gt; 0.25" in paths["html"].read_text()
    assert any("links.node2/eth0: 1.0 -> 0.25" in f.text for f in ET.parse(paths["junit"]).iter("failure"))


def test_the_overview_of_a_night_with_a_regression_says_what_changed_once_per_change(tmp_path):
    """`nightly --overview` on a store whose last night regressed: a row per platform, its verdicts' counts,
    and each distinct change among the failing verdicts in words, with how many share it (it used to stop
    with AttributeError on the first failing night)."""
    from harness.report.overview import OverviewRow, overview_line, overview_page

    row = OverviewRow("cpu", "2026-05-10", tmp_path, "2026-05-10T03:00:00+00:00", _records(), _verdicts())
    line = overview_line(row)
    assert line.startswith("cpu 2026-05-10: 2 runs, 1 failed; references: 1 regression, 1 missing, "), line
    assert ("what changed: nccl: 2.20.5 -> 2.21.5; env.NCCL_ALGO: None -> Tree (1 verdict); "
            "torch: 2.3.1 -> 2.4.0 (1 verdict)") in line, line
    page = overview_page([row], "sqlite:///history.sqlite")
    assert "nccl: 2.20.5 -&gt; 2.21.5" in page and "1 of 1 platform(s) with a regression" in page
    quiet = OverviewRow("cpu", "2026-05-10", tmp_path, None, [], {"references": [_verdict(
        "regression", "samples_per_s", "slower", value=35.2, reference=40.0, worse_pct=12.0)]})
    assert overview_line(quiet).endswith("what changed: nothing in the fingerprint (1 verdict)")
    assert "(unfinished)" in overview_line(quiet)
    # a night whose runs had a straggler says so, whatever its verdicts
    late = {"host": "node<2>", "ranks": [2, 3], "held_back_pct": 43.0, "next_pct": 2.1, "stands_out": True}
    lagging = OverviewRow("cpu-cluster", "2026-05-10", tmp_path, "2026-05-10T03:00:00+00:00", _repeats(late), {})
    assert overview_line(lagging).endswith("; straggler: z3-mb2-ga4 (llama-tiny): node node<2> (ranks 2, 3) held the "
                                           "others back 43 % of the profiled steps, in 1 of 1 runs")
    page = overview_page([lagging, quiet], "sqlite:///history.sqlite")
    assert "<th>stragglers</th>" in page and "node node&lt;2&gt; (ranks 2, 3)" in page and "node<2>" not in page


def _repeats(*stragglers) -> list:
    """Repeats of one run, each with the straggler its record found (harness/held_up.py straggler)."""
    base = {"run_id": "z3-mb2-ga4", "kind": "training", "platform": "cpu", "benchmark": "llama-tiny",
            "status": "ok", "reason": None, "metrics": {"samples_per_s": {"value": 13.4, "unit": "1/s"}},
            "microsteps": []}
    return typed([schema_valid({**base, "environment": {"load": {"straggler": s} if s else {}}}) for s in stragglers])


def test_a_rank_that_stood_out_as_the_straggler_is_named_in_every_report_whatever_the_verdicts(tmp_path):
    late = {"rank": 1, "host": "node<1>", "held_back_pct": 47.2, "next_pct": 3.1, "stands_out": True}
    records = _repeats({**late, "held_back_pct": 20.4}, late, {**late, "held_back_pct": 6.0, "stands_out": False})
    line = "z3-mb2-ga4 (llama-tiny): rank 1 (node<1>) held the others back 47 % of the profiled steps, in 2 of 3 runs"
    assert night_stragglers(records) == [line]
    paths = write_reports(tmp_path / "night", platform="cpu", night="2026-05-10", verdicts={"baseline": []},
                          records=records, history={})
    assert f"## Stragglers\n\n- {line}\n" in paths["markdown"].read_text()
    page = paths["html"].read_text()
    assert "<h2>Stragglers</h2>" in page and html.escape(line) in page and "node<1>" not in page
    # another rank on another repeat: named by turns; a night without one says so
    turns = _repeats(late, {**late, "rank": 0, "host": "node0"})
    assert night_stragglers(turns)[0].endswith("in 2 of 2 runs; by turns rank 0 (node0), rank 1 (node<1>)")
    assert night_stragglers(_repeats(None, {**late, "stands_out": False})) == []
    # one repeat of three is a spell of the host (the AVX2 EPYC's quiet runs: 2 of 12 stood out, 1 of 3 a night)
    assert night_stragglers(_repeats(late, None, {**late, "stands_out": False})) == []
    assert night_stragglers(_repeats(late, {**late, "stands_out": False})) == []          # half is not most
    quiet = write_reports(tmp_path / "quiet", platform="cpu", night="2026-05-10", verdicts={"baseline": []},
                          records=_records(), history={})
    assert "## Stragglers\n\nnone stood out" in quiet["markdown"].read_text()
    assert "<h2>Stragglers</h2>\n<p>none stood out</p>" in quiet["html"].read_text()
