"""Loss parity: a tuned configuration must train like the default one.

Every trial of steps 2 and 3 runs with the same seed, the same initial weights (drawn per
parameter name, whatever the ZeRO stage) and the same tokens per optimizer step (each rank draws
its C samples as one block, then splits them into micro-batches). So the loss of optimizer step k
must agree with the default configuration's step k up to floating-point reduction order; a larger
difference means the configuration changed the numerics (e.g. a broken gradient reduction).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Optional

from ..config.choices import Precision
from ..record import ResultRecord
from ..verdict.references import STACK_DEFAULTS, STACK_KEYS


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


FP8_TOLERANCE = 0.10
"""FP8 training's loss against bf16's at the same seed: e4m3 keeps 3 mantissa bits (e5m2, for
gradients, 2), so every linear layer's inputs are rounded to ~6 % and the first steps' losses drift
by a few percent; measured on one H100 (llama-440m, torchao tensorwise, compiled): 1.3 % above bf16
at step 5 (reference_results/sources/gpu-runs/2026-11-27-h100-stack/)."""
STACK_FIELDS, EAGER = STACK_KEYS, STACK_DEFAULTS   # the reference key's own: one list of the stack's fields


def stack_tolerance(workload: dict[str, Any]) -> tuple[float, str]:
    """(relative loss tolerance, why) of a stack variant (workload.compile, kernels, attention,
    precision=fp8) against its eager twin at the same seed."""
    if workload.get("precision") == "fp8":
        return FP8_TOLERANCE, ("FP8 rounds every linear layer's inputs to 3 mantissa bits (e4m3): a few "
                               "percent of drift in the first steps (1.3 % measured on an H100)")
    base = default_tolerance(Precision(workload.get("precision", "fp32")))
    why = []
    if workload.get("compile", "none") != "none":
        why.append("Inductor fuses and reorders reductions")
    if workload.get("kernels", "eager") != "eager":
        why.append("Liger's fused kernels accumulate in their own order (chunked cross-entropy)")
    if workload.get("attention", "auto") != "auto":
        why.append("another attention kernel sums in another order")
    return base, ("; ".join(why) or "the same kernels") + f": reduction-order noise of {workload.get('precision')}"


def _twin_key(record: ResultRecord, keep_stack: bool = False) -> str:
    """A record's configuration and seed with the stack set back to eager (keep_stack: kept as it is)
    and fp8 to its bf16 base."""
    w = dict(record.config["workload"])
    for k in STACK_FIELDS:
        if not keep_stack or k == "fp8_recipe":
            w.pop(k, None)
    if w.get("precision") == "fp8":
        w["precision"] = "bf16"
    key = {"platform": record.platform, "benchmark": record.benchmark, "zero": record.config["zero"],
           "seed": record.config.get("measure", {}).get("seed"), "workload": w}
    return json.dumps(key, sort_keys=True, default=str)


def is_variant(record: ResultRecord) -> bool:
    w = record.config.get("workload", {})
    return w.get("precision") == "fp8" or any(w.get(k, v) != v for k, v in EAGER.items())


@dataclass(frozen=True)
class StackParity:
    variant: ResultRecord
    eager: ResultRecord
    parity: Parity
    why: str

    def line(self) -> str:
        return (f"{self.variant.run_id} against {self.eager.run_id}: {self.parity.describe()}, tolerance "
                f"{self.parity.tolerance:.0e} ({self.why})")


def stack_parity(records: list[ResultRecord]) -> list[StackParity]:
    """Every training variant of the stack among `records` against its eager twin there (the same
    configuration and seed with the stack eager), losses step by step; an fp8 run's twin is the bf16
    run of the same stack when there is one (FP8 alone differs), else the eager bf16 one."""
    training = [r for r in records if r.kind == "training" and r.status == "ok" and "workload" in (r.config or {})]
    eager, bf16 = {}, {}
    for r in training:
        if not is_variant(r):
            eager.setdefault(_twin_key(r), r)
        if r.config["workload"].get("precision") == "bf16":
            bf16.setdefault(_twin_key(r, keep_stack=True), r)
    out = []
    for r in training:
        twin = None
        if r.config["workload"].get("precision") == "fp8":
            twin = bf16.get(_twin_key(r, keep_stack=True))
        if twin is None and is_variant(r):
            twin = eager.get(_twin_key(r))
        if twin is not None:
            tolerance, why = stack_tolerance(r.config["workload"])
            out.append(StackParity(r, twin, check(r, twin, tolerance), why))
    return out
