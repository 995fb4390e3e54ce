"""The host floor of a GPU micro-step, fitted from records (harness/model/params.py host_s_per_module and
host_base_s; `compiled_host_floor` for a compiled stack): on a GPU node at small micro-batches the GPU's
share of a micro-step is a few ms and the host issuing it sets its time, which grows with the modules
the host walks (transformers' LlamaForCausalLM: 9 a layer + 3, each with its hooks, and under ZeRO-3
its gather and release). So, per group of runs of one stack (eager, compiled, DeepCompile), stage class
(replicated: ZeRO 0-2; sharded: ZeRO-3) and micro-batch, over runs of several layer counts:

    micro-step s = host_base_s + host_s_per_module x modules       (least squares)

A micro-step is the median of the profiled micro-steps but the last of each step (which holds the
optimizer step), as reference_results/sources/gpu-runs/README.md reads them. The committed H200
records (2026-11-26-h200, gpu-zero3-host and gpu-zero3-layers, mb 8) give params' eager figures
(tests/unit/test_host_floor.py keeps the two equal); conf/suite/gpu-compile-host.yaml makes the
compiled and DeepCompile ones on a GPU node (tests/gpu/compile_host_node.sh).

    .venv/bin/python tests/perf/host_floor.py [DIR ...]      (default: the H200's two folders)
"""
from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))
from harness.model.perfmodel import modules_with_parameters  # noqa: E402

H200 = REPO_ROOT / "reference_results" / "sources" / "gpu-runs" / "2026-11-26-h200"
H200_FLOOR = (H200 / "gpu-zero3-layers", H200 / "gpu-zero3-host")
"""The records params.py's eager host floor was fitted on."""


@dataclass(frozen=True)
class Point:
    """One run: its group, its modules, its micro-step."""
    stack: str                  # eager, compile, deepcompile (+liger)
    stage_class: str            # replicated (ZeRO 0-2) or sharded (ZeRO-3)
    micro_batch_size: int
    modules: int
    micro_step_s: float
    run: str


@dataclass(frozen=True)
class Fit:
    """host_base_s + host_s_per_module x modules over one group's points."""
    stack: str
    stage_class: str
    micro_batch_size: int
    host_base_s: float
    host_s_per_module: float
    max_residual_s: float
    points: tuple[Point, ...]


def micro_step_s(record: dict[str, Any]) -> Optional[float]:
    """The median of the profiled micro-steps but each step's last; None without two a step."""
    steps = record.get("microsteps") or []
    times = [m["total_s"] for step in steps if isinstance(step, list) and len(step) > 1 for m in step[:-1]]
    return statistics.median(times) if times else None


def point(record: dict[str, Any]) -> Optional[Point]:
    """A record as a point of the fit; None for one that is no ok GPU training run with profiled micro-steps."""
    cfg = record.get("config") or {}
    if record.get("kind") != "training" or record.get("status") != "ok" or (cfg.get("platform") or {}).get("device") != "cuda":
        return None
    seconds = micro_step_s(record)
    if seconds is None:
        return None
    w = cfg["workload"]
    stack = {"none": "eager", "torch": "compile", "deepcompile": "deepcompile"}[w.get("compile", "none")]
    stack += "+liger" if w.get("kernels", "eager") == "liger" else ""
    stack += "+ds-json" if cfg.get("deepspeed_config") else ""   # a user's DeepSpeed JSON: a line of its own
    modules = modules_with_parameters(w["num_layers"]) + (modules_with_parameters(w["distill"]["teacher"]["num_layers"]) // 2
                                                          if w.get("distill") else 0)
    return Point(stack, "sharded" if cfg["zero"]["stage"] == 3 else "replicated", w["micro_batch_size"], modules,
                 seconds, str(record.get("name") or record.get("run_id")))


def points(dirs: list[Path]) -> list[Point]:
    out = []
    for d in dirs:
        for path in sorted(Path(d).glob("*.json")):
            try:
                record = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            p = point(record) if isinstance(record, dict) and "microsteps" in record else None
            if p is not None:
                out.append(p)
    return out


def fit(pts: list[Point]) -> list[Fit]:
    """One least-squares line per (stack, stage class, micro-batch) with two module counts or more."""
    groups: dict[tuple[str, str, int], list[Point]] = {}
    for p in pts:
        groups.setdefault((p.stack, p.stage_class, p.micro_batch_size), []).append(p)
    fits = []
    for (stack, cls, mb), group in sorted(groups.items()):
        xs, ys = [p.modules for p in group], [p.micro_step_s for p in group]
        if len(set(xs)) < 2:
            continue
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        base = my - slope * mx
        residual = max(abs(y - (base + slope * x)) for x, y in zip(xs, ys))
        fits.append(Fit(stack, cls, mb, base, slope, residual, tuple(sorted(group, key=lambda p: p.modules))))
    return fits


def against_eager(fits: list[Fit]) -> dict[tuple[str, str, int], float]:
    """Each other stack's floor over eager's of the same class and micro-batch, at the points' mean modules:
    how far under the eager floor params.compiled_host_floor sits."""
    eager = {(f.stage_class, f.micro_batch_size): f for f in fits if f.stack == "eager"}
    out = {}
    for f in fits:
        e = eager.get((f.stage_class, f.micro_batch_size))
        if f.stack != "eager" and e is not None:
            n = statistics.fmean(p.modules for p in f.points)
            out[(f.stack, f.stage_class, f.micro_batch_size)] = (f.host_base_s + f.host_s_per_module * n) / (
                e.host_base_s + e.host_s_per_module * n)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    dirs = [Path(a) for a in (argv if argv is not None else sys.argv[1:])] or list(H200_FLOOR)
    fits = fit(points(dirs))
    if not fits:
        print("no group of ok GPU training records with profiled micro-steps at two layer counts or more in "
              + ", ".join(map(str, dirs)))
        return 1
    print("micro-step s = host_base_s + host_s_per_module x modules (least squares; the median profiled micro-step "
          "but each step's last)")
    print(f"{'stack':<12} {'class':<10} {'mb':>4} {'base ms':>8} {'ms/module':>9} {'max resid ms':>12}  points (modules: ms)")
    for f in fits:
        pts = ", ".join(f"{p.modules}: {1e3 * p.micro_step_s:.1f}" for p in f.points)
        print(f"{f.stack:<12} {f.stage_class:<10} {f.micro_batch_size:>4} {1e3 * f.host_base_s:>8.2f} "
              f"{1e3 * f.host_s_per_module:>9.3f} {1e3 * f.max_residual_s:>12.2f}  {pts}")
    for (stack, cls, mb), ratio in against_eager(fits).items():
        print(f"{stack} {cls} mb {mb}: {ratio:.3f} x the eager floor at these modules (params.py compiled_host_floor)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
