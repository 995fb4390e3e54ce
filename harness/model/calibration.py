"""What the performance model (harness/model/perfmodel.py) takes from measurements: the computation
efficiency (achieved over declared peak FLOP/s) and bus-bandwidth curves of the collectives.

Sources, best first, each named in the Calibration's source strings:
- training records of the same platform, world size, workload, sequence length and precision,
  status ok: efficiency = FLOPs executed per rank in a profile-mode optimizer step / (the step's
  summed micro-step compute_s x declared peak) -- profile mode times every collective on its own,
  so compute_s is computation only (it includes the optimizer step's own work, which the model
  does not count separately). Records without profile micro-steps: the efficiency at which the
  model reproduces the measured step time (its communication estimate subtracted).
- collective records (kind 'collective') of the same platform and world size: busbw per message
  size per op, nccl-tests semantics (harness/collectives.py), the mean of the placements.
- with no training record: the reference tables' samples_per_s (or, for the paper's Model 1,
  batch_time_s = step time / grad-acc) of the same platform, workload, world size, sequence length,
  precision and activation checkpointing (reference_results/*.json), each inverted with its OWN
  configuration (stage, split, ZeRO knobs: DeepSpeed's defaults where the entry sets none), not the
  predicted one's; cells listed as outliers in harness/model/params.py are left out. The source
  says so.
- an implied efficiency above 1 (the measurement beats the declared peak) is kept and warned
  about (Calibration.warnings), never dropped.
- per micro-batch size, on GPU platforms every stage's entries are pooled (the model carries
  ZeRO-3's overhead itself, harness/model/params.py); on the cpu platform a stage's own entries
  are preferred (gloo's synchronous ZeRO-3 bookkeeping is part of its measured compute).
- otherwise DEFAULT_EFFICIENCY, labelled uncalibrated.

With `compute_records` (the command line's --compute-records), the efficiency comes from those
training records only, which may be of ANOTHER platform: one that ran on the same machine (same
device kind, same device model, on CPU the same number of usable cores: record_machine) as the
records of cfg's own platform in `records` show, with the same number of ranks, workload, sequence
length and precision, in profile mode. Their profile-mode compute_s is computation only, so the
FLOPs it executed over cfg's declared peak transfers the achieved FLOP/s, not the other platform's
declared peak; the busbw curves still come from cfg's own platform (e.g. single-node runs of the
emulated cluster's machine for the computation, the cluster's collective sweep for the network).
The source names the platform(s), the machine and the runs. Nothing qualifying is an error.
Pure, except load_records (reads files).
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Iterable, Optional

from ..config.choices import Device
from ..config.schema import BenchConfig
from ..config.split import with_split
from ..errors import HarnessError
from ..record import ResultRecord
from ..verdict.cross_machine import names_agree
from .calibration_inputs import (above_peak, busbw_curves, efficiency_by_mb, host_bound, load_records,  # noqa: F401 (API)
                                 calibrating, num_ranks, own_shape, profile_efficiency,
                                 record_efficiency, record_variant, same_place, stack_matches, stage_and_micro_batch,
                                 workload_matches, zero_from_knobs)
from .calibration_types import DEFAULT_EFFICIENCY, BusbwCurve, Calibration  # noqa: F401 (API)
from .compute_calibration import calibrate_on_machine
from .params import PARAMS, ModelParams
from .perfmodel import efficiency_for_step_time, roofline_efficiency
from .stack import eager_twin, is_eager, stack_words


def calibrate(records: list[ResultRecord], cfg: BenchConfig, references: Optional[list] = None,
              params: ModelParams = PARAMS, compute_records: Optional[list[ResultRecord]] = None,
              machine: Optional[str] = None) -> Calibration:
    """A Calibration for cfg from records (any mix of kinds; others' platforms and world sizes are
    ignored) and, when no training record qualifies, from `references` (harness.verdict.references.Reference
    list, e.g. load_references()); with compute_records, the efficiency from those alone (another
    platform of the same machine allowed: calibrate_on_machine); see the module docstring. Only
    measurements of cfg's own training stack calibrate it (stack_matches); a configuration away from
    the eager stack with none of its own takes the eager twin's measured efficiency carried by the
    roofline's ratio (carried_to_stack); a distilled run with none of its own takes its student alone's
    (student_twin). `machine` (cross_machine.this_machine: the one that will run cfg)
    picks its own entries where the table holds several machines' (of_machine)."""
    own = _of_stack(records, cfg, references, params, compute_records, machine)
    student = student_twin(cfg)
    if own.efficiency_by_mb or student is None:
        return own
    try:
        alone = _of_stack(records, student, references, params, compute_records, machine)
    except HarnessError:            # --compute-records: none of the student alone
        return own
    if not alone.efficiency_by_mb:
        return own
    return carried_to_teacher(alone, cfg, student, params)


