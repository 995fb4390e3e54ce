"""Compare results with references: a verdict per run and metric, noise-aware, with attribution.

Verdicts: pass, regression, improvement, new (no reference), missing (a reference with no result),
status changed (ok -> oom, ok -> error, oom -> ok, ...), insufficient data, not comparable (the
reference's machine measured otherwise than this run's: machines_apart, harness/probe.py; the
efficiency against each machine's own measured matmul rate is judged across them all the same; or
the run's own pulse read the machine at a pace that explains its change: at_machine_pace).

Decision (per metric): the relative change of the median of this run's samples against the
reference, signed so that positive is worse (direction-aware), with a bootstrap 95% interval
that resamples both sides (a side with one sample is fixed; seeded, so verdicts repeat):
- regression   when the whole interval is worse than the tolerance;
- improvement  when the whole interval is better than the tolerance;
- pass         when the interval lies within the tolerance, or straddles it while the point
               estimate is within;
- insufficient data when the point estimate is out of tolerance but the interval is not, when
               both sides have a single sample (noise cannot be judged; see min_samples), or when
               the values cannot be compared (zero or absent reference, unit mismatch, no
               finite sample).
Attribution: every verdict judged against a reference with a fingerprint carries what changed between
the two (harness/verdict/changes.py environment_diff: the machine first, the software, the recorded
variables and settings, the suite's commit last).
"""
from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from contract.metrics import METRICS

from ..errors import HarnessError
from ..probe import PACE_NOISE_PCT, Pace, mix_apart, node_probes, not_comparable, pace
from ..record import ResultRecord
from .changes import environment_diff, hardware
from .changes import HARDWARE_FIELDS, commits_between, package_diff, stack_diff  # noqa: F401 (read from here before)
from .record_files import load_records as load_result_records
from .references import REFERENCE_METRICS, STACK_KEYS, Reference, record_config

VERDICTS = ("pass", "regression", "improvement", "new", "missing", "status changed", "insufficient data",
            "not comparable")
BOOTSTRAP_ROUNDS = 2000
ACROSS_MACHINES = ("matmul_eff_pct",)
"""Metrics judged even between machines that are not comparable (said so in the reason): the
efficiency against each machine's own measured matmul rate, where a software slowdown still shows;
not where its parts' dtypes run at another ratio of rates on the two (harness/probe.py mix_apart)."""


def parse_fail_on(text: str) -> set[str]:
    """--fail-on of `compare` and `nightly`: a comma list of verdicts (underscores for spaces, so
    status_changed is "status changed"), or none."""
    if text.strip() == "none":
        return set()
    chosen = {v.strip().replace("_", " ") for v in text.split(",") if v.strip()}
    unknown = chosen - set(VERDICTS)
    if unknown or not chosen:
        raise HarnessError(f"--fail-on {sorted(unknown) or repr(text)} is invalid; valid: {', '.join(VERDICTS)} "
                           "(comma-separated, _ for a space), or none")
    return chosen


@dataclass
class Verdict:
    platform: str
    benchmark: str
    config: dict[str, Any]
    metric: str
    verdict: str
    reason: str
    unit: Optional[str] = None
    value: Optional[float] = None
    reference: Optional[float] = None
    worse_pct: Optional[float] = None
    """Relative change, positive = worse (direction-aware)."""
    interval_pct: Optional[tuple[float, float]] = None
    tolerance_pct: Optional[float] = None
    num_samples: int = 0
    num_reference_samples: int = 0
    run_ids: list[str] = field(default_factory=list)
    environment_diff: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Group:
    """Repeated records of one platform, benchmark and configuration."""
    platform: str
    benchmark: str
    kind: str
    config: dict[str, Any]
    records: list[ResultRecord]


def group_records(records: list[ResultRecord]) -> list[Group]:
    groups: dict[tuple, Group] = {}
    for rec in records:
        cfg = record_config(rec)
        key = (rec.platform, rec.benchmark, json.dumps(cfg, sort_keys=True))
        groups.setdefault(key, Group(rec.platform, rec.benchmark, rec.kind, cfg, [])).records.append(rec)
    return list(groups.values())


