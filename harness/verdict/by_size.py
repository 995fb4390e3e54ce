"""Collectives judged message size by message size, over the sizes both sides ran.

nccl-tests' "Avg bus bandwidth" is the mean busbw over the sizes of one sweep, so it means something
only against a sweep of the same -b/-e/-f: an acceptance log of `-b 8 -e 8G` and a nightly's 1 KiB-256 MiB
sweep share 19 sizes but no average. The metric SHARED (`shared_busbw_gbps`) is that average taken over
the sizes both sides ran: its reference (references.references_from_records) is keyed without the
range (`sizeless`) and keeps every run's busbw per size (`Reference.by_size`); `restrict` makes of it,
for the runs at hand, a reference of the shared sizes alone, which compare.judge judges as any other
(bootstrap over runs, tolerance, pace, machines apart). It judges only where no reference of the run's
own range applies (compare.judge): a sweep of the same range keeps its avg_busbw_gbps verdict.

A size's busbw is the mean over its placements (out-of-place, in-place), as nccl-tests' average takes
them. The average weighs the bandwidth-bound sizes: a latency change at the small ones shows in the
reason's spread and in `compare --sizes` (each size's time), and is judged by SMALL (`small_time_us`, the
mean time of the sizes up to 64 KiB) against a sweep of the same range; against another range, by SHARED_SMALL
(`shared_small_time_us`): the same mean over the small sizes both ran, from a by-size reference that keeps each
run's time per size (a text output prints a small size's busbw as 0.00, its time in full). On gloo that time is noisy: three back-to-back cpu-short sweeps on the 2-core AVX-512 EPYC read each
size's time 1.2-5.3x apart (a 1 KiB broadcast 148-699 us), the largest sizes' 1.2-1.7x. Sizes are compared as printed: the key's ranks and dtype fix nccl-tests' rounding, and its
source keeps the built-in sweep's sizes from nccl-tests'.
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any, NamedTuple, Optional

from ..collectives import SMALL_BYTES, size_label
from ..record import ResultRecord

SHARED = "shared_busbw_gbps"
AVERAGE = "avg_busbw_gbps"
LARGE = "large_busbw_gbps"
"""The largest sizes' busbw, keyed by the sweep's range as the average (harness/collectives.py large_busbw_gbps); no
by-size counterpart of its own: another range's reference judges the sizes both ran (shared_busbw_gbps)."""
SMALL = "small_time_us"
"""The small sizes' time, keyed by the sweep's range as the average (harness/collectives.py small_time_us)."""
SMALL_MEDIAN = "small_median_us"
"""The small sizes' median call, keyed by the sweep's range too; no by-size counterpart (another range's reference
judges no median)."""
SMALL_P25 = "small_p25_us"
"""Their lower quartile call, keyed by the sweep's range as the median; no by-size counterpart either."""
SHARED_SMALL = "shared_small_time_us"
"""SMALL over the sizes up to SMALL_BYTES a run shares with a by-size reference of each run's time per size."""
BY_SIZE = {SHARED: AVERAGE, SHARED_SMALL: SMALL}
"""Each by-size metric and the metric of one range it stands in for where the ranges differ."""
RANGE_KEYS = ("min_bytes", "max_bytes")


def sizeless(config: dict[str, Any]) -> dict[str, Any]:
    """A collective's configuration key without its size range: what a SHARED reference is keyed on."""
    return {k: v for k, v in config.items() if k not in RANGE_KEYS}


def busbw_by_size(record: ResultRecord) -> dict[int, float]:
    """{size in bytes: busbw in GB/s, the mean of its placements'} of a record's rows with a bandwidth."""
    out: dict[int, float] = {}
    for row in record.rows or []:
        if not isinstance(row, dict) or not isinstance(row.get("size_bytes"), int):
            continue
        values = [p["busbw_gbps"] for p in (row.get("out_of_place"), row.get("in_place"))
                  if isinstance(p, dict) and isinstance(p.get("busbw_gbps"), (int, float))]
        if values:
            out[row["size_bytes"]] = sum(values) / len(values)
    return out


def time_by_size(record: ResultRecord) -> dict[int, float]:
    """{size in bytes: time in us, the mean of its placements'} of a record's rows from 1 B to SMALL_BYTES, the
    placements small_time_us takes (those with a bandwidth: a one-rank smoke sweep's have none)."""
    out: dict[int, float] = {}
    for row in record.rows or []:
        if not isinstance(row, dict) or not isinstance(row.get("size_bytes"), int) \
                or not 0 < row["size_bytes"] <= SMALL_BYTES:
            continue
        values = [p["time_us"] for p in (row.get("out_of_place"), row.get("in_place"))
                  if isinstance(p, dict) and isinstance(p.get("time_us"), (int, float))
                  and isinstance(p.get("busbw_gbps"), (int, float))]
        if values:
            out[row["size_bytes"]] = sum(values) / len(values)
    return out


