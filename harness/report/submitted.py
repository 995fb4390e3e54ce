"""What a submission did, as a person reads it: one line saying where the references went, how many, of how many
configurations and runs, measured on which machine; then a row per reference (its action, its configuration's label,
metric, value and unit, the runs it is the median of, and the machine whose reference of the same key the table
keeps beside it, m1, m2, ... named below where there are several), the configurations said once below, as the
verdict tables do (report/legend.py). Three default-cpu suites submitted to a table of another machine's were 59
lines of 200-400 characters, each repeating its configuration, machine and file."""
from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from .legend import config_key, config_labels, item, legend_lines, wrap
from .summary import text_table
from .verdicts import config_label, config_order, distinguishing_keys, value_text


def submitted_table(changes: Sequence[Any]) -> str:
    """changes: harness.verdict.submit.Change (action, reference, path, beside), in the order submit made them."""
    if not changes:
        return "nothing submitted"
    refs = [c.reference for c in changes]
    keys = [config_key(r.platform, r.benchmark, r.config) for r in refs]
    order = sorted(range(len(changes)), key=lambda i: (config_order(refs[i]), refs[i].metric))
    labels = config_labels([keys[i] for i in order])
    paths = sorted({str(c.path) for c in changes})
    machines = sorted({r.machine() for r in refs})
    runs = sorted({r.num_samples for r in refs})
    actions = Counter(c.action for c in changes)
    alongside = sum(1 for c in changes if c.beside)
    counts = ", ".join(f"{n} {action}" for action, n in actions.items())
    if alongside:
        counts += f"; {alongside} beside another machine's reference of its key, {len(changes) - alongside} not"
    head = (f"{', '.join(paths)}: {len(changes)} reference{'s' if len(changes) != 1 else ''} of {len(labels)} "
            f"configuration{'s' if len(labels) != 1 else ''} ({counts}), each the median of "
            f"{' or '.join(map(str, runs))} runs, measured on {'; '.join(machines)}")
    beside = any(c.beside for c in changes)
    others = sorted({m for c in changes for m in c.beside})   # more than one: each a label, named below
    short = {m: f"m{n}" for n, m in enumerate(others, start=1)} if len(others) > 1 else {m: m for m in others}
    headers = ["action", "cfg", "metric", "value", "unit", "n", *(["beside the reference of"] if beside else [])]
    rows = [[changes[i].action, labels[keys[i]], refs[i].metric, value_text(refs[i].value, refs[i].unit),
             refs[i].unit or "-", str(refs[i].num_samples),
             *([", ".join(short[m] for m in changes[i].beside) or "-"] if beside else [])]
            for i in order]
    varying, common = distinguishing_keys([r.config or {} for r in refs])
    texts = {k: f"{r.platform}/{r.benchmark} {config_label(r.config or {}, varying)}".strip() for k, r in zip(keys, refs)}
    lines = legend_lines(labels, texts, " ".join(f"{k}={v}" for k, v in common.items()), False)
    if beside:
        lines += [line for m in others if short[m] != m for line in item(f"{short[m]}: {m}", False)]
        lines += item("beside: the table keeps that machine's reference of the same key too, and each machine's "
                      "judges its own runs; -: a key the table had no reference of on any machine", False)
    return "\n".join([*wrap(head, "", "    "), "", text_table(headers, rows, False), "", *lines])
