"""Collective benchmark results in nccl-tests' terms: rows, bandwidths, its column layout.

Definitions follow nccl-tests (doc/PERFORMANCE.md):
- algbw = size / time, GB/s with GB = 1e9 bytes; `size` is the total buffer (nccl-tests' S:
  an all-gather's output, a reduce-scatter's input).
- busbw = algbw x factor: 2(n-1)/n for all_reduce; (n-1)/n for all_gather, reduce_scatter and
  all_to_all; 1 for broadcast, reduce and sendrecv (n ranks).
- time is the slowest rank's average time per iteration, in microseconds. Where each call blocks (the
  built-in sweep on cpu) the slowest rank's median call, lower quartile and share of calls held up are kept
  beside it (median_us, p25_us, stalled_pct: contract/collectives.py call_figures; nccl-tests has none).
- "Avg bus bandwidth" is the mean busbw over every row and placement reported.

On one rank there is no bus: a built-in sweep there is a smoke run (SMOKE_REASON), every op once
through the real backend with the correctness check; its placements carry time and #wrong and
no bandwidth (algbw and busbw None, never 0).
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Optional

from contract.collectives import LARGE_SPAN, OPS, SMALL_BYTES

SMOKE_REASON = "one rank: no bus bandwidth can be measured"
_PREFIXES = ("", "K", "M", "G", "T", "P")


def busbw_factor(op: str, num_ranks: int) -> float:
    """nccl-tests' bus-bandwidth factor for an op over num_ranks ranks."""
    n = num_ranks
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "sendrecv"):
        return 1.0
    raise ValueError(f"unknown collective {op!r}; valid: {', '.join(OPS)}")


def algbw_gbps(size_bytes: int, time_us: float) -> float:
    return size_bytes / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0


PER_CALL = ("median_us", "p25_us", "stalled_pct")
"""A placement's figures of its calls timed one by one, where a call blocks (the built-in sweep on cpu)."""


@dataclass
class Placement:
    """One placement (out-of-place or in-place) of one size: nccl-tests' time/algbw/busbw/#wrong."""
    time_us: float
    algbw_gbps: Optional[float]
    """None in a smoke run (one rank): no bandwidth is claimed."""
    busbw_gbps: Optional[float]
    """None in a smoke run (one rank): no bandwidth is claimed."""
    num_wrong: Optional[int]
    """Elements that failed the correctness check; None when the check was off (nccl-tests 'N/A')."""
    median_us: Optional[float] = None
    """The slowest rank's median time of one call, each timed on its own: where a call returns when it is done
    (the built-in sweep on cpu); None elsewhere (a GPU's calls are timed together, as nccl-tests times them)."""
    p25_us: Optional[float] = None
    """The slowest rank's lower quartile of the same calls: a call the scheduler did not hold up while fewer than
    three in four were (contract/collectives.py call_figures). None where median_us is, and in records made before."""
    stalled_pct: Optional[float] = None
    """The largest share, over the ranks, of those calls held up (over STALL_FACTOR times the rank's lower
    quartile), %. None where p25_us is."""

    @classmethod
    def measured(cls, op: str, size_bytes: int, time_us: float, num_ranks: int,
                 num_wrong: Optional[int], median_us: Optional[float] = None, p25_us: Optional[float] = None,
                 stalled_pct: Optional[float] = None) -> "Placement":
        alg = algbw_gbps(size_bytes, time_us)
        return cls(time_us, alg, alg * busbw_factor(op, num_ranks), num_wrong, median_us, p25_us, stalled_pct)

    def to_dict(self) -> dict[str, Any]:
        """Its fields, the per-call figures only where they were measured."""
        d = asdict(self)
        for key in PER_CALL:
            if d[key] is None:
                del d[key]
        return d

    @classmethod
    def smoke(cls, time_us: float, num_wrong: Optional[int]) -> "Placement":
        """A one-rank placement: its time and #wrong, no bandwidth (SMOKE_REASON)."""
        return cls(time_us, None, None, num_wrong)