def matches(ref: Reference, group: Group) -> bool:
    """A reference applies when every entry of its configuration is the group's too, and the group's
    training stack is the reference's: a stack key (compile, kernels, attention, ...) the reference
    lacks means it ran eager, as every reference made before the key existed did."""
    return (ref.platform == group.platform and ref.benchmark == group.benchmark
            and all(group.config.get(k) == v for k, v in ref.config.items())
            and all(k in ref.config for k in STACK_KEYS if k in group.config))


def worse_pct(current: float, reference: float, direction: str) -> float:
    change = 100.0 * (current - reference) / reference
    return -change if direction == "higher" else change


def bootstrap_interval(current: list[float], reference: list[float], direction: str,
                       rounds: int = BOOTSTRAP_ROUNDS, seed: int = 0) -> tuple[float, float]:
    """95% interval of worse_pct between the medians, resampling each side with replacement."""
    rng = random.Random(seed)
    values = []
    for _ in range(rounds):
        cur = statistics.median(rng.choices(current, k=len(current)))
        ref = statistics.median(rng.choices(reference, k=len(reference)))
        values.append(worse_pct(cur, ref, direction))
    values.sort()
    return values[int(0.025 * (rounds - 1))], values[int(0.975 * (rounds - 1))]


def decide(samples: list[float], ref: Reference, min_samples: int = 2) -> tuple[str, str, dict[str, Any]]:
    """(verdict, reason, figures) for one metric of one group against one ok reference."""
    finite = [x for x in samples if isinstance(x, (int, float)) and math.isfinite(x)]
    if not finite:
        return "insufficient data", "no finite sample (NaN or infinity)", {}
    if ref.value is None or ref.value == 0 or not math.isfinite(ref.value):
        return "insufficient data", f"reference value is {ref.value!r}: no relative change", {}
    ref_samples = [x for x in ref.samples if math.isfinite(x)] or [ref.value]
    current = statistics.median(finite)
    point = worse_pct(current, ref.value, ref.direction)
    lo, hi = bootstrap_interval(finite, ref_samples, ref.direction)
    figures = {"value": current, "worse_pct": point, "interval_pct": (lo, hi)}
    tol = ref.tolerance_pct
    change = (f"gain {-point:+.1f}% against {ref.value:g} {ref.unit} (95% interval [{-hi:+.1f}, {-lo:+.1f}]%, "
              f"tolerance {tol:g}%; positive is better)")
    if max(len(finite), len(ref_samples)) < min_samples:
        if abs(point) <= tol:   # no change beyond the tolerance was seen; none is claimed either way
            return "pass", f"one sample on each side, within the tolerance; {change}", figures
        return "insufficient data", f"one sample on each side: noise cannot be judged; {change}", figures
    if lo > tol:
        return "regression", change, figures
    if hi < -tol:
        return "improvement", change, figures
    if abs(point) <= tol:
        return "pass", change, figures
    return "insufficient data", f"point estimate out of tolerance, interval is not: {change}", figures