def carried_to_teacher(alone: Calibration, cfg: BenchConfig, student: BenchConfig,
                       params: ModelParams = PARAMS) -> Calibration:
    """The student alone's measured efficiency per micro-batch carried to its distilled run: x the ratio of
    the two rooflines there (the distilled one adds the teacher's forward and the loss), so that the
    measured student time grows by the roofline's share of the teacher and the loss. Without a roofline
    (the cpu platform, a GPU of undeclared bandwidth) the teacher's forward runs at the student's
    efficiency and the loss is not counted, as the source says."""
    by_mb, ratios = {}, []
    for mb, eff in alone.efficiency_by_mb.items():
        ratio = _roofline_ratio(cfg, student, mb, params)
        ratios.append(ratio)
        by_mb[mb] = eff * (ratio or 1.0)
    name = student.workload.name
    how = (f"of {name} alone, x the roofline's ratio with its teacher's forward and the distillation loss "
           f"({min(ratios):.3g}" + (f"-{max(ratios):.3g}" if max(ratios) > min(ratios) + 5e-4 else "") + ")"
           if all(ratios) else
           f"of {name} alone, the teacher's forward taken at its efficiency, the distillation loss not counted")
    return dataclasses.replace(alone, efficiency_by_mb=by_mb, efficiency_default=statistics.median(by_mb.values()),
                               efficiency_source=f"{alone.efficiency_source}; {how}",
                               warnings=alone.warnings + above_peak(by_mb, "the carried efficiency"))


def _roofline_ratio(cfg: BenchConfig, twin: BenchConfig, mb: int, params: ModelParams) -> Optional[float]:
    """cfg's roofline efficiency over its twin's, both at micro-batch mb (None without a roofline)."""
    at, twin_at = (dataclasses.replace(c, workload=dataclasses.replace(c.workload, micro_batch_size=mb))
                   for c in (cfg, twin))
    mine, theirs = roofline_efficiency(at, params), roofline_efficiency(twin_at, params)
    return mine[0] / theirs[0] if mine and theirs else None


def student_twin(cfg: BenchConfig) -> Optional[BenchConfig]:
    """cfg's student alone (workload <name>-kd without its teacher, named <name>), None for a run without a
    teacher or a distilled workload not so named: its own measurements calibrate a distilled run that has
    none, its efficiency over the student's and the teacher's FLOPs (perfmodel.phase_flops)."""
    w = cfg.workload
    if w.distill is None or not w.name.endswith("-kd"):
        return None
    return dataclasses.replace(cfg, workload=dataclasses.replace(w, distill=None, name=w.name.removesuffix("-kd")))


