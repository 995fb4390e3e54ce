"""The compiled stack on the cpu platform: `make perf`.

    .venv/bin/python tests/perf/compile_cost.py [--stage 1] [--rounds 2] [--steps 5] [--out DIR]

Runs llama-tiny (ZeRO-1, mb 2 x ga 4, two gloo ranks) alternately eager and compiled
(workload.compile=torch: DeepSpeed's engine.compile, Inductor's C++ backend on cpu), `--rounds`
times each, the way `make bench` runs them. Printed per round and as medians:

1. compile seconds: the compiled run's warm-up beyond its steady-state steps (metrics.compile_s)
   and TorchDynamo's own frame-compile seconds. Every compiled run keeps Inductor's caches in an empty
   folder of this measurement's own (measure.compile_cache=warm, TORCHINDUCTOR_CACHE_DIR), whatever ran on
   the box before: the first round compiles into it (a user's first run: "warm: 2 graphs compiled"), later
   rounds load from it (every later run: "warm: 2 of 2 graphs from the cache");
2. steady-state speed: compiled samples/s over eager samples/s (throughput mode, warm-up excluded);
3. loss parity: the compiled run's losses against the eager run's of the same round, step by step
   (harness/tune/parity.py stack_parity; tolerance 1e-3 for fp32).

Exit status 0 whatever the figures; 1 if a run failed or parity failed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from harness.record import ResultRecord  # noqa: E402
from harness.tune.parity import stack_parity  # noqa: E402


def bench(out: Path, stage: int, steps: int, compiled: bool) -> ResultRecord:
    argv = [sys.executable, "-m", "harness", "bench", "confirm_regressions=0", "suite=single", f"zero=stage{stage}", "history=none",
            f"measure.steps={steps}", "measure.profile_steps=0", f"out={out}"]
    argv += ["workload.compile=torch", "measure.compile_cache=warm"] if compiled else []
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(out.parent / "inductor-cache")}
    run = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200, env=env)
    records = [p for p in out.glob("*.json") if p.name not in ("suite.json",)]
    if run.returncode != 0 or len(records) != 1:
        raise SystemExit(f"{' '.join(argv[3:])} failed (exit {run.returncode}):\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    return ResultRecord.from_dict(json.loads(records[0].read_text()), str(records[0]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    root = a.out or Path(tempfile.mkdtemp(prefix="compile-cost-"))
    shutil.rmtree(root / "inductor-cache", ignore_errors=True)   # empty, whatever an earlier --out left
    print(f"compile cost: llama-tiny ZeRO-{a.stage} on the cpu platform, eager vs compiled, {a.rounds} rounds "
          f"-> {root}", flush=True)
    rows, failed = [], False
    for i in range(a.rounds):
        eager = bench(root / f"{i}-eager", a.stage, a.steps, compiled=False)
        comp = bench(root / f"{i}-compiled", a.stage, a.steps, compiled=True)
        (parity,) = stack_parity([eager, comp])
        failed |= parity.parity.ok is False
        watch = comp.environment["stack"]["compile_watch"]
        row = {"round": i, "compile_s": comp.metrics["compile_s"]["value"], "cache": comp.metrics["compile_s"].get("cache"),
               "dynamo_s": watch["dynamo_seconds"]["entire_frame_compile_time_s"],
               "speed": comp.metrics["samples_per_s"]["value"] / eager.metrics["samples_per_s"]["value"],
               "eager": eager.metrics["samples_per_s"]["value"], "compiled": comp.metrics["samples_per_s"]["value"],
               "graph_breaks": watch["graph_breaks"], "parity": parity.parity.describe()}
        rows.append(row)
        print(f"  round {i}: compile {row['compile_s']:.1f} s ({row['cache']}; Dynamo {row['dynamo_s']:.1f} s), "
              f"samples/s eager {row['eager']:.2f} compiled {row['compiled']:.2f} = {row['speed']:.2f}x, "
              f"graph breaks {row['graph_breaks']}, loss parity {row['parity']}", flush=True)
    warm = [r["compile_s"] for r in rows[1:]]
    print(f"compile seconds: first {rows[0]['compile_s']:.1f} (into empty caches: a first job on a machine)"
          + (f", then median {statistics.median(warm):.1f} (from the caches the first filled)" if warm else ""))
    print(f"compiled / eager samples/s: median {statistics.median(r['speed'] for r in rows):.2f}x "
          f"(informational on cpu: Inductor's C++ kernels against ATen's)")
    print(f"loss parity: {'ok' if not failed else 'FAIL'} in every round" if not failed else "loss parity: FAIL")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
