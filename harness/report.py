"""Terminal progress while runs go, and the summary tables (terminal and Markdown) at the end."""
from __future__ import annotations

import json
import math
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from benchmarks import events as ev

from .compare import machine_of
from .record import ResultRecord
from .references import REFERENCE_METRICS


class Progress:
    """Tails a run's events file and prints one line per optimizer step."""

    def __init__(self, events_path: Path, label: str, total_steps: int, stream: TextIO = sys.stdout):
        self.path = events_path
        self.label = label
        self.total = total_steps
        self.stream = stream
        self._offset = 0
        self._rows = 0

    def poll(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8") as f:
            f.seek(self._offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        self._offset += len(complete.encode("utf-8"))
        for line in ev.read_lines(complete):
            if line["key"] == ev.COLLECTIVE_ROW:
                v = line["value"]
                self._rows += 1
                print(f"  {self.label}  {self._rows}/{self.total} {v['op']} {v['size_bytes']} B  "
                      f"{v['out_of_place']['time_us']:.1f} us", file=self.stream, flush=True)
            if line["key"] == ev.TRAIN_STEP:
                s = line["value"]
                tag = "warm-up" if s["warmup"] else s["mode"]
                print(f"  {self.label}  step {s['index'] + 1}/{self.total} ({tag})  "
                      f"{s['step_time_s']:.3f} s  loss {s['loss']:.4f}", file=self.stream, flush=True)


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _metric(rec: ResultRecord, name: str) -> Any:
    m = rec.metrics.get(name)
    return m["value"] if m else None


def _table(headers: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*headers), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*r) for r in rows])


def collective_table(records: list[ResultRecord], markdown: bool = False) -> str:
    headers = ["run", "status", "op", "sizes (B)", "peak busbw GB/s", "avg busbw GB/s", "#wrong"]
    rows = []
    for r in records:
        busbw = [p["busbw_gbps"] for row in (r.rows or []) for p in (row["out_of_place"], row["in_place"]) if p]
        wrong = sum(p["num_wrong"] or 0 for row in (r.rows or [])
                    for p in (row["out_of_place"], row["in_place"]) if p)
        span = f"{r.rows[0]['size_bytes']}..{r.rows[-1]['size_bytes']}" if r.rows else "-"
        rows.append([r.run_id, r.status, r.benchmark, span, _fmt(max(busbw) if busbw else None, 3),
                     _fmt(_metric(r, "avg_busbw_gbps"), 3), str(wrong)])
    return _table(headers, rows, markdown)


def throughput_table(records: list[ResultRecord], markdown: bool = False) -> str:
    """One row per training run. With a distillation run among them, two more columns: the
    teacher's parameter memory per rank (part of peak), and MFU counting its forward too."""
    headers = ["run", "status", "ZeRO", "mb x ga", "seq", "samples/s", "tokens/s", "tokens/s/dev",
               "step s (p10-p90, n)", "peak GiB", "MFU %"]
    distilled = any(r.config["workload"].get("distill") for r in records)
    if distilled:
        headers += ["teacher GiB", "MFU+teacher %"]
    rows = []
    for r in records:
        w = r.config["workload"]
        st = r.metrics.get("step_time_s")
        step = f"{st['value']:.3f} ({st['p10']:.3f}-{st['p90']:.3f}, {st['n']})" if st else "-"
        rows.append([r.run_id, r.status, str(r.config["zero"]["stage"]),
                     f"{w['micro_batch_size']} x {w['grad_acc_steps']}", _fmt(w.get("seq_len")),
                     _fmt(_metric(r, "samples_per_s")), _fmt(_metric(r, "tokens_per_s"), 0),
                     _fmt(_metric(r, "tokens_per_s_per_device"), 0), step,
                     _fmt(_metric(r, "peak_mem_gib")), _fmt(_metric(r, "mfu_pct"))])
        if distilled:
            rows[-1] += [_fmt(_metric(r, "teacher_mem_gib"), 3), _fmt(_metric(r, "mfu_with_teacher_pct"))]
    return _table(headers, rows, markdown)


