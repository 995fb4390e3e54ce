"""Compare results with references: a verdict per run and metric, noise-aware, with attribution.

Pairing: a run's configuration (references.record_config) is judged by the references of its own
platform that apply; when none does, by those of each other platform that ran the same configuration
(pairing: an H100's gpu-check against an H200's), across two machines.

Verdicts: pass, regression, improvement, new (no reference), missing (a reference with no result),
status changed (ok -> oom, ok -> error, oom -> ok, ...), insufficient data, not comparable (the
reference's machine is another platform, or measured otherwise than this run's:
harness/verdict/cross_machine.py apart, harness/probe.py; the row keeps now/reference as information;
the efficiency against each machine's own measured matmul rate, ACROSS_MACHINES, is judged across them
all the same, unless the machines' balance of matmul rate and memory bandwidth explains its change: at_balance;
or the run's own pulses read the machine at a pace that explains its change: at_machine_pace (an efficiency
on one machine: each side's pace over its own probe, pace.probe_pace);
or, on cpu, other work took the CPU time that explains it: at_cpu_share; or the small calls' median is a call
the host held up on one side only: at_held_up_median).

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
from ..pace import balance, cpu_share, exchange_pulses, one_cpu_host, pace, probe_pace, taken
from ..probe import mix_apart, node_probes, pooled
from ..record import ResultRecord
from .by_size import AVERAGE, BY_SIZE, LARGE, SHARED, SMALL, SMALL_MEDIAN, SMALL_P25, restrict, sizeless
from .explained import (at_balance, at_busy_host, at_cpu_share, at_exchange_spell, at_held_up_median, at_machine_pace,
                        held_medians, worse_pct)
from .changes import environment_diff
from .compiled import COMPILER_METRICS, COUNTS, caches_apart, count_verdict
from .cross_machine import (apart, machine_name, machine_of, machines_apart, nearness,  # noqa: F401 (machines_apart: read
                            named_only, names_agree)                         # from here before)
from .changes import HARDWARE_FIELDS, commits_between, package_diff, stack_diff  # noqa: F401 (read from here before)
from .record_files import load_records as load_result_records, none_found
from .references import NCCL_KEY, REFERENCE_METRICS, STACK_KEYS, SWEEP_KEYS, Reference, record_config

VERDICTS = ("pass", "regression", "improvement", "new", "missing", "status changed", "insufficient data",
            "not comparable")
BOOTSTRAP_ROUNDS = 2000
ACROSS_MACHINES = ("matmul_eff_pct",)
RANGED = (AVERAGE, LARGE, SMALL, SMALL_MEDIAN, SMALL_P25)
"""A collective's metrics keyed by its sweep's size range: judged against a sweep of the same range only."""
"""Metrics judged even between machines that are not comparable (said so in the reason): the
efficiency against each machine's own measured matmul rate, where a software slowdown still shows;
not where its parts' dtypes run at another ratio of rates on the two (harness/probe.py mix_apart)."""


def parse_fail_on(text: str, also: tuple[str, ...] = ()) -> set[str]:
    """--fail-on of `compare` and `nightly`: a comma list of verdicts (underscores for spaces, so
    status_changed is "status changed") and of the caller's other findings (`also`: the nightly's straggler),
    or none."""
    if text.strip() == "none":
        return set()
    chosen = {v.strip().replace("_", " ") for v in text.split(",") if v.strip()}
    unknown = chosen - set(VERDICTS) - set(also)
    if unknown or not chosen:
        raise HarnessError(f"--fail-on {sorted(unknown) or repr(text)} is invalid; valid: "
                           f"{', '.join((*VERDICTS, *also))} (comma-separated, _ for a space), or none")
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
    reference_platform: Optional[str] = None
    """The reference's platform where it is not the run's (a run paired across platforms), else None."""
    machines: Optional[list[str]] = None
    """[this run's machine, the reference's] where the two differ (cross_machine.apart), else None."""
    device: Optional[str] = None
    """What the two machines computed on ('cuda', 'cpu') where they differ and the records say."""
    sizes: Optional[list[dict[str, Any]]] = None
    """A collective's busbw per message size both sides ran, where a by-size reference applied (by_size.py)."""
    balance: Optional[dict[str, Any]] = None
    """An efficiency judged across two machines (ACROSS_MACHINES): their matmul FLOP per byte of memory bandwidth
    ({'now', 'reference', 'dtype'}: pace.balance), which moves it at the same software (explained.at_balance)."""

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


