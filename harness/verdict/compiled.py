"""The compiler's own figures judged: a compiled run's compile_s, graph_breaks and recompiles (harness/stack_view.py).

- **graph_breaks, recompiles** are TorchDynamo's counts over the run: the same model on the same software
  breaks and recompiles the same way every run, so they are judged exactly, not against a noise band: more
  than the reference is a regression (a torch or transformers upgrade that adds a graph break costs a fused
  region and a host round trip every micro-step), fewer an improvement, and the reason names each break
  the run met that the reference's runs did not (Dynamo's own words, `environment.stack.compile_watch`).
- **compile_s** (the warm-up's time beyond its steps) is judged like a time, with its tolerance and the
  machine's pace, only between runs that compiled cold on both sides: Inductor's caches alone take a first
  compile of llama-tiny from 65-85 s to 9-12 s on the 2-core EPYC, the cache's state and not the software's.
  A reference's compile_s is its cold runs' alone; a run whose caches served graphs
  (`measure.compile_cache=warm`, or a record from before the caches were counted) is `not comparable`, naming
  what its caches gave.
"""
from __future__ import annotations

import statistics
from typing import Any, Optional

from ..stack_view import cache_hits, cache_label

COUNTS = ("graph_breaks", "recompiles")
COMPILER_METRICS = ("compile_s", *COUNTS)
"""What only a compiled run records."""
WHAT = {"graph_breaks": "graph break", "recompiles": "recompilation"}
REASONS = {"graph_breaks": "graph_break_reasons", "recompiles": "recompile_reasons"}


def _watch(env: Optional[dict[str, Any]]) -> dict[str, Any]:
    stack = (env or {}).get("stack") if isinstance(env, dict) else None
    watch = stack.get("compile_watch") if isinstance(stack, dict) else None
    return watch if isinstance(watch, dict) else {}


def cold(env: Optional[dict[str, Any]]) -> Optional[bool]:
    """Whether a run compiled every graph itself (no cache hit); None when its record does not say."""
    cache = _watch(env).get("cache")
    if not isinstance(cache, dict):
        return None
    return cache_hits(cache) == 0


def caches_apart(envs: list[dict[str, Any]]) -> Optional[str]:
    """'not comparable: ...' when this side's compile_s cannot be judged: a run whose compilers' caches served
    graphs, or that does not say; None when every run compiled cold. A reference's compile_s holds cold
    compiles only (harness/verdict/references.py references_from_records)."""
    if all(cold(e) is True for e in envs):
        return None
    said = ", ".join(sorted({cache_label(_watch(e).get("cache")) or "caches not recorded" for e in envs}))
    return (f"not comparable: compile time is judged between cold compiles only (measure.compile_cache=cold); "
            f"the compilers' caches of this run: {said}")


def _reasons(env: Optional[dict[str, Any]], metric: str) -> list[str]:
    found = _watch(env).get(REASONS[metric]) or []
    return [str(r.get("reason") if isinstance(r, dict) else r) for r in found if r]


def count_verdict(metric: str, samples: list[float], ref_value: float, ref_env: Optional[dict[str, Any]],
                  envs: list[dict[str, Any]]) -> tuple[str, str, dict[str, Any]]:
    """(verdict, reason, figures) of a Dynamo count: exact, the median of the runs against the reference's."""
    now = statistics.median(samples)
    figures: dict[str, Any] = {"value": now, "worse_pct": None, "interval_pct": None}
    what = WHAT[metric]
    counted = f"{now:g} {what}{'s' if now != 1 else ''} a run against the reference's {ref_value:g}"
    if now == ref_value:
        return "pass", f"{counted}: the same count (judged exactly: the same software compiles alike)", figures
    if now < ref_value:
        return "improvement", f"{counted}: fewer (judged exactly)", figures
    before = set(_reasons(ref_env, metric))
    new = sorted({r for e in envs for r in _reasons(e, metric)} - before)
    named = ("; new: " + " | ".join(r[:160] for r in new[:3]) + (f" (+{len(new) - 3} more)" if len(new) > 3 else "")
             if new else "")
    return "regression", f"{counted}: more (judged exactly){named}", figures