def _collectives_summary(collectives: list[dict]) -> str:
    per_op: Counter = Counter()
    size: Counter = Counter()
    for c in collectives:  # a distillation teacher's collectives are counted apart
        op = f"teacher {c['op']}" if c.get("phase") == "teacher" else c["op"]
        per_op[op] += 1
        size[op] += c["bytes"]
    return ", ".join(f"{op} x{n} {size[op] / 1e6:.2f} MB" for op, n in per_op.most_common()) or "none"


def microstep_table(rec: ResultRecord, markdown: bool = False) -> str:
    """Median over profiled steps of each micro-step's total/compute/comm, with its collectives."""
    if not rec.microsteps:
        return "(no profiled steps)"
    num = len(rec.microsteps[0])
    teacher = any("teacher" in m.get("phase_s", {}) for step in rec.microsteps for m in step)
    rows = []
    for i in range(num):
        same = [step[i] for step in rec.microsteps if len(step) > i]
        med = {k: statistics.median(m[k] for m in same) * 1e3 for k in ("total_s", "compute_s", "comm_s")}
        row = [str(i), f"{med['total_s']:.1f}", f"{med['compute_s']:.1f}", f"{med['comm_s']:.1f}"]
        if teacher:
            row.append(f"{statistics.median(m.get('phase_s', {}).get('teacher', 0.0) for m in same) * 1e3:.1f}")
        rows.append(row + [_collectives_summary(same[-1]["collectives"])])
    headers = ["micro-step", "total ms", "compute ms", "comm ms"] + (["teacher fwd ms"] if teacher else [])
    return _table(headers + ["collectives (last profiled step)"], rows, markdown)


def summary(records: list[ResultRecord], markdown: bool = False) -> str:
    parts = []
    h = "## " if markdown else ""
    collectives = [r for r in records if r.kind == "collective"]
    records = [r for r in records if r.kind == "training"]
    if collectives:
        parts.append(f"{h}Collectives (nccl-tests semantics; GB/s = 1e9 bytes/s; time = slowest rank)")
        parts.append(collective_table(collectives, markdown))
        parts += [f"{'- ' if markdown else '  '}{r.run_id}: {r.status}: {r.reason}"
                  for r in collectives if r.status != "ok"]
        plots = sorted({r.plot for r in collectives if r.plot})
        parts += [f"![busbw by message size]({name})" if markdown else f"busbw plot: {name}" for name in plots]
    if not records:
        return "\n\n".join(parts) + "\n"
    parts.append(f"{h}Throughput (mode: throughput, nothing instrumented, warm-up excluded)")
    parts.append(throughput_table(records, markdown))
    failed = [r for r in records if r.status != "ok"]
    for r in failed:
        parts.append(f"{'- ' if markdown else '  '}{r.run_id}: {r.status}: {r.reason}")
    parts.append(f"{h}Micro-step breakdown (mode: profile, each collective serialised and timed)")
    for r in records:
        if r.status == "ok":
            z = r.config["zero"]["stage"]
            w = r.config["workload"]
            teacher = (r.flops or {}).get("teacher")
            placement = ("sharded by ZeRO-3" if z == 3 else "replica per rank") if teacher else ""
            parts.append(f"{'### ' if markdown else ''}{r.run_id} (ZeRO-{z}, mb {w['micro_batch_size']} "
                         f"x ga {w['grad_acc_steps']}{', teacher ' + placement if teacher else ''})")
            parts.append(microstep_table(r, markdown))
    return "\n\n".join(parts) + "\n"


# --- verdicts (harness.compare) ------------------------------------------------------------------
# One convention for every change shown: the ratio now / reference of the better-is-higher form
# of the metric (samples/s as measured; step time and memory inverted: reference / now), so that
# below 1x is always worse. Verdict.worse_pct (positive = worse) maps onto it monotonically.
VERDICT_ORDER = ("regression", "status changed", "missing", "insufficient data", "not comparable", "improvement", "new",
                 "pass")