def same_configuration(ref: Reference, group: Group) -> bool:
    """Every entry of the reference's configuration is the group's too (workload, ZeRO stage, micro
    batch x grad accumulation, sequence, precision, nodes and ranks, ...), and the group's training
    stack is the reference's: a stack key (compile, kernels, attention, ...) the reference lacks means
    it ran eager, as every reference made before the key existed did; likewise a sweep's setting (SWEEP_KEYS: an
    unbound sweep's reference judges no bound sweep). The platform is not asked, nor the
    run's own NCCL variables (NCCL_KEY): a run with other NCCL settings is judged against the reference,
    and what changed names them (`env.NCCL_ALGO: None -> Tree`), as around an upgrade."""
    return (ref.benchmark == group.benchmark
            and all(group.config.get(k) == v for k, v in ref.config.items() if k != NCCL_KEY)
            and all(k in ref.config for k in (*STACK_KEYS, *SWEEP_KEYS) if k in group.config))


def matches(ref: Reference, group: Group) -> bool:
    """A reference of the group's own platform applies (same_configuration)."""
    return ref.platform == group.platform and same_configuration(ref, group)


def pairing(references: list[Reference], group: Group) -> list[list[Reference]]:
    """The references that judge a group, one list per platform: its own platform's when any apply;
    else, for each other platform that ran the same configuration, that platform's (the run is paired
    across machines: an H100's gpu-check with an H200's); [[]] when none ran it."""
    own = [r for r in references if matches(r, group)]
    if own:
        return [own]
    other: dict[str, list[Reference]] = {}
    for ref in references:
        if same_configuration(ref, group):
            other.setdefault(ref.platform, []).append(ref)
    return [other[p] for p in sorted(other)] or [[]]


def bootstrap_interval(current: list[float], reference: list[float], direction: str,
                       rounds: int = BOOTSTRAP_ROUNDS, seed: int = 0, metric: Optional[str] = None) -> tuple[float, float]:
    """95% interval of worse_pct between the medians, resampling each side with replacement."""
    rng = random.Random(seed)
    values = []
    for _ in range(rounds):
        cur = statistics.median(rng.choices(current, k=len(current)))
        ref = statistics.median(rng.choices(reference, k=len(reference)))
        values.append(worse_pct(cur, ref, direction, metric))
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
    point = worse_pct(current, ref.value, ref.direction, ref.metric)
    lo, hi = bootstrap_interval(finite, ref_samples, ref.direction, metric=ref.metric)
    figures = {"value": current, "worse_pct": point, "interval_pct": (lo, hi)}
    tol = ref.tolerance_pct
    change = (f"gain {-point:+.1f}% against {ref.value:g} {ref.unit} (95% interval [{-hi:+.1f}, {-lo:+.1f}]%, "
              f"tolerance {tol:g}%; positive is better)")
    if max(len(finite), len(ref_samples)) < min_samples:
        if abs(point) <= tol:   # no change beyond the tolerance was seen; none is claimed either way
            return "pass", f"one sample on each side, within the tolerance; {change}", figures
        kind = "regression" if point > 0 else "improvement"   # beyond the tolerance, but one run a side
        return ("insufficient data", f"one sample on each side: an apparent {kind} beyond the tolerance that noise "
                f"cannot be told from (run each side again); {change}", figures)
    if lo > tol:
        return "regression", change, figures
    if hi < -tol:
        return "improvement", change, figures
    if abs(point) <= tol:
        return "pass", change, figures
    return "insufficient data", f"point estimate out of tolerance, interval is not: {change}", figures


def _dtypes(records: list[ResultRecord], metric: str) -> list[str]:
    """The dtypes whose matmul rates an efficiency metric was measured against (its measured_gflops)."""
    return sorted({d for r in records for d in ((r.metrics.get(metric) or {}).get("measured_gflops") or {})})


def run_dtypes(g: Group) -> Optional[list[str]]:
    """The matmul dtypes a group's speed rests on, whose probe rates decide whether a reference's
    machine can judge it: those its efficiency was measured against (matmul_eff_pct's
    measured_gflops: the model's dtype, a distillation teacher's); none for collectives (their
    bandwidth rests on the link and the memory, the triad); None (every dtype the probes measured)
    where the records do not say (runs that failed). Measured: on a 2-core AMX VM one core's bf16
    F.linear read 352-960 GFLOP/s across one CI run's benches, with its host's neighbours (fp32 84-112,
    within the 40 %), and a CI night whose runs were all fp32 was judged "not comparable" by bf16 alone."""
    if g.kind == "collective":
        return []
    return _dtypes(g.records, "matmul_eff_pct") or None


