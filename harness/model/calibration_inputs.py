"""What a measurement says to the calibration (harness/model/calibration.py): result records read back,
where a record ran, the configuration it measured, and the computation efficiency it implies
(profile-mode compute time, else the step time through the model's communication estimate)."""
from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path
from typing import Any, Iterable, Optional

from ..config.choices import Device, GradientCollective
from ..config.schema import BenchConfig, ZeroConfig
from ..config.split import with_split
from ..errors import HarnessError
from ..record import ResultRecord
from ..verdict.record_files import load_records as load_result_records
from ..verdict.references import SHAPE_FIELDS, STACK_DEFAULTS, shape_override
from .calibration_types import BusbwCurve, Calibration
from .offload import offload_settings
from .params import PARAMS, ModelParams
from .perfmodel import efficiency_for_step_time, executed_flops_per_step, host_floor, optimizer_step
from .topology import carried_points

HOST_BOUND_MARGIN = 1.25
"""A GPU measurement whose micro-steps take less than this many times the host's floor (params
host_s_per_module) is host-bound: it says how fast the host issued work, not how fast the GPU ran
it, so it calibrates no efficiency. 1.25: the floor's fit leaves residuals up to 19 ms of 100-350 ms."""


def host_bound(measured: BenchConfig, step_time_s: float, params: ModelParams = PARAMS) -> bool:
    """Whether a measured GPU configuration's step time is within HOST_BOUND_MARGIN of its host floor."""
    floor, _ = host_floor(measured, params)
    return floor > 0 and step_time_s / measured.workload.grad_acc_steps < HOST_BOUND_MARGIN * floor


def offloaded(rec: ResultRecord) -> bool:
    """Whether a GPU record's optimizer ran (partly) on the host (zero_optimization.offload_optimizer in
    its DeepSpeed JSON): its step holds the host's share, which the model adds itself (offload_time), so
    it calibrates no GPU efficiency."""
    config = rec.config if isinstance(rec.config, dict) else {}
    return ((config.get("platform") or {}).get("device") == Device.cuda.value
            and offload_settings(config.get("deepspeed")).optimizer != "none")


def load_records(paths: Iterable[str | Path]) -> list[ResultRecord]:
    """Result records from files and folders (record_files.load_records: a named file that is not a
    record is an error; a folder's JSON that is not one, such as a tune's state, is skipped)."""
    try:
        return [rec for _, rec in load_result_records(paths).records]
    except HarnessError as exc:
        raise HarnessError(f"--records {exc}") from None


def num_ranks(record: ResultRecord) -> Optional[int]:
    env = record.environment
    if env.get("num_ranks"):
        return int(env["num_ranks"])
    p = record.config.get("platform") or {}
    if p.get("gpus_per_node") and p.get("nodes"):
        return int(p["gpus_per_node"]) * int(p["nodes"])
    return None


def same_place(record: ResultRecord, cfg: BenchConfig) -> bool:
    return record.platform == cfg.platform.name and num_ranks(record) == cfg.platform.world_size


def busbw_curves(records: list[ResultRecord], cfg: BenchConfig) -> dict[str, BusbwCurve]:
    """Curves from the ok collective records of cfg's platform: per op and size, the median over
    records of the mean busbw of a row's placements, at cfg's world size. An op measured on the
    platform at other world sizes only is carried from the nearest one as a ring
    (harness/model/topology.py, carried_points: the latency part grows with the ring's steps, the
    bandwidth part with nccl-tests' factor), and its source says so."""
    by_op: dict[tuple[str, int], dict[int, list[float]]] = {}
    ids: dict[tuple[str, int], list[str]] = {}
    for rec in records:
        n = num_ranks(rec)
        if rec.kind != "collective" or rec.status != "ok" or rec.platform != cfg.platform.name or not n or n < 2:
            continue
        key = (rec.benchmark, n)
        for row in rec.rows or []:
            values = [row[k]["busbw_gbps"] for k in ("out_of_place", "in_place")
                      if row.get(k) and (row[k].get("busbw_gbps") or 0) > 0]
            if values:
                by_op.setdefault(key, {}).setdefault(int(row["size_bytes"]), []).append(statistics.fmean(values))
        ids.setdefault(key, []).append(rec.run_id)
    world, curves = cfg.platform.world_size, {}
    for op in sorted({op for op, _ in by_op}):
        measured = [n for o, n in by_op if o == op]
        m = min(measured, key=lambda n: (abs(math.log(n / world)), n))
        sizes = by_op[(op, m)]
        points = tuple((s, statistics.median(v)) for s, v in sorted(sizes.items()))
        source = (f"measured: {len(ids[(op, m)])} {op} record(s) {points[0][0]}..{points[-1][0]} B "
                  f"({', '.join(ids[(op, m)][:3])})")
        if m != world:
            points = carried_points(points, op, m, world, gloo=cfg.platform.device != Device.cuda)
            source += f" at {m} ranks, carried to {world} as a ring (latency x steps, bandwidth x factor)"
        curves[op] = BusbwCurve(op, points, source)
    return curves


def own_shape(cfg: BenchConfig) -> dict[str, Any]:
    """cfg's model shape where it differs from its named workload's (references.shape_override)."""
    return shape_override({"name": cfg.workload.name, **{k: getattr(cfg.workload, k) for k in SHAPE_FIELDS}})


def own_stack(cfg: BenchConfig) -> dict[str, Any]:
    """cfg's training stack as a record's workload (or a reference's key) spells it: compile,
    compile_mode, kernels, attention, and fp8_recipe under precision fp8."""
    w = cfg.workload
    out = {k: getattr(w, k).value for k in STACK_DEFAULTS}
    if w.precision.value == "fp8":
        out["fp8_recipe"] = w.fp8_recipe.value
    return out