def _of_stack(records: list[ResultRecord], cfg: BenchConfig, references: Optional[list], params: ModelParams,
              compute_records: Optional[list[ResultRecord]], machine: Optional[str]) -> Calibration:
    """cfg's own measurements, or for a stack away from eager with none, its eager twin's carried (carried_to_stack)."""
    if is_eager(cfg.workload):
        return _calibrate(records, cfg, references, params, compute_records, machine)
    try:
        own = _calibrate(records, cfg, references, params, compute_records, machine)
    except HarnessError:            # --compute-records: none of this stack
        own = None
    if own is not None and own.efficiency_by_mb:
        return own
    eager = _calibrate(records, eager_twin(cfg), references, params, compute_records, machine)
    return carried_to_stack(eager, cfg, params) if eager.efficiency_by_mb else (own or eager)


def carried_to_stack(eager: Calibration, cfg: BenchConfig, params: ModelParams = PARAMS) -> Calibration:
    """The eager twin's measured efficiency per micro-batch carried to cfg's stack: x the ratio of the two
    rooflines (perfmodel.roofline_efficiency, each over its own precision's peak) at that micro-batch, so
    that the measured eager time shrinks by the roofline's speed-up. Without a roofline (the cpu
    platform, a GPU of undeclared bandwidth) the time is carried unchanged and the source says the
    stack's effect there is not modelled."""
    twin, w = eager_twin(cfg), cfg.workload
    by_mb: dict[int, float] = {}
    speedups = []
    peaks = cfg.platform.peak_tflops[w.precision.value] / cfg.platform.peak_tflops[twin.workload.precision.value]
    for mb, eff in eager.efficiency_by_mb.items():
        ratio = _roofline_ratio(cfg, twin, mb, params) or 1.0 / peaks     # unchanged time without a roofline
        speedups.append(ratio * peaks)
        by_mb[mb] = eff * ratio
    words = stack_words(w)
    how = (f"x the roofline's speed-up of the {words} stack ({min(speedups):.3g}x"
           + (f"-{max(speedups):.3g}x" if max(speedups) > min(speedups) + 5e-4 else "") + ", harness/model/stack.py)"
           if roofline_efficiency(cfg, params) else
           f"carried unchanged: the {words} stack's effect on {cfg.platform.name} is not modelled (TO MEASURE)")
    return Calibration(by_mb, statistics.median(by_mb.values()),
                       f"{eager.efficiency_source}; measured on the eager stack, {how}", eager.busbw,
                       eager.warnings + above_peak({mb: e for mb, e in by_mb.items()}, "the carried efficiency"))


def _calibrate(records: list[ResultRecord], cfg: BenchConfig, references: Optional[list],
               params: ModelParams, compute_records: Optional[list[ResultRecord]],
               machine: Optional[str] = None) -> Calibration:
    curves = busbw_curves(records, cfg)
    if compute_records is not None:
        return calibrate_on_machine(compute_records, records, cfg, curves)
    found: list[tuple[int, int, float]] = []
    modes: set[str] = set()
    for rec in records:
        if (rec.kind != "training" or rec.status != "ok" or not same_place(rec, cfg)
                or rec.benchmark != cfg.workload.name or not workload_matches(rec.config, cfg)):
            continue
        try:
            got = record_efficiency(rec, cfg, curves, params)
            key = stage_and_micro_batch(rec)
        except (KeyError, TypeError, ValueError):  # a record without the fields a training record has
            continue
        if got is not None:
            found.append((*key, got[0]))
            modes.add(got[1])
    prefer_stage = cfg.platform.device != Device.cuda
    zero3_modelled = cfg.platform.name in params.zero3_unexplained_platforms
    found = calibrating(found, not prefer_stage, zero3_modelled)
    if found:
        by_mb, where = efficiency_by_mb(found, cfg.zero.stage, prefer_stage)
        how = "profile-mode compute" if modes == {"profile"} else "+".join(sorted(modes))
        return Calibration(by_mb, statistics.median(by_mb.values()),
                           f"measured: {where} training runs, {how}", curves, above_peak(by_mb, "training runs"))
    other = calibrating(_other_size_efficiencies(records, cfg), not prefer_stage, zero3_modelled)
    if other:
        by_mb, where = efficiency_by_mb([(s, mb, e) for s, mb, e, _ in other], cfg.zero.stage, prefer_stage)
        notes = sorted({note for *_, note in other})
        return Calibration(by_mb, statistics.median(by_mb.values()),
                           f"measured at another size: {where} profile-mode training runs of {cfg.platform.name} "
                           f"({'; '.join(notes)})", curves, above_peak(by_mb, "training runs"))
    entries, whose = of_machine([r for r in references or [] if _qualifies(r, cfg, params)], machine)
    found = calibrating(_reference_efficiencies(entries, cfg, curves, params), not prefer_stage, zero3_modelled)
    if found:
        by_mb, where = efficiency_by_mb([(s, mb, e) for s, mb, e, _, _ in found], cfg.zero.stage, prefer_stage)
        metrics = "/".join(sorted({metric for *_, metric, _ in found}))
        return Calibration(by_mb, statistics.median(by_mb.values()),
                           f"reference table: {where} {metrics} entries{whose}, each inverted with its own configuration "
                           f"through the model's communication estimate; {found[0][4]}", curves,
                           above_peak(by_mb, "reference entries"))
    return Calibration(busbw=curves)


