"""Loss parity: a tuned configuration must train like the default one.

Every trial of steps 2 and 3 runs with the same seed, the same initial weights (drawn per
parameter name, whatever the ZeRO stage) and the same tokens per optimizer step (each rank draws
its C samples as one block, then splits them into micro-batches). So the loss of optimizer step k
must agree with the default configuration's step k up to floating-point reduction order; a larger
difference means the configuration changed the numerics (e.g. a broken gradient reduction).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from ..config.choices import Precision
from ..record import ResultRecord


def default_tolerance(precision: Precision) -> float:
    """Relative loss difference allowed: fp32 reduction-order noise is ~1e-6 after a few steps
    (measured on the cpu platform, see docs/tuning.md); 16-bit training accumulates more."""
    return 1e-3 if precision == Precision.fp32 else 3e-2


@dataclass(frozen=True)
class Parity:
    ok: Optional[bool]
    """None when it cannot be judged (no losses on one side)."""
    max_rel_diff: Optional[float]
    num_steps: int
    tolerance: float

    def describe(self) -> str:
        if self.ok is None:
            return "n/a"
        mark = "ok" if self.ok else "FAIL"
        return f"{mark} ({self.max_rel_diff:.1e} over {self.num_steps} steps)"

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "max_rel_diff": self.max_rel_diff, "num_steps": self.num_steps,
                "tolerance": self.tolerance}


def losses(record: ResultRecord) -> list[float]:
    """Losses of the throughput-mode steps (warm-up included), in order: the first steps of training."""
    return [s["loss"] for s in record.steps if s.get("mode") == "throughput" and "loss" in s]


def check(record: ResultRecord, baseline: ResultRecord, tolerance: float) -> Parity:
    mine, ref = losses(record), losses(baseline)
    n = min(len(mine), len(ref))
    if record.status != "ok" or baseline.status != "ok" or n == 0:
        return Parity(None, None, 0, tolerance)
    diffs = []
    for a, b in zip(mine[:n], ref[:n]):
        if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
            diffs.append(math.inf)  # a diverged loss never passes
        else:
            diffs.append(abs(a - b) / max(abs(b), 1e-12))
    worst = max(diffs)
    return Parity(worst <= tolerance, worst, n, tolerance)
