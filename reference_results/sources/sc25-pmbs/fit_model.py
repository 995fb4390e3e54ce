"""Fits the performance model's global parameters (harness/model/params.py and
harness/memory_model.FRAGMENTATION_FRACTION) to the published tables, and prints them.

    .venv/bin/python reference_results/sources/sc25-pmbs/fit_model.py

- FRAGMENTATION_FRACTION: the bracket in which the memory model calls every published cell right
  (an ok cell bounds it from above, an OOM cell from below), with the suite's workloads as
  conf/workload/ defines them (infer_workloads.py beside this file).
- fabric efficiencies (ib, roce) and ZeRO-3's unexplained per-call cost on the paper's clusters: every point of a grid,
  minimising Model 2's leave-one-out median |error| (plus half Model 1's, plus a penalty per
  Model 2 cell above 25 % beyond two), each cell predicted with its efficiency calibrated on the
  OTHER published cells (harness/model/validation.py). Latencies are declared, not fitted.
The shipped values are compared with the fit; update harness/model/params.py by hand if you refit.
"""
from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from harness.config.compose import compose  # noqa: E402
from harness.model.memory import DEVICE_RESERVE_GIB, FRAGMENTATION_FRACTION  # noqa: E402
from harness.model.params import PARAMS, ModelParams  # noqa: E402
from harness.model.validation import load_published, validate_model  # noqa: E402

GRID = {"roce": (0.04, 0.06, 0.08, 0.1, 0.12, 0.15, 0.2, 0.3, 0.5),
        "ib": (0.5, 1.0),
        "zero3_unexplained_s": (0.06, 0.08, 0.09, 0.1, 0.11, 0.12)}

def with_values(roce: float, ib: float, tau: float) -> ModelParams:
    return dataclasses.replace(PARAMS, fabric_efficiency={**PARAMS.fabric_efficiency, "ib": ib},
                               paper_roce_efficiency=roce, zero3_unexplained_s=tau)


def objective(v) -> float:
    m1, m2 = v.tables
    return m2.loo_median_pct + 0.5 * m1.loo_median_pct + 10 * max(0, m2.loo_over25 - 2)


def fragmentation_bracket(refs) -> tuple[float, float]:
    """(lowest, highest) FRAGMENTATION_FRACTION calling every published cell right."""
    v = validate_model(compose, refs)
    lo, hi = 0.0, 1.0
    for c in v.cells:  # capacity = M (1 - f) - reserve on a GPU: the cell fits while f <= 1 - (mem + reserve) / M
        m = (c.capacity_gib + DEVICE_RESERVE_GIB) / (1 - FRAGMENTATION_FRACTION)
        bound = 1 - (c.predicted_mem_gib + DEVICE_RESERVE_GIB) / m
        if c.status == "ok":
            hi = min(hi, bound)
        else:
            lo = max(lo, bound)
    return lo, hi


def main() -> int:
    refs = load_published()
    lo, hi = fragmentation_bracket(refs)
    print(f"FRAGMENTATION_FRACTION: every OOM call right for {lo:.3f} < f <= {hi:.3f}; shipped {FRAGMENTATION_FRACTION}"
          + ("" if lo < FRAGMENTATION_FRACTION <= hi else "  <- OUTSIDE the bracket"))
    scores = {key: objective(validate_model(compose, refs, with_values(*key)))
              for key in itertools.product(GRID["roce"], GRID["ib"], GRID["zero3_unexplained_s"])}
    best = min(scores, key=lambda k: (scores[k], k))
    m1, m2 = validate_model(compose, refs, with_values(*best)).tables
    print(f"fitted ({len(scores)} evaluations): paper_roce_efficiency {best[0]}, fabric_efficiency.ib {best[1]}, "
          f"zero3_unexplained_s {best[2]}")
    print(f"  leave-one-out: Model 2 median {m2.loo_median_pct:.1f} % ({m2.loo_over25} above 25 %), "
          f"Model 1 median {m1.loo_median_pct:.1f} %")
    shipped = (PARAMS.paper_roce_efficiency, PARAMS.fabric_efficiency["ib"], PARAMS.zero3_unexplained_s)
    print(f"shipped (harness/model/params.py): {shipped} -> {'the fit' if shipped == best else 'DIFFERS from the fit'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
