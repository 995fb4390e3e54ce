"""Performance portability: Pennycook's metric over platforms, from references and result records.

    PP(a, p, H) = |H| / sum_{i in H} 1 / e_i(a, p)   if a is supported on every platform i of H
                = 0                                  otherwise
(S. J. Pennycook, J. D. Sewall, V. W. Lee, "Implications of a metric for performance portability",
Future Generation Computer Systems 92 (2019) 947-958): the harmonic mean of the per-platform
efficiencies e_i, zero when any platform of H cannot run the application (e.g. out of memory).

Two efficiencies:
- application efficiency: performance on platform i / the best known performance on platform i
  (best over every configuration considered for that platform, same benchmark and metric;
  best / value for a lower-is-better metric);
- architectural efficiency: the achieved fraction of the platform's peak, MFU (mfu_pct / 100).

An application is a configuration identified by APPLICATION_KEYS of its config ("tuning" for the
published baseline/tuned pair, else ZeRO stage, micro-batch, gradient accumulation, and the training
stack away from eager: `z1-mb128-ga8-torch` is llama-440m compiled, never pooled with the eager run of the
same split); other keys (nodes, overlap_comm, gradient_collective, ...) are how it was run or tuned on one
platform.
Several results of one application on one platform: the best ok value counts; it is unsupported
there only when none is ok (status oom/error/timeout), or when there is no result at all.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

from contract.metrics import METRICS

from ..errors import HarnessError
from ..record import ResultRecord
from ..stack_view import stack_words
from .record_files import load_records
from .references import load_references

CITATION = ('S. J. Pennycook, J. D. Sewall, V. W. Lee, "Implications of a metric for performance '
            'portability", Future Generation Computer Systems 92 (2019) 947-958')
DEFAULT_BENCHMARK = "llama-8b-kd"   # the published Model 2 (SC'25 PMBS)
DEFAULT_METRIC = "samples_per_s"
MFU_METRIC = "mfu_pct"
KINDS = ("application", "architectural")
APPLICATION_KEYS = ("tuning", "zero_stage", "micro_batch_size", "grad_acc_steps")
STACK_FIELDS = ("compile", "kernels", "precision", "attention")
"""A record's workload fields that name its training stack (harness/stack_view.py stack_words)."""
SLACK = 1e-9                         # efficiencies may exceed 1 by rounding, no more


@dataclass(frozen=True)
class Efficiency:
    platform: str
    value: Optional[float]
    """The metric's value on the platform; None when unsupported there."""
    efficiency: Optional[float]
    """In (0, 1]; None when unsupported."""
    supported: bool
    source: str
    """Where the value comes from (reference source or record file), or why it is missing."""
    status: str = "ok"
    """ok, oom, error, timeout, or 'no data'."""


@dataclass(frozen=True)
class Portability:
    application: str
    metric: str
    kind: str
    """'application' or 'architectural' efficiency."""
    platforms: list[str]
    efficiencies: list[Efficiency]
    pp: float
    config: Optional[dict[str, Any]] = None
    """The application's identifying configuration (APPLICATION_KEYS present)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Observation:
    """One result: an application's metric value on one platform (None unless status is ok)."""
    application: str
    config: dict[str, Any]
    platform: str
    metric: str
    value: Optional[float]
    status: str
    source: str
    direction: Optional[str] = None
    """'higher' / 'lower' when the source declares it (references); None for records."""


# --- the metric --------------------------------------------------------------------------------

def pennycook(efficiencies: dict[str, Optional[float]], platforms: list[str]) -> float:
    """PP over `platforms`: harmonic mean of the efficiencies, 0 when one is None (unsupported),
    missing or 0. Each efficiency must lie in [0, 1] (1e-9 slack above 1)."""
    if not platforms:
        raise HarnessError("performance portability needs at least one platform (H is empty)")
    values = [efficiencies.get(p) for p in platforms]
    for p, e in zip(platforms, values):
        if e is not None and not (0.0 <= e <= 1.0 + SLACK):   # also rejects NaN
            raise HarnessError(f"efficiency on platform {p!r} is {e!r}; an efficiency lies in (0, 1]")
    if any(e is None or e == 0.0 for e in values):
        return 0.0
    return len(values) / sum(1.0 / min(e, 1.0) for e in values)


