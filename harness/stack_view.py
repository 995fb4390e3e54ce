"""What a run's STACK event (benchmarks/training/stack.py) puts in its record: environment.stack, the settings
of the training stack and what really ran (the compile path, the SDPA backend used, graph breaks by
reason, recompilations), and the metrics compile_s, graph_breaks and recompiles."""
from __future__ import annotations

import statistics
from typing import Any, Optional

from contract.metrics import unit_of


def stack_of(stack: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """environment.stack: the event's value less its step counts (those are metrics)."""
    if not stack:
        return None
    return {k: v for k, v in stack.items() if k != "warmup_steps_run"}


def compile_seconds(steps: list[dict[str, Any]]) -> Optional[float]:
    """The warm-up's time beyond what its steps take at the steady state: the compilation (first
    compile, recompilations, autotuning) as a user waits for it. None without warm-up or measured steps."""
    warm = [s["step_time_s"] for s in steps if s.get("warmup")]
    timed = [s["step_time_s"] for s in steps if s.get("mode") == "throughput" and not s.get("warmup")]
    if not warm or not timed:
        return None
    return max(0.0, sum(warm) - len(warm) * statistics.median(timed))


def cache_label(cache: Optional[dict[str, Any]]) -> Optional[str]:
    """The compilers' caches as a run found them, in words: 'cold: 4 graphs compiled' or 'warm: 3 of 4
    graphs from the cache' (Inductor's FX graph cache, or AOT autograd's, which holds forward and backward
    together); None for a record from before the caches were counted."""
    if not cache:
        return None
    fx, aot = cache.get("fx_graph") or {}, cache.get("aot_autograd") or {}
    hits = max(fx.get("hit", 0), 2 * aot.get("hit", 0))
    total = hits + fx.get("miss", 0) + fx.get("bypass", 0)
    if not hits:
        return f"{cache.get('setting', '?')}: {total} graph{'s' if total != 1 else ''} compiled"
    return f"{cache.get('setting', '?')}: {hits} of {total} graphs from the cache"


def stack_metrics(stack: Optional[dict[str, Any]], steps: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """compile_s, graph_breaks, recompiles of a compiled run ({} for an eager one)."""
    if not stack or stack.get("compile", "none") == "none":
        return {}
    watch = stack.get("compile_watch") or {}
    out: dict[str, dict[str, Any]] = {}
    seconds = compile_seconds(steps)
    if seconds is not None:
        dynamo = (watch.get("dynamo_seconds") or {}).get("entire_frame_compile_time_s")
        out["compile_s"] = {"value": seconds, "unit": unit_of("compile_s"), "mode": "throughput",
                            "warmup_steps": stack.get("warmup_steps_run"), "dynamo_frame_compile_s": dynamo,
                            "cache": cache_label(watch.get("cache")),
                            "source": "warm-up time beyond its steps at the steady-state median"}
    for name in ("graph_breaks", "recompiles"):
        if name in watch:
            out[name] = {"value": watch[name], "unit": unit_of(name), "mode": "throughput"}
    return out
