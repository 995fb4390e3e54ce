"""What a calibration is: the computation efficiency per micro-batch size and the measured bus-bandwidth
curves the performance model (harness/model/perfmodel.py) takes; how they are found is harness/model/calibration.py."""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

DEFAULT_EFFICIENCY = 0.4
"""Efficiency assumed when nothing was measured: a typical MFU of dense LLaMA training with
DeepSpeed on A100/H100 (30-50% in public reports). A guess, and every output labelled as such."""


@dataclass(frozen=True)
class BusbwCurve:
    """Measured bus bandwidth of one collective against message size."""
    op: str
    points: tuple[tuple[int, float], ...]
    """(size_bytes, busbw_gbps): nccl-tests' size (the full buffer), ascending, busbw > 0."""
    source: str

    def busbw_gbps(self, size_bytes: float) -> float:
        """busbw at a message size: log-log interpolation between the measured sizes; below the
        smallest the time stays that of the smallest (latency-bound, busbw proportional to size);
        above the largest the busbw stays that of the largest (bandwidth-bound)."""
        sizes = [s for s, _ in self.points]
        if size_bytes <= sizes[0]:
            return self.points[0][1] * size_bytes / sizes[0]
        if size_bytes >= sizes[-1]:
            return self.points[-1][1]
        i = bisect.bisect_right(sizes, size_bytes)
        (s0, b0), (s1, b1) = self.points[i - 1], self.points[i]
        frac = (math.log(size_bytes) - math.log(s0)) / (math.log(s1) - math.log(s0))
        return math.exp(math.log(b0) + frac * (math.log(b1) - math.log(b0)))


@dataclass(frozen=True)
class Calibration:
    efficiency_by_mb: dict[int, float] = field(default_factory=dict)
    """Measured efficiency per micro-batch size (empty: efficiency_default everywhere)."""
    efficiency_default: float = DEFAULT_EFFICIENCY
    efficiency_source: str = f"uncalibrated default {DEFAULT_EFFICIENCY}"
    busbw: dict[str, BusbwCurve] = field(default_factory=dict)
    """Measured curves by op (all_reduce, all_gather, reduce_scatter, ...)."""
    warnings: tuple[str, ...] = ()
    """What a user should know about the calibration (an implied efficiency above 1, ...)."""

    def efficiency(self, micro_batch_size: int) -> float:
        """The efficiency at a micro-batch size: measured there, else interpolated in log(mb)
        between the nearest measured sizes, else that of the nearest one."""
        if not self.efficiency_by_mb:
            return self.efficiency_default
        mbs = sorted(self.efficiency_by_mb)
        if micro_batch_size <= mbs[0]:
            return self.efficiency_by_mb[mbs[0]]
        if micro_batch_size >= mbs[-1]:
            return self.efficiency_by_mb[mbs[-1]]
        i = bisect.bisect_left(mbs, micro_batch_size)
        lo, hi = mbs[i - 1], mbs[i]
        if hi == micro_batch_size:
            return self.efficiency_by_mb[hi]
        frac = math.log(micro_batch_size / lo) / math.log(hi / lo)
        return self.efficiency_by_mb[lo] + frac * (self.efficiency_by_mb[hi] - self.efficiency_by_mb[lo])

    def to_dict(self) -> dict[str, Any]:
        return {"efficiency_by_mb": {str(k): v for k, v in sorted(self.efficiency_by_mb.items())},
                "efficiency_default": self.efficiency_default, "efficiency_source": self.efficiency_source,
                "busbw": {op: {"points": [list(p) for p in c.points], "source": c.source}
                          for op, c in sorted(self.busbw.items())}, "warnings": list(self.warnings)}
