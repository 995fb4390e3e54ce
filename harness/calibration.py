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
- with no training record: the reference tables' samples_per_s of the same platform and workload
  (reference_results/*.json), inverted like throughput records; the source says so.
- otherwise DEFAULT_EFFICIENCY, labelled uncalibrated.
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

from .config import BenchConfig
from .errors import HarnessError

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
                          for op, c in sorted(self.busbw.items())}}


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


def _variant(cfg: BenchConfig, mb: int, ga: int, stage: int, ckpt: Optional[bool] = None) -> BenchConfig:
    """cfg with another split and stage (a measured configuration to invert)."""
    w = dataclasses.replace(cfg.workload, micro_batch_size=mb, grad_acc_steps=ga)
    if ckpt is not None:
        w.activation_checkpointing = ckpt
    return dataclasses.replace(cfg, workload=w, zero=dataclasses.replace(cfg.zero, stage=stage))


def _record_efficiency(rec: dict[str, Any], cfg: BenchConfig, curves: dict[str, BusbwCurve]) -> Optional[tuple[float, str]]:
    from .perfmodel import efficiency_for_step_time, executed_flops_per_step

    w = rec["config"]["workload"]
    mb, ga, stage = int(w["micro_batch_size"]), int(w["grad_acc_steps"]), int(rec["config"]["zero"]["stage"])
    variant = _variant(cfg, mb, ga, stage, bool(w.get("activation_checkpointing", False)))
    profiled = [sum(m.get("compute_s", 0.0) for m in step) for step in rec.get("microsteps") or [] if step]
    if profiled and statistics.median(profiled) > 0:
        peak = variant.platform.peak_tflops[variant.workload.precision.value] * 1e12
        return executed_flops_per_step(variant) / (statistics.median(profiled) * peak), "profile"
    step = (rec.get("metrics") or {}).get("step_time_s", {}).get("value")
    if not step:
        return None
    eff = efficiency_for_step_time(variant, Calibration(busbw=curves), float(step))
    return (eff, "throughput") if eff is not None else None


def _by_mb(values: list[tuple[int, int, float]], stage: int) -> tuple[dict[int, float], str]:
    """Median efficiency per micro-batch size, from the entries of `stage` when there are any
    (ZeRO-3's compute time also holds its gather bookkeeping), else from all."""
    same = [v for v in values if v[0] == stage]
    chosen = same or values
    groups: dict[int, list[float]] = {}
    for _, mb, eff in chosen:
        groups.setdefault(mb, []).append(eff)
    stages = sorted({s for s, _, _ in chosen})
    where = f"ZeRO-{stage}" if same else "ZeRO-" + "/".join(map(str, stages)) + f", none of ZeRO-{stage}"
    return ({mb: statistics.median(v) for mb, v in sorted(groups.items())},
            f"{len(chosen)} of {len(values)} ({where}; mb {', '.join(map(str, sorted(groups)))})")


def calibrate(records: list[dict[str, Any]], cfg: BenchConfig, references: Optional[list] = None) -> Calibration:
    """A Calibration for cfg from records (any mix of kinds; others' platforms and world sizes are
    ignored) and, when no training record qualifies, from `references` (harness.references.Reference
    list, e.g. load_references()); see the module docstring."""
    curves = busbw_curves(records, cfg)
    found: list[tuple[int, int, float]] = []
    modes: set[str] = set()
    for rec in records:
        if (rec.get("kind") != "training" or rec.get("status") != "ok" or not _same_place(rec, cfg)
                or rec.get("benchmark") != cfg.workload.name or not _workload_matches(rec.get("config") or {}, cfg)):
            continue
        try:
            got = _record_efficiency(rec, cfg, curves)
            w = rec["config"]["workload"]
            key = (int(rec["config"]["zero"]["stage"]), int(w["micro_batch_size"]))
        except (KeyError, TypeError, ValueError):  # a record without the fields a training record has
            continue
        if got is not None:
            found.append((*key, got[0]))
            modes.add(got[1])
    if found:
        by_mb, where = _by_mb(found, cfg.zero.stage)
        how = "profile-mode compute" if modes == {"profile"} else "+".join(sorted(modes))
        return Calibration(by_mb, statistics.median(by_mb.values()),
                           f"measured: {where} training runs, {how}", curves)
    found = _reference_efficiencies(references or [], cfg, curves)
    if found:
        by_mb, where = _by_mb([(s, mb, e) for s, mb, e, _ in found], cfg.zero.stage)
        origin = found[0][3]
        return Calibration(by_mb, statistics.median(by_mb.values()),
                           f"reference table: {where} samples_per_s entries, inverted through the model's "
                           f"communication estimate; {origin}", curves)
    return Calibration(busbw=curves)


def _reference_efficiencies(refs: list, cfg: BenchConfig, curves: dict[str, BusbwCurve]) -> list[tuple[int, int, float, str]]:
    from .perfmodel import efficiency_for_step_time

    out = []
    world = cfg.platform.world_size
    for r in refs:
        c = r.config
        if (r.platform != cfg.platform.name or r.benchmark != cfg.workload.name or r.metric != "samples_per_s"
                or r.status != "ok" or not r.value or not {"micro_batch_size", "grad_acc_steps", "zero_stage"} <= set(c)
                or c.get("num_ranks", world) != world or c.get("seq_len", cfg.workload.seq_len) != cfg.workload.seq_len
                or c.get("precision", cfg.workload.precision.value) != cfg.workload.precision.value):
            continue
        mb, ga, stage = int(c["micro_batch_size"]), int(c["grad_acc_steps"]), int(c["zero_stage"])
        step_time = mb * ga * world / r.value
        eff = efficiency_for_step_time(_variant(cfg, mb, ga, stage), Calibration(busbw=curves), step_time)
        if eff is not None:
            src = r.provenance.source if r.provenance else "no provenance"
            unstated = [k for k in ("num_ranks", "seq_len") if k not in c]
            note = f" (the entry does not state {' or '.join(unstated)}: assumed as configured)" if unstated else ""
            out.append((stage, mb, eff, f"from: {src[:70]}{'...' if len(src) > 70 else ''}{note}"))
    return out
