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


def steady_step_s(steps: list[dict[str, Any]]) -> Optional[float]:
    """The measured throughput steps' median step time (None without any): what a warm-up step is held against."""
    timed = [s["step_time_s"] for s in steps if s.get("mode") == "throughput" and not s.get("warmup")]
    return statistics.median(timed) if timed else None


def compile_seconds(steps: list[dict[str, Any]]) -> Optional[float]:
    """The warm-up's time beyond what its steps take at the steady state: the compilation (first
    compile, recompilations, autotuning) as a user waits for it. None without warm-up or measured steps."""
    warm, steady = [s["step_time_s"] for s in steps if s.get("warmup")], steady_step_s(steps)
    return None if not warm or steady is None else max(0.0, sum(warm) - len(warm) * steady)


def compile_by_step(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each warm-up step that compiled (frames_compiled > 0): its index, the seconds it took beyond the
    steady state (steady_step_s), the frames. A compile in two parts, e.g. DeepCompile's first compile and its
    passes' recompilation at a later step, is thus shown apart; [] for a record without the counts."""
    steady = steady_step_s(steps)
    return [] if steady is None else [
        {"step": s.get("index"), "s": round(max(0.0, s["step_time_s"] - steady), 3), "frames": s["frames_compiled"]}
        for s in steps if s.get("warmup") and s.get("frames_compiled")]


def cache_hits(cache: dict[str, Any]) -> int:
    """Graphs the compilers' caches served a run: Inductor's FX graph cache's hits, or AOT autograd's, which
    holds forward and backward together (two graphs a hit)."""
    fx, aot = cache.get("fx_graph") or {}, cache.get("aot_autograd") or {}
    return max(fx.get("hit", 0) or 0, 2 * (aot.get("hit", 0) or 0))


def cache_label(cache: Optional[dict[str, Any]]) -> Optional[str]:
    """The compilers' caches as a run found them, in words: 'cold: 4 graphs compiled' or 'warm: 3 of 4
    graphs from the cache' (Inductor's FX graph cache, or AOT autograd's, which holds forward and backward
    together); None for a record from before the caches were counted."""
    if not cache:
        return None
    fx = cache.get("fx_graph") or {}
    hits = cache_hits(cache)
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
                            "cache": cache_label(watch.get("cache")), "by_step": compile_by_step(steps),
                            "source": "warm-up time beyond its steps at the steady-state median"}
    for name in ("graph_breaks", "recompiles"):
        if name in watch:
            out[name] = {"value": watch[name], "unit": unit_of(name), "mode": "throughput"}
    late = compiled_while_measured(steps)
    if late:  # e.g. DeepCompile's passes at a step the warm-up did not reach: counted, and named with their steps
        fresh = sum(s["frames"] - s.get("recompiled", 0) for s in late)   # Dynamo's recompiles are in watch's count
        out["recompiles"] = {"value": watch.get("recompiles", 0) + fresh,
                             "unit": unit_of("recompiles"), "mode": "throughput", "measured_steps": late,
                             "source": "Dynamo's recompilations, and the frames compiled during measured steps"}
    return out


def compiled_while_measured(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The measured steps (not warm-up) that compiled anything: index, frames (of them Dynamo's recompilations,
    where any), seconds."""
    return [{"step": s.get("index"), "frames": s["frames_compiled"],
             **({"recompiled": s["frames_recompiled"]} if s.get("frames_recompiled") else {}),
             "step_time_s": round(s["step_time_s"], 3)}
            for s in steps if not s.get("warmup") and s.get("frames_compiled")]


def stack_words(workload: dict[str, Any]) -> str:
    """A run's training stack in a few words (its workload's settings): eager, compile, compile+fp8, liger,
    attn=math, deepcompile, ..."""
    parts = [workload.get("compile", "none") if workload.get("compile", "none") != "none" else "",
             workload.get("kernels", "eager") if workload.get("kernels", "eager") != "eager" else "",
             "fp8" if workload.get("precision") == "fp8" else "",
             f"attn={workload['attention']}" if workload.get("attention", "auto") != "auto" else ""]
    return "+".join(x for x in parts if x) or "eager"


STACK_HEADERS = ["run", "stack", "compile s", "compilers' caches", "graph breaks", "recompiles", "SDPA backend that ran"]


def stack_fields(rec_metrics: dict[str, Any], env_stack: Optional[dict[str, Any]]) -> dict[str, Any]:
    """What the training-stack table shows of a record (bench's summary, gpu-check's report and its JSON)."""
    def value(name: str) -> Optional[float]:
        return (rec_metrics.get(name) or {}).get("value")
    return {"compile_s": value("compile_s"), "compile_cache": (rec_metrics.get("compile_s") or {}).get("cache"),
            "compile_by_step": (rec_metrics.get("compile_s") or {}).get("by_step") or [],
            "graph_breaks": value("graph_breaks"), "recompiles": value("recompiles"),
            "attention_used": (env_stack or {}).get("attention_used"),
            "graph_break_reasons": ((env_stack or {}).get("compile_watch") or {}).get("graph_break_reasons")}


def stack_row(run: str, stack: str, f: dict[str, Any]) -> list[str]:
    """One row of the training-stack table from a run's stack_fields: what the compilation cost and met, and
    the attention that ran."""
    def num(x: Optional[float], fmt: str) -> str:
        return "-" if x is None else format(x, fmt)
    parts = f.get("compile_by_step") or []
    apart = " (" + ", ".join(f"step {p['step']} {p['s']:.1f}" for p in parts) + ")" if len(parts) > 1 else ""
    return [run, stack, num(f["compile_s"], ".1f") + apart, f["compile_cache"] or "-", num(f["graph_breaks"], ".0f"),
            num(f["recompiles"], ".0f"), ", ".join(f["attention_used"] or ["-"])]


def break_lines(run: str, f: dict[str, Any], most: int = 5) -> list[str]:
    """Each graph break of a run (the most frequent `most`) from its stack_fields, with where it happened first."""
    return [f"{run}: graph break x{b['count']}: {b['reason'][:160]}" + (f" (at {b['where'][0]})" if b.get("where") else "")
            for b in (f["graph_break_reasons"] or [])[:most]]