def application_efficiency(values: dict[str, Optional[float]], best: dict[str, float],
                           direction: str) -> dict[str, Optional[float]]:
    """value / best on each platform (best / value when lower is better); None stays None."""
    if direction not in ("higher", "lower"):
        raise HarnessError(f"direction={direction!r} is invalid; valid: higher, lower")
    out: dict[str, Optional[float]] = {}
    for platform, v in values.items():
        if v is None:
            out[platform] = None
            continue
        b = best.get(platform)
        if b is None or not b > 0:
            raise HarnessError(f"no positive best known value on platform {platform!r} (best={b!r})")
        if not v >= 0 or (direction == "lower" and v == 0):
            raise HarnessError(f"value {v!r} on platform {platform!r} is not a valid measurement")
        out[platform] = v / b if direction == "higher" else b / v
    return out


def architectural_efficiency(mfu_pct: dict[str, Optional[float]]) -> dict[str, Optional[float]]:
    """The achieved fraction of peak: MFU / 100."""
    return {p: None if v is None else v / 100.0 for p, v in mfu_pct.items()}


def direction_of(metric: str, observations: list[Observation]) -> str:
    """The direction the references declare for `metric`; else the registry's (contract/metrics.py)."""
    declared = {o.direction for o in observations if o.metric == metric and o.direction}
    if len(declared) > 1:
        raise HarnessError(f"references disagree on the direction of {metric}: {sorted(declared)}")
    if declared:
        return declared.pop()
    if metric not in METRICS:
        raise HarnessError(f"metric {metric!r} is not registered (contract/metrics.py) and no reference declares "
                           "its direction: which way is better is unknown")
    return METRICS[metric].direction


def _better(a: float, b: float, direction: str) -> bool:
    return a > b if direction == "higher" else a < b


def best_known(observations: list[Observation], direction: str) -> dict[str, Observation]:
    """Per platform, the best ok observation over every application."""
    best: dict[str, Observation] = {}
    for o in observations:
        if o.status == "ok" and o.value is not None and (
                o.platform not in best or _better(o.value, best[o.platform].value, direction)):
            best[o.platform] = o
    return best


def _per_platform(observations: list[Observation], application: str, platforms: list[str],
                  direction: str) -> dict[str, Optional[Observation]]:
    """An application's chosen observation per platform: the best ok one, else the first failure."""
    chosen: dict[str, Optional[Observation]] = {p: None for p in platforms}
    for o in observations:
        if o.application != application or o.platform not in chosen:
            continue
        cur = chosen[o.platform]
        ok = o.status == "ok" and o.value is not None
        if cur is None or (ok and (cur.status != "ok" or _better(o.value, cur.value, direction))):
            chosen[o.platform] = o
    return chosen


def portability(observations: list[Observation], metric: str, kind: str,
                platforms: list[str]) -> list[Portability]:
    """PP of every application found in `observations` (of one benchmark) across `platforms`."""
    if kind not in KINDS:
        raise HarnessError(f"kind={kind!r} is invalid; valid: {', '.join(KINDS)}")
    obs = [o for o in observations if o.metric == metric]
    direction = "higher" if kind == "architectural" else direction_of(metric, obs)
    best = {p: o.value for p, o in best_known(obs, direction).items()}
    apps: dict[str, dict[str, Any]] = {}
    for o in sorted(obs, key=lambda o: "tuning" not in o.config):  # baseline/tuned first, else as found
        apps.setdefault(o.application, o.config)
    results = []
    for app, config in apps.items():
        chosen = _per_platform(obs, app, platforms, direction)
        values = {p: (o.value if o is not None and o.status == "ok" else None) for p, o in chosen.items()}
        effs = (application_efficiency(values, best, direction) if kind == "application"
                else architectural_efficiency(values))
        rows = [Efficiency(p, values[p], effs[p], effs[p] is not None,
                           o.source if o is not None else f"no {metric} result on {p}",
                           o.status if o is not None else "no data")
                for p, o in chosen.items()]
        results.append(Portability(app, metric, kind, list(platforms), rows, pennycook(effs, platforms),
                                   config))
    return results


# --- inputs ------------------------------------------------------------------------------------

