"""A collective's busbw per message size, now against the reference's (`compare --sizes`): the figures
behind a verdict judged by size (harness/verdict/by_size.py), so a team sees which sizes moved. Each size's
time is given too, as nccl-tests prints it for the latency-bound sizes: size x the op's bus factor / busbw
(the key fixes the op and the ranks; a size's busbw is its placements' mean, so this is the time at it). The small
sizes' time judged by size (shared_small_time_us, small_time_us) shows each size's time as measured."""
from __future__ import annotations

from typing import Any, Optional

from ..collectives import busbw_factor
from ..verdict.by_size import size_text
from .legend import config_key
from .summary import text_table
from .verdicts import _x


def time_us(size_bytes: int, busbw_gbps: float, factor: Optional[float]) -> str:
    """'14.63', '17,640': four significant digits, whole microseconds from 1,000 on (no exponents)."""
    if not factor or busbw_gbps <= 0:
        return "-"
    return _us(size_bytes * factor / (busbw_gbps * 1e3))


def _us(t: float) -> str:
    return f"{t:,.0f}" if t >= 1000 else f"{t:.4g}"


def _factor(v: Any) -> Optional[float]:
    ranks = (v.config or {}).get("num_ranks")
    try:
        return busbw_factor(v.benchmark, ranks) if isinstance(ranks, int) and ranks > 1 else None
    except ValueError:   # not an op the suite knows
        return None


def timed(v: Any) -> bool:
    """A verdict's sizes are times (the small sizes': harness/verdict/by_size.py time_by_size), not busbw."""
    return bool(v.sizes) and "now_us" in v.sizes[0]


def size_rows(v: Any, ref_name: str = "reference") -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of one verdict's sizes: size, busbw now and the reference's, now/ref, time now and the
    reference's; of the small sizes' time: size, time now and the reference's, now/ref (the faster-is-higher
    ratio, as every now/ref: the reference's time over now's)."""
    if timed(v):
        return ["size", "time us now", ref_name, f"now/{ref_name}"], [
            [size_text(f["size_bytes"]), _us(f["now_us"]), _us(f["reference_us"]),
             _x(f["reference_us"] / f["now_us"]) if f["now_us"] > 0 else "-"] for f in v.sizes]
    factor = _factor(v)
    rows = [[size_text(f["size_bytes"]), f"{f['now_gbps']:.4g}", f"{f['reference_gbps']:.4g}",
             _x(f["now_gbps"] / f["reference_gbps"]) if f["reference_gbps"] > 0 else "-",
             time_us(f["size_bytes"], f["now_gbps"], factor), time_us(f["size_bytes"], f["reference_gbps"], factor)]
            for f in v.sizes or []]
    return ["size", "busbw GB/s now", ref_name, f"now/{ref_name}", "time us now", ref_name], rows


def shown(verdicts: list, only: Optional[tuple[str, ...]] = None) -> list:
    """The verdicts whose sizes are shown (of the verdicts in `only`, where given): one per configuration and
    kind of figure (busbw, the small sizes' time), as one judged on both bandwidth metrics shows once."""
    out, seen = [], set()
    for v in verdicts:
        key = (config_key(v.platform, v.benchmark, v.config), timed(v))
        if v.sizes and key not in seen and (only is None or v.verdict in only):
            seen.add(key)
            out.append(v)
    return out


def heading(v: Any) -> str:
    config = " ".join(f"{k}={val}" for k, val in sorted(v.config.items()))
    return f"{v.platform}/{v.benchmark} ({config}): {v.verdict} on {v.metric}; by message size"


def size_tables(verdicts: list, ref_name: str = "reference", markdown: bool = False,
                only: Optional[tuple[str, ...]] = None) -> str:
    """One table per verdict shown (`shown`); '' when none is."""
    blocks = []
    for v in shown(verdicts, only):
        headers, rows = size_rows(v, ref_name)
        blocks.append(("**" + heading(v) + "**\n\n" if markdown else heading(v) + "\n")
                      + text_table(headers, rows, markdown=markdown))
    return "\n\n".join(blocks)


CHANGED = ("regression", "improvement")
"""The verdicts a report shows by message size under its table: what moved."""


def under_table(table: str, verdicts: list, ref_name: str) -> str:
    """A Markdown verdict table with, under it, each collective regression or improvement by message size
    (bench's compare.md, the nightly's nightly.md)."""
    sizes = size_tables(verdicts, ref_name, markdown=True, only=CHANGED)
    return f"{table}\n\n{sizes}" if sizes else table
