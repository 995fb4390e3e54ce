"""Validation of a composed BenchConfig: every check names the field, the bad value and what would be
valid, and runs before anything launches."""
from __future__ import annotations

import copy
import math
import re
import warnings
from pathlib import Path
from typing import Any

from contract.collectives import OPS

from ..errors import ConfigError
from .choices import (CheckpointPolicy, CollectiveRedop, CollectiveSource, ContainerRuntime, DataSource, Device,
                      GradientCollective, LauncherKind, Precision, RunKind, checkpointing_of)
from .stack import validate_stack
from .nccl_env import normalise_nccl_env, validate_nccl_env
from .schema import BenchConfig, ContainerConfig, PlatformConfig, SlurmConfig, WorkloadConfig, ZeroConfig, delayed_ranks
from .teacher import teacher_workload, validate_checkpoint


def _check(ok: bool, field_name: str, value: Any, valid: str) -> None:
    if not ok:
        raise ConfigError(f"{field_name}={value!r} is invalid: {valid}")


def validate_grad_accum(w: WorkloadConfig, z: ZeroConfig) -> None:
    if w.grad_accum_dtype is None:
        return
    a, field_name = Precision(w.grad_accum_dtype), "workload.grad_accum_dtype"
    model = Precision.bf16 if w.precision == Precision.fp8 else w.precision
    _check(a != Precision.fp8, field_name, a.value, "gradients accumulate in fp32, bf16 or fp16")
    _check(a in (Precision.fp32, model), field_name, a.value,
           f"DeepSpeed accumulates a {model.value} model's gradients in "
           + " or ".join(sorted({"fp32", model.value})))
    _check(a == model or z.stage != 0, field_name, a.value,
           f"DeepSpeed 0.19.8 has no fp32 accumulation of a {model.value} model without ZeRO "
           "(NotImplementedError); use zero.stage >= 1 or leave it unset")
    _check(not (a != model and z.stage == 1 and z.gradient_collective == GradientCollective.reduce_scatter),
           field_name, a.value, "fp32 accumulation under ZeRO-1 runs DeepSpeed's BF16_Optimizer, which "
           "zero.gradient_collective=reduce_scatter cannot replace; use all_reduce or leave it unset")


def resolve(cfg: BenchConfig) -> BenchConfig:
    """A copy of a composed config with what it leaves implicit made explicit: the NCCL variables
    normalised (names checked, values as strings), grad_acc_steps derived from samples_per_step /
    micro_batch_size when unset (0). The input is not changed; validate() then checks the copy."""
    cfg = copy.deepcopy(cfg)
    p, w = cfg.platform, cfg.workload
    p.nccl_env = normalise_nccl_env(p.nccl_env, field="platform.nccl_env")
    cfg.nccl_env = normalise_nccl_env(cfg.nccl_env, field="nccl_env")
    if w.grad_acc_steps == 0 and w.micro_batch_size >= 1 and w.samples_per_step % w.micro_batch_size == 0:
        w.grad_acc_steps = w.samples_per_step // w.micro_batch_size
    return cfg


