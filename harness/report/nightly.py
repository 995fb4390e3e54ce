"""The nightly reports of one platform: Markdown for people, one self-contained HTML page (verdict
tables, trend charts, micro-step charts as inline PNGs), and JUnit XML for CI systems.

Inputs are already decided: the verdicts of harness.compare against the reference table and against
the rolling baseline of earlier nights, this night's records, and each metric series' history.
matplotlib is imported inside the chart functions and always renders with Agg (no display, no
network). Every file is written atomically (temp file in the same folder + os.replace).
"""
from __future__ import annotations

import base64
import html
import io
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

from ..atomic import write_bytes_atomic
from ..compare import Verdict
from ..record import ResultRecord
from .verdicts import change_text, environment_text, verdict_table, verdict_text

COMPARISONS = {"references": "against the reference table",
               "baseline": "against the rolling baseline of earlier nights"}
FAILURES = ("regression", "status changed")
SKIPS = ("insufficient data", "missing", "not comparable")
_ORDER = ("regression", "status changed", "missing", "insufficient data", "not comparable", "improvement", "new", "pass")
_CSS = """body{font-family:sans-serif;margin:2em;max-width:1400px}
table{border-collapse:collapse;margin:1em 0;font-size:90%}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#eee} tr.regression{background:#f8d0d0;font-weight:bold}
tr.status-changed{background:#fde5c0} img{max-width:100%} .charts{display:flex;flex-wrap:wrap;gap:1em}"""


def summary_line(name: str, verdicts: list[Verdict]) -> str:
    """'references (against the reference table): 1 regression, 3 pass (4 verdicts)', the worst
    kinds first."""
    counts = Counter(v.verdict for v in verdicts)
    kinds = ", ".join(f"{counts[k]} {k}" for k in _ORDER if counts[k])
    where = f" ({COMPARISONS[name]})" if name in COMPARISONS else ""
    return f"{name}{where}: {kinds or 'no verdicts'} ({len(verdicts)} verdicts)"


def _num(value: Any) -> str:
    return "-" if value is None else f"{value:,.3f}" if isinstance(value, float) else str(value)


def config_label(config: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items())


def _failed(records: list[ResultRecord]) -> list[ResultRecord]:
    return [r for r in records if r.status != "ok"]


# ----------------------------------------------------------------------------- charts

