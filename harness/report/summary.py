"""Terminal progress while runs go, and the summary tables (terminal and Markdown) at the end."""
from __future__ import annotations

import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any, TextIO

from contract import events as ev

from ..held_up import for_peer_s, held_up_s, stragglers, who
from ..probe import summary_line
from ..record import ResultRecord
from ..stack_view import STACK_HEADERS, break_lines, stack_fields, stack_row, stack_words


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


def fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _metric(rec: ResultRecord, name: str) -> Any:
    m = rec.metrics.get(name)
    return m["value"] if m else None


def text_table(headers: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*headers), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*r) for r in rows])


def collective_table(records: list[ResultRecord], markdown: bool = False) -> str:
    headers = ["run", "status", "op", "sizes (B)", "peak busbw GB/s", "avg busbw GB/s", "top sizes GB/s",
               "time <=64K us", "median <=64K us", "p25 <=64K us", "held up <=64K %", "#wrong"]
    rows = []
    for r in records:
        busbw = [p["busbw_gbps"] for row in (r.rows or []) for p in (row["out_of_place"], row["in_place"]) if p]
        wrong = sum(p["num_wrong"] or 0 for row in (r.rows or [])
                    for p in (row["out_of_place"], row["in_place"]) if p)
        span = f"{r.rows[0]['size_bytes']}..{r.rows[-1]['size_bytes']}" if r.rows else "-"
        rows.append([r.run_id, r.status, r.benchmark, span, fmt(max(busbw) if busbw else None, 3),
                     fmt(_metric(r, "avg_busbw_gbps"), 3), fmt(_metric(r, "large_busbw_gbps"), 3),
                     fmt(_metric(r, "small_time_us"), 1),
                     fmt(_metric(r, "small_median_us"), 1), fmt(_metric(r, "small_p25_us"), 1),
                     fmt(_metric(r, "small_stalled_pct"), 0), str(wrong)])
    return text_table(headers, rows, markdown)


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
                     f"{w['micro_batch_size']} x {w['grad_acc_steps']}", fmt(w.get("seq_len")),
                     fmt(_metric(r, "samples_per_s")), fmt(_metric(r, "tokens_per_s"), 0),
                     fmt(_metric(r, "tokens_per_s_per_device"), 0), step,
                     fmt(_metric(r, "peak_mem_gib")), fmt(_metric(r, "mfu_pct"))])
        if distilled:
            rows[-1] += [fmt(_metric(r, "teacher_mem_gib"), 3), fmt(_metric(r, "mfu_with_teacher_pct"))]
    return text_table(headers, rows, markdown)


def _collectives_summary(collectives: list[dict]) -> str:
    per_op: Counter = Counter()
    size: Counter = Counter()
    for c in collectives:  # a distillation teacher's collectives are counted apart
        op = f"teacher {c['op']}" if c.get("phase") == "teacher" else c["op"]
        per_op[op] += 1
        size[op] += c["bytes"]
    return ", ".join(f"{op} x{n} {size[op] / 1e6:.2f} MB" for op, n in per_op.most_common()) or "none"


def microstep_table(rec: ResultRecord, markdown: bool = False) -> str:
    """Median over profiled steps of each micro-step's total/compute/comm, the part of its comm that was waiting
    (harness/held_up.py), with its collectives."""
    if not rec.microsteps:
        return "(no profiled steps)"
    num = len(rec.microsteps[0])
    teacher = any("teacher" in m.get("phase_s", {}) for step in rec.microsteps for m in step)
    waits, peer = held_up_s(rec.microsteps), for_peer_s(rec.microsteps)
    rows = []
    for i in range(num):
        same = [step[i] for step in rec.microsteps if len(step) > i]
        med = {k: statistics.median(m[k] for m in same) * 1e3 for k in ("total_s", "compute_s", "comm_s")}
        row = [str(i), f"{med['total_s']:.1f}", f"{med['compute_s']:.1f}", f"{med['comm_s']:.1f}"]
        row += [f"{statistics.median(w[i] for w in each if len(w) > i) * 1e3:.1f}" for each in (waits, peer) if each]
        if teacher:
            row.append(f"{statistics.median(m.get('phase_s', {}).get('teacher', 0.0) for m in same) * 1e3:.1f}")
        rows.append(row + [_collectives_summary(same[-1]["collectives"])])
    headers = (["micro-step", "total ms", "compute ms", "comm ms", "held up ms"] + (["for a peer ms"] if peer else [])
               + (["teacher fwd ms"] if teacher else []))
    table = text_table(headers + ["collectives (last profiled step)"], rows, markdown)
    return "\n".join([table, *("\n" * markdown + line for line in straggler_lines(rec, markdown))])


def straggler_lines(rec: ResultRecord, markdown: bool = False) -> list[str]:
    """Which rank came last to the profiled calls and how long it held the others back (harness/held_up.py
    stragglers): the slowest ranks first, at most four; then the nodes the same way where the run spanned hosts."""
    out = []
    for per, noun in (("ranks", "ranks"), ("hosts", "nodes")):
        found = stragglers(rec.steps, per)
        if not found or not found[0]["calls"]:
            continue
        each = [f"{who(r)} {100 * r['last_calls'] / r['calls']:.0f} % of calls, {r['held_back_s'] * 1e3:.1f} ms"
                for r in found[:4]]
        out.append(f"{'- ' if markdown else '  '}{'last' if per == 'ranks' else 'the node last'} to reach the "
                   f"profiled calls ({found[0]['calls']}), and how long it held the others back: " + "; ".join(each)
                   + (f"; {len(found) - 4} more {noun}" if len(found) > 4 else ""))
    return out


def probe_lines(records: list[ResultRecord]) -> list[str]:
    """The capability probe of each machine the records ran on, one line each (harness/probe.py)."""
    lines = [summary_line(r.environment) for r in records]
    return list(dict.fromkeys(line for line in lines if line))


def stack_section(records: list[ResultRecord], markdown: bool = False) -> list[str]:
    """The runs away from the eager stack (compiled, Liger, FP8, an SDPA backend asked): compile seconds and what
    the compilers' caches gave, graph breaks (each with where it happened), recompilations, the SDPA backend
    that ran. Nothing for an all-eager suite."""
    stacked = [(r, stack_fields(r.metrics, r.environment.get("stack"))) for r in records
               if r.status == "ok" and stack_words(r.config["workload"]) != "eager"]
    if not stacked:
        return []
    rows = [stack_row(r.run_id, stack_words(r.config["workload"]), f) for r, f in stacked]
    lead = "- " if markdown else "  "
    return [f"{'## ' if markdown else ''}Training stack (compile s: the warm-up beyond its steady-state steps)",
            text_table(STACK_HEADERS, rows, markdown),
            *[lead + line for r, f in stacked for line in break_lines(r.run_id, f)]]


def summary(records: list[ResultRecord], markdown: bool = False) -> str:
    parts = probe_lines(records)
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
    parts += stack_section(records, markdown)
    parts.append(f"{h}Micro-step breakdown (mode: profile, each collective serialised and timed; held up: calls over 3x "
                 "the lower quartile of their op and size, their time beyond it: waiting, not data moving)")
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


# --- verdicts (harness.verdict.compare) ------------------------------------------------------------------
# One convention for every change shown: the ratio now / reference of the better-is-higher form
# of the metric (samples/s as measured; step time and memory inverted: reference / now), so that
# below 1x is always worse. Verdict.worse_pct (positive = worse) maps onto it monotonically.