def validate(cfg: BenchConfig) -> None:
    """Check every cross-field rule of a resolved config (resolve()); changes nothing. Raises ConfigError."""
    p, w, z, m, d = cfg.platform, cfg.workload, cfg.zero, cfg.measure, cfg.data
    _check(p.gpus_per_node >= 1, "platform.gpus_per_node", p.gpus_per_node, "must be >= 1")
    _check(p.rails >= 0, "platform.rails", p.rails, "must be >= 0 (0: one NIC per GPU)")
    _check(p.nodes >= 1, "platform.nodes", p.nodes, "must be >= 1")
    _check(1 <= p.cpu_threads <= 1024, "platform.cpu_threads", p.cpu_threads, "threads per rank in [1, 1024]")
    if p.host_threads is not None:
        _check(1 <= p.host_threads <= 1024, "platform.host_threads", p.host_threads,
               "threads per GPU rank in [1, 1024], or null for the rank's share of its cores")
        if p.device == Device.cpu:
            warnings.warn(f"platform.host_threads={p.host_threads} has no effect on a cpu platform: "
                          "platform.cpu_threads sets a rank's threads there", stacklevel=2)
    _check(p.mem_per_device_gib > 0, "platform.mem_per_device_gib", p.mem_per_device_gib, "must be > 0")
    _check(p.hbm_gbps >= 0, "platform.hbm_gbps", p.hbm_gbps, "must be >= 0 GB/s (0: the model's table by gpu_model)")
    if p.device == Device.cpu:
        _check(w.precision != Precision.fp16, "workload.precision", "fp16",
               "fp16 needs a GPU; use fp32 or bf16 on the cpu device")
    validate_stack(cfg)   # first: precision=fp8 on a GPU without FP8 is refused for that reason, not for its peak
    dtype = w.precision.value
    _check(p.peak_tflops.get(dtype, 0) > 0, "platform.peak_tflops", dict(p.peak_tflops),
           f"needs a positive entry for the workload's precision '{dtype}' (MFU is never guessed)")
    validate_nccl_env(p.nccl_env, "platform.nccl_env")
    validate_nccl_env(cfg.nccl_env, "nccl_env")
    validate_nccl_env({**p.nccl_env, **cfg.nccl_env}, "nccl_env (over platform.nccl_env)")
    if p.device == Device.cpu and cfg.nccl_env:
        warnings.warn(f"nccl_env {sorted(cfg.nccl_env)} has no effect on the cpu platform (gloo); "
                      "it is recorded only", stacklevel=2)
    _check(p.launcher != LauncherKind.local or p.nodes == 1, "platform.nodes", p.nodes,
           "the local launcher runs one node; use nodes=1 or platform.launcher=slurm")
    validate_container(p.container)
    validate_slurm(p.slurm)

    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "seq_len", "samples_per_step", "micro_batch_size"):
        _check(getattr(w, name) >= 1, f"workload.{name}", getattr(w, name), "must be >= 1")
    _check(w.hidden_size % w.num_heads == 0, "workload.num_heads", w.num_heads,
           f"must divide hidden_size={w.hidden_size}")
    _check(w.num_heads % w.num_kv_heads == 0, "workload.num_kv_heads", w.num_kv_heads,
           f"must divide num_heads={w.num_heads}")
    _check(w.samples_per_step % w.micro_batch_size == 0, "workload.micro_batch_size",
           w.micro_batch_size, f"must divide samples_per_step (C) = {w.samples_per_step}; valid: "
           f"{[b for b in range(1, w.samples_per_step + 1) if w.samples_per_step % b == 0]}")
    derived = w.samples_per_step // w.micro_batch_size
    _check(w.grad_acc_steps == derived, "workload.grad_acc_steps", w.grad_acc_steps,
           f"micro_batch_size x grad_acc_steps must equal samples_per_step (C) = "
           f"{w.samples_per_step}; with micro_batch_size={w.micro_batch_size} it must be {derived}")
    _check(w.checkpoint_every_n_layers >= 1, "workload.checkpoint_every_n_layers", w.checkpoint_every_n_layers,
           "must be >= 1 (1: every layer)")
    alone = "has no effect without workload.activation_checkpointing=true; set both or neither"
    _check(w.activation_checkpointing or w.checkpoint_every_n_layers == 1, "workload.checkpoint_every_n_layers",
           w.checkpoint_every_n_layers, alone)
    _check(w.activation_checkpointing or w.checkpoint_policy == CheckpointPolicy.full, "workload.checkpoint_policy",
           w.checkpoint_policy.value, alone)
    for name in ("lr", "eps"):
        _check(getattr(w, name) > 0, f"workload.{name}", getattr(w, name), "must be > 0")
    _check(all(0 <= b < 1 for b in w.betas), "workload.betas", list(w.betas), "each in [0, 1)")
    _check(w.weight_decay >= 0, "workload.weight_decay", w.weight_decay, "must be >= 0")
    _check(w.grad_clip >= 0, "workload.grad_clip", w.grad_clip, "must be >= 0 (0 disables)")
    _check(w.name.endswith("-kd") == (w.distill is not None), "workload.name", w.name,
           "a distillation workload (workload.distill set) is named <model>-<size>-kd, and only it")
    if w.distill is not None:
        validate_distill(w, p)

    _check(z.stage in (0, 1, 2, 3), "zero.stage", z.stage, "valid stages: 0, 1, 2, 3")
    if z.gradient_collective == GradientCollective.reduce_scatter:
        _check(z.stage in (1, 2), "zero.gradient_collective", z.gradient_collective.value,
               f"reduce_scatter replaces the ZeRO-1/2 gradient all-reduce; zero.stage={z.stage} "
               f"{'has no partitioned gradients' if z.stage == 0 else 'already reduce-scatters'}; "
               "use all_reduce")
    validate_grad_accum(w, z)
    for name in ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                 "stage3_max_live_parameters"):
        v = getattr(z, name)
        _check(v is None or v >= 1, f"zero.{name}", v, "must be >= 1 elements (or unset)")
    for name in ("stage3_param_persistence_threshold", "stage3_max_reuse_distance"):
        v = getattr(z, name)
        _check(v is None or v >= 0, f"zero.{name}", v, "must be >= 0 (or unset)")

    _check(m.warmup_steps >= 0, "measure.warmup_steps", m.warmup_steps, "must be >= 0")
    _check(0 <= m.compile_warmup_max <= 50, "measure.compile_warmup_max", m.compile_warmup_max, "steps in [0, 50]")
    _check(m.steps >= 1, "measure.steps", m.steps, "must be >= 1")
    _check(m.profile_steps >= 0, "measure.profile_steps", m.profile_steps, "must be >= 0")
    _check(0 <= m.inject_delay_s < 60, "measure.inject_delay_s", m.inject_delay_s, "seconds in [0, 60)")
    _check(m.inject_delay_rank is None or 0 <= m.inject_delay_rank < cfg.platform.world_size,
           "measure.inject_delay_rank", m.inject_delay_rank, f"must be a rank in 0..{cfg.platform.world_size - 1}")
    _check(m.inject_delay_node is None or 0 <= m.inject_delay_node < cfg.platform.nodes,
           "measure.inject_delay_node", m.inject_delay_node, f"must be a node in 0..{cfg.platform.nodes - 1}")
    _check(m.inject_delay_node is None or m.inject_delay_rank is None, "measure.inject_delay_node",
           m.inject_delay_node, "slows a node's ranks; measure.inject_delay_rank one rank: set one of them")
    if m.inject_delay_s:
        ranks = delayed_ranks(cfg)
        who = ("every" if ranks is None else f"rank {ranks[0]}'s" if m.inject_delay_node is None else
               f"node {m.inject_delay_node}'s ranks' (ranks {', '.join(map(str, ranks))})")
        warnings.warn(f"measure.inject_delay_s={m.inject_delay_s}: {who} micro-step is slowed on purpose",
                      stacklevel=2)
    _check(math.isfinite(m.timeout_s) and m.timeout_s > 0, "measure.timeout_s", m.timeout_s,
           "must be a positive number of seconds")

    _check(cfg.history in ("auto", "none") or "://" in cfg.history, "history", cfg.history,
           "auto, none, or an SQLAlchemy URL (sqlite:///path/history.sqlite)")
    _check(0 <= cfg.confirm_regressions <= 10, "confirm_regressions", cfg.confirm_regressions,
           "runs more of a run that read a regression, in [0, 10] (0: none)")
    if d.source == DataSource.corpus:
        for name in ("corpus_path", "tokenizer_path"):
            path = getattr(d, name)
            _check(path is not None and Path(path).exists(), f"data.{name}", path,
                   "data.source=corpus needs an existing local file")
    if cfg.deepspeed_config is not None:
        _check(Path(cfg.deepspeed_config).is_file(), "deepspeed_config", cfg.deepspeed_config,
               "must be an existing DeepSpeed JSON file")
    validate_collective(cfg)
    validate_tune(cfg)
    names = [r.name for r in cfg.suite.runs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    _check(not dupes, "suite.runs", dupes, "run names must be unique within a suite")
    unknown = [n for n in cfg.only if n not in names]
    _check(not unknown, "only", unknown, f"suite {cfg.suite.name} has the runs {names}" if names
           else f"suite {cfg.suite.name} has no named runs (only= picks among a suite's runs)")


def validate_tune(cfg: BenchConfig) -> None:
    t, c = cfg.tune, cfg.workload.samples_per_step
    _check(bool(t.steps) and set(t.steps) <= {1, 2, 3} and len(set(t.steps)) == len(t.steps),
           "tune.steps", list(t.steps), "a non-empty list of distinct steps from 1, 2, 3")
    _check(t.budget >= 0, "tune.budget", t.budget, "must be >= 0 (0: automatic)")
    _check(t.grid_max >= 1, "tune.grid_max", t.grid_max, "must be >= 1")
    _check(bool(t.stages) and set(t.stages) <= {0, 1, 2, 3}, "tune.stages", list(t.stages),
           "a non-empty list of ZeRO stages from 0, 1, 2, 3")
    bad = [b for b in t.micro_batch_sizes if b < 1 or c % b]
    _check(not bad, "tune.micro_batch_sizes", list(t.micro_batch_sizes),
           f"each must divide C = workload.samples_per_step = {c}; {bad} do not")
    try:
        chosen = [checkpointing_of(word) for word in t.checkpointing]
    except ValueError as exc:
        raise ConfigError(f"tune.checkpointing={list(t.checkpointing)!r} is invalid: {exc}") from None
    _check(len(set(chosen)) == len(chosen), "tune.checkpointing", list(t.checkpointing),
           "each choice once (every_1 is full)")
    for name in ("bucket_sizes", "prefetch_bucket_sizes"):
        values = getattr(t, name)
        _check(all(v >= 1 for v in values), f"tune.{name}", list(values), "elements, each >= 1")
    for var, values in t.nccl_space.items():
        _check(bool(values), f"tune.nccl_space.{var}", values, "a non-empty list of values")
        for v in values:
            validate_nccl_env(normalise_nccl_env({var: v}, field="tune.nccl_space"), "tune.nccl_space")
    _check(t.loss_tolerance is None or t.loss_tolerance > 0, "tune.loss_tolerance", t.loss_tolerance,
           "must be > 0 (or null: by precision)")
    _check(t.collective_iters >= 1, "tune.collective_iters", t.collective_iters, "must be >= 1")
    _check(t.confirm_repeats >= 2, "tune.confirm_repeats", t.confirm_repeats,
           "must be >= 2 (one sample a side cannot judge noise)")


SCRIPT_SAFE = re.compile(r"^[A-Za-z0-9_.,:@+%=/-]+$")
"""What a Slurm option value may hold: it goes into a batch script, so no spaces, quotes or newlines."""


def validate_container(c: ContainerConfig) -> None:
    if c.runtime == ContainerRuntime.none:
        _check(c.image is None, "platform.container.image", c.image,
               "set platform.container.runtime (apptainer, docker or podman) to run in an image")
        return
    _check(bool(c.image) and SCRIPT_SAFE.match(c.image) is not None, "platform.container.image", c.image,
           f"runtime {c.runtime.value} needs an image (a .sif path or an image reference, no spaces)")
    for b in c.binds:
        _check(bool(b) and SCRIPT_SAFE.match(b) is not None and b.split(":")[0].startswith("/"),
               "platform.container.binds", b, "absolute host paths `src[:dst]`, no spaces")


def validate_slurm(s: SlurmConfig) -> None:
    for name in ("partition", "account", "qos", "time_limit", "constraint"):
        v = getattr(s, name)
        _check(v is None or SCRIPT_SAFE.match(v) is not None, f"platform.slurm.{name}", v,
               "letters, digits and _.,:@+%=/- only (it goes into the batch script)")
    if s.time_limit is not None:
        _check(re.fullmatch(r"(\d+-)?\d+(:\d{1,2}){0,2}", s.time_limit) is not None,
               "platform.slurm.time_limit", s.time_limit, "Slurm's format: minutes, MM:SS, HH:MM:SS or D-HH:MM:SS")
    for a in s.extra_args:
        _check(a.startswith("--") and SCRIPT_SAFE.match(a) is not None, "platform.slurm.extra_args", a,
               "each an sbatch option `--name[=value]` with no spaces")
    _check(s.cpus_per_task is None or s.cpus_per_task >= 1, "platform.slurm.cpus_per_task", s.cpus_per_task,
           "must be >= 1 (or unset)")
    _check(s.array_parallelism is None or s.array_parallelism >= 1, "platform.slurm.array_parallelism",
           s.array_parallelism, "must be >= 1 (or unset: no limit)")
    _check(1024 <= s.rdzv_port <= 64535, "platform.slurm.rdzv_port", s.rdzv_port, "a port in 1024..64535")
    _check(s.startup_s >= 0, "platform.slurm.startup_s", s.startup_s, "must be >= 0")
    _check(s.poll_s > 0, "platform.slurm.poll_s", s.poll_s, "must be > 0")
    _check(s.queue_limit_s is None or s.queue_limit_s > 0, "platform.slurm.queue_limit_s", s.queue_limit_s,
           "must be > 0 seconds (or null: no limit)")
    for word in s.client_prefix:
        _check(bool(word) and "\n" not in word and "\0" not in word, "platform.slurm.client_prefix", word,
               "each a non-empty argument with no newline (an argv, never run through a shell)")


def validate_distill(w: WorkloadConfig, p: PlatformConfig) -> None:
    """The distillation settings and the teacher: its shape, and its checkpoint if one is named."""

    d = w.distill
    assert d is not None
    _check(0 <= d.alpha <= 1, "workload.distill.alpha", d.alpha, "must be in [0, 1]")
    _check(math.isfinite(d.temperature) and d.temperature > 0, "workload.distill.temperature",
           d.temperature, "must be a positive number")
    if p.device == Device.cpu:
        _check(d.teacher.precision != Precision.fp16, "workload.distill.teacher.precision", "fp16",
               "fp16 needs a GPU; use bf16 or fp32 on the cpu device")
    t = teacher_workload(w)
    for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
        _check(getattr(t, name) >= 1, f"workload.distill.teacher.{name}", getattr(t, name), "must be >= 1")
    _check(t.hidden_size % t.num_heads == 0, "workload.distill.teacher.num_heads", t.num_heads,
           f"must divide the teacher's hidden_size={t.hidden_size}")
    _check(t.num_heads % t.num_kv_heads == 0, "workload.distill.teacher.num_kv_heads", t.num_kv_heads,
           f"must divide the teacher's num_heads={t.num_heads}")
    validate_checkpoint(d.teacher.checkpoint, t)


def validate_collective(cfg: BenchConfig) -> None:

    c = cfg.collective
    ops = [op.value for op in c.ops]  # each one of OPS, as dtype, redop and source are theirs: their types say so
    _check(bool(ops), "collective.ops", ops, f"valid collectives: {', '.join(OPS)}")
    _check(c.min_bytes >= 1, "collective.min_bytes", c.min_bytes, "must be >= 1 byte")
    _check(c.min_bytes <= c.max_bytes, "collective.min_bytes", c.min_bytes,
           f"must not exceed collective.max_bytes={c.max_bytes}")
    _check(c.step_bytes >= 0, "collective.step_bytes", c.step_bytes, "must be >= 0 (0: use step_factor)")
    _check(c.step_bytes > 0 or c.step_factor > 1, "collective.step_factor", c.step_factor,
           "must be > 1 when step_bytes is 0")
    _check(c.iters >= 1, "collective.iters", c.iters, "must be >= 1")
    _check(c.warmup_iters >= 0, "collective.warmup_iters", c.warmup_iters, "must be >= 0")
    _check(c.small_iters >= 0, "collective.small_iters", c.small_iters, "must be >= 0 (0: collective.iters)")
    _check(0 <= c.root < cfg.platform.world_size, "collective.root", c.root,
           f"must be a rank in 0..{cfg.platform.world_size - 1}")
    if cfg.kind == RunKind.collective:
        if cfg.platform.world_size == 1 and c.source == CollectiveSource.builtin:  # a smoke run: no bus bandwidth
            _check(c.check, "collective.check", c.check,
                   "a one-rank collective sweep is a smoke run (no bus bandwidth can be measured): "
                   "its correctness check is what it measures; set collective.check=true")
            _check(cfg.platform.device != Device.cpu or "sendrecv" not in ops, "collective.ops",
                   ops, "gloo cannot send to its own rank: a one-rank sweep on the cpu device "
                   "cannot run sendrecv; drop it from collective.ops")
        if cfg.platform.device == Device.cpu:
            _check(c.redop != CollectiveRedop.avg, "collective.redop", "avg", "gloo has no avg; valid: sum, prod, max, min")
            _check(c.source == CollectiveSource.builtin, "collective.source", c.source.value,
                   "nccl-tests needs GPUs; the cpu platform runs the builtin sweep")
