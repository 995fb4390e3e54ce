"""Verdicts as text: each change as one ratio of the better-is-higher quantity, the tables that tell
configurations apart (the ZeRO stage first), what changed between environments, the load a run saw,
and the verdicts as JSON."""
from __future__ import annotations

import json
import math
import re
import statistics
from collections import Counter
from typing import Any, Optional

from contract.metrics import METRICS

from ..verdict.compare import ACROSS_MACHINES, machine_of
from ..verdict.cross_machine import MachinePair, better_ratio, machine_pairs, with_isa
from ..provenance import CONTENT_PREFIX
from ..record import ResultRecord
from ..verdict.references import REFERENCE_METRICS
from .legend import config_key, config_labels, grouped, item, legend_lines, rows_text
from .summary import fmt, text_table

VERDICT_ORDER = ("regression", "status changed", "missing", "insufficient data", "not comparable", "improvement", "new",
                 "pass")
RATIO_LEGEND = ("now/{ref}: the better-is-higher quantity now over {name} (samples/s as is; step time and "
                "memory inverted), so below 1x is worse (for example, step time 1.07 -> 2.56 s is 0.42x, 2.39x slower; "
                "samples/s 22 -> 13.8 is 0.63x, 1.59x slower); the 95% interval and the tolerance in the same terms")
SPEED_WORDS = {"samples_per_s": "samples/s", "tokens_per_s": "tokens/s", "avg_busbw_gbps": "bus bandwidth",
               "shared_busbw_gbps": "bus bandwidth over the sizes both ran"}
"""A machine pair's throughput (cross_machine.SPEED_METRICS) in its summary's words."""
STEAL_SHOWN_CPUS = 0.05
"""A hypervisor's steal at or above this (CPUs' worth) is named in the bench's closing line; below it, and
on bare metal (0), nothing is said."""
SHOWN_KEYS = ("zero_stage", "micro_batch_size", "grad_acc_steps", "seq_len")
"""Configuration keys said first in a configuration's label; every other key that tells rows apart follows in full."""
def _direction(v) -> str:
    """'higher' or 'lower' is better: from the verdict's own numbers where they moved, else the metric. A step's
    time (contract.metrics per_step) is judged as its rate (explained.worse_pct): its change reads as one."""
    if METRICS.get(v.metric) is not None and METRICS[v.metric].per_step:
        return "higher"
    if v.worse_pct and v.value is not None and v.reference:
        return "higher" if (v.value - v.reference) * v.worse_pct < 0 else "lower"
    return next((m[v.metric] for m in REFERENCE_METRICS.values() if v.metric in m), "higher")


def ratio(worse_pct: float, direction: str) -> float:
    """now/ref of the better-is-higher quantity from worse_pct (harness.verdict.compare: positive = worse)."""
    if direction == "higher":
        return 1.0 - worse_pct / 100.0
    return 100.0 / (100.0 + worse_pct) if worse_pct > -100.0 else math.inf


def _x(r: float, *near: float) -> str:
    """'0.42x'; three decimals within 10 % of 1x (for r or any of `near`, so that a pair reads alike)."""
    if not math.isfinite(r):
        return "inf"
    return f"{r:.3f}x" if any(abs(x - 1.0) < 0.1 for x in (r, *near)) else f"{r:.2f}x"


def _pair(a: float, b: float) -> str:
    return f"[{_x(a, b)}, {_x(b, a)}]"


def change_text(v) -> str:
    """'0.42x (2.39x slower)' for a verdict with a relative change, else '-'."""
    if v.worse_pct is None:
        return "-"
    r = ratio(v.worse_pct, _direction(v))
    worse, better = ("more memory", "less memory") if "mem" in v.metric else ("slower", "faster")
    if r == 1.0 or not math.isfinite(r) or r <= 0 or f"{max(r, 1 / r):.2f}" == "1.00":
        return _x(r)
    return f"{_x(r)} ({1 / r:.2f}x {worse})" if r < 1 else f"{_x(r)} ({r:.2f}x {better})"


def interval_text(v) -> str:
    """The 95% interval of the change, as now/ref ratios: '[0.40x, 0.44x]'."""
    if not v.interval_pct:
        return "-"
    lo, hi = v.interval_pct
    d = _direction(v)
    return _pair(ratio(hi, d), ratio(lo, d))


