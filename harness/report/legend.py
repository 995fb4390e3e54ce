"""What lets a verdict table fit 120 columns: rows name their configuration by a short label (c1,
c2, ...) whose full configuration is said once below the table, a set of rows is named in a few
words ('all 29 rows', 'c1-c3, c5 (18 rows)', 'c4 avg_busbw_gbps'), and the text below the table is
wrapped to the width."""
from __future__ import annotations

import json
import re
import textwrap
from typing import Any, Callable, Sequence, TypeVar

WIDTH = 120
"""Columns a terminal table and its notes fit (STYLE.md, "What a person reads")."""

T = TypeVar("T")


def config_key(platform: str, benchmark: str, config: Any) -> str:
    """One configuration of one benchmark, as a key (JSON, so that a configuration with lists still is one)."""
    return json.dumps([platform, benchmark, config or {}], sort_keys=True, default=str)


def config_labels(keys: Sequence[str]) -> dict[str, str]:
    """{config_key: 'c1'}: c1, c2, ... in the order the keys first appear."""
    return {k: f"c{i}" for i, k in enumerate(dict.fromkeys(keys), start=1)}


def grouped(items: Sequence[T], key: Callable[[T], Any]) -> list[tuple[Any, list[T]]]:
    """[(key, items with that key)] in the order each key first appears."""
    groups: dict[Any, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return list(groups.items())


def _number(label: str) -> int:
    return int(label[1:]) if re.fullmatch(r"c\d+", label) else -1


def _labels_text(labels: list[str]) -> str:
    """'c1-c3, c5': runs of consecutive labels as ranges."""
    runs: list[list[str]] = []
    for label in labels:
        if runs and _number(label) == _number(runs[-1][-1]) + 1 >= 1:
            runs[-1].append(label)
        else:
            runs.append([label])
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _by(rows: list[int], scope: list[int], key: Sequence[str], other: Sequence[str], ranges: bool) -> tuple[str, bool]:
    """(the rows by `key`, a label or a metric: the key alone when every row of it in scope is one
    of them, else the key with the `other` of its rows: 'c1-c3, c5 (mfu_pct, samples_per_s)';
    whether every key stands alone, so that the text does not count its rows)."""
    parts, full, alone = [], [], True
    order = list(dict.fromkeys(key[i] for i in rows))
    if ranges:
        order.sort(key=_number)
    for k in order:
        mine = [i for i in rows if key[i] == k]
        if len(mine) == sum(key[i] == k for i in scope):
            full.append(k)
            continue
        if full:
            parts.append(_labels_text(full) if ranges else ", ".join(full))
            full = []
        alone = False
        others = list(dict.fromkeys(other[i] for i in mine))
        parts.append(f"{k} ({', '.join(others) if ranges else _labels_text(others)})")
    if full:
        parts.append(_labels_text(full) if ranges else ", ".join(full))
    return ", ".join(parts), alone


def rows_text(rows: list[int], scope: list[int], labels: Sequence[str], metrics: Sequence[str],
              by_metric: bool = False) -> str:
    """A set of table rows (indices) in a few words, among the rows of `scope` (those it could have
    been): 'all 29 rows', 'c4 avg_busbw_gbps' (one row), else by configuration ('c1-c3, c5 (18
    rows)') or, by_metric or when that takes less than half the words, by metric ('step_time_s (6 rows)')."""
    if len(rows) == 1 and not by_metric:
        return f"{labels[rows[0]]} {metrics[rows[0]]}"
    if set(rows) == set(scope):
        return f"all {len(rows)} rows"
    by_label = _by(rows, scope, labels, metrics, ranges=True)
    by_metrics = _by(rows, scope, metrics, labels, ranges=False)
    text, alone = by_metrics if by_metric or 2 * len(by_metrics[0]) < len(by_label[0]) else by_label
    return f"{text} ({len(rows)} row{'s' if len(rows) > 1 else ''})" if alone else text


def wrap(text: str, first: str, rest: str, width: int = WIDTH) -> list[str]:
    """text in lines of at most `width` columns, the first after `first` and the others after
    `rest`; broken after '; ' or before a 'key: ' where it can (an environment difference stays
    whole), else at spaces."""
    out: list[str] = []
    line, fresh = first, True
    for part in re.split(r"(?<=; )|(?<=: )(?=[^\s:;]+: )", text):   # after '; ' and before 'key: '
        need = len(part.rstrip())
        if len(line) + need <= width:
            line, fresh = line + part, False
            continue
        if not fresh and (len(rest) + need <= width or len(line) > width - 20):  # a new line, or no room left
            out.append(line.rstrip())
            line, fresh = rest, True
            if len(line) + need <= width:
                line, fresh = line + part, False
                continue
        pieces = textwrap.wrap(part, width=width, initial_indent=line, subsequent_indent=rest, break_on_hyphens=False)
        out += pieces[:-1]
        line, fresh = (pieces[-1] if pieces else line) + (" " if part.endswith(" ") else ""), False
    out.append(line.rstrip())
    return out


def item(text: str, markdown: bool, level: int = 0) -> list[str]:
    """One note below a table: a Markdown list item, or on the terminal indented and wrapped to WIDTH."""
    if markdown:
        return [f"{'  ' * level}- {text}"]
    return wrap(text, "  " + "    " * level, "      " + "    " * level)


def legend_lines(labels: dict[str, str], texts: dict[str, str], common: str, markdown: bool) -> list[str]:
    """'c1  cpu/llama-tiny ZeRO-2 ...' per label, then the keys every configuration shares once."""
    width = max((len(label) for label in labels.values()), default=0)
    lines: list[str] = []
    for key, label in sorted(labels.items(), key=lambda kv: _number(kv[1])):
        if markdown:
            lines.append(f"- {label}: {texts[key]}")
        else:
            lines += wrap(texts[key], f"  {label:<{width}}  ", " " * (width + 4))
    if common:
        lines += item(f"every configuration: {common}", markdown)
    return lines
