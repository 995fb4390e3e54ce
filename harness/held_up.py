"""The waiting in a training run's measured communication: each profiled collective is timed on its own
(benchmarks/training/instrument.py), so a call that took over STALL_FACTOR times the lower quartile of its kind (op
and bytes, over every profiled micro-step of the run) was held up, for the host's scheduler or for a peer still
computing, and its time beyond that quartile is waiting, not data moving (contract/collectives.py held_up_excess).

On the 2-core Zen 5 box 24 llama-tiny ZeRO-3 runs spent 17-56 % of their profiled communication time so (18-51 % of
their calls held up, most for 2-6 ms; about half of it for the other rank to reach the call, half after both had:
docs/measurement.md, "Held-up communication"); 32 ZeRO-1/2 runs, with a few large calls a step, 0-22 %."""
from __future__ import annotations

from typing import Any, Optional

from contract.collectives import held_up_excess


def held_up_s(microsteps: list[list[dict[str, Any]]]) -> list[list[float]]:
    """Seconds of waiting in each micro-step of each profiled step (the record's `microsteps`, same shape)."""
    flat = [((c["op"], c["bytes"]), c["time_s"]) for step in microsteps for m in step for c in m["collectives"]]
    excess = iter(held_up_excess(flat))
    return [[sum(next(excess) for _ in m["collectives"]) for m in step] for step in microsteps]


def comm_held_up_pct(microsteps: list[list[dict[str, Any]]]) -> Optional[float]:
    """The share of the profiled steps' communication time that was waiting; None without a timed collective."""
    total = sum(c["time_s"] for step in microsteps for m in step for c in m["collectives"])
    if total <= 0:
        return None
    return 100.0 * sum(sum(step) for step in held_up_s(microsteps)) / total