def _best(refs: list[Reference], nccl: Optional[dict], judges=lambda r: True, machine: Optional[str] = None,
          near=lambda r: 0.0) -> Reference:
    """The reference that applies best: one whose machine can judge the run (`judges`: of a platform's boxes of
    two kinds, each references its own: submit.py) first; then, by name, one of the run's `machine`
    (cross_machine.machine_name: its CPU's ISA class and kind too), else one whose name agrees but for a kind
    one side did not keep (names_agree), over another machine's; then the machine whose probe read nearest the
    run's (`near`, cross_machine.nearness), so that a run none can judge is shown against the nearest; then one
    of the run's own NCCL settings, else one of the platform's (none of its own), then the most specific."""
    def kinship(r: Reference) -> int:
        theirs = r.machine()
        return 2 if theirs == machine else 1 if machine and names_agree(theirs, machine) else 0
    return max(refs, key=lambda r: (judges(r), kinship(r), near(r), r.config.get(NCCL_KEY) == nccl,
                                    NCCL_KEY not in r.config, len(r.config)))


def compare(records: list[ResultRecord], references: list[Reference], min_samples: int = 2) -> list[Verdict]:
    verdicts: list[Verdict] = []
    used: set[tuple] = set()
    for g in group_records(records):
        for applicable in pairing(references, g):
            verdicts += judge(g, applicable, min_samples, used)
    scope = {(g.platform, g.benchmark) for g in group_records(records)}
    by_size = {k[:3] for k in used if k[3] in BY_SIZE}   # a figure of another range: the sizes judged it
    for ref in references:
        if ref.metric in RANGED and (ref.platform, ref.benchmark, _sizeless_key(ref.config)) in by_size:
            continue
        if (ref.platform, ref.benchmark) in scope and ref.key() not in used:
            verdicts.append(Verdict(ref.platform, ref.benchmark, ref.config, ref.metric, "missing",
                                    "a reference with no result in this comparison", unit=ref.unit,
                                    reference=ref.value, tolerance_pct=ref.tolerance_pct,
                                    num_reference_samples=ref.num_samples))
    return verdicts


def _sizeless_key(config: dict[str, Any]) -> str:
    return json.dumps(sizeless(config), sort_keys=True)


def outside_runs(verdicts: list[Verdict], records: list[ResultRecord]) -> tuple[list[Verdict], list[Verdict]]:
    """(the verdicts without those below, the 'missing' verdicts of references whose configuration none of
    the records ran). The nightly lists a reference with no result as missing only when its suite runs
    that configuration (tonight or on its baseline's nights); a reference of a configuration its suite
    never runs (the cpu references of the default suite's nine, against the nightly's two) is one line."""
    groups = group_records(records)
    outside = [v for v in verdicts if v.verdict == "missing" and not v.run_ids and not any(
        matches(Reference(v.platform, v.benchmark, v.config, v.metric, None, "", "higher", 0.0), g) for g in groups)]
    gone = {id(v) for v in outside}
    return [v for v in verdicts if id(v) not in gone], outside