PER_SIZE = {SHARED: (busbw_by_size, "busbw", "gbps"), SHARED_SMALL: (time_by_size, "time", "us")}
"""Per by-size metric: what a run's rows give per size, its word in a reason, the suffix of its figures' keys."""


def as_stored(sizes: dict[int, float]) -> dict[str, float]:
    """A run's sizes as a reference file keeps them (JSON keys are strings)."""
    return {str(s): v for s, v in sorted(sizes.items())}


def as_read(sizes: dict[str, float]) -> dict[int, float]:
    return {int(s): v for s, v in sizes.items()}


def size_text(size: int) -> str:
    """'64K', '1M', '8' for a power-of-two multiple of 1024 (nccl-tests' -b/-e style), else '1020 B'."""
    return size_label(size) if size < 1024 or size % 1024 == 0 else f"{size} B"


def span_text(sizes: list[int]) -> str:
    """'19 sizes (1K-256M)' / 'one size (64K)' / 'no size'."""
    if not sizes:
        return "no size"
    if len(sizes) == 1:
        return f"one size ({size_text(sizes[0])})"
    return f"{len(sizes)} sizes ({size_text(min(sizes))}-{size_text(max(sizes))})"


def _mean(sizes: dict[int, float], shared: list[int]) -> float:
    return sum(sizes[s] for s in shared) / len(shared)


class Narrowed(NamedTuple):
    reference: Optional[Any]
    """The reference over the sizes every run of both sides has (None: they share no size)."""
    samples: list[float]
    """This side's runs, each its mean over those sizes."""
    words: str
    """Which sizes, and where the two differ most; or why none is shared ('' where the runs have no size the
    metric takes: a sweep from 1 MiB has no small size to judge)."""
    sizes: list[dict[str, Any]]
    """Per shared size: {size_bytes, now_gbps, reference_gbps} (busbw), {size_bytes, now_us, reference_us}
    (time); each side's median over its runs."""


def restrict(ref: Any, records: list[ResultRecord]) -> Narrowed:
    """A by-size reference (SHARED, SHARED_SMALL) narrowed to what the runs at hand share with it (see Narrowed)."""
    of, word, unit = PER_SIZE[ref.metric]
    now = [of(r) for r in records]
    then = [as_read(d) for d in ref.by_size]
    shared = sorted(set.intersection(*(set(d) for d in now + then))) if now and then else []
    if not shared:
        ours = sorted(set().union(*now)) if now else []
        theirs = sorted(set().union(*then)) if then else []
        if not ours and ref.metric == SHARED_SMALL:
            return Narrowed(None, [], "", [])
        upto = f" up to {size_text(SMALL_BYTES)}" if ref.metric == SHARED_SMALL else ""
        return Narrowed(None, [], (f"no message size{upto} that both ran: this run's {span_text(ours)}, "
                                   f"the reference's {span_text(theirs)}"), [])
    samples = [_mean(d, shared) for d in now]
    ref_samples = tuple(_mean(d, shared) for d in then)
    narrowed = replace(ref, value=statistics.median(ref_samples), samples=ref_samples)
    sizes = [{"size_bytes": s, f"now_{unit}": statistics.median(d[s] for d in now),
              f"reference_{unit}": statistics.median(d[s] for d in then)} for s in shared]
    ratios = {f["size_bytes"]: f[f"now_{unit}"] / f[f"reference_{unit}"] for f in sizes if f[f"reference_{unit}"] > 0}
    words = f"over the {span_text(shared)} both ran"
    low, high = (min(ratios, key=ratios.get), max(ratios, key=ratios.get)) if ratios else (None, None)
    if low is not None and f"{ratios[low]:.2f}" != f"{ratios[high]:.2f}":
        words += (f", {word} from {ratios[low]:.2f}x the reference's at {size_text(low)} "
                  f"to {ratios[high]:.2f}x at {size_text(high)}")
    elif low is not None:
        words += f", {word} {ratios[low]:.2f}x the reference's at {'each' if len(ratios) > 1 else 'that'} size"
    return Narrowed(narrowed, samples, words, sizes)