@dataclass
class Row:
    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int
    out_of_place: Placement
    in_place: Optional[Placement]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["out_of_place"] = self.out_of_place.to_dict()
        d["in_place"] = self.in_place.to_dict() if self.in_place else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Row":
        ip = d.get("in_place")
        return cls(d["size_bytes"], d["count"], d["dtype"], d["redop"], d["root"],
                   Placement(**d["out_of_place"]), Placement(**ip) if ip else None)


def measured_placements(r: Row) -> list[Placement]:
    """A row's placements that carry a bandwidth (a smoke run's have none): what every figure below averages."""
    return [p for p in (r.out_of_place, r.in_place) if p is not None and p.busbw_gbps is not None]


def avg_busbw_gbps(rows: list[Row]) -> float:
    """nccl-tests' "Avg bus bandwidth": mean busbw over every row and placement (placements without
    a bandwidth, a smoke run's, are not averaged)."""
    values = [p.busbw_gbps for r in rows for p in measured_placements(r)]
    return sum(values) / len(values) if values else 0.0


def large_busbw_gbps(rows: list[Row]) -> Optional[float]:
    """The mean busbw over the placements of the sweep's largest sizes (from 1/LARGE_SPAN of its largest up) that
    have a bandwidth: what the link carries. Across the emulated cluster's shaped link it held within 1.08x over 13
    sweeps where the average spread 1.54x, and a link at 3/4 of its rate read 0.75x (docs/collectives.md).
    None where no row has a bandwidth."""
    values = [p.busbw_gbps for r in large_rows(rows) for p in measured_placements(r)]
    return sum(values) / len(values) if values else None


def large_rows(rows: list[Row]) -> list[Row]:
    """The rows large_busbw_gbps averages: those with a bandwidth, from 1/LARGE_SPAN of the largest such size up."""
    sized = [r for r in rows if measured_placements(r)]
    top = max((r.size_bytes for r in sized), default=0)
    return [r for r in sized if r.size_bytes * LARGE_SPAN >= top]


def small_time_us(rows: list[Row]) -> Optional[float]:
    """The mean time per call, us, over the placements of the sweep's sizes from 1 B to SMALL_BYTES that have a
    bandwidth (a smoke run's have none): the latency the average busbw cannot show, since it weighs the
    bandwidth-bound sizes (a protocol turned off, a slower launch path). None where the sweep has no such size."""
    values = [p.time_us for p in small_placements(rows)]
    return sum(values) / len(values) if values else None


def small_placements(rows: list[Row]) -> list[Placement]:
    """The placements of the sweep's sizes from 1 B to SMALL_BYTES that have a bandwidth: what each small_* figure
    takes."""
    return [p for r in rows if 0 < r.size_bytes <= SMALL_BYTES for p in measured_placements(r)]


def _per_call(rows: list[Row], field: str) -> Optional[list[float]]:
    """Each small placement's per-call figure `field` (PER_CALL); None unless every one has it."""
    values = [getattr(p, field) for p in small_placements(rows)]
    return values if values and None not in values else None


def small_median_us(rows: list[Row]) -> Optional[float]:
    """The median, over the placements small_time_us takes, of each one's median call (Placement.median_us): the
    small sizes' latency without the heavy tail a busy or virtual host adds to some calls, and to all calls of
    a placement now and then (a 2-core VM's 4 ms scheduler ticks: one placement's median read 2.4 ms among
    others' 0.4-0.5). A change of one size alone moves small_time_us, not this. None unless every such
    placement has a median."""
    values = _per_call(rows, "median_us")
    return statistics.median(values) if values else None