def _figure(**kwargs):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    return Figure(figsize=(7, 3.6), dpi=100, layout="constrained", **kwargs)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def trend_png(series: str, points: list[tuple[str, float]], night: str) -> bytes:
    """A line of the series' value per night (oldest left), this night's point highlighted."""
    fig = _figure()
    ax = fig.add_subplot()
    nights, values = [n for n, _ in points], [v for _, v in points]
    ax.plot(range(len(points)), values, marker="o", markersize=4, label="nightly value")
    if night in nights:
        i = nights.index(night)
        ax.plot([i], [values[i]], linestyle="none", marker="o", markersize=10, color="crimson",
                label=f"this night ({night}): {values[i]:.4g}")
    step = max(1, len(nights) // 12)  # at most ~12 labels on the axis
    ax.set_xticks(range(0, len(nights), step), nights[::step], rotation=30, ha="right", fontsize=8)
    ax.set_xlabel("night")
    ax.set_ylabel(series.rsplit(" ", 1)[-1])  # series names end with the metric
    ax.set_title(series, fontsize=10)
    ax.margins(x=0.05, y=0.15)  # room for the highlighted point at an edge
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


def microstep_png(record: ResultRecord) -> bytes:
    """Stacked compute/communication bars (ms) per micro-step of the first profiled step."""
    steps = record.microsteps[0]
    index = [m["index"] for m in steps]
    compute_ms = [m["compute_s"] * 1e3 for m in steps]
    comm_ms = [m["comm_s"] * 1e3 for m in steps]
    fig = _figure()
    ax = fig.add_subplot()
    ax.bar(index, compute_ms, label="compute", color="tab:blue")
    ax.bar(index, comm_ms, bottom=compute_ms, label="communication", color="tab:orange")
    ax.set_xticks(index)
    ax.set_xlabel("micro-step (first profiled optimizer step)")
    ax.set_ylabel("time (ms)")
    ax.set_title(f"{record.run_id} ({record.platform}/{record.benchmark})", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _png(fig)


# ----------------------------------------------------------------------------- documents

def nightly_markdown(platform: str, night: str, verdicts: dict[str, list[Verdict]],
                     records: list[ResultRecord]) -> str:
    parts = [f"# Nightly report: {platform}, {night}",
             "\n".join(f"- {summary_line(name, vs)}" for name, vs in verdicts.items())]
    for name, vs in verdicts.items():
        parts += [f"## Verdicts {COMPARISONS.get(name, name)}", verdict_table(vs, markdown=True) if vs else "none"]
    failed = _failed(records)
    parts.append("## Failed runs")
    parts.append("\n".join(f"- {r.run_id} ({r.benchmark}): {r.status}: {r.reason}" for r in failed)
                 or "none")
    return "\n\n".join(parts) + "\n"


def _html_table(headers: list[str], rows: list[tuple[str, list[str]]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(f'<tr class="{html.escape(cls)}">' + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
                   + "</tr>" for cls, cells in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _verdict_rows(verdicts: list[Verdict]) -> list[tuple[str, list[str]]]:
    rank = {k: i for i, k in enumerate(_ORDER)}
    rows = []
    for v in sorted(verdicts, key=lambda v: (rank.get(v.verdict, 9), v.platform, v.benchmark, v.metric)):
        reason = verdict_text(v) + (f" | changed: {environment_text(v.environment_diff)}" if v.verdict in FAILURES else "")
        rows.append((v.verdict.replace(" ", "-"), [
            v.verdict, f"{v.platform}/{v.benchmark}", config_label(v.config), v.metric, _num(v.value),
            _num(v.reference), v.unit or "-", change_text(v), reason]))
    return rows


def _img(png: bytes, alt: str) -> str:
    return (f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
            f"<figcaption>{html.escape(alt)}</figcaption></figure>")


def nightly_html(platform: str, night: str, verdicts: dict[str, list[Verdict]], records: list[ResultRecord],
                 history: dict[str, list[tuple[str, float]]]) -> str:
    esc = html.escape
    title = esc(f"Nightly report: {platform}, {night}")
    parts = [f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{title}</title>",
             f"<style>{_CSS}</style></head><body><h1>{title}</h1><ul>"]
    parts += [f"<li>{esc(summary_line(name, vs))}</li>" for name, vs in verdicts.items()]
    parts.append("</ul>")
    headers = ["verdict", "platform/benchmark", "config", "metric", "now", "reference", "unit", "now/ref", "reason"]
    for name, vs in verdicts.items():
        parts.append(f"<h2>Verdicts {esc(COMPARISONS.get(name, name))}</h2>")
        parts.append(_html_table(headers, _verdict_rows(vs)) if vs else "<p>none</p>")
    failed = _failed(records)
    parts.append("<h2>Failed runs</h2>")
    parts.append(_html_table(["run", "benchmark", "status", "reason"],
                             [("failed", [r.run_id, r.benchmark, r.status, str(r.reason)])
                              for r in failed]) if failed else "<p>none</p>")
    parts.append('<h2>Trends</h2><div class="charts">')
    parts += [_img(trend_png(name, points, night), name) for name, points in history.items()]
    parts.append('</div><h2>Micro-step breakdown</h2><div class="charts">')
    parts += [_img(microstep_png(r), f"micro-steps of {r.run_id}") for r in records
              if r.kind == "training" and r.microsteps]
    parts.append("</div></body></html>")
    return "\n".join(parts) + "\n"


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
                  records: list[ResultRecord], history: dict[str, list[tuple[str, float]]]) -> dict[str, Path]:
    """Write nightly.md, nightly.html and junit.xml into out_dir; {"markdown"|"html"|"junit": path}."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return {
        "markdown": write_bytes_atomic(out_dir / "nightly.md",
                                  nightly_markdown(platform, night, verdicts, records).encode("utf-8")),
        "html": write_bytes_atomic(out_dir / "nightly.html",
                              nightly_html(platform, night, verdicts, records, history).encode("utf-8")),
        "junit": write_bytes_atomic(out_dir / "junit.xml", junit_xml(platform, verdicts)),
    }