def judge(g: Group, applicable: list[Reference], min_samples: int, used: set[tuple]) -> list[Verdict]:
    """The verdicts of one group against the references of one platform (pairing); the keys of the
    references it used are added to `used`."""
    verdicts: list[Verdict] = []
    other = next((r.platform for r in applicable if r.platform != g.platform), None)
    base = {"platform": g.platform, "benchmark": g.benchmark, "config": g.config,
            "run_ids": [r.run_id for r in g.records], "reference_platform": other}
    ok = [r for r in g.records if r.status == "ok"]
    statuses = sorted({r.status for r in g.records})
    env = pooled(g.records[-1].environment, [r.environment for r in g.records])   # the group's probes, pooled
    dtypes = run_dtypes(g)
    metrics = by_range(sorted(set(REFERENCE_METRICS.get(g.kind, {})) | {r.metric for r in applicable}), applicable, used)
    machines: dict[int, Any] = {}   # id(reference) -> cross_machine.apart of it: once per reference

    def apart_from(ref: Reference) -> Any:
        if id(ref) not in machines:
            machines[id(ref)] = apart(ref.provenance and ref.provenance.environment, env, ref.platform, g.platform,
                                      dtypes)
        return machines[id(ref)]

    def judges(ref: Reference) -> bool:   # the reference's machine can judge this run's
        return not apart_from(ref)
    here, near = machine_name(env, g.platform), nearness(env)
    narrowed = {m: restrict(_best(refs, g.config.get(NCCL_KEY), judges, here, near), ok) for m in BY_SIZE  # once each: the
                if ok and (refs := [r for r in applicable if r.metric == m and r.status == "ok"])}   # figures
    scopes: dict[str, str] = {}
    for metric in metrics:
        refs = [r for r in applicable if r.metric == metric]
        ref = _best(refs, g.config.get(NCCL_KEY), judges, here, near) if refs else None
        if ref:
            used.add(ref.key())
        samples = [r.metrics[metric]["value"] for r in ok if metric in r.metrics]
        units = {r.metrics[metric]["unit"] for r in ok if metric in r.metrics}
        if metric in narrowed and ref and ref.status == "ok":   # the sweep's own range has no reference
            by_size = narrowed[metric]   # of the best ok by-size reference
            if not by_size.words:   # the runs have no size it takes (a sweep from 1 MiB: no small size)
                continue
            units = {ref.unit}
            if by_size.reference is None:
                verdicts.append(Verdict(**base, metric=metric, verdict="insufficient data", reason=by_size.words,
                                        unit=ref.unit, reference=ref.value, tolerance_pct=ref.tolerance_pct,
                                        num_reference_samples=ref.num_samples))
                continue
            ref, samples, scopes[metric] = by_size.reference, by_size.samples, by_size.words
        if ref is None:
            compiled_only = metric in COMPILER_METRICS and "compile" not in g.config   # an eager run has none
            if samples or (not ok and not applicable and not compiled_only):   # a known one's status rows say it
                verdicts.append(Verdict(**base, metric=metric, verdict="new", unit=next(iter(units), None),
                                        reason=f"no reference (status {'/'.join(statuses)})",
                                        value=statistics.median(samples) if samples else None,
                                        num_samples=len(samples)))
            continue
        ref_env = ref.provenance and ref.provenance.environment
        two = apart_from(ref)
        two_why = two.reason.removeprefix('not comparable: ') if two else ""
        across = f"across machines ({two_why}): " if two else ""
        if not two and node_probes(env) and named_only(ref_env, env, dtypes):
            across = f"the reference names its machine only ({machine_of(ref_env)}, a saved output's; no probe): "
        fig = {"unit": ref.unit, "reference": ref.value, "tolerance_pct": ref.tolerance_pct,
               "num_reference_samples": ref.num_samples, "machines": list(two.machines) if two else None,
               "device": two.device if two else None}
        if ref.status != "ok" or not ok:
            now = "ok" if ok else "/".join(statuses)
            if ref.status == now:
                verdicts.append(Verdict(**base, metric=metric, verdict="pass", reason=f"status {now}, as the reference", **fig))
            else:
                reasons = "; ".join(r.reason for r in g.records if r.reason)
                verdicts.append(Verdict(**base, metric=metric, verdict="status changed", **fig,
                                        reason=(across if other else "") + f"{ref.status} -> {now}"
                                        + (f": {reasons}" if reasons else ""),
                                        environment_diff=environment_diff(ref_env, env)))
            continue
        if not samples:
            verdicts.append(Verdict(**base, metric=metric, verdict="missing", **fig,
                                    reason="the reference has this metric; the results do not"))
            continue
        if units != {ref.unit}:
            verdicts.append(Verdict(**base, metric=metric, verdict="insufficient data", **fig,
                                    reason=f"unit mismatch: results in {sorted(units)}, reference in {ref.unit!r}"))
            continue
        mix = two and metric in ACROSS_MACHINES and mix_apart(ref_env, env, _dtypes(ok, metric))
        if two and (metric not in ACROSS_MACHINES or mix):   # the ratio is information, not a verdict
            value = statistics.median(samples)
            change = worse_pct(value, ref.value, ref.direction, metric) if ref.value and math.isfinite(value) else None
            verdicts.append(Verdict(**base, metric=metric, verdict="not comparable", **fig, value=value,
                                    worse_pct=change, num_samples=len(samples),
                                    reason=f"{two.reason}; {mix}" if mix else two.reason))
            continue
        if metric in COUNTS:   # Dynamo's counts: exact, no noise band (harness/verdict/compiled.py)
            verdict, reason, figures = count_verdict(metric, samples, ref.value, ref_env, [r.environment for r in ok])
            verdicts.append(Verdict(**base, metric=metric, verdict=verdict, reason=across + reason,
                                    **{**fig, "tolerance_pct": None}, **figures,   # no band: exact
                                    num_samples=len(samples), environment_diff=environment_diff(ref_env, env)))
            continue
        caches = metric == "compile_s" and caches_apart([r.environment for r in ok])
        if caches:   # a warm cache's compile time is the cache's, not the software's
            value = statistics.median(samples)
            verdicts.append(Verdict(**base, metric=metric, verdict="not comparable", **fig, value=value,
                                    worse_pct=worse_pct(value, ref.value, ref.direction, metric) if ref.value else None,
                                    num_samples=len(samples), reason=caches))
            continue
        verdict, reason, figures = decide(samples, ref, min_samples)
        host = metric in METRICS and METRICS[metric].host_paced and one_cpu_host(ref.config, ref_env, env, metric)
        paced = metric in METRICS and METRICS[metric].paced or host
        held = held_medians(ref, applicable, ok) if metric == SMALL_MEDIAN else None
        # the other work first where it explains the change: it names the cause, the pace only that the machine slowed
        explained = (at_held_up_median(verdict, figures, ref, held)   # a median the tick held up: the calls' count
                     or (at_busy_host(verdict, figures, ref, taken(ref_env, [r.environment for r in ok])) if host else None)
                     or (at_exchange_spell(verdict, figures, ref, exchange_pulses(ref_env, [r.environment for r in ok]))
                         if host and METRICS[metric].latency_bound else None)
                     or (at_cpu_share(verdict, figures, ref, cpu_share(ref_env, [r.environment for r in ok]))
                         if paced or metric in ACROSS_MACHINES else None)
                     or (at_machine_pace(verdict, figures, ref, pace(ref_env, env)) if paced else None)
                     or (at_machine_pace(verdict, figures, ref, probe_pace(ref_env, env))   # against each side's probe
                         if metric in ACROSS_MACHINES and not two else None))
        bal = balance(ref_env, env, _dtypes(ok, metric)) if two and metric in ACROSS_MACHINES and not explained else None
        balanced = at_balance(verdict, figures, ref, bal)
        weighed = {"balance": {"now": bal.now, "reference": bal.then, "dtype": bal.dtype}} if bal else {}
        if explained or balanced:   # the balance's says what sets the machines apart, as any verdict across them
            why = explained or f"{balanced}; the machines apart: {two_why}"
            verdicts.append(Verdict(**base, metric=metric, verdict="not comparable", **fig, value=figures["value"],
                                    worse_pct=figures["worse_pct"], num_samples=len(samples),   # the ratio: information
                                    reason=why, **(weighed if balanced else {})))
            continue
        diff = environment_diff(ref_env, env)   # named whatever the verdict
        verdicts.append(Verdict(**base, metric=metric, verdict=verdict, reason=across + reason, **fig, **figures,
                                num_samples=len(samples), environment_diff=diff, **weighed))
    for v in verdicts:   # which sizes a by-size verdict is of, whatever it says; its kind's figures per size
        if v.metric in scopes:
            v.reason = f"{scopes[v.metric]}: {v.reason}"
        kind = next((shared for shared, own in BY_SIZE.items() if v.metric in (shared, own)), None)
        if kind in narrowed and narrowed[kind].sizes:
            v.sizes = narrowed[kind].sizes
    return verdicts


