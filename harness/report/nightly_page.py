"""The nightly's HTML page, as a person reads it in a browser (issue 29 item 3): the first screen says
how the night went (the count of each verdict per comparison, then each regression and status change
with what changed, in words); the verdict tables fit the window (a configuration is a short label,
c1, c2, ..., said in full once in a legend); the trends are small multiples, one panel per
configuration, each metric over the nights as a ratio to its rolling baseline (better-is-higher, as
the tables' now/ref) with the tolerance band and the reference drawn; a regressed run's micro-step
breakdown stands beside its predecessor's. Self-contained: inline PNGs, no script, nothing fetched.
tests/integration/test_report_browser.py opens it in headless Chromium at 1400 px.
"""
from __future__ import annotations

import base64
import html
import io
import math
import statistics
import textwrap
from collections import Counter
from typing import Any, Optional

from contract.metrics import METRICS

from ..held_up import STRAGGLER_PCT, for_peer_s, held_up_s, night_stragglers
from ..record import ResultRecord
from ..straggler_trend import CREEP_PCT
from ..verdict.compare import ACROSS_MACHINES, Verdict
from ..verdict.cross_machine import machine_pairs
from .legend import config_key, config_labels, grouped
from .sizes import CHANGED, shown, size_rows
from .verdicts import VERDICT_ORDER, config_order, change_text, config_label, distinguishing_keys, environment_text
from .verdicts import OUTSIDE_SUITE, interval_text, pair_text, unrun_line, value_text, why_text

COMPARISONS = {"references": "against the reference table",
               "baseline": "against the rolling baseline of earlier nights"}
FAILURES = ("regression", "status changed")
WINDOW_PX = 1400
"""The window the page is laid out for: nothing is wider (tables wrap, images scale down)."""
CSS = """body{font-family:sans-serif;margin:1em 1.5em;max-width:1360px}
h1{margin:.2em 0} h2{margin:1.2em 0 .4em}
.night{font-size:120%;padding:.5em .8em;border-radius:4px} .bad{background:#f8d0d0} .good{background:#d5f0d5}
table{border-collapse:collapse;margin:.6em 0;font-size:90%;width:100%;table-layout:fixed}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{background:#eee} table.counts{width:auto;table-layout:auto} table.counts td{text-align:right}
tr.regression{background:#f8d0d0;font-weight:bold} tr.status-changed{background:#fde5c0}
img{max-width:100%;height:auto} figure{margin:.5em 0} .pair{display:flex;gap:1em;flex-wrap:wrap}
.pair figure{flex:1 1 600px;min-width:0} dl.legend{display:grid;grid-template-columns:4em 1fr;gap:2px 8px;margin:0}
dl.legend dd{margin:0;overflow-wrap:anywhere} li{margin:.3em 0}"""


def series_label(platform: str, benchmark: str, config: dict[str, Any]) -> str:
    """A trend series' configuration: 'cpu/llama-tiny zero_stage=1,micro_batch_size=4,grad_acc_steps=2'."""
    label = ",".join(f"{k}={v}" for k, v in config.items() if k in ("zero_stage", "micro_batch_size",
                                                                   "grad_acc_steps", "max_bytes"))
    return f"{platform}/{benchmark} {label}"


class Labels:
    """c1, c2, ... for every configuration of the night's verdicts (the same label in every table, the
    problems and the trend panels), with each one's full text."""

    def __init__(self, verdicts: list[Verdict]):
        ordered = sorted(verdicts, key=config_order)
        self.keys = config_labels([config_key(v.platform, v.benchmark, v.config) for v in ordered])
        varying, self.common = distinguishing_keys([v.config or {} for v in ordered])
        self.texts = {config_key(v.platform, v.benchmark, v.config):
                      f"{v.platform}/{v.benchmark} {config_label(v.config or {}, varying)}".strip() for v in ordered}
        self.series = {series_label(v.platform, v.benchmark, v.config or {}): config_key(v.platform, v.benchmark,
                                                                                           v.config)
                       for v in ordered}

    def of(self, v: Verdict) -> str:
        return self.keys[config_key(v.platform, v.benchmark, v.config)]

    def text(self, v: Verdict) -> str:
        return self.texts[config_key(v.platform, v.benchmark, v.config)]

    def legend(self) -> str:
        esc = html.escape
        rows = "".join(f"<dt>{esc(label)}</dt><dd>{esc(self.texts[key])}</dd>" for key, label in self.keys.items())
        common = " ".join(f"{k}={v}" for k, v in self.common.items())
        return (f'<dl class="legend">{rows}</dl>'
                + (f"<p><small>every configuration: {esc(common)}</small></p>" if common else ""))


