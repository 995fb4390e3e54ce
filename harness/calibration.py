"""What the performance model (harness/perfmodel.py) takes from measurements: the computation
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
  predicted one's; cells listed as outliers in harness/model_params.py are left out. The source
  says so.
- an implied efficiency above 1 (the measurement beats the declared peak) is kept and warned
  about (Calibration.warnings), never dropped.
- per micro-batch size, on GPU platforms every stage's entries are pooled (the model carries
  ZeRO-3's overhead itself, harness/model_params.py); on the cpu platform a stage's own entries
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

import bisect
import dataclasses
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from .config import BenchConfig, Device, GradientCollective, ZeroConfig
from .errors import HarnessError
from .model_params import PARAMS, ModelParams

DEFAULT_EFFICIENCY = 0.4
"""Efficiency assumed when nothing was measured: a typical MFU of dense LLaMA training with
DeepSpeed on A100/H100 (30-50% in public reports). A guess, and every output labelled as such."""
RECORD_KINDS = ("training", "collective")


@dataclass(frozen=True)
class BusbwCurve:
    """Measured bus bandwidth of one collective against message size."""
    op: str
    points: tuple[tuple[int, float], ...]
    """(size_bytes, busbw_gbps): nccl-tests' size (the full buffer), ascending, busbw > 0."""
    source: str

    def busbw_gbps(self, size_bytes: float) -> float:
        """busbw at a message size: log-log interpolation between the measured sizes; below the
        smallest the time stays that of the smallest (latency-bound, busbw proportional to size);
        above the largest the busbw stays that of the largest (bandwidth-bound)."""
        sizes = [s for s, _ in self.points]
        if size_bytes <= sizes[0]:
            return self.points[0][1] * size_bytes / sizes[0]
        if size_bytes >= sizes[-1]:
            return self.points[-1][1]
        i = bisect.bisect_right(sizes, size_bytes)
        (s0, b0), (s1, b1) = self.points[i - 1], self.points[i]
        frac = (math.log(size_bytes) - math.log(s0)) / (math.log(s1) - math.log(s0))
        return math.exp(math.log(b0) + frac * (math.log(b1) - math.log(b0)))


@dataclass(frozen=True)
class Calibration:
    efficiency_by_mb: dict[int, float] = field(default_factory=dict)
    """Measured efficiency per micro-batch size (empty: efficiency_default everywhere)."""
    efficiency_default: float = DEFAULT_EFFICIENCY
    efficiency_source: str = f"uncalibrated default {DEFAULT_EFFICIENCY}"
    busbw: dict[str, BusbwCurve] = field(default_factory=dict)
    """Measured curves by op (all_reduce, all_gather, reduce_scatter, ...)."""
    warnings: tuple[str, ...] = ()
    """What a user should know about the calibration (an implied efficiency above 1, ...)."""

    def efficiency(self, micro_batch_size: int) -> float:
        """The efficiency at a micro-batch size: measured there, else interpolated in log(mb)
        between the nearest measured sizes, else that of the nearest one."""
        if not self.efficiency_by_mb:
            return self.efficiency_default
        mbs = sorted(self.efficiency_by_mb)
        if micro_batch_size <= mbs[0]:
            return self.efficiency_by_mb[mbs[0]]
        if micro_batch_size >= mbs[-1]:
            return self.efficiency_by_mb[mbs[-1]]
        i = bisect.bisect_left(mbs, micro_batch_size)
        lo, hi = mbs[i - 1], mbs[i]
        if hi == micro_batch_size:
            return self.efficiency_by_mb[hi]
        frac = math.log(micro_batch_size / lo) / math.log(hi / lo)
        return self.efficiency_by_mb[lo] + frac * (self.efficiency_by_mb[hi] - self.efficiency_by_mb[lo])

    def to_dict(self) -> dict[str, Any]:
        return {"efficiency_by_mb": {str(k): v for k, v in sorted(self.efficiency_by_mb.items())},
                "efficiency_default": self.efficiency_default, "efficiency_source": self.efficiency_source,
                "busbw": {op: {"points": [list(p) for p in c.points], "source": c.source}
                          for op, c in sorted(self.busbw.items())}, "warnings": list(self.warnings)}