def at_machine_pace(verdict: str, figures: dict[str, Any], ref: Reference, paces: Optional[Pace]) -> Optional[str]:
    """'not comparable: ...' when a regression (an improvement) of a metric that moves with the
    machine's speed is the machine's own: this run's pulse read the machine slower (faster) than the
    reference's pace by more than the pulse's noise (PACE_NOISE_PCT), and at the machine's measured
    pace the change lies within the tolerance. None otherwise: a change beyond what the machine's
    pace explains stays a regression, and a run with no pulse is judged as before."""
    if verdict not in ("regression", "improvement") or paces is None or "value" not in figures:
        return None
    now, then, unit, device = paces
    ratio = now / then
    noise = PACE_NOISE_PCT.get(device, PACE_NOISE_PCT["cpu"]) / 100
    if not (ratio < 1 - noise if verdict == "regression" else ratio > 1 + noise):
        return None
    at_pace = figures["value"] / ratio if ref.direction == "higher" else figures["value"] * ratio
    change = worse_pct(at_pace, ref.value, ref.direction)
    if abs(change) > ref.tolerance_pct:
        return None
    return (f"not comparable: the machine ran {abs(1 - ratio) * 100:.0f} % {'slower' if ratio < 1 else 'faster'} "
            f"during this run than the reference's (fp32 matmul {now:.3g} vs {then:.3g} {unit}, this run's pulse); "
            f"at its own pace the {verdict} is a change of {-change:+.1f} %, within the tolerance {ref.tolerance_pct:g} %")


def machine_of(env: Optional[dict[str, Any]]) -> Optional[str]:
    """What a measurement's speed rests on, from the fingerprint's machine (rank 0's node): the
    GPUs' model and count when it has GPUs, else the CPU's model and usable CPUs; None when the
    fingerprint does not say (a reference recorded before the machine was read, or one whose CPU
    model was only the architecture, 'x86_64'), and then nothing is concluded from it."""
    machine = (env or {}).get("machine") if isinstance(env, dict) else None
    if not isinstance(machine, dict) or not isinstance(machine.get("cpu") or {}, dict) \
            or not isinstance(machine.get("gpus") or [], list) or not all(isinstance(g, dict) for g in machine.get("gpus") or []):
        return None   # malformed (a hand-edited record): nothing concluded from it
    hw = hardware(machine)
    if hw["gpu_model"]:
        return f"{hw['gpu_count']} x {hw['gpu_model']}"
    model = hw["cpu_model"]
    if not model or model in ("x86_64", "aarch64", "arm64", "ppc64le", "s390x"):
        return None
    return f"{model} ({hw['logical_cpus']} CPUs)"


def machines_apart(reference_env: Optional[dict[str, Any]], current_env: dict[str, Any]) -> Optional[str]:
    """'not comparable: ...' when the reference's machine cannot judge this run's, else None: by the
    two capability probes where this run has one (harness/probe.py), and by the machines' names (a
    name alike proves nothing; names that differ are two machines)."""
    taken_on, run_on = machine_of(reference_env), machine_of(current_env)
    named = (f"reference taken on {taken_on}, this run on {run_on}"
             if taken_on and run_on and taken_on != run_on else None)
    measured = not_comparable(reference_env, current_env) if node_probes(current_env) else None
    if measured and named:
        return f"{measured}; {named}"
    return measured or (f"not comparable: {named}" if named else None)


def _dtypes(records: list[ResultRecord], metric: str) -> list[str]:
    """The dtypes whose matmul rates an efficiency metric was measured against (its measured_gflops)."""
    return sorted({d for r in records for d in ((r.metrics.get(metric) or {}).get("measured_gflops") or {})})


def _best(refs: list[Reference]) -> Reference:
    """The most specific reference (the largest configuration) among those that apply."""
    return max(refs, key=lambda r: len(r.config))