# ----------------------------------------------------------------------------- charts

def _figure(width_in: float, height_in: float, dpi: int = 80):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    return Figure(figsize=(width_in, height_in), dpi=dpi, layout="constrained")


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def trend_panels_png(panels: list[tuple[str, dict[str, list[tuple[str, float]]]]], night: str,
                     bands: dict[tuple[str, str], float], references: dict[tuple[str, str], float]) -> bytes:
    """Small multiples: a panel per configuration [(title, {metric: [(night, value)]})], each metric as
    its better-is-higher ratio to its baseline (the median of the nights before `night`; the first
    night when there is none): 1 is as good as the baseline, below is worse. The tolerance band
    (bands[(title, metric)], percent) is shaded around 1, the reference table's value
    (references[(title, metric)], as a ratio the same way) a dashed line, this night's point ringed."""
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = _figure(5.6 * cols, 3.2 * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    nights = sorted({n for _, metrics in panels for pts in metrics.values() for n, _ in pts})
    at = {n: i for i, n in enumerate(nights)}
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (title, metrics) in zip(axes.flat, panels):
        for metric, points in sorted(metrics.items()):
            before = [v for n, v in points if n < night] or [points[0][1]]
            base = statistics.median(before)
            if not base:
                continue
            flip = metric in METRICS and METRICS[metric].direction == "lower"
            ratios = [(at[n], (base / v if flip else v / base) if v else math.nan) for n, v in points]
            (line,) = ax.plot([x for x, _ in ratios], [r for _, r in ratios], marker="o", markersize=3, label=metric)
            tol = bands.get((title, metric))
            if tol:
                ax.axhspan(1 - tol / 100, 1 + tol / 100, color=line.get_color(), alpha=0.08, linewidth=0)
            ref = references.get((title, metric))
            if ref:
                ax.axhline(base / ref if flip else ref / base, color=line.get_color(), linestyle="--", linewidth=1)
            tonight = [r for x, r in ratios if nights[x] == night]
            if tonight:
                ax.plot([at[night]], tonight, marker="o", markersize=9, markerfacecolor="none",
                        color="crimson", linestyle="none")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        step = max(1, len(nights) // 5)
        ax.set_xticks(range(0, len(nights), step), [n[5:] if len(n) == 10 else n for n in nights[::step]],
                      fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_title(textwrap.fill(title, 72), fontsize=8)
        ax.set_ylabel("vs baseline (1 = same)", fontsize=7)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6, loc="lower left")
    return _png(fig)


def held_back_png(series: dict[str, dict[str, list[tuple[str, float]]]], night: str) -> bytes:
    """Small multiples: a panel per run id ({run id: {rank or node: [(night, % of the profiled steps it held the
    others back)]}}, harness/straggler_trend.py held_back_series), a line per rank or node, the share at which one
    night's straggler stands out (STRAGGLER_PCT) and the least a rise every night is named at (CREEP_PCT) dashed,
    this night's points ringed."""
    cols = min(3, len(series))
    fig = _figure(5.6 * cols, 3.0 * math.ceil(len(series) / cols))
    axes = fig.subplots(math.ceil(len(series) / cols), cols, squeeze=False)
    nights = sorted({n for lines in series.values() for pts in lines.values() for n, _ in pts})
    at = {n: i for i, n in enumerate(nights)}
    for ax in axes.flat[len(series):]:
        ax.set_visible(False)
    for ax, (run_id, lines) in zip(axes.flat, sorted(series.items())):
        for who, points in lines.items():
            (line,) = ax.plot([at[n] for n, _ in points], [v for _, v in points], marker="o", markersize=3, label=who)
            ax.plot([at[n] for n, v in points if n == night], [v for n, v in points if n == night], marker="o",
                    markersize=9, markerfacecolor="none", color=line.get_color(), linestyle="none")
        for pct, words in ((STRAGGLER_PCT, "stands out"), (CREEP_PCT, "named if rising every night")):
            ax.axhline(pct, color="grey", linestyle="--", linewidth=0.8)
            ax.annotate(words, (1, pct), xycoords=("axes fraction", "data"), fontsize=6, color="grey", ha="right",
                        xytext=(-2, 2), textcoords="offset points")
        step = max(1, len(nights) // 5)
        ax.set_xticks(range(0, len(nights), step), [n[5:] if len(n) == 10 else n for n in nights[::step]], fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        top = max([v for pts in lines.values() for _, v in pts] + [STRAGGLER_PCT])
        ax.set_ylim(0, top * 1.15)
        ax.set_title(run_id, fontsize=8)
        ax.set_ylabel("held the others back (%)", fontsize=7)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6, loc="upper left")
    return _png(fig)


def microstep_pair_png(now: ResultRecord, before: Optional[tuple[str, ResultRecord]], night: str) -> bytes:
    """Stacked compute/communication bars (ms) per micro-step of the first profiled step, the communication's
    waiting (harness/held_up.py) hatched on top, the host's and, where the ranks' calls were matched, a later rank's
    apart: this night's run beside its predecessor's (the same run of the
    last earlier night), on one scale."""
    sides = [(f"{night} (this night)", now)] + ([(f"{before[0]} (before)", before[1])] if before else [])
    fig = _figure(5.2 * len(sides), 3.0)
    axes = fig.subplots(1, len(sides), squeeze=False, sharey=True)[0]
    for ax, (title, rec) in zip(axes, sides):
        steps = rec.microsteps[0] if rec.microsteps else []
        index = [m["index"] for m in steps]
        compute = [m["compute_s"] * 1e3 for m in steps]
        held = [h * 1e3 for h in held_up_s(rec.microsteps)[0]] if steps else []
        split = for_peer_s(rec.microsteps) if steps else None
        peer = [p * 1e3 for p in split[0]] if split else [0.0] * len(steps)
        moving = [m["comm_s"] * 1e3 - h for m, h in zip(steps, held)]
        ax.bar(index, compute, label="compute", color="tab:blue")
        ax.bar(index, moving, bottom=compute, label="communication", color="tab:orange")
        below = [c + m for c, m in zip(compute, moving)]
        ax.bar(index, [h - p for h, p in zip(held, peer)], bottom=below, color="white", edgecolor="tab:orange",
               hatch="///", label="communication held up" + (" by the host" if split else ""))
        if split:
            ax.bar(index, peer, bottom=[b + h - p for b, h, p in zip(below, held, peer)], color="white",
                   edgecolor="tab:red", hatch="...", label="waiting for a later rank")
        ax.set_xticks(index)
        ax.set_xlabel("micro-step (first profiled optimizer step)", fontsize=8)
        ax.set_title(f"{rec.run_id}: {title}", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("time (ms)", fontsize=8)
    return _png(fig)


# ----------------------------------------------------------------------------- page

def _img(png: bytes, alt: str) -> str:
    return (f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
            f"<figcaption>{html.escape(alt)}</figcaption></figure>")


def _counts(verdicts: dict[str, list[Verdict]]) -> str:
    kinds = [k for k in VERDICT_ORDER if any(v.verdict == k for vs in verdicts.values() for v in vs)]
    head = "".join(f"<th>{html.escape(k)}</th>" for k in kinds)
    body = ""
    for name, vs in verdicts.items():
        counts = Counter(v.verdict for v in vs)
        body += (f"<tr><th>{html.escape(COMPARISONS.get(name, name))}</th>"
                 + "".join(f"<td>{counts[k] or ''}</td>" for k in kinds) + "</tr>")
    return f'<table class="counts"><thead><tr><th></th>{head}</tr></thead><tbody>{body}</tbody></table>'


def _problems(verdicts: dict[str, list[Verdict]], labels: Labels) -> str:
    """Each regression and status change in words, under what changed (said once for the verdicts
    that share it)."""
    esc = html.escape
    items = []
    for name, vs in verdicts.items():
        failing = [v for v in vs if v.verdict in FAILURES]
        for diff, group in grouped(failing, lambda v: environment_text(v.environment_diff)):
            lines = ""
            for (verdict, label), same in grouped(group, lambda v: (v.verdict, labels.of(v))):
                metrics = ", ".join(f"{v.metric} {change_text(v)}" + (f" ({why_text(v)})" if why_text(v) and
                                                                     v.verdict != "regression" else "")
                                    for v in same)
                lines += f"<li><b>{esc(verdict)}</b> {esc(label)} ({esc(labels.text(same[0]))}): {esc(metrics)}</li>"
            items.append(f"<li>{esc(COMPARISONS.get(name, name))}, what changed: <b>{esc(diff)}</b><ul>{lines}</ul></li>")
    return f"<ul>{''.join(items)}</ul>" if items else "<p>none</p>"


def _stragglers(lines: list[str]) -> str:
    return f"<ul>{''.join(f'<li>{html.escape(line)}</li>' for line in lines)}</ul>" if lines else "<p>none stood out</p>"


def _table(vs: list[Verdict], labels: Labels) -> str:
    esc = html.escape
    order = {k: i for i, k in enumerate(VERDICT_ORDER)}
    ranked = sorted(vs, key=lambda v: (order.get(v.verdict, 9), config_order(v), v.metric))
    widths = ["9%", "4%", "12%", "9%", "9%", "6%", "11%", "12%", "5%", "23%"]
    head = ["verdict", "cfg", "metric", "now", "ref", "unit", "now/ref", "95% interval", "n", "why"]
    cols = "".join(f'<col style="width:{w}">' for w in widths)
    rows = "".join(
        f'<tr class="{esc(v.verdict.replace(" ", "-"))}">' + "".join(f"<td>{esc(c)}</td>" for c in (
            v.verdict, labels.of(v), v.metric, value_text(v.value), value_text(v.reference), v.unit or "-",
            change_text(v), interval_text(v), f"{v.num_samples}/{v.num_reference_samples}",
            "" if v.verdict == "pass" else why_text(v))) + "</tr>" for v in ranked)
    return (f"<table><colgroup>{cols}</colgroup><thead><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr></thead>"
            f"<tbody>{rows}</tbody></table>")


def _sizes(v: Verdict, labels: Labels) -> str:
    """A collective's change by message size (harness/report/sizes.py), as a small table under its comparison's."""
    esc = html.escape
    headers, rows = size_rows(v, "then")
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return (f"<p><b>{esc(labels.of(v))}</b> {esc(v.verdict)} on {esc(v.metric)}, by message size</p>"
            f"<table><thead><tr>{''.join(f'<th>{esc(h)}</th>' for h in headers)}</tr></thead><tbody>{body}</tbody></table>")


def _trends(history: dict[str, list[tuple[str, float]]], verdicts: dict[str, list[Verdict]], labels: Labels,
            night: str) -> str:
    if not history:
        return "<p>no history yet</p>"
    panels: dict[str, dict[str, list[tuple[str, float]]]] = {}
    for name, points in history.items():
        config, metric = name.rsplit(" ", 1)
        panels.setdefault(config, {})[metric] = points
    titled = []     # (label's number, title, config, metrics): panels in the legend's order
    for config, metrics in panels.items():
        key = labels.series.get(config)
        titled.append((int(labels.keys[key][1:]), f"{labels.keys[key]}: {labels.texts[key]}", config, metrics)
                      if key else (math.inf, config, config, metrics))
    titled.sort(key=lambda t: (t[0], t[1]))
    title_of = {config: title for _, title, config, _ in titled}
    bands, refs = {}, {}
    for name, vs in verdicts.items():
        for v in vs:
            config = series_label(v.platform, v.benchmark, v.config or {})
            if config not in title_of:
                continue
            if name == "baseline" and v.tolerance_pct:
                bands[(title_of[config], v.metric)] = v.tolerance_pct
            if name == "references" and v.reference:
                refs[(title_of[config], v.metric)] = v.reference
    png = trend_panels_png([(title, metrics) for _, title, _, metrics in titled], night, bands, refs)
    return _img(png, f"each configuration's metrics over the nights, as a ratio to their baseline (the median of "
                     f"the earlier nights; below 1 is worse); shaded: the tolerance; dashed: the reference table; "
                     f"ringed: {night}")


def _microsteps(verdicts: dict[str, list[Verdict]], records: list[ResultRecord],
                previous: dict[str, tuple[str, ResultRecord]], night: str) -> str:
    regressed = {rid for vs in verdicts.values() for v in vs if v.verdict in FAILURES for rid in v.run_ids}
    profiled = [r for r in records if r.kind == "training" and r.microsteps]
    first: dict[str, ResultRecord] = {}
    for r in profiled:
        first.setdefault(r.run_id, r)
    shown = [r for rid, r in first.items() if rid in regressed]
    parts = [_img(microstep_pair_png(r, previous.get(r.run_id), night),
                  f"micro-steps of {r.run_id}, this night beside "
                  + (f"the night {previous[r.run_id][0]}" if r.run_id in previous else "no earlier night's run"))
             for r in shown]
    others = [r for rid, r in first.items() if rid not in regressed]
    if others:
        parts.append(f"<details><summary>every other run's micro-steps ({len(others)})</summary>"
                     + "".join(_img(microstep_pair_png(r, None, night), f"micro-steps of {r.run_id}") for r in others)
                     + "</details>")
    return "".join(parts) or "<p>no profiled training run</p>"


def nightly_page(platform: str, night: str, verdicts: dict[str, list[Verdict]], records: list[ResultRecord],
                 history: dict[str, list[tuple[str, float]]],
                 previous: Optional[dict[str, tuple[str, ResultRecord]]] = None,
                 unrun: Optional[list[Verdict]] = None, baseline: str = "",
                 stragglers: Optional[list[str]] = None,
                 held_back: Optional[dict[str, dict[str, list[tuple[str, float]]]]] = None) -> str:
    """stragglers: the Stragglers section's lines (harness/straggler_trend.py); tonight's own when None. held_back:
    each run's ranks' (nodes') held-back shares over the nights (held_back_series), charted under the trends."""
    esc = html.escape
    title = esc(f"Nightly report: {platform}, {night}")
    labels = Labels([v for vs in verdicts.values() for v in vs])
    failing = sum(v.verdict in FAILURES for vs in verdicts.values() for v in vs)
    failed = [r for r in records if r.status != "ok"]
    line = (f"{failing} regression(s) or status change(s)" if failing else "no regression, no status change") \
        + f"; {len(records)} run(s), {len(failed)} failed"
    parts = [f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
             f'<meta name="viewport" content="width=device-width"><title>{title}</title>'
             f"<style>{CSS}</style></head><body><h1>{title}</h1>",
             f'<p class="night {"bad" if failing or failed else "good"}">{esc(line)}</p>',
             _counts(verdicts), "<h2>Regressions and status changes</h2>", _problems(verdicts, labels),
             "<h2>Stragglers</h2>", _stragglers(night_stragglers(records) if stragglers is None else stragglers)]
    if failed:
        parts.append("<h2>Failed runs</h2><ul>" + "".join(
            f"<li>{esc(r.run_id)} ({esc(r.benchmark)}): {esc(r.status)}: {esc(str(r.reason))}</li>" for r in failed)
            + "</ul>")
    parts.append("<h2>Configurations</h2>" + labels.legend())
    for name, vs in verdicts.items():
        parts.append(f"<h2>Verdicts {esc(COMPARISONS.get(name, name))}</h2>")
        parts.append(_table(vs, labels) if vs else "<p>none</p>")
        parts += [f'<p class="pair">{esc(pair_text(pair, labels.of))}</p>'   # against another machine: in a line
                  for pair in machine_pairs(vs, ACROSS_MACHINES)]
        if name == "references" and unrun:
            parts.append(f"<p>{esc(unrun_line(unrun, OUTSIDE_SUITE))}</p>")
        if name == "baseline" and baseline:
            parts += [f"<p>{esc(line)}</p>" for line in baseline.splitlines()]
        parts += [_sizes(v, labels) for v in shown(vs, CHANGED)]   # which sizes moved
    parts += ["<h2>Trends</h2>", _trends(history, verdicts, labels, night)]
    if held_back and any(len(pts) > 1 for lines in held_back.values() for pts in lines.values()):
        parts.append(_img(held_back_png(held_back, night), "held the others back, per rank (node), over the nights: "
                          "the median of each night's repeats"))
    parts += ["<h2>Micro-step breakdown</h2>", _microsteps(verdicts, records, previous or {}, night), "</body></html>"]
    return "\n".join(parts) + "\n"