def load_records(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Result records from files and folders (a folder's *.json; JSON that is not a record, such
    as suite.json, and unreadable files inside a folder are skipped). A named path that does not
    exist, or a named file that is not readable JSON, is an error."""
    records: list[dict[str, Any]] = []
    for path in map(Path, paths):
        if path.is_dir():
            files, named = sorted(path.glob("*.json")), False
        elif path.is_file():
            files, named = [path], True
        else:
            raise HarnessError(f"--records {path}: no such file or folder")
        for f in files:
            try:
                data = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                if named:
                    raise HarnessError(f"--records {f}: not a readable JSON file: {exc}") from None
                continue
            if is_record(data):
                records.append(data)
    return records


def is_record(data: Any) -> bool:
    return (isinstance(data, dict) and data.get("kind") in RECORD_KINDS
            and all(k in data for k in ("platform", "status", "config", "metrics")))


def num_ranks(record: dict[str, Any]) -> Optional[int]:
    env = record.get("environment") or {}
    if env.get("num_ranks"):
        return int(env["num_ranks"])
    p = (record.get("config") or {}).get("platform") or {}
    if p.get("gpus_per_node") and p.get("nodes"):
        return int(p["gpus_per_node"]) * int(p["nodes"])
    return None


def _same_place(record: dict[str, Any], cfg: BenchConfig) -> bool:
    return record.get("platform") == cfg.platform.name and num_ranks(record) == cfg.platform.world_size


def busbw_curves(records: list[dict[str, Any]], cfg: BenchConfig) -> dict[str, BusbwCurve]:
    """Curves from the ok collective records of cfg's platform and world size: per op and size,
    the median over records of the mean busbw of a row's placements."""
    by_op: dict[str, dict[int, list[float]]] = {}
    ids: dict[str, list[str]] = {}
    for rec in records:
        if rec.get("kind") != "collective" or rec.get("status") != "ok" or not _same_place(rec, cfg):
            continue
        op = rec.get("benchmark")
        for row in rec.get("rows") or []:
            values = [row[k]["busbw_gbps"] for k in ("out_of_place", "in_place")
                      if row.get(k) and row[k].get("busbw_gbps", 0) > 0]
            if values:
                by_op.setdefault(op, {}).setdefault(int(row["size_bytes"]), []).append(statistics.fmean(values))
        ids.setdefault(op, []).append(str(rec.get("run_id", "?")))
    curves = {}
    for op, sizes in by_op.items():
        points = tuple((s, statistics.median(v)) for s, v in sorted(sizes.items()))
        curves[op] = BusbwCurve(op, points, f"measured: {len(ids[op])} {op} record(s) "
                                f"{points[0][0]}..{points[-1][0]} B ({', '.join(ids[op][:3])})")
    return curves


def _workload_matches(config: dict[str, Any], cfg: BenchConfig) -> bool:
    w = config.get("workload") or {}
    return (w.get("seq_len") == cfg.workload.seq_len
            and w.get("precision") in (None, cfg.workload.precision.value))


ZERO_KNOBS = tuple(f.name for f in dataclasses.fields(ZeroConfig) if f.name != "stage")


def zero_from_knobs(stage: int, knobs: Optional[dict[str, Any]]) -> ZeroConfig:
    """A ZeroConfig of a measured configuration: its stage and its own knobs (a record's or a
    reference's `zero`), DeepSpeed's defaults for every knob it does not set."""
    z = ZeroConfig(stage=stage)
    for k, v in (knobs or {}).items():
        if k in ZERO_KNOBS and v is not None:
            setattr(z, k, GradientCollective(v) if k == "gradient_collective" else v)
    return z


def _variant(cfg: BenchConfig, mb: int, ga: int, stage: int, ckpt: Optional[bool] = None,
             knobs: Optional[dict[str, Any]] = None) -> BenchConfig:
    """cfg with another split, stage and ZeRO knobs (a measured configuration to invert: its own
    knobs, never the predicted configuration's)."""
    w = dataclasses.replace(cfg.workload, micro_batch_size=mb, grad_acc_steps=ga)
    if ckpt is not None:
        w.activation_checkpointing = ckpt
    return dataclasses.replace(cfg, workload=w, zero=zero_from_knobs(stage, knobs))


def _record_variant(rec: dict[str, Any], cfg: BenchConfig) -> BenchConfig:
    w = rec["config"]["workload"]
    mb, ga, stage = int(w["micro_batch_size"]), int(w["grad_acc_steps"]), int(rec["config"]["zero"]["stage"])
    return _variant(cfg, mb, ga, stage, bool(w.get("activation_checkpointing", False)), rec["config"]["zero"])


def _profile_efficiency(rec: dict[str, Any], cfg: BenchConfig) -> Optional[float]:
    """FLOPs executed per rank per optimizer step / (median profile-mode compute_s of a step x
    cfg's declared peak); None without profile micro-steps."""
    from .perfmodel import executed_flops_per_step

    variant = _record_variant(rec, cfg)
    profiled = [sum(m.get("compute_s", 0.0) for m in step) for step in rec.get("microsteps") or [] if step]
    if not profiled or statistics.median(profiled) <= 0:
        return None
    peak = variant.platform.peak_tflops[variant.workload.precision.value] * 1e12
    return executed_flops_per_step(variant) / (statistics.median(profiled) * peak)


def _record_efficiency(rec: dict[str, Any], cfg: BenchConfig, curves: dict[str, BusbwCurve],
                       params: ModelParams = PARAMS) -> Optional[tuple[float, str]]:
    from .perfmodel import efficiency_for_step_time

    eff = _profile_efficiency(rec, cfg)
    if eff is not None:
        return eff, "profile"
    step = (rec.get("metrics") or {}).get("step_time_s", {}).get("value")
    if not step:
        return None
    variant = _record_variant(rec, cfg)
    eff = efficiency_for_step_time(variant, Calibration(busbw=curves), float(step), params)
    return (eff, "throughput") if eff is not None else None


def _by_mb(values: list[tuple[int, int, float]], stage: int, prefer_stage: bool = True) -> tuple[dict[int, float], str]:
    """Median efficiency per micro-batch size, from the entries of `stage` when there are any and
    prefer_stage (cpu: ZeRO-3's compute time also holds its gather bookkeeping), else from all."""
    same = [v for v in values if v[0] == stage] if prefer_stage else []
    chosen = same or values
    groups: dict[int, list[float]] = {}
    for _, mb, eff in chosen:
        groups.setdefault(mb, []).append(eff)
    stages = sorted({s for s, _, _ in chosen})
    where = (f"ZeRO-{stage}" if same else "ZeRO-" + "/".join(map(str, stages))
             + (f", none of ZeRO-{stage}" if prefer_stage else " pooled: the model carries each stage's communication"))
    return ({mb: statistics.median(v) for mb, v in sorted(groups.items())},
            f"{len(chosen)} of {len(values)} ({where}; mb {', '.join(map(str, sorted(groups)))})")


def calibrate(records: list[dict[str, Any]], cfg: BenchConfig, references: Optional[list] = None,
              params: ModelParams = PARAMS, compute_records: Optional[list[dict[str, Any]]] = None) -> Calibration:
    """A Calibration for cfg from records (any mix of kinds; others' platforms and world sizes are
    ignored) and, when no training record qualifies, from `references` (harness.references.Reference
    list, e.g. load_references()); with compute_records, the efficiency from those alone (another
    platform of the same machine allowed: calibrate_on_machine); see the module docstring."""
    curves = busbw_curves(records, cfg)
    if compute_records is not None:
        from .compute_calibration import calibrate_on_machine

        return calibrate_on_machine(compute_records, records, cfg, curves)
    found: list[tuple[int, int, float]] = []
    modes: set[str] = set()
    for rec in records:
        if (rec.get("kind") != "training" or rec.get("status") != "ok" or not _same_place(rec, cfg)
                or rec.get("benchmark") != cfg.workload.name or not _workload_matches(rec.get("config") or {}, cfg)):
            continue
        try:
            got = _record_efficiency(rec, cfg, curves, params)
            w = rec["config"]["workload"]
            key = (int(rec["config"]["zero"]["stage"]), int(w["micro_batch_size"]))
        except (KeyError, TypeError, ValueError):  # a record without the fields a training record has
            continue
        if got is not None:
            found.append((*key, got[0]))
            modes.add(got[1])
    prefer_stage = cfg.platform.device != Device.cuda
    if found:
        by_mb, where = _by_mb(found, cfg.zero.stage, prefer_stage)
        how = "profile-mode compute" if modes == {"profile"} else "+".join(sorted(modes))
        return Calibration(by_mb, statistics.median(by_mb.values()),
                           f"measured: {where} training runs, {how}", curves, _above_peak(by_mb, "training runs"))
    found = _reference_efficiencies(references or [], cfg, curves, params)
    if found:
        by_mb, where = _by_mb([(s, mb, e) for s, mb, e, _, _ in found], cfg.zero.stage, prefer_stage)
        metrics = "/".join(sorted({metric for *_, metric, _ in found}))
        return Calibration(by_mb, statistics.median(by_mb.values()),
                           f"reference table: {where} {metrics} entries, each inverted with its own configuration "
                           f"through the model's communication estimate; {found[0][4]}", curves,
                           _above_peak(by_mb, "reference entries"))
    return Calibration(busbw=curves)


def _above_peak(by_mb: dict[int, float], what: str) -> tuple[str, ...]:
    high = {mb: e for mb, e in by_mb.items() if e > 1}
    if not high:
        return ()
    return (f"implied efficiency above 1 (faster than the declared peak) from {what} at micro-batch "
            + ", ".join(f"{mb}: {e:.2f}" for mb, e in sorted(high.items()))
            + ": kept, but the measured workload is probably not the one configured (sequence length, "
              "checkpointing, node count?) or the declared peak is wrong",)


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


def _reference_efficiencies(refs: list, cfg: BenchConfig, curves: dict[str, BusbwCurve],
                            params: ModelParams = PARAMS) -> list[tuple[int, int, float, str, str]]:
    """(stage, micro-batch, efficiency, metric, origin) of every reference entry that qualifies."""
    from .perfmodel import efficiency_for_step_time

    out = []
    p, world, w = cfg.platform, cfg.platform.world_size, cfg.workload
    for r in refs:
        c = r.config
        if (r.platform != p.name or r.benchmark != w.name or r.metric not in REFERENCE_METRICS
                or r.status != "ok" or not r.value or not {"micro_batch_size", "grad_acc_steps", "zero_stage"} <= set(c)
                or is_outlier(r, params.outliers)
                or c.get("num_ranks", c.get("nodes", p.nodes) * p.gpus_per_node) != world
                or c.get("seq_len", w.seq_len) != w.seq_len
                or c.get("activation_checkpointing", w.activation_checkpointing) != w.activation_checkpointing
                or c.get("precision", w.precision.value) != w.precision.value):
            continue
        mb, ga, stage = int(c["micro_batch_size"]), int(c["grad_acc_steps"]), int(c["zero_stage"])
        step_time = reference_step_time_s(r, world)
        eff = efficiency_for_step_time(_variant(cfg, mb, ga, stage, knobs=c.get("zero")), Calibration(busbw=curves),
                                       step_time, params)
        if eff is not None:
            src = r.provenance.source if r.provenance else "no provenance"
            unstated = [k for k in ("seq_len", "activation_checkpointing") if k not in c]
            note = f" (the entry does not state {' or '.join(unstated)}: assumed as configured)" if unstated else ""
            out.append((stage, mb, eff, r.metric, f"from: {src[:70]}{'...' if len(src) > 70 else ''}{note}"))
    return out
