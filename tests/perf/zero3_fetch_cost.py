"""ZeRO-3's host-side cost per parameter fetch, measured on real DeepSpeed (issue 28, item 1):

    .venv/bin/python tests/perf/zero3_fetch_cost.py [--layers 2 4 8] [--hidden 128 256] [--out DIR]

For each shape of llama-tiny (layers x hidden), one `bench` under ZeRO-2 and one under ZeRO-3 (same
micro-batch and accumulation, cpu platform, 2 gloo ranks, profile micro-steps). ZeRO-3 gathers
each module's parameters before its forward and backward (async on gloo: its wire time is the
record's comm_s) and releases them after; what DeepSpeed does around each gather (its hooks, the
partition bookkeeping, allocating and freeing the gathered tensor) runs on the host thread and
lands in the micro-step's compute_s. So

    host cost per fetch = (compute_s under ZeRO-3 - compute_s under ZeRO-2) / fetches per micro-step

per micro-step (the median over the profiled micro-steps, the optimizer step's own left out), per
all-gather call and per module fetched (forward and backward: DeepSpeed's hooks run for each module
with parameters, and coalesces small modules' gathers into one call). Printed per shape, with the all-gathers
per micro-step and the gathered bytes, so its dependence on module count and size shows. These are
this CPU's figures. On a GPU node the same Python runs on the host while the GPU computes: measured
on an H200 node (reference_results/sources/gpu-runs/2026-11-26-h200, suites gpu-zero3-host and
gpu-zero3-layers), ZeRO-3 adds 1.25 ms per module per micro-step (0.62 ms per fetch), which
harness/model/params.py host_s_per_module carries.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from harness.model.perfmodel import modules_with_parameters  # noqa: E402


FETCH_EVERY_MODULE = ["zero.stage3_param_persistence_threshold=0", "zero.stage3_max_live_parameters=2000000",
                      "zero.stage3_max_reuse_distance=0", "zero.stage3_prefetch_bucket_size=200000"]
"""As the default cpu suite's ZeRO-3 runs: no parameter kept whole, none kept for reuse, so every module's
parameters are gathered before each use and released after, as a large model's are on a GPU node."""


def micro_steps(record: dict) -> list[dict]:
    out = []
    for step in record.get("microsteps") or []:
        out += step if isinstance(step, list) else [step]
    return out


def run(out: Path, stage: int, layers: int, hidden: int) -> dict:
    heads = max(2, hidden // 64)
    args = [sys.executable, "-m", "harness", "bench", "confirm_regressions=0", "platform=cpu", "suite=single", "workload=llama-tiny",
            f"zero=stage{stage}", f"workload.num_layers={layers}", f"workload.hidden_size={hidden}",
            f"workload.num_heads={heads}", f"workload.num_kv_heads={max(1, heads // 2)}",
            f"workload.intermediate_size={(hidden * 8 // 3) // 16 * 16}", "history=none", f"out={out}", *FETCH_EVERY_MODULE]
    with open(out.with_suffix(".log"), "w", encoding="utf-8") as log:
        subprocess.run(args, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    (path,) = sorted(out.glob("*.json"))[:1] or [None]
    if path is None:
        raise SystemExit(f"no record from {out} (see {out}.log)")
    return json.loads(path.read_text(encoding="utf-8"))


def steady(steps: list[dict]) -> list[dict]:
    """The micro-steps without the optimizer step's (the last of each step: its norm all-reduce and
    the parameter update add to compute_s)."""
    return [m for m in steps if not any(c["op"] == "all_reduce" for c in m.get("collectives", []))] or steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--hidden", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--out", type=Path, default=None)
    ns = ap.parse_args(argv)
    work = ns.out or Path(tempfile.mkdtemp(prefix="zero3-fetch-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"ZeRO-3 host cost per parameter fetch (cpu, 2 gloo ranks; records in {work}):")
    print(f"{'layers':>6}{'hidden':>7}{'gathers/ms':>11}{'MB gathered':>12}{'compute z2 s':>13}{'compute z3 s':>13}"
          f"{'per gather ms':>14}{'per module ms':>14}")
    costs, per_module = [], []
    for layers in ns.layers:
        for hidden in ns.hidden:
            sides = {}
            for stage in (2, 3):
                out = work / f"l{layers}-h{hidden}-z{stage}"
                sides[stage] = steady(micro_steps(run(out, stage, layers, hidden)))
            c2 = statistics.median(m["compute_s"] for m in sides[2])
            c3 = statistics.median(m["compute_s"] for m in sides[3])
            gathers = [[c for c in m.get("collectives", []) if c["op"] == "all_gather"] for m in sides[3]]
            n = statistics.median(len(g) for g in gathers)
            mb = statistics.median(sum(c["bytes"] for c in g) for g in gathers) / 1e6
            per = (c3 - c2) / n if n else float("nan")
            fetches = 2 * modules_with_parameters(layers)   # each module's forward and backward
            costs.append(per)
            per_module.append((c3 - c2) / fetches)
            print(f"{layers:>6}{hidden:>7}{n:>11.0f}{mb:>12.1f}{c2:>13.4f}{c3:>13.4f}{per * 1e3:>14.2f}"
                  f"{per_module[-1] * 1e3:>14.2f}", flush=True)
    print(f"median over the shapes: {statistics.median(costs) * 1e3:.2f} ms per all-gather call (DeepSpeed coalesces "
          f"small modules' parameters into one call), {statistics.median(per_module) * 1e3:.2f} ms per module fetched "
          "(its hooks run for every module with parameters, forward and backward)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
