"""The nightly reports of one platform: Markdown for people, one self-contained HTML page
(harness/report/nightly_page.py: how the night went first, verdict tables, trends as small
multiples, micro-step charts as inline PNGs), and JUnit XML for CI systems.

Inputs are already decided: the verdicts of harness.verdict.compare against the reference table and against
the rolling baseline of earlier nights, this night's records, and each metric series' history.
matplotlib is imported inside the chart functions and always renders with Agg (no display, no
network). Every file is written atomically (temp file in the same folder + os.replace).
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from ..atomic import write_bytes_atomic
from ..held_up import night_stragglers
from ..verdict.compare import Verdict
from ..record import ResultRecord
from .nightly_page import COMPARISONS, FAILURES, nightly_page
from .sizes import under_table
from .verdicts import OUTSIDE_SUITE, environment_text, unrun_line, verdict_table, verdict_text

SKIPS = ("insufficient data", "missing", "not comparable")
_ORDER = ("regression", "status changed", "missing", "insufficient data", "not comparable", "improvement", "new", "pass")


def summary_line(name: str, verdicts: list[Verdict]) -> str:
    """'references (against the reference table): 1 regression, 3 pass (4 verdicts)', the worst
    kinds first."""
    counts = Counter(v.verdict for v in verdicts)
    kinds = ", ".join(f"{counts[k]} {k}" for k in _ORDER if counts[k])
    where = f" ({COMPARISONS[name]})" if name in COMPARISONS else ""
    return f"{name}{where}: {kinds or 'no verdicts'} ({len(verdicts)} verdicts)"


def config_label(config: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items())


def _failed(records: list[ResultRecord]) -> list[ResultRecord]:
    return [r for r in records if r.status != "ok"]


# ----------------------------------------------------------------------------- documents

def nightly_markdown(platform: str, night: str, verdicts: dict[str, list[Verdict]],
                     records: list[ResultRecord], unrun: Optional[list[Verdict]] = None, baseline: str = "",
                     stragglers: Optional[list[str]] = None) -> str:
    """unrun: the references of configurations the nightly's suite does not run (one line under their table);
    baseline: which nights the rolling baseline is (harness/nightly.py judge), a line under its table, and any more
    lines after it (what the first repeat alone read: harness/nightly.py first_repeat), a line each."""
    parts = [f"# Nightly report: {platform}, {night}",
             "\n".join(f"- {summary_line(name, vs)}" for name, vs in verdicts.items())]
    for name, vs in verdicts.items():
        table = verdict_table(vs, markdown=True) if vs else "none"
        if name == "references" and unrun:
            table += f"\n- {unrun_line(unrun, OUTSIDE_SUITE)}"
        if name == "baseline" and baseline:
            table += "".join(f"\n- {line}" for line in baseline.splitlines())
        parts += [f"## Verdicts {COMPARISONS.get(name, name)}", under_table(table, vs, "then")]
    lines = night_stragglers(records) if stragglers is None else stragglers
    parts += ["## Stragglers", "\n".join(f"- {line}" for line in lines) or "none stood out"]
    failed = _failed(records)
    parts.append("## Failed runs")
    parts.append("\n".join(f"- {r.run_id} ({r.benchmark}): {r.status}: {r.reason}" for r in failed)
                 or "none")
    return "\n\n".join(parts) + "\n"


def junit_xml(platform: str, verdicts: dict[str, list[Verdict]]) -> bytes:
    """One <testsuite> per comparison, one <testcase> per verdict: regressions and status changes
    fail, insufficient data and missing are skipped, the rest pass."""
    root = ET.Element("testsuites", name=f"nightly-{platform}")
    for name, vs in verdicts.items():
        suite = ET.SubElement(root, "testsuite", name=f"nightly-{platform}", id=name, tests=str(len(vs)),
                              failures=str(sum(v.verdict in FAILURES for v in vs)), errors="0",
                              skipped=str(sum(v.verdict in SKIPS for v in vs)))
        ET.SubElement(suite, "properties").append(ET.Element("property", name="comparison", value=name))
        for v in vs:
            case = ET.SubElement(suite, "testcase", classname=f"{v.platform}.{v.benchmark}",
                                 name=f"{config_label(v.config)} {v.metric}")
            if v.verdict in FAILURES:
                fail = ET.SubElement(case, "failure", message=f"{v.verdict}: {verdict_text(v)}", type=v.verdict)
                fail.text = f"{verdict_text(v)}\nwhat changed since the reference: {environment_text(v.environment_diff)}"
            elif v.verdict in SKIPS:
                ET.SubElement(case, "skipped", message=f"{v.verdict}: {verdict_text(v)}")
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def write_reports(out_dir: Path, *, platform: str, night: str, verdicts: dict[str, list[Verdict]],
                  records: list[ResultRecord], history: dict[str, list[tuple[str, float]]],
                  previous: Optional[dict[str, tuple[str, ResultRecord]]] = None,
                  unrun: Optional[list[Verdict]] = None, baseline: str = "",
                  stragglers: Optional[list[str]] = None,
                  held_back: Optional[dict[str, dict[str, list[tuple[str, float]]]]] = None) -> dict[str, Path]:
    """Write nightly.md, nightly.html (harness/report/nightly_page.py) and junit.xml into out_dir;
    {"markdown"|"html"|"junit": path}. previous: {run_id: (night, record)} of the last earlier night,
    whose micro-steps the page shows beside a regressed run's. unrun: the references of configurations
    the nightly's suite does not run (harness/verdict/compare.py outside_runs), one line in each report; baseline:
    which nights the rolling baseline is, and what the first repeat alone read, a line each under its table;
    stragglers: the lines of the Stragglers section
    (harness/straggler_trend.py night_straggler_lines; tonight's own, night_stragglers, when None); held_back: its
    held_back_series, charted on the page."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return {
        "markdown": write_bytes_atomic(out_dir / "nightly.md",
                                  nightly_markdown(platform, night, verdicts, records, unrun, baseline,
                                                   stragglers).encode("utf-8")),
        "html": write_bytes_atomic(out_dir / "nightly.html",
                              nightly_page(platform, night, verdicts, records, history, previous, unrun,
                                           baseline, stragglers, held_back).encode("utf-8")),
        "junit": write_bytes_atomic(out_dir / "junit.xml", junit_xml(platform, verdicts)),
    }