def small_p25_us(rows: list[Row]) -> Optional[float]:
    """The median, over the placements small_time_us takes, of each one's lower quartile (Placement.p25_us): the
    small sizes' latency of a call the host did not hold up. Where gloo's event loop holds a call up for a
    scheduler tick in 11-46 % of a sweep's small calls (up to 62 % of one placement's), the median flips to the
    held-up mode: over 10 sweeps on the Zen 5 box all_reduce's small_median_us read 266-1,786 us (6.7x), this
    219-307 (1.40x) (docs/collectives.md). None unless every such placement has one (records made before it, a
    GPU's)."""
    values = _per_call(rows, "p25_us")
    return statistics.median(values) if values else None


def small_stalled_pct(rows: list[Row]) -> Optional[float]:
    """The mean, over the same placements, of each one's share of calls held up (Placement.stalled_pct), %: how often
    this host held a small call up, which small_time_us carries and small_p25_us leaves out. None as small_p25_us."""
    values = _per_call(rows, "stalled_pct")
    return sum(values) / len(values) if values else None


def _placement_cols(p: Optional[Placement]) -> str:
    if p is None:
        return f"{'':>10} {'':>8} {'':>8} {'':>6}"
    wrong = "N/A" if p.num_wrong is None else str(p.num_wrong)
    alg, bus = (f"{x:>8.2f}" if x is not None else f"{'-':>8}" for x in (p.algbw_gbps, p.busbw_gbps))
    return f"{p.time_us:>10.2f} {alg} {bus} {wrong:>6}"


def format_table(op: str, rows: list[Row], num_ranks: int) -> str:
    """Rows in nccl-tests' (newer) column layout, with its "Avg bus bandwidth" footer."""
    head = (f"# Collective test: {op}  (nranks {num_ranks})\n"
            f"#{'':>50}{'out-of-place':^36}{'in-place':^36}\n"
            f"#{'size':>11} {'count':>12} {'type':>8} {'redop':>6} {'root':>6} "
            f"{'time':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>6} "
            f"{'time':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>6}\n"
            f"#{'(B)':>11} {'(elements)':>12} {'':>8} {'':>6} {'':>6} "
            f"{'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8} {'':>6} {'(us)':>10} {'(GB/s)':>8} {'(GB/s)':>8}")
    lines = [head]
    for r in rows:
        lines.append(f" {r.size_bytes:>11} {r.count:>12} {r.dtype:>8} {r.redop:>6} {r.root:>6} "
                     f"{_placement_cols(r.out_of_place)} {_placement_cols(r.in_place)}")
    wrong = sum((p.num_wrong or 0) for r in rows for p in (r.out_of_place, r.in_place) if p)
    lines.append(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    placements = [p for r in rows for p in (r.out_of_place, r.in_place) if p is not None]
    if placements and all(p.busbw_gbps is None for p in placements):  # a smoke run: no bandwidth
        lines.append("# Avg bus bandwidth    : N/A (no bandwidth measured)")
    else:
        lines.append(f"# Avg bus bandwidth    : {avg_busbw_gbps(rows):.4g} ")
    return "\n".join(lines)


def sizes(min_bytes: int, max_bytes: int, step_factor: float, step_bytes: int, elem_bytes: int,
          num_ranks: int) -> list[int]:
    """Message sizes from min to max, by a factor (step_bytes == 0) or a step, rounded down to a
    multiple of elem_bytes x num_ranks (every rank's chunk must be whole), as nccl-tests does."""
    unit = elem_bytes * num_ranks
    out: list[int] = []
    size = min_bytes
    while size <= max_bytes:
        rounded = max(unit, size // unit * unit)
        if not out or rounded != out[-1]:
            out.append(rounded)
        size = size + step_bytes if step_bytes > 0 else int(size * step_factor)
    return out


def size_label(size_bytes: int) -> str:
    """Binary sizes as nccl-tests' -b/-e arguments write them: 512 -> '512', 1 << 20 -> '1M'."""
    value, i = float(size_bytes), 0
    while value >= 1024 and i < len(_PREFIXES) - 1:
        value, i = value / 1024, i + 1
    return f"{value:g}{_PREFIXES[i]}"