RATIO_LEGEND = ("now/{ref}: the better-is-higher quantity now over {name} (samples/s as is; step time and "
                "memory inverted), so below 1x is worse: step time 1.07 -> 2.56 s is 0.42x (2.39x slower), "
                "samples/s 22 -> 13.8 is 0.63x (1.59x slower); the 95% interval and the tolerance in the same terms")
SHOWN_KEYS = ("zero_stage", "micro_batch_size", "grad_acc_steps", "seq_len")
"""Configuration keys with a column of their own; every other key that tells rows apart is listed in full."""


def _direction(v) -> str:
    """'higher' or 'lower' is better: from the verdict's own numbers where they moved, else the metric."""
    if v.worse_pct and v.value is not None and v.reference:
        return "higher" if (v.value - v.reference) * v.worse_pct < 0 else "lower"
    return next((m[v.metric] for m in REFERENCE_METRICS.values() if v.metric in m), "higher")


def ratio(worse_pct: float, direction: str) -> float:
    """now/ref of the better-is-higher quantity from worse_pct (harness.compare: positive = worse)."""
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
    if r == 1.0 or not math.isfinite(r) or r <= 0:
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
    """The band of now/ref a pass lies in: tolerance 25 % of a step time is [0.80x, 1.33x]."""
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
    text = (f"{_fmt(v.value, 3)}{unit} against {_fmt(v.reference, 3)}{unit}: {change_text(v)}, 95% interval "
            f"{interval_text(v)}, tolerance {tolerance_text(v)}")
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
    return [_fmt(config.get("zero_stage")), f"{_fmt(mb)} x {_fmt(ga)}" if mb is not None or ga is not None else "-",
            _fmt(config.get("seq_len")), " ".join(f"{k}={flat[k]}" for k in varying if k in flat) or "-"]


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


def unrun_line(verdicts: list) -> str:
    """'25 references (5 configurations) of cpu/llama-tiny had no result among these runs (not judged)', or ''."""
    per: dict[str, list] = {}
    for v in unrun(verdicts):
        per.setdefault(f"{v.platform}/{v.benchmark}", []).append(v)
    parts = [f"{len(vs)} reference{'s' if len(vs) != 1 else ''} "
             f"({len({json.dumps(v.config, sort_keys=True) for v in vs})} configurations) of {name}"
             for name, vs in sorted(per.items())]
    return f"{', '.join(parts)} had no result among these runs (not judged)" if parts else ""


def verdict_counts(verdicts: list, missing: str = "summary") -> str:
    """'1 regression, 3 pass', the worst first; unrun references left out unless missing='rows'."""
    judged = verdicts if missing == "rows" else _judged(verdicts)
    counts = Counter(v.verdict for v in judged)
    return ", ".join(f"{counts[k]} {k}" for k in VERDICT_ORDER if counts[k]) or "no verdicts"


