"""Is the tuner efficient? `make perf` (or run this file): on the cpu platform's llama-tiny search
space, the exhaustive grid against the default tuner (model-guided, Bayesian where a step is large).

    .venv/bin/python tests/perf/tune_efficiency.py [--out DIR] [--grid DIR]

1. `python -m harness tune tune.strategy=grid` runs every point of steps 2 and 3 (step 1 on the
   cpu platform only measures the collectives: gloo has no NCCL variables).
2. `python -m harness tune` with its defaults (auto: grid for small steps, Optuna TPE with a
   quarter of the space otherwise; trials ordered by the performance model).
3. The two winners re-measured: the grid's best and the tuner's best configurations, run
   alternately --rounds times each with `bench` (median samples/s). A search's best is the
   maximum of noisy samples, biased upwards the more trials it ran; re-measuring both picks side
   by side compares the configurations, not their luckiest samples.
Printed: the trials each ran (the default configuration and the collective sweep included), each
one's best configuration and samples/s, the tuner's pick as the grid measured it, and the
re-measured medians. Targets: the tuner's pick within 3% of the grid's (re-measured) while running
at most a third of the grid's trials. --grid DIR reuses a finished grid tune (nothing is rerun).
Exit 0 whatever the figures; the figures are the result.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MEASURE = ["measure.warmup_steps=2", "measure.steps=6", "measure.profile_steps=1"]
"""Per trial (both searches alike): 2 warm-up steps, the median of 6 measured, 1 profiled for the model."""
TARGET_GAP_PCT = 3.0
TARGET_TRIAL_FRACTION = 1 / 3


def tune(out: Path, *overrides: str) -> tuple[dict, float]:
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "harness", "tune", "platform=cpu", "workload=llama-tiny",
           "tune.install_preset=false", f"out={out}", *MEASURE, *overrides]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    (out.parent / f"{out.name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        sys.exit(f"tune failed ({proc.returncode}); see {out.parent / (out.name + '.log')}:\n{proc.stderr[-2000:]}")
    return json.loads((out / "tune.json").read_text()), time.perf_counter() - start


def trials(state: dict) -> list[dict]:
    every = [state["baseline"]] + [t for s in state["steps"] for t in s["trials"]]
    return [t for t in every if t["status"] != "skipped"]


def best(state: dict) -> dict:
    ok = [t for t in trials(state) if t["status"] == "ok" and t["unit"] == "samples/s"
          and (t.get("parity") or {}).get("ok") is not False]
    return max(ok, key=lambda t: t["value"])


def remeasure(out: Path, picks: dict[str, list[str]], rounds: int) -> dict[str, list[float]]:
    """samples/s of each pick, measured alternately `rounds` times with `bench` (one run each)."""
    values: dict[str, list[float]] = {name: [] for name in picks}
    for r in range(rounds):
        for name, overrides in picks.items():
            run_out = out / f"confirm-{name}-{r}"
            keep = [o for o in overrides if not o.startswith(("out=", "tune."))]
            cmd = [sys.executable, "-m", "harness", "bench", "confirm_regressions=0", "suite=single", f"out={run_out}", *keep]
            proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
            recs = [json.loads(p.read_text()) for p in run_out.glob("*.json") if p.name != "suite.json"]
            ok = [x for x in recs if x.get("status") == "ok" and "samples_per_s" in x.get("metrics", {})]
            if proc.returncode != 0 or not ok:
                sys.exit(f"re-measuring {name} failed ({proc.returncode}): {proc.stderr[-1500:]}")
            values[name].append(ok[0]["metrics"]["samples_per_s"]["value"])
            print(f"  round {r + 1}/{rounds} {name}: {values[name][-1]:.3f} samples/s", flush=True)
    return values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "results" / f"perf-tune-{stamp}")
    parser.add_argument("--grid", type=Path, help="a finished (or interrupted) grid tune to reuse")
    parser.add_argument("--rounds", type=int, default=3, help="re-measurements of each pick (default 3)")
    ns = parser.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    grid_state, grid_s = tune(ns.grid or ns.out / "grid", "tune.strategy=grid")
    tuner_state, tuner_s = tune(ns.out / "tuner")
    g, t = trials(grid_state), trials(tuner_state)
    gb, tb = best(grid_state), best(tuner_state)
    same = [x for x in g if sorted(x["overrides"]) == sorted(tb["overrides"])]
    pick_in_grid = same[0]["value"] if same and same[0]["value"] else None
    gap_own = 100 * (gb["value"] - tb["value"]) / gb["value"]
    gap_grid = 100 * (gb["value"] - pick_in_grid) / gb["value"] if pick_in_grid else None
    fraction = len(t) / len(g)
    print(f"\ngrid : {len(g):3d} trials ({grid_s / 60:.1f} min); best {gb['label']} (step {gb['step']}): "
          f"{gb['value']:.3f} samples/s")
    print(f"tuner: {len(t):3d} trials ({tuner_s / 60:.1f} min); best {tb['label']} (step {tb['step']}): "
          f"{tb['value']:.3f} samples/s")
    print(f"trials: tuner/grid = {fraction:.2f} (target <= {TARGET_TRIAL_FRACTION:.2f}): "
          f"{'MET' if fraction <= TARGET_TRIAL_FRACTION else 'MISSED'}")
    print(f"gap to the grid's best, tuner's own measurement: {gap_own:+.1f}%")
    if gap_grid is not None:
        print(f"gap to the grid's best, the tuner's pick as the grid measured it: {gap_grid:+.1f}% "
              f"(target <= {TARGET_GAP_PCT:g}%): {'MET' if gap_grid <= TARGET_GAP_PCT else 'MISSED'}")
    import statistics

    print(f"\nre-measuring both picks, alternately, {ns.rounds} rounds:", flush=True)
    again = remeasure(ns.out, {"grid": gb["overrides"], "tuner": tb["overrides"]}, ns.rounds)
    med = {k: statistics.median(v) for k, v in again.items()}
    gap_remeasured = 100 * (med["grid"] - med["tuner"]) / med["grid"]
    print(f"re-measured medians: grid's pick {med['grid']:.3f}, tuner's pick {med['tuner']:.3f} samples/s; "
          f"gap {gap_remeasured:+.1f}% (target <= {TARGET_GAP_PCT:g}%): "
          f"{'MET' if gap_remeasured <= TARGET_GAP_PCT else 'MISSED'}")
    ranked = sorted((x for x in g if x["value"] and x["unit"] == "samples/s"), key=lambda x: -x["value"])
    print("grid ranking (top 8): " + ", ".join(f"{x['label']}@{x['step']} {x['value']:.2f}" for x in ranked[:8]))
    summary = {"grid_trials": len(g), "tuner_trials": len(t), "trial_fraction": fraction,
               "grid_best": {k: gb[k] for k in ("label", "step", "value")},
               "tuner_best": {k: tb[k] for k in ("label", "step", "value")},
               "tuner_pick_in_grid": pick_in_grid, "gap_pct_own": gap_own, "gap_pct_grid": gap_grid,
               "remeasured": again, "remeasured_median": med, "gap_pct_remeasured": gap_remeasured,
               "grid_minutes": grid_s / 60, "tuner_minutes": tuner_s / 60}
    (ns.out / "tune_efficiency.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"figures: {ns.out / 'tune_efficiency.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