def core_share(cfg: BenchConfig, ranks: int, cores: Optional[int]) -> float:
    """The share of a core each rank's threads get: on a cpu platform the ranks of a host (every rank
    when platform.shared_host, else a node's) split its cores; 1 on GPUs or with the cores unknown."""
    p = cfg.platform
    if p.device == Device.cuda or not cores:
        return 1.0
    on_host = ranks if p.shared_host else min(ranks, p.gpus_per_node)
    return min(1.0, cores / (on_host * p.cpu_threads))


def _other_size_efficiencies(records: list[ResultRecord], cfg: BenchConfig) -> list[tuple[int, int, float, str]]:
    """(stage, micro-batch, efficiency, note) of the profile-mode training records of cfg's platform,
    workload, sequence and precision at ANOTHER world size: a rank's computation does not depend on
    how many ranks there are (data parallel: the same micro-batch per rank), except where ranks share
    a host's cores (core_share): the efficiency is carried by the ratio of the shares."""
    out = []
    for rec in records:
        m = num_ranks(rec)
        if (rec.kind != "training" or rec.status != "ok" or rec.platform != cfg.platform.name or not m
                or m == cfg.platform.world_size or rec.benchmark != cfg.workload.name
                or not workload_matches(rec.config, cfg)):
            continue
        try:
            eff, key = profile_efficiency(rec, cfg), stage_and_micro_batch(rec)
            step = rec.metrics.get("step_time_s", {}).get("value")
            if eff is None or (step and host_bound(record_variant(rec, cfg), float(step))):
                continue
        except (KeyError, TypeError, ValueError):
            continue
        cores = ((rec.environment.get("machine") or {}).get("cpu") or {}).get("usable_cpus")
        share_m, share_n = core_share(cfg, m, cores), core_share(cfg, cfg.platform.world_size, cores)
        note = f"at {m} ranks" + (f", x {share_n / share_m:.3g} for {cfg.platform.world_size} ranks on {cores} cores"
                                  if share_n != share_m else "")
        out.append((*key, eff * share_n / share_m, note))
    return out


REFERENCE_METRICS = ("samples_per_s", "batch_time_s")
"""Reference metrics that give a step time: samples_per_s (global samples per second) and
batch_time_s (the paper's Model 1: seconds per micro-batch, i.e. per loop iteration = step / grad-acc)."""


def reference_step_time_s(r: Any, world: int) -> Optional[float]:
    """The optimizer-step time a reference entry states (see REFERENCE_METRICS), None for others."""
    c = r.config
    if r.status != "ok" or not r.value or r.metric not in REFERENCE_METRICS:
        return None
    mb, ga = int(c["micro_batch_size"]), int(c["grad_acc_steps"])
    return mb * ga * world / r.value if r.metric == "samples_per_s" else r.value * ga