def verdict_table(verdicts: list, markdown: bool = False, missing: str = "rows", ref_name: str = "reference") -> str:
    """Verdicts of harness.compare, regressions and status changes first, with attribution.
    missing: 'rows' lists each reference that had no result (the nightly, whose suite planned the
    runs); 'summary' puts them in one line (bench, compare); 'omit' leaves them out."""
    shown = verdicts if missing == "rows" else _judged(verdicts)
    order = {v: i for i, v in enumerate(VERDICT_ORDER)}
    ranked = sorted(shown, key=lambda v: (order.get(v.verdict, 9), v.platform, v.benchmark,
                                          json.dumps(v.config, sort_keys=True, default=str), v.metric))
    varying, common = distinguishing_keys([v.config for v in ranked])
    cells = 4 if varying else 3   # "other config" only when some other key tells rows apart
    rows = [[v.verdict, f"{v.platform}/{v.benchmark}", *config_cells(v.config, varying)[:cells], v.metric,
             _fmt(v.value, 3), _fmt(v.reference, 3), v.unit or "-", change_text(v), interval_text(v),
             f"{v.num_samples}/{v.num_reference_samples}"] for v in ranked]
    ref = "ref" if ref_name == "reference" else ref_name
    text = _table(["verdict", "platform/benchmark", *["ZeRO", "mb x ga", "seq", "other config"][:cells], "metric",
                   "now", ref_name, "unit", f"now/{ref}", "95% interval", f"n now/{ref}"], rows, markdown)
    item = "- " if markdown else "  "
    since = "the reference" if ref == "ref" else ref_name
    lines = [item + RATIO_LEGEND.format(ref=ref, name=since)]
    if common:
        lines.append(f"{item}every row: " + " ".join(f"{k}={val}" for k, val in common.items()))
    if missing == "summary" and unrun_line(verdicts):
        lines.append(f"{item}{unrun_line(verdicts)}")
    apart = Counter(v.reason for v in verdicts if v.verdict == "not comparable")
    lines += [f"{item}{n} verdict{'s' if n > 1 else ''} {reason} (references are per machine)"
              for reason, n in apart.items()]
    for v in ranked:
        if v.verdict in ("regression", "status changed", "insufficient data", "missing"):
            label = config_label(v.config, varying)
            lines.append(f"{item}{v.verdict}: {v.platform}/{v.benchmark} {label + ' ' if label else ''}{v.metric}: "
                         f"{verdict_text(v)}")
        if v.verdict in ("regression", "status changed"):
            lines.append(f"{'  - ' if markdown else '      '}what changed since {since}: "
                         f"{environment_text(v.environment_diff)}")
    return text + "\n\n" + "\n".join(lines)


def environment_text(diff: dict[str, Any]) -> str:
    """{key: [reference, now]} (or {key: note}) as 'nccl: 2.20 -> 2.21; ...'; the suite's commits
    shortened, with the count between: 'suite_commit: a785365c4e -> bcccdb5c49 (40 commits between)'."""
    parts = []
    for k, x in diff.items():
        if k == "suite_commit.commits_between":
            continue
        if k == "suite_commit" and isinstance(x, list) and len(x) == 2:
            between = diff.get("suite_commit.commits_between")
            parts.append(f"{k}: {str(x[0])[:10]} -> {str(x[1])[:10]}"
                         + (f" ({between} commit{'' if between == 1 else 's'} between)" if between is not None else ""))
        else:
            parts.append(f"{k}: {x[0]} -> {x[1]}" if isinstance(x, list) and len(x) == 2 else f"{k}: {x}")
    return "; ".join(parts) or "nothing in the fingerprint"


def load_line(records: list[dict[str, Any]]) -> str:
    """The machine the records ran on and how busy it was: 'ran on AMD EPYC (2 CPUs) (host vm);
    other work during the measured steps: 0.05-1.30 CPUs (median 0.10) over 13 runs'."""
    envs = [r.get("environment") or {} for r in records]
    machines = sorted({machine_of(e) or "an unrecorded machine" for e in envs if e.get("machine")})
    hosts = sorted({h for e in envs for h in (e.get("hosts") or [])})
    other = [l["other_cpus"] for e in envs for l in [e.get("load") or {}] if isinstance(l.get("other_cpus"), (int, float))]
    text = f"ran on {', '.join(machines) or 'an unrecorded machine'}" + (f" (host {', '.join(hosts)})" if hosts else "")
    if other:
        busy = (f"{min(other):.2f}-{max(other):.2f} CPUs (median {statistics.median(other):.2f})"
                if len(other) > 1 else f"{other[0]:.2f} CPUs")
        text += f"; other work during the measured steps: {busy} over {len(other)} record(s)"
    return text


def verdicts_json(verdicts: list) -> str:
    """The verdicts as JSON (compare --json): the reason and the change in the table's terms (the
    numbers as compare() gives them: worse_pct, interval_pct)."""
    return json.dumps([{**v.to_dict(), "reason": verdict_text(v), "change": change_text(v),
                        "interval": interval_text(v), "tolerance": tolerance_text(v)} for v in verdicts], indent=2)