def tolerance_text(v) -> str:
    """The band of now/ref a pass lies in: tolerance 25 % of a memory figure is [0.80x, 1.33x]; of a rate, and of a
    step's time (judged as its rate), [0.75x, 1.25x]."""
    if v.tolerance_pct is None:
        return "-"
    d = _direction(v)
    return _pair(ratio(v.tolerance_pct, d), ratio(-v.tolerance_pct, d))


def verdict_text(v) -> str:
    """The verdict's reason with its change in the table's terms (compare.decide words it as a gain %)."""
    if v.worse_pct is None:
        return v.reason
    why = v.reason.split("gain ", 1)[0].rstrip(" ;:") if "gain " in v.reason else v.reason
    unit = f" {v.unit}" if v.unit else ""
    text = f"{fmt(v.value, 3)}{unit} against {fmt(v.reference, 3)}{unit}: {change_text(v)}"
    text += (", as information (not comparable: no verdict)" if v.verdict == "not comparable" and not v.interval_pct
             else f", 95% interval {interval_text(v)}, tolerance {tolerance_text(v)}")
    return f"{why}: {text}" if why else text


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, val in config.items():
        if isinstance(val, dict):
            out.update(_flat(val, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = val
    return out


def distinguishing_keys(configs: list[dict[str, Any]]) -> tuple[list[str], dict[str, Any]]:
    """(keys besides SHOWN_KEYS whose values differ between the configurations, {key: value} the same in all)."""
    flat = [_flat(c) for c in configs]
    keys = sorted({k for f in flat for k in f} - set(SHOWN_KEYS))
    varying = [k for k in keys if len({json.dumps(f.get(k), default=str) for f in flat}) > 1]
    common = {k: flat[0][k] for k in keys if k not in varying} if flat else {}
    return varying, common


def config_cells(config: dict[str, Any], varying: list[str]) -> list[str]:
    """[ZeRO stage, 'mb x ga', seq len, the other distinguishing keys in full]."""
    flat = _flat(config)
    mb, ga = config.get("micro_batch_size"), config.get("grad_acc_steps")
    return [fmt(config.get("zero_stage")), f"{fmt(mb)} x {fmt(ga)}" if mb is not None or ga is not None else "-",
            fmt(config.get("seq_len")), " ".join(f"{k}={flat[k]}" for k in varying if k in flat) or "-"]


def config_label(config: dict[str, Any], varying: list[str]) -> str:
    """'ZeRO-2 mb 4 x ga 2 seq 128 precision=bf16': what tells this configuration apart, in a line."""
    zero, mbga, seq, other = config_cells(config, varying)
    parts = [f"ZeRO-{zero}" if zero != "-" else "", f"mb {mbga.replace(' x ', ' x ga ')}" if mbga != "-" else "",
             f"seq {seq}" if seq != "-" else "", other if other != "-" else ""]
    return " ".join(p for p in parts if p)


def unrun(verdicts: list) -> list:
    """The 'missing' verdicts of references no result in the comparison ran (compare() gives them no run)."""
    return [v for v in verdicts if v.verdict == "missing" and not v.run_ids]


def _judged(verdicts: list) -> list:
    skip = {id(v) for v in unrun(verdicts)}
    return [v for v in verdicts if id(v) not in skip]


OUTSIDE_SUITE = "are of configurations the nightly's suite does not run"


def unrun_line(verdicts: list, why: str = "had no result among these runs") -> str:
    """'25 references (5 configurations) of cpu/llama-tiny had no result among these runs (not judged)', or ''."""
    per: dict[str, list] = {}
    for v in unrun(verdicts):
        per.setdefault(f"{v.platform}/{v.benchmark}", []).append(v)
    parts = []
    for name, vs in sorted(per.items()):
        configs = len({json.dumps(v.config, sort_keys=True) for v in vs})
        parts.append(f"{len(vs)} reference{'s' if len(vs) != 1 else ''}"
                     + (f" ({configs} configurations)" if configs > 1 else "") + f" of {name}")
    return f"{', '.join(parts)} {why} (not judged)" if parts else ""


def verdict_counts(verdicts: list, missing: str = "summary") -> str:
    """'1 regression, 3 pass', the worst first; unrun references left out unless missing='rows'."""
    judged = verdicts if missing == "rows" else _judged(verdicts)
    counts = Counter(v.verdict for v in judged)
    return ", ".join(f"{counts[k]} {k}" for k in VERDICT_ORDER if counts[k]) or "no verdicts"


def value_text(x: Any, unit: Optional[str] = None) -> str:
    """A figure in a verdict table: three decimals below 1,000, fewer above (a million tokens/s needs none); a
    count as a whole number where it is one (a reference's median of 0 graph breaks is 0, not 0.000)."""
    if unit == "count" and isinstance(x, float) and x.is_integer():
        return fmt(int(x))
    if not isinstance(x, float) or not math.isfinite(x):
        return fmt(x)
    return fmt(x, 3 if abs(x) < 1e3 else 2 if abs(x) < 1e4 else 1 if abs(x) < 1e5 else 0)


def why_text(v) -> str:
    """The verdict's cause in words, without the figures the table shows: 'point estimate out of
    tolerance, interval is not', 'ok -> oom: rank 0: ...', 'reference taken on X, this run on Y'."""
    why = v.reason.split("gain ", 1)[0].rstrip(" ;:") if v.worse_pct is not None and "gain " in v.reason else v.reason
    return why.removeprefix("not comparable: ")


def verdict_table(verdicts: list, markdown: bool = False, missing: str = "rows", ref_name: str = "reference") -> str:
    """Verdicts of harness.verdict.compare, regressions and status changes first: a row per configuration
    and metric, the configuration named by a label (c1, c2, ...) said in full once below, then each
    problem with its cause and what changed, said once for the rows that share it. The terminal form
    fits legend.WIDTH (120) columns; the Markdown form adds the platform/benchmark, unit and
    tolerance columns. missing: 'rows' lists each reference that had no result (the nightly, of the
    configurations its suite runs: compare.outside_runs); 'summary' puts them in one line (bench, compare); 'omit' leaves them out."""
    shown = verdicts if missing == "rows" else _judged(verdicts)
    order = {v: i for i, v in enumerate(VERDICT_ORDER)}
    ranked = sorted(shown, key=lambda v: (order.get(v.verdict, 9), config_order(v), v.metric))
    keys = [_row_key(v) for v in ranked]
    labels = config_labels([_row_key(v) for v in sorted(ranked, key=config_order)])
    row_labels = [labels[k] for k in keys]
    ref = "ref" if ref_name == "reference" else ref_name
    units = {(v.metric, v.unit) for v in ranked if v.unit}
    unit_column = markdown or len(units) > len({m for m, _ in units})   # else one line of units per metric
    headers = ["verdict", *(["platform/benchmark"] if markdown else []), "config" if markdown else "cfg", "metric",
               "now", ref_name, *(["unit"] if unit_column else []), f"now/{ref}", "95% interval",
               *(["tolerance", f"n now/{ref}"] if markdown else ["n"])]
    rows = [[v.verdict, *([f"{v.platform}/{v.benchmark}"] if markdown else []), label, v.metric, value_text(v.value, v.unit),
             value_text(v.reference, v.unit), *([v.unit or "-"] if unit_column else []), change_text(v), interval_text(v),
             *([tolerance_text(v)] if markdown else []), f"{v.num_samples}/{v.num_reference_samples}"]
            for v, label in zip(ranked, row_labels)]
    text = text_table(headers, rows, markdown)
    varying, common = distinguishing_keys([v.config or {} for v in ranked])
    several = len({v.reference_platform for v in ranked}) > 1   # some rows against another platform than others
    texts = {k: f"{v.platform}/{v.benchmark} {config_label(v.config or {}, varying)}".strip()
             + (f" (against {v.reference_platform or v.platform})" if several else "") for k, v in zip(keys, ranked)}
    lines = legend_lines(labels, texts, " ".join(f"{k}={val}" for k, val in common.items()), markdown)
    row_of = {id(v): label for v, label in zip(ranked, row_labels)}
    lines += [line for pair in machine_pairs(ranked, ACROSS_MACHINES)
              for line in item(pair_text(pair, lambda v: row_of[id(v)], ref), markdown)]
    since = "the reference" if ref == "ref" else ref_name
    lines += problem_lines(ranked, row_labels, since, markdown)
    lines += quiet_change_lines(ranked, row_labels, since, markdown)
    lines += item(RATIO_LEGEND.format(ref=ref, name=since) + ("" if markdown else f"; n: samples now/{ref}"), markdown)
    if not markdown:
        if not unit_column and units:
            lines += item("units: " + "; ".join(f"{m} {u}" for m, u in sorted(units)), markdown)
        lines += tolerance_lines(ranked, row_labels, ref)
    if missing == "summary" and unrun_line(verdicts):
        lines += item(unrun_line(verdicts), markdown)
    return text + "\n\n" + "\n".join(lines)


def _row_key(v) -> str:
    """A row's configuration as a key: its platform, benchmark and configuration, and the reference's
    platform where it is another (a run paired across platforms)."""
    platform = f"{v.platform} vs {v.reference_platform}" if v.reference_platform else v.platform
    return config_key(platform, v.benchmark, v.config)


def pair_text(pair: MachinePair, name, ref: str = "ref") -> str:
    """A comparison across two machines in one line: 'H100 80GB HBM3 runs these 4 configurations at
    0.961x the H200's samples/s (geometric mean of now/OLD over the configurations, 0.89x-1.18x); at
    0.942x of its efficiency (matmul_eff_pct, ...); ranking of the configurations by samples/s unchanged
    beyond noise: c1 and c3 tied (c1 0.4 % ahead on H100 80GB HBM3, c3 0.6 % on H200), within a run's
    noise (3 %)'; a swap beyond the noise on either machine: '... changed: c2 and c1 swapped (...)'.
    `name(v)` names a verdict's configuration."""
    parts = []
    speed = SPEED_WORDS.get(pair.speed_metric or "", pair.speed_metric)
    if pair.speed_ratio is not None:
        ratios = pair.ratios()
        lo, hi = min(ratios), max(ratios)
        spread = f" over the configurations, {_x(lo, hi)}-{_x(hi, lo)}" if len(ratios) > 1 else ""
        n = pair.num_configs
        parts.append(f"{pair.now} runs {'these ' + str(n) + ' configurations' if n > 1 else 'this configuration'} at "
                     f"{_x(pair.speed_ratio)} the {pair.reference}'s {speed} (geometric mean of now/{ref}{spread})")
    else:
        parts.append(f"{pair.now} against {pair.reference}")
    for metric, (r, n) in pair.efficiency.items():
        dtype, low, within = pair.balance.get(metric, ("", 1.0, 0))
        ends = sorted([(1.0, "all matmuls"), (low, "a step all memory traffic")])
        weighed = (f"; their balance ({dtype} matmul per byte of memory bandwidth) puts the same software between "
                   + " and ".join(f"{_x(r) if r != 1.0 else '1x'} ({words})" for r, words in ends)
                   + (f", {within} configuration{'s' if within != 1 else ''} within that" if within else "")
                   if dtype and abs(low - 1.0) * 100 > pair.noise_pct else "")
        parts.append(f"at {_x(r)} of its efficiency ({metric}, {n} configuration{'s' if n != 1 else ''}, judged "
                     f"across the machines{weighed})")

    def swaps(pairs: list, verb: str) -> str:
        return ", ".join(f"{name(a)} and {name(b)} {verb} ({name(a)} {now:.1f} % ahead on {pair.now}, {name(b)} "
                         f"{then:.1f} % on {pair.reference})" for a, b in pairs for now, then in [pair.gaps_pct(a, b)])

    ties = (f"{'; ' if pair.swapped else ': '}{swaps(pair.ties, 'tied')}, within a run's noise ({pair.noise_pct:g} %)"
            if pair.ties else "")
    if pair.num_configs > 1 and not pair.swapped:
        parts.append(f"ranking of the configurations by {speed} unchanged{' beyond noise' if ties else ''}{ties}")
    elif pair.swapped:
        parts.append(f"ranking of the configurations by {speed} changed: {swaps(pair.swapped, 'swapped')}{ties}")
    return "; ".join(parts)


def pair_json(pair: MachinePair, name) -> dict[str, Any]:
    """A MachinePair as the JSON of compare --json carries it on each of its rows (across_machines)."""
    ratios = pair.ratios()

    def orders(pairs: list) -> list[dict[str, Any]]:
        return [{"ahead_now": name(a), "ahead_on_reference": name(b), "gaps_pct": list(pair.gaps_pct(a, b))}
                for a, b in pairs]

    return {"now": pair.now, "reference": pair.reference, "num_configurations": pair.num_configs,
            "speed_metric": pair.speed_metric, "speed_ratio_geomean": pair.speed_ratio,
            "speed_ratio_range": [min(ratios), max(ratios)] if ratios else None,
            "efficiency_ratio_geomean": {m: r for m, (r, _) in pair.efficiency.items()},
            "efficiency_memory_bound": {m: {"dtype": d, "ratio": low, "explained": k} for m, (d, low, k) in pair.balance.items()},
            "ranking": [name(v) for v in pair.speed], "ranking_unchanged": not pair.swapped,
            "swapped": orders(pair.swapped), "tied": orders(pair.ties), "noise_pct": pair.noise_pct,
            "summary": pair_text(pair, name, "reference")}


def config_order(v) -> tuple:
    """Platform, benchmark, then the ZeRO stage, micro-batch, grad-acc and sequence length as numbers."""
    config = v.config or {}
    shown = [(0, x, "") if isinstance(x, (int, float)) else (1, 0, str(x)) for x in (config.get(k) for k in SHOWN_KEYS)]
    return v.platform, v.benchmark, *shown, config_key(v.platform, v.benchmark, config)


PROBLEMS = ("regression", "status changed", "insufficient data", "missing", "not comparable")
"""The verdicts whose cause is said below the table."""
CHANGED = ("regression", "status changed")
"""The verdicts that say what changed in the environment."""


def problem_lines(ranked: list, labels: list[str], since: str, markdown: bool) -> list[str]:
    """Each problem's cause in words, once for the rows that share it: 'regression, all 29 rows: what
    changed since the reference: ...'; 'insufficient data, c4 avg_busbw_gbps: point estimate out of
    tolerance, interval is not'. Rows that share what changed are one group, whatever their verdict."""
    metrics = [v.metric for v in ranked]
    problems = [i for i, v in enumerate(ranked) if v.verdict in PROBLEMS]

    def where(rows: list[int]) -> str:
        kinds = {ranked[i].verdict for i in rows}
        return rows_text(rows, [i for i in problems if ranked[i].verdict in kinds], labels, metrics)

    def cause(verdict: str, rows: list[int], why: str) -> str:
        apart = any(ranked[i].machines for i in rows)   # two machines, not one machine's pace or neighbours
        note = " (references are per machine)" if verdict == "not comparable" and apart else ""
        return f"{verdict}, {where(rows)}" + (f": {why}{note}" if why else "")

    def changed(i: int) -> str | None:
        return environment_text(ranked[i].environment_diff) if ranked[i].verdict in CHANGED else None

    lines: list[str] = []
    for env, rows in grouped(problems, changed):
        causes = grouped(rows, lambda i: (ranked[i].verdict, why_text(ranked[i])))
        if env is None:
            lines += [line for (verdict, why), rs in causes for line in item(cause(verdict, rs, why), markdown)]
            continue
        if len(causes) == 1:
            ((verdict, why), rs), = causes
            what = f"what changed since {since}: {env}"
            lines += item(f"{cause(verdict, rs, why)}{'; ' if why else ': '}{what}", markdown)
            continue
        lines += item(f"what changed since {since}, for {len(rows)} rows: {env}", markdown)
        lines += [line for (verdict, why), rs in causes for line in item(cause(verdict, rs, why), markdown, 1)]
    return lines


def quiet_change_lines(ranked: list, labels: list[str], since: str, markdown: bool) -> list[str]:
    """What changed in the environment for rows that did not regress (a pass, an improvement, a
    verdict the noise left open): a new image, a moved package or variable is named even when
    nothing moved beyond the tolerance. Once per distinct change: 'what changed since OLD, with
    no regression (pass, all 47 rows): container_digest: ... -> ...; package.numpy: ...'."""
    metrics = [v.metric for v in ranked]
    quiet = [i for i, v in enumerate(ranked) if v.verdict not in CHANGED and v.verdict != "not comparable"
             and v.environment_diff and "reference" not in v.environment_diff]
    lines: list[str] = []
    for env, rows in grouped(quiet, lambda i: environment_text(ranked[i].environment_diff)):
        kinds = ", ".join(sorted({ranked[i].verdict for i in rows}))
        lines += item(f"what changed since {since}, with no regression judged ({kinds}, "
                      f"{rows_text(rows, quiet, labels, metrics)}): {env}", markdown)
    return lines


def tolerance_lines(ranked: list, labels: list[str], ref: str = "ref") -> list[str]:
    """The band of now/ref a pass lies in, once per band: '[0.85x, 1.15x] samples_per_s, ...'."""
    metrics = [v.metric for v in ranked]
    scope = [i for i, v in enumerate(ranked) if v.tolerance_pct is not None]
    bands = grouped(scope, lambda i: tolerance_text(ranked[i]))
    if not bands:
        return []
    if len(bands) == 1:
        return item(f"tolerance (the now/{ref} a pass lies in): {bands[0][0]} in every row that has one", False)
    return item(f"tolerance (the now/{ref} a pass lies in): " + "; ".join(
        f"{band} {re.sub(r' [(][0-9]+ rows?[)]$', '', rows_text(rows, scope, labels, metrics, by_metric=True))}"
        for band, rows in bands), False)


def environment_text(diff: dict[str, Any]) -> str:
    """{key: [reference, now]} (or {key: note}) as 'nccl: 2.20 -> 2.21; ...'; the suite's commits
    shortened, with the count between: 'suite_commit: a785365c4e -> bcccdb5c49 (40 commits between)'; a
    copy's content hash in full ('content:sha256:<16 hex>', harness/provenance.py suite_identity)."""
    parts = []
    for k, x in diff.items():
        if k == "suite_commit.commits_between":
            continue
        if k == "suite_commit" and isinstance(x, list) and len(x) == 2:
            between = diff.get("suite_commit.commits_between")
            short = [str(c) if str(c).startswith(CONTENT_PREFIX) else str(c)[:10] for c in x]
            parts.append(f"{k}: {short[0]} -> {short[1]}"
                         + (f" ({between} commit{'' if between == 1 else 's'} between)" if between is not None else ""))
        else:
            parts.append(f"{k}: {x[0]} -> {x[1]}" if isinstance(x, list) and len(x) == 2 else f"{k}: {x}")
    return "; ".join(parts) or "nothing in the fingerprint"


def load_line(records: list[ResultRecord]) -> str:
    """The machine the records ran on and how busy it was: 'ran on AMD EPYC (2 CPUs, AVX2) (host vm);
    other work during the measured steps: 0.05-1.30 CPUs (median 0.10) over 13 runs', and on a virtual
    machine whose hypervisor took its CPUs: '; the hypervisor took (steal) 0.30-0.80 CPUs'."""
    envs = [r.environment for r in records]
    machines = sorted({with_isa(name, e) if (name := machine_of(e)) else "an unrecorded machine"   # the probe's
                       for e in envs if e.get("machine")})                                        # ISA class too
    hosts = sorted({h for e in envs for h in (e.get("hosts") or [])})
    other = [l["other_cpus"] for e in envs for l in [e.get("load") or {}] if isinstance(l.get("other_cpus"), (int, float))]
    text = f"ran on {', '.join(machines) or 'an unrecorded machine'}" + (f" (host {', '.join(hosts)})" if hosts else "")
    if other:
        busy = (f"{min(other):.2f}-{max(other):.2f} CPUs (median {statistics.median(other):.2f})"
                if len(other) > 1 else f"{other[0]:.2f} CPUs")
        text += f"; other work during the measured steps: {busy} over {len(other)} record(s)"
    steal = [l["steal_cpus"] for e in envs for l in [e.get("load") or {}] if isinstance(l.get("steal_cpus"), (int, float))]
    if steal and max(steal) >= STEAL_SHOWN_CPUS:
        text += (f"; the hypervisor took (steal) {min(steal):.2f}-{max(steal):.2f} CPUs" if len(steal) > 1
                 else f"; the hypervisor took (steal) {steal[0]:.2f} CPUs")
    return text


def verdicts_json(verdicts: list) -> str:
    """The verdicts as JSON (compare --json): the reason and the change in the table's terms (the
    numbers as compare() gives them: worse_pct, interval_pct), `ratio` (now/reference of the
    better-is-higher quantity, also where the machines differ and no verdict is made); a row made
    across two machines (`machines`: [this run's, the reference's]) carries its pair's summary in
    `across_machines` (pair_json: the geometric means, the ranking, the summary line)."""
    varying, _ = distinguishing_keys([v.config or {} for v in verdicts])

    def name(v) -> str:
        return f"{v.platform}/{v.benchmark} {config_label(v.config or {}, varying)}".strip()

    pairs = {(p.now, p.reference): pair_json(p, name) for p in machine_pairs(verdicts, ACROSS_MACHINES)}
    return json.dumps([{**v.to_dict(), "reason": verdict_text(v), "change": change_text(v), "ratio": better_ratio(v),
                        "interval": interval_text(v), "tolerance": tolerance_text(v),
                        **({"across_machines": pairs[tuple(v.machines)]} if tuple(v.machines or ()) in pairs else {})}
                       for v in verdicts], indent=2)
