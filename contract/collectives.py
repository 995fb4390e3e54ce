"""The collective vocabulary, in nccl-tests' semantics: the ops, the dtypes and reductions a sweep takes
(our names are torch's dtype names), nccl-tests' names for them, element sizes and binaries. The
harness validates and records with it; the ranks (benchmarks/comm/collectives.py) map it onto torch."""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Hashable, Sequence

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "sendrecv")
DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8")
"""The dtypes a sweep (collective.dtype) takes: torch's names."""
REDOPS = ("sum", "prod", "max", "min", "avg")
SMALL_BYTES = 64 * 1024
"""The sizes whose time is the collective's latency, not its bandwidth: up to 64 KiB, where NCCL's LL and LL128
protocols carry a message and a ring's time is its hops' latency (nccl-tests' busbw there is a few GB/s at most)."""
LARGE_SPAN = 8
"""The sweep's largest sizes, from an eighth of its largest up (at 4x steps the top two, at 2x the top four): where a
fabric's bandwidth, not its latency, sets the time. Their busbw is the link's (large_busbw_gbps); nccl-tests'
average over every size also carries the latency-bound ones."""
STALL_FACTOR = 3.0
"""A call timed on its own that took more than this many times its placement's lower quartile was held up
(`call_figures`). On a 2-core box gloo's TCP event loop thread spins on a message whose receive buffer its rank's
worker thread has not posted yet, while that worker waits runnable behind it on the same CPU until the scheduler's
tick (4 ms on the Zen 5 box; perf sched: the loop thread ran 3.75 ms unbroken while the worker waited as long and
the other CPU idled). Such calls took 10-40x the unheld ones there (90-400 us), the fast calls' own spread is
under 2.3x (docs/collectives.md, "Calls held up by the scheduler's tick")."""
NCCL_TYPES = {"float32": "float", "float16": "half", "bfloat16": "bfloat16", "float64": "double",
              "int32": "int32", "int64": "int64", "int8": "int8", "uint8": "uint8", "float": "float",
              "half": "half", "double": "double", "uint32": "uint32", "uint64": "uint64"}
"""Our dtype names and nccl-tests' own -> nccl-tests' -d names (the `type` column it prints)."""
DTYPE_BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
               "half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4, "double": 8,
               "float64": 8}
BINARIES = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf",
            "reduce_scatter": "reduce_scatter_perf", "all_to_all": "alltoall_perf",
            "broadcast": "broadcast_perf", "reduce": "reduce_perf", "sendrecv": "sendrecv_perf"}
"""The nccl-tests binary of each op."""


def lower_quartile(values: list[float]) -> float:
    """The nearest-rank 25th percentile (the value a quarter of the way up, by rank): no interpolation between a
    fast call and a held-up one. One value is its own quartile."""
    ordered = sorted(values)
    return ordered[max(0, -(-len(ordered) // 4) - 1)]


def call_figures(times_us: list[float]) -> dict[str, float]:
    """One rank's figures of a placement's calls, each timed on its own (the built-in sweep on cpu): the median
    (median_us), the lower quartile (p25_us: a call the scheduler did not hold up, as long as fewer than three in
    four were), and the share of calls held up (stalled_pct: over STALL_FACTOR times the lower quartile)."""
    if not times_us:
        raise ValueError("call_figures needs at least one call's time")
    p25 = lower_quartile(times_us)
    held = sum(1 for t in times_us if t > STALL_FACTOR * p25)
    return {"median_us": statistics.median(times_us), "p25_us": p25, "stalled_pct": 100.0 * held / len(times_us)}


def held_up_excess(calls: Sequence[tuple[Hashable, float]]) -> list[float]:
    """Of calls each timed on its own, given as (kind, time) in any unit (a training run's profiled collectives, kind
    = op and bytes), each call's time beyond its kind's lower quartile where it was held up (over STALL_FACTOR times
    that quartile, as `call_figures` counts them), else 0; in the calls' order. What a held-up call adds is waiting,
    not data moving: for the scheduler's tick on a busy host, or for a peer that came to the call later."""
    by_kind: dict = defaultdict(list)
    for kind, t in calls:
        by_kind[kind].append(t)
    p25 = {kind: lower_quartile(times) for kind, times in by_kind.items()}
    return [t - p25[kind] if t > STALL_FACTOR * p25[kind] else 0.0 for kind, t in calls]