def compare(records: list[ResultRecord], references: list[Reference], min_samples: int = 2) -> list[Verdict]:
    verdicts: list[Verdict] = []
    used: set[tuple] = set()
    for g in group_records(records):
        base = {"platform": g.platform, "benchmark": g.benchmark, "config": g.config,
                "run_ids": [r.run_id for r in g.records]}
        applicable = [r for r in references if matches(r, g)]
        ok = [r for r in g.records if r.status == "ok"]
        statuses = sorted({r.status for r in g.records})
        metrics = sorted(set(REFERENCE_METRICS.get(g.kind, {})) | {r.metric for r in applicable})
        for metric in metrics:
            refs = [r for r in applicable if r.metric == metric]
            ref = _best(refs) if refs else None
            if ref:
                used.add(ref.key())
            env = g.records[-1].environment
            samples = [r.metrics[metric]["value"] for r in ok if metric in r.metrics]
            units = {r.metrics[metric]["unit"] for r in ok if metric in r.metrics}
            if ref is None:
                if samples or not ok:
                    verdicts.append(Verdict(**base, metric=metric, verdict="new", unit=next(iter(units), None),
                                            reason=f"no reference (status {'/'.join(statuses)})",
                                            value=statistics.median(samples) if samples else None,
                                            num_samples=len(samples)))
                continue
            fig = {"unit": ref.unit, "reference": ref.value, "tolerance_pct": ref.tolerance_pct,
                   "num_reference_samples": ref.num_samples}
            if ref.status != "ok" or not ok:
                now = "ok" if ok else "/".join(statuses)
                if ref.status == now:
                    verdicts.append(Verdict(**base, metric=metric, verdict="pass", reason=f"status {now}, as the reference", **fig))
                else:
                    reasons = "; ".join(r.reason for r in g.records if r.reason)
                    verdicts.append(Verdict(**base, metric=metric, verdict="status changed", **fig,
                                            reason=f"{ref.status} -> {now}" + (f": {reasons}" if reasons else ""),
                                            environment_diff=environment_diff(ref.provenance and ref.provenance.environment, env)))
                continue
            if not samples:
                verdicts.append(Verdict(**base, metric=metric, verdict="missing", **fig,
                                        reason="the reference has this metric; the results do not"))
                continue
            if units != {ref.unit}:
                verdicts.append(Verdict(**base, metric=metric, verdict="insufficient data", **fig,
                                        reason=f"unit mismatch: results in {sorted(units)}, reference in {ref.unit!r}"))
                continue
            apart = machines_apart(ref.provenance and ref.provenance.environment, env)
            mix = apart and metric in ACROSS_MACHINES and mix_apart(
                ref.provenance and ref.provenance.environment, env, _dtypes(ok, metric))
            if mix:
                apart = f"{apart}; {mix}"
            if apart and (metric not in ACROSS_MACHINES or mix):
                verdicts.append(Verdict(**base, metric=metric, verdict="not comparable", **fig,
                                        value=statistics.median(samples), num_samples=len(samples), reason=apart))
                continue
            verdict, reason, figures = decide(samples, ref, min_samples)
            explained = (at_machine_pace(verdict, figures, ref, pace(ref.provenance and ref.provenance.environment, env))
                         if metric in METRICS and METRICS[metric].paced else None)
            if explained:
                verdicts.append(Verdict(**base, metric=metric, verdict="not comparable", **fig,
                                        value=figures["value"], num_samples=len(samples), reason=explained))
                continue
            if apart:   # an efficiency: judged across the two machines, and said so
                reason = f"across machines ({apart.removeprefix('not comparable: ')}): {reason}"
            diff = environment_diff(ref.provenance and ref.provenance.environment, env)   # named whatever the verdict
            verdicts.append(Verdict(**base, metric=metric, verdict=verdict, reason=reason, **fig, **figures,
                                    num_samples=len(samples), environment_diff=diff))
    scope = {(g.platform, g.benchmark) for g in group_records(records)}
    for ref in references:
        if (ref.platform, ref.benchmark) in scope and ref.key() not in used:
            verdicts.append(Verdict(ref.platform, ref.benchmark, ref.config, ref.metric, "missing",
                                    "a reference with no result in this comparison", unit=ref.unit,
                                    reference=ref.value, tolerance_pct=ref.tolerance_pct,
                                    num_reference_samples=ref.num_samples))
    return verdicts


def load_records(paths: list[str]) -> list[ResultRecord]:
    """Result records from files and folders (record_files.load_records): any file that is not a
    valid record stops the comparison, every one named."""
    records = [rec for _, rec in load_result_records(paths, strict=True, heading="cannot compare").records]
    if not records:
        raise HarnessError(f"no result records in {', '.join(map(str, paths))}")
    return records