def is_outlier(r: Any, outliers: Iterable[tuple[str, str, int, int]]) -> bool:
    c = r.config
    return (r.platform, r.benchmark, int(c.get("zero_stage", -1)), int(c.get("micro_batch_size", -1))) in set(outliers)


def of_machine(entries: list, machine: Optional[str]) -> tuple[list, str]:
    """(the entries to calibrate on, how the source names their machines): where the qualifying entries come
    from several machines (one platform's boxes of two kinds: cpu.json's EPYC with AVX2 only and with AVX-512),
    those of `machine` (the one that will run) when it has any, else all of them pooled, the source saying
    which; one machine's as they are."""
    machines = sorted({r.machine() for r in entries})
    if len(machines) < 2:
        return entries, ""
    mine = ([r for r in entries if r.machine() == machine]   # its own name, else one kept before the CPU's kind
            or [r for r in entries if machine and names_agree(r.machine(), machine)])
    if mine:
        return mine, f" of this machine, {machine} (one of the table's {len(machines)})"
    return entries, (f" pooled over {len(machines)} machines ({'; '.join(machines)})"
                     + (f": none is this one, {machine}" if machine else ""))


def _qualifies(r: Any, cfg: BenchConfig, params: ModelParams = PARAMS) -> bool:
    """Whether a reference entry states a step time of cfg's platform, workload, world size, sequence, checkpointing,
    precision, shape and training stack (not a listed outlier)."""
    c = r.config
    p, world, w = cfg.platform, cfg.platform.world_size, cfg.workload
    return not (r.platform != p.name or r.benchmark != w.name or r.metric not in REFERENCE_METRICS
                or r.status != "ok" or not r.value or not {"micro_batch_size", "grad_acc_steps", "zero_stage"} <= set(c)
                or is_outlier(r, params.outliers)
                or c.get("num_ranks", c.get("nodes", p.nodes) * p.gpus_per_node) != world
                or c.get("seq_len", w.seq_len) != w.seq_len
                or c.get("activation_checkpointing", w.activation_checkpointing) != w.activation_checkpointing
                or c.get("checkpoint_every_n_layers", 1) != w.checkpoint_every_n_layers
                or c.get("checkpoint_policy", "full") != w.checkpoint_policy.value
                or c.get("precision", w.precision.value) != w.precision.value
                or (c.get("shape") or {}) != own_shape(cfg)  # another model's
                or not stack_matches(c, cfg))               # another training stack's


def _reference_efficiencies(refs: list, cfg: BenchConfig, curves: dict[str, BusbwCurve],
                            params: ModelParams = PARAMS) -> list[tuple[int, int, float, str, str]]:
    """(stage, micro-batch, efficiency, metric, origin) of every reference entry that qualifies (_qualifies)."""
    out = []
    world = cfg.platform.world_size
    for r in refs:
        if not _qualifies(r, cfg, params):
            continue
        c = r.config
        mb, ga, stage = int(c["micro_batch_size"]), int(c["grad_acc_steps"]), int(c["zero_stage"])
        step_time = reference_step_time_s(r, world)
        measured = with_split(cfg, stage, mb, ga, zero=zero_from_knobs(stage, c.get("zero")))
        if host_bound(measured, step_time, params):
            continue
        eff = efficiency_for_step_time(measured, Calibration(busbw=curves), step_time, params)
        if eff is not None:
            src = r.provenance.source if r.provenance else "no provenance"
            unstated = [k for k in ("seq_len", "activation_checkpointing") if k not in c]
            note = f" (the entry does not state {' or '.join(unstated)}: assumed as configured)" if unstated else ""
            out.append((stage, mb, eff, r.metric, f"from: {src[:70]}{'...' if len(src) > 70 else ''}{note}"))
    return out