def application_of(config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(label, identifying config): 'baseline' / 'tuned', or 'z1-mb64-ga4' as the suite names runs, with the
    training stack when it is not eager ('z1-mb64-ga4-torch', '...-torch+liger+fp8': stack_words of the
    config's compile, kernels, precision and attention)."""
    ident = {k: config[k] for k in APPLICATION_KEYS if k in config}
    if "tuning" in ident:
        return str(ident["tuning"]), {"tuning": ident["tuning"]}
    parts = [f"{prefix}{ident[k]}" for k, prefix in
             (("zero_stage", "z"), ("micro_batch_size", "mb"), ("grad_acc_steps", "ga")) if k in ident]
    stack = stack_words(config)
    if stack != "eager":
        ident["stack"] = stack
        parts.append(stack)
    return ("-".join(parts) or "default"), ident


def observations_from_references(refs: list, benchmark: str) -> list[Observation]:
    """harness.verdict.references.Reference objects of `benchmark` as observations."""
    out = []
    for r in refs:
        if r.benchmark != benchmark:
            continue
        label, ident = application_of(r.config)
        extra = " ".join(f"{k}={v}" for k, v in r.config.items() if k not in ident and not isinstance(v, dict))
        src = r.provenance.source if r.provenance else "reference"
        out.append(Observation(label, ident, r.platform, r.metric, r.value if r.status == "ok" else None,
                               r.status, f"reference: {src}" + (f" [{extra}]" if extra else ""), r.direction))
    return out


def _record_files(paths: list[Path]) -> list[tuple[Path, ResultRecord]]:
    """(path, record) of every file given and every record under a folder (record_files.load_records:
    a named file that is not a valid record is an error; a folder's other JSON files are skipped)."""
    loaded = load_records(paths, recursive=True, heading="--records: not a JSON result record")
    return loaded.records


def observations_from_records(paths: list[Path], benchmark: Optional[str]) -> list[Observation]:
    """Every metric of every training record (of `benchmark`, when given); a record whose status
    is not ok makes its application unsupported on its platform."""
    out = []
    for path, rec in _record_files(paths):
        if benchmark is not None and rec.benchmark != benchmark:
            continue
        cfg = rec.config or {}
        w, z = cfg.get("workload") or {}, cfg.get("zero") or {}
        label, ident = application_of({"zero_stage": z.get("stage"), "micro_batch_size": w.get("micro_batch_size"),
                                       "grad_acc_steps": w.get("grad_acc_steps"),
                                       **{k: w[k] for k in STACK_FIELDS if k in w}}
                                      if w or z else {})
        metrics = rec.metrics or {}
        names = set(metrics) | {DEFAULT_METRIC, MFU_METRIC}
        for name in sorted(names):
            ok = rec.status == "ok" and name in metrics
            out.append(Observation(label, ident, rec.platform, name,
                                   float(metrics[name]["value"]) if ok else None,
                                   rec.status if rec.status != "ok" else ("ok" if ok else "no data"),
                                   f"record: {path}"))
    return out


def _record_benchmarks(paths: list[Path]) -> list[str]:
    return sorted({rec.benchmark for _, rec in _record_files(paths) if rec.kind == "training"})


# --- report ------------------------------------------------------------------------------------

def _cell(e: Efficiency) -> str:
    if not e.supported:
        return {"no data": "no data", "ok": "n/a"}.get(e.status, e.status.upper())
    return f"{_value(e.value)} ({e.efficiency:.3f})"


def _value(x: float) -> str:
    """Five significant digits, none after the point from 1,000 on: 1,265 / 709.09 / 146.37 / 0.86147."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.5g}"


def table(results: list[Portability], best: dict[str, Observation], unit: str = "") -> str:
    """One row per application: per platform 'value (efficiency)', then PP."""
    if not results:
        return "(no applications)"
    platforms = results[0].platforms
    width = max(12, *(len(r.application) for r in results))
    cols = [max(18, len(p)) for p in platforms]
    head = f"{'application':<{width}}  " + "  ".join(f"{p:>{c}}" for p, c in zip(platforms, cols)) + "      PP"
    lines = [head, "-" * len(head)]
    for r in results:
        cells = "  ".join(f"{_cell(e):>{c}}" for e, c in zip(r.efficiencies, cols))
        lines.append(f"{r.application:<{width}}  {cells}  {r.pp:6.3f}")
    if best:
        lines.append(f"{'best known':<{width}}  " + "  ".join(
            f"{(f'{_value(best[p].value)} {best[p].application}' if p in best else '-'):>{c}}"
            for p, c in zip(platforms, cols)))
    return "\n".join(lines)


def _render(benchmark: str, sections: list[dict[str, Any]], notes: list[str]) -> str:
    out = [f"Performance portability of {benchmark} (Pennycook et al., FGCS 92 (2019) 947-958):",
           "  PP = |H| / sum_i 1/e_i over the platforms H; 0 when any platform is unsupported (OOM, no data)."]
    for s in sections:
        what = (("e_i = value / best known on platform i" if s["direction"] == "higher"
                 else "e_i = best known / value on platform i (lower is better)")
                if s["kind"] == "application" else "e_i = mfu_pct / 100, the fraction of peak achieved")
        out += ["", f"{s['kind']} efficiency, metric {s['metric']}: {what}",
                "cells: value (efficiency); zN-mbM-gaK = ZeRO stage N, micro-batch M, gradient accumulation K"
                + (", then the training stack where it is not eager" if any("stack" in (r.config or {})
                                                                          for r in s["results"]) else ""),
                table(s["results"], s["best"])]
    out += [""] + [f"note: {n}" for n in notes] if notes else []
    return "\n".join(out)


# --- command line ------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # a bad argument is a HarnessError (exit 2 via harness.__main__)
        raise HarnessError(f"{self.prog}: {message}")


def _split(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def cli(args: list[str]) -> int:
    """python -m harness portability [--benchmark B] [--metric M] [--platforms P,Q] [--records F|D ...]
    [--references F ...] [--kind application|architectural|both] [--json]: Pennycook's PP."""
    parser = _Parser(prog="python -m harness portability",
                     description="Performance portability (Pennycook et al. 2019) over platforms. "
                                 "Default: the published Model 2 (llama-8b-kd) from reference_results/.")
    parser.add_argument("--benchmark", help=f"benchmark (default {DEFAULT_BENCHMARK}, or the one "
                                            "benchmark of the --records)")
    parser.add_argument("--metric", default=DEFAULT_METRIC, help="metric of the application efficiency "
                                                                "(default %(default)s)")
    parser.add_argument("--platforms", type=_split, help="comma-separated platforms H (default: every "
                                                         "platform with data)")
    parser.add_argument("--records", nargs="+", type=Path, default=[], metavar="FILE_OR_DIR",
                        help="result records (files, or folders searched for *.json records)")
    parser.add_argument("--references", nargs="+", type=Path, metavar="FILE",
                        help="reference files (default: reference_results/*.json unless --records is given)")
    parser.add_argument("--kind", choices=("application", "architectural", "both"), default="both")
    parser.add_argument("--json", action="store_true", help="print a JSON document instead of tables")
    try:
        return _run(parser.parse_args(args))
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(ns: argparse.Namespace) -> int:
    refs = (load_references(ns.references) if ns.references is not None
            else [] if ns.records else load_references())
    benchmark = ns.benchmark
    if benchmark is None:
        found = _record_benchmarks(ns.records) if ns.records else []
        if len(found) > 1:
            raise HarnessError(f"--records hold several benchmarks ({', '.join(found)}); choose one with --benchmark")
        benchmark = found[0] if found else DEFAULT_BENCHMARK
    obs = observations_from_references(refs, benchmark) + observations_from_records(ns.records, benchmark)
    if not obs:
        raise HarnessError(f"--benchmark {benchmark}: no references or records of it")
    measured = sorted({o.metric for o in obs if o.status != "no data"})
    if ns.kind != "architectural" and ns.metric not in measured:   # a typo: an error, not a table of "no data"
        raise HarnessError(f"--metric {ns.metric}: no result of {benchmark} has it; its metrics: {', '.join(measured)}")
    kinds = KINDS if ns.kind == "both" else (ns.kind,)
    sections, notes = [], []
    for kind in kinds:
        metric = ns.metric if kind == "application" else MFU_METRIC
        have = sorted({o.platform for o in obs if o.metric == metric and o.status != "no data"})
        if not have:
            msg = (f"no {metric} data for {benchmark} in the "
                   + ("records and references" if ns.records and refs else "records" if ns.records else "references")
                   + (": architectural efficiency needs MFU (records' metrics.mfu_pct, or references with "
                      "metric mfu_pct); the published figures carry none" if kind == "architectural" else ""))
            if ns.kind != "both":
                raise HarnessError(msg)
            notes.append(msg)
            continue
        platforms = ns.platforms or have
        unknown = [p for p in platforms if p not in have]
        if unknown:
            raise HarnessError(f"--platforms: no {metric} data for {benchmark} on {', '.join(unknown)}; "
                               f"platforms with data: {', '.join(have)}")
        kobs = [o for o in obs if o.metric == metric]
        direction = "higher" if kind == "architectural" else direction_of(metric, kobs)
        sections.append({"kind": kind, "metric": metric, "direction": direction, "platforms": platforms,
                         "results": portability(kobs, metric, kind, platforms),
                         "best": {p: o for p, o in best_known(kobs, direction).items() if p in platforms}})
    if ns.json:
        doc = {"schema_version": "1.0", "benchmark": benchmark, "citation": CITATION,
               "formula": "PP = |H| / sum_{i in H} 1/e_i if supported on every i in H, else 0",
               "sections": [{"kind": s["kind"], "metric": s["metric"], "direction": s["direction"],
                             "platforms": s["platforms"],
                             "best_known": {p: {"value": o.value, "application": o.application, "source": o.source}
                                            for p, o in s["best"].items()},
                             "results": [r.to_dict() for r in s["results"]]} for s in sections],
               "notes": notes}
        print(json.dumps(doc, indent=2))
    else:
        print(_render(benchmark, sections, notes))
    return 0