def by_range(metrics: list[str], applicable: list[Reference], used: set[tuple]) -> list[str]:
    """The metrics a collective group is judged on, per pair of a range's metric and its by-size one (BY_SIZE):
    the range's (avg_busbw_gbps, small_time_us) where a reference of its own size range applies (a by-size
    reference of it is then used up silently); else the by-size one (shared_busbw_gbps, shared_small_time_us)
    where it applies (the range's has no counterpart: no 'new' row for it); neither by-size metric otherwise.
    Another range's references without a by-size time (made before it) judge no small time, nor call it new; nor
    the small sizes' median and lower quartile (small_median_us, small_p25_us), which only a reference of the run's
    own range judges."""
    have = {r.metric for r in applicable}
    drop = set()
    for shared, own in BY_SIZE.items():
        if own in have:
            used.update(r.key() for r in applicable if r.metric == shared)
            drop.add(shared)
        else:
            drop.add(own if shared in have else shared)
    if SHARED in have and AVERAGE not in have:   # only another range's: its sizes judge, no figure of its own range
        drop.update((LARGE, SMALL, SMALL_MEDIAN, SMALL_P25))
    return [m for m in metrics if m not in drop]


def load_records(paths: list[str]) -> list[ResultRecord]:
    """Result records from files and folders (record_files.load_records): any file that is not a
    valid record stops the comparison, every one named."""
    records = [rec for _, rec in load_result_records(paths, strict=True, heading="cannot compare").records]
    if not records:
        raise HarnessError(none_found(paths))
    return records