def stack_matches(entry: dict[str, Any], cfg: BenchConfig) -> bool:
    """Whether a record's workload (or a reference entry's key) ran cfg's training stack: a key it
    lacks is the eager default (every record and reference made before the stack existed ran eager)."""
    return all(entry.get(k, STACK_DEFAULTS.get(k, "tensorwise")) == v for k, v in own_stack(cfg).items())


def workload_matches(config: dict[str, Any], cfg: BenchConfig) -> bool:
    """Same sequence length, precision, model shape (a record of llama-440m at 6 layers says
    nothing of the 24-layer model's efficiency) and training stack (a compiled run's efficiency is
    not the eager model's: stack_matches)."""
    w = config.get("workload") or {}
    return (w.get("seq_len") == cfg.workload.seq_len
            and w.get("precision") in (None, cfg.workload.precision.value)
            and shape_override(w) == own_shape(cfg) and stack_matches(w, cfg))


ZERO_KNOBS = tuple(f.name for f in dataclasses.fields(ZeroConfig) if f.name != "stage")


def zero_from_knobs(stage: int, knobs: Optional[dict[str, Any]]) -> ZeroConfig:
    """A ZeroConfig of a measured configuration: its stage and its own knobs (a record's or a
    reference's `zero`), DeepSpeed's defaults for every knob it does not set."""
    z = ZeroConfig(stage=stage)
    for k, v in (knobs or {}).items():
        if k in ZERO_KNOBS and v is not None:
            setattr(z, k, GradientCollective(v) if k == "gradient_collective" else v)
    return z


def stage_and_micro_batch(rec: ResultRecord) -> tuple[int, int]:
    """The ZeRO stage and micro-batch size a training record ran (KeyError/TypeError/ValueError when
    its free-form config lacks them)."""
    return int(rec.config["zero"]["stage"]), int(rec.config["workload"]["micro_batch_size"])


def record_variant(rec: ResultRecord, cfg: BenchConfig) -> BenchConfig:
    """cfg at a record's split, stage, activation checkpointing and ZeRO knobs (a measured configuration
    to invert: its own knobs, never the predicted configuration's), validated (config.split)."""
    w, z = rec.config["workload"], rec.config["zero"]
    mb, ga, stage = int(w["micro_batch_size"]), int(w["grad_acc_steps"]), int(z["stage"])
    return with_split(cfg, stage, mb, ga, activation_checkpointing=bool(w.get("activation_checkpointing", False)),
                      checkpoint_every_n_layers=int(w.get("checkpoint_every_n_layers", 1)),
                      checkpoint_policy=w.get("checkpoint_policy", "full"),
                      zero=zero_from_knobs(stage, z))


def profile_efficiency(rec: ResultRecord, cfg: BenchConfig) -> Optional[float]:
    """FLOPs executed per rank per optimizer step / ((median profile-mode compute_s of a step less the model's
    optimizer step, perfmodel.optimizer_step, which predict adds apart) x cfg's declared peak); None without
    profile micro-steps."""
    if offloaded(rec):
        return None
    variant = record_variant(rec, cfg)
    profiled = [sum(m.get("compute_s", 0.0) for m in step) for step in rec.microsteps if step]
    compute = statistics.median(profiled) - optimizer_step(variant, ranks=num_ranks(rec)) if profiled else 0.0
    if compute <= 0:
        return None
    peak = variant.platform.peak_tflops[variant.workload.precision.value] * 1e12
    return executed_flops_per_step(variant) / (compute * peak)


def record_efficiency(rec: ResultRecord, cfg: BenchConfig, curves: dict[str, BusbwCurve],
                       params: ModelParams = PARAMS) -> Optional[tuple[float, str]]:
    if offloaded(rec):
        return None
    step = rec.metrics.get("step_time_s", {}).get("value")
    variant = record_variant(rec, cfg)
    if step and host_bound(variant, float(step), params):
        return None
    eff = profile_efficiency(rec, cfg)
    if eff is not None:
        return eff, "profile"
    if not step:
        return None
    eff = efficiency_for_step_time(variant, Calibration(busbw=curves), float(step), params)
    return (eff, "throughput") if eff is not None else None


def calibrating(values: list, gpu: bool, zero3_modelled: bool) -> list:
    """The measured (stage, micro-batch, efficiency, ...) entries that may calibrate: on a GPU platform
    whose ZeRO-3 excess the model does not carry (not one of params zero3_unexplained_platforms),
    none of ZeRO-3's: what ZeRO-3 costs beyond its bytes and its host floor is not the GPU's
    computation, and inverted as such it slows every stage (on the H200: ZeRO-1 at mb 32 predicted
    5x too slow from ZeRO-3's entry)."""
    return [v for v in values if v[0] != 3] if gpu and not zero3_modelled else values


def efficiency_by_mb(values: list[tuple[int, int, float]], stage: int, prefer_stage: bool = True) -> tuple[dict[int, float], str]:
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


def above_peak(by_mb: dict[int, float], what: str) -> tuple[str, ...]:
    high = {mb: e for mb, e in by_mb.items() if e > 1}
    if not high:
        return ()
    return (f"implied efficiency above 1 (faster than the declared peak) from {what} at micro-batch "
            + ", ".join(f"{mb}: {e:.2f}" for mb, e in sorted(high.items()))
            + ": kept, but the measured workload is probably not the one configured (sequence length, "
              "checkpointing, node count?) or the declared peak is wrong",)
