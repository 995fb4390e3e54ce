"""Planning: BenchConfig -> DeepSpeed config -> TrainSpec -> RunSpec. Pure but for reading the user's
DeepSpeed JSON (deepspeed_config=) and, when the caller passes an ImageDigests, its check of each
container image: no other I/O, no processes. A RunSpec is final once planned: nothing adds to it later."""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.collectives import DTYPE_BYTES
from contract.fingerprint import DIGEST_VAR
from contract.spec import HOST_THREADS_VAR, CollectiveSpec, DataSpec, DistillSpec, ModelSpec, OptimizerSpec, StackSpec, TrainSpec

from .collectives import sizes
from .config.choices import Compile, CompileCache, ContainerRuntime, Device, LauncherKind, OptimizerImpl, Precision, RunKind
from .config.schema import BenchConfig, WorkloadConfig, delayed_ranks, grad_accum_precision, to_dict
from .config.teacher import checkpoint_files, teacher_workload
from .errors import ConfigError
from .launch.container import ImageDigests, container_env, resolve_image
from .nccl_tests.command import binary_for, command

ZERO_KNOBS = ("overlap_comm", "reduce_scatter", "contiguous_gradients", "reduce_bucket_size",
              "allgather_bucket_size", "stage3_prefetch_bucket_size",
              "stage3_param_persistence_threshold", "stage3_max_live_parameters",
              "stage3_max_reuse_distance")


@dataclass
class RunSpec:
    """Everything needed to launch one run; built without touching the disk."""
    run_id: str
    name: str
    argv: list[str]
    env: dict[str, str]
    num_ranks: int
    timeout_s: float
    run_dir: Path
    spec: TrainSpec | CollectiveSpec
    config: dict[str, Any]
    overrides: list[str] = field(default_factory=list)
    output: str = "events"
    """How the run reports: 'events' (our benchmarks' events.jsonl) or 'nccl-tests' (its stdout)."""

    def record_ids(self) -> list[str]:
        """The records this run produces: a built-in collective sweep one per op, else one."""
        if self.output == "events" and isinstance(self.spec, CollectiveSpec):
            return [f"{self.run_id}-{op}" for op in self.spec.ops]
        return [self.run_id]


def deepspeed_config(cfg: BenchConfig) -> dict[str, Any]:
    """The DeepSpeed JSON generated from the workload and zero groups (before any user file)."""
    w, z = cfg.workload, cfg.zero
    zero: dict[str, Any] = {"stage": z.stage}
    zero.update({k: getattr(z, k) for k in ZERO_KNOBS if getattr(z, k) is not None})
    ds: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": w.micro_batch_size,
        "gradient_accumulation_steps": w.grad_acc_steps,
        "train_batch_size": w.micro_batch_size * w.grad_acc_steps * cfg.platform.world_size,
        "gradient_clipping": w.grad_clip,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
    }
    if w.precision in (Precision.bf16, Precision.fp8):   # fp8: bf16 weights, FP8 matmuls (torchao)
        ds["bf16"] = {"enabled": True}
    elif w.precision == Precision.fp16:
        ds["fp16"] = {"enabled": True}
    # always explicit: DeepSpeed's default accumulates in the model's dtype (bf16 over 16-32 micro-steps)
    ds["data_types"] = {"grad_accum_dtype": grad_accum_precision(w.precision, z.stage, w.grad_accum_dtype).value}
    if w.optimizer == OptimizerImpl.deepspeed:
        ds["optimizer"] = {"type": "AdamW", "params": {
            "lr": w.lr, "betas": list(w.betas), "eps": w.eps, "weight_decay": w.weight_decay}}
    if w.compile == Compile.deepcompile:
        ds["compile"] = {"deepcompile": True}
    return ds


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(merged.get(k), dict):
            merged[k] = _deep_merge(merged[k], v)
        else:
            merged[k] = copy.deepcopy(v)
    return merged


# Keys of the DeepSpeed JSON that the suite derives from its own config: a user file may repeat
# them only with the same value, since the figures (samples/s, MFU, memory) are computed from
# the suite's config. Each maps to the field to set instead.
SUITE_OWNED = {"train_micro_batch_size_per_gpu": "workload.micro_batch_size",
               "gradient_accumulation_steps": "workload.grad_acc_steps",
               "train_batch_size": "workload.micro_batch_size (x grad_acc_steps x ranks)",
               "gradient_clipping": "workload.grad_clip",
               "bf16.enabled": "workload.precision", "fp16.enabled": "workload.precision",
               "data_types.grad_accum_dtype": "workload.grad_accum_dtype",
               **{f"zero_optimization.{k}": f"zero.{k}" for k in ("stage",) + ZERO_KNOBS}}


def _get(d: dict[str, Any], dotted: str, default: Any = None) -> Any:
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return default
        d = d[part]
    return d


def merge_user_deepspeed(generated: dict[str, Any], user: dict[str, Any], source: str) -> dict[str, Any]:
    """Merge a user's DeepSpeed JSON over the generated one.

    Suite-owned keys (SUITE_OWNED) must agree with the suite's config: a differing value is an
    error naming the field to set instead (a missing precision section counts as disabled).
    Everything else comes from the user's file; the merged result is what the run uses and records.
    """
    conflicts = []
    for key, field_name in SUITE_OWNED.items():
        mine = _get(generated, key, False if key.endswith(".enabled") else None)
        theirs = _get(user, key)
        if theirs is not None and mine is not None and theirs != mine:
            conflicts.append(f"{key}={theirs!r} (the suite has {mine!r}; set {field_name} instead)")
    if conflicts:
        raise ConfigError(f"deepspeed_config={source} conflicts with the suite's config: " + "; ".join(conflicts))
    return _deep_merge(generated, user)


def load_user_deepspeed(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"deepspeed_config={path!r} is not a readable JSON file: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"deepspeed_config={path!r} must hold a JSON object, not {type(data).__name__}")
    return data


def model_spec(w: WorkloadConfig) -> ModelSpec:
    return ModelSpec(vocab_size=w.vocab_size, hidden_size=w.hidden_size,
                     intermediate_size=w.intermediate_size, num_layers=w.num_layers,
                     num_heads=w.num_heads, num_kv_heads=w.num_kv_heads,
                     max_position_embeddings=w.seq_len, tie_embeddings=w.tie_embeddings,
                     rope_theta=w.rope_theta, rms_norm_eps=w.rms_norm_eps)


def distill_spec(w: WorkloadConfig) -> DistillSpec | None:
    if w.distill is None:
        return None
    t = teacher_workload(w)
    checkpoint, files = w.distill.teacher.checkpoint, []
    if checkpoint is not None:  # absolute: ranks may start elsewhere than the controller's folder
        checkpoint = str(Path(checkpoint).expanduser().resolve())
        files = [str(f) for f in checkpoint_files(Path(checkpoint))]
    return DistillSpec(alpha=w.distill.alpha, temperature=w.distill.temperature, teacher=model_spec(t),
                       teacher_precision=t.precision.value, teacher_checkpoint=checkpoint,
                       teacher_files=files)


def train_spec(cfg: BenchConfig, run_id: str, ds: dict[str, Any]) -> TrainSpec:
    w, p, m, d = cfg.workload, cfg.platform, cfg.measure, cfg.data
    model = model_spec(w)
    return TrainSpec(
        run_id=run_id, benchmark=w.name, platform=p.name, device=p.device.value,
        dist_backend=p.dist_backend, model=model, seq_len=w.seq_len,
        micro_batch_size=w.micro_batch_size, grad_acc_steps=w.grad_acc_steps,
        precision=w.precision.value,
        optimizer=OptimizerSpec(impl=w.optimizer.value, lr=w.lr, betas=tuple(w.betas), eps=w.eps,
                                weight_decay=w.weight_decay, grad_clip=w.grad_clip),
        deepspeed=ds, warmup_steps=m.warmup_steps, steps=m.steps, profile_steps=m.profile_steps,
        seed=m.seed, data=DataSpec(source=d.source.value, corpus_path=d.corpus_path,
                                   tokenizer_path=d.tokenizer_path, text_field=d.text_field),
        activation_checkpointing=w.activation_checkpointing,
        checkpoint_every_n_layers=w.checkpoint_every_n_layers, checkpoint_policy=w.checkpoint_policy.value,
        inject_delay_s=m.inject_delay_s, inject_delay_ranks=delayed_ranks(cfg),
        cpu_mem_limit_gib=p.mem_per_device_gib if p.device == Device.cpu else None,
        distill=distill_spec(w), gradient_collective=cfg.zero.gradient_collective.value,
        stack=StackSpec(compile=w.compile.value, compile_mode=w.compile_mode.value, kernels=w.kernels.value,
                        attention=w.attention.value, fp8_recipe=w.fp8_recipe.value,
                        compile_warmup_max=m.compile_warmup_max,
                        compile_cache=m.compile_cache.value))


def rank_env(cfg: BenchConfig, repo_root: Path, cache_dir: Path, images: ImageDigests | None = None) -> dict[str, str]:
    """Environment shared by every rank of a run (per-rank variables are the launcher's). `images`:
    checks the run's container image and gives its digest (without it, no check and no digest)."""
    # The interpreter's own bin first: DeepSpeed JIT-builds with the first `ninja` on PATH, and a
    # build log written by another ninja version makes it rebuild from scratch (1-2 min a run).
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)])
    # the repository first, then the caller's own PYTHONPATH (module load, pip --target), which a
    # rank would otherwise lose; inside an image the host's paths mean nothing: the repository only
    own = os.environ.get("PYTHONPATH", "") if cfg.platform.container.runtime == ContainerRuntime.none else ""
    env = {"PYTHONPATH": os.pathsep.join([str(repo_root)] + [x for x in own.split(os.pathsep) if x]),
           "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TORCH_EXTENSIONS_DIR": str(cache_dir / "torch_extensions"),
           "TRITON_CACHE_DIR": str(cache_dir / "triton")}
    c, digest = cfg.platform.container, None
    if c.runtime == ContainerRuntime.none:
        env["PATH"] = path
    else:  # the image's own PATH; it is told which image it is, and its digest where `images` knows it
        image = resolve_image(c, repo_root)
        env.update(container_env(c, image, None))
        if images is not None:
            digest = images.digest(c, image, local_runtime=cfg.platform.launcher == LauncherKind.local)
    if cfg.platform.device == Device.cpu:
        env["DS_ACCELERATOR"] = "cpu"
        env["OMP_NUM_THREADS"] = str(cfg.platform.cpu_threads)
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        env["DS_ACCELERATOR"] = "cuda"
        if cfg.platform.host_threads is not None:
            env[HOST_THREADS_VAR] = str(cfg.platform.host_threads)
    env.update({k: str(v) for k, v in cfg.platform.nccl_env.items()})
    env.update({k: str(v) for k, v in cfg.nccl_env.items()})
    if digest:  # last: it wins over a same-named nccl_env entry
        env[DIGEST_VAR] = digest
    return env


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "run"


def collective_spec(cfg: BenchConfig, run_id: str) -> CollectiveSpec:
    c, p = cfg.collective, cfg.platform
    return CollectiveSpec(
        run_id=run_id, platform=p.name, device=p.device.value, dist_backend=p.dist_backend,
        ops=[op.value for op in c.ops], sizes=sizes(c.min_bytes, c.max_bytes, c.step_factor, c.step_bytes,
                                                    DTYPE_BYTES[c.dtype.value], p.world_size),
        dtype=c.dtype.value, redop=c.redop.value, root=c.root, warmup_iters=c.warmup_iters, iters=c.iters,
        small_iters=c.small_iters, check=c.check, in_place=c.in_place, bind_ranks=c.bind_ranks)


COLD_CACHE = "compile-cache"
"""The run folder's subfolder a compiled run compiles into with measure.compile_cache=cold."""


def compile_cache_env(cfg: BenchConfig, run_dir: Path) -> dict[str, str]:
    """Where a compiled run's ranks keep Inductor's and Triton's caches. cold: the run folder's COLD_CACHE,
    emptied before the launch and removed after it (harness/bench.py), which every rank of the run sees (the
    ranks read their spec from that folder) and shares, as the ranks of a first job on a machine share torch's
    default cache: one rank compiles a kernel, the others wait on its lock and load it. warm, or eager: the
    environment's (TORCHINDUCTOR_CACHE_DIR, else torch's own under the temp folder)."""
    if cfg.kind != RunKind.training or cfg.workload.compile == Compile.none or cfg.measure.compile_cache != CompileCache.cold:
        return {}
    folder = run_dir.resolve() / COLD_CACHE
    return {"TORCHINDUCTOR_CACHE_DIR": str(folder), "TRITON_CACHE_DIR": str(folder / "triton")}


def plan_run(cfg: BenchConfig, name: str, index: int, overrides: list[str], out_dir: Path,
             repo_root: Path, cache_dir: Path, images: ImageDigests | None = None) -> RunSpec:
    run_id = f"{index:02d}-{safe_name(name)}"
    run_dir = out_dir / "runs" / run_id
    config = to_dict(cfg)
    config.pop("suite", None)
    config.pop("only", None)
    config.pop("tune", None)
    config.pop("confirm_regressions", None)   # what a bench does after its runs, not what a run is
    spec: TrainSpec | CollectiveSpec
    if cfg.kind == RunKind.collective:
        for group in ("workload", "zero", "data", "deepspeed_config"):
            config.pop(group, None)
        spec, module = collective_spec(cfg, run_id), "benchmarks.comm.collectives"
    else:
        config.pop("collective", None)
        ds = deepspeed_config(cfg)
        if cfg.deepspeed_config:
            ds = merge_user_deepspeed(ds, load_user_deepspeed(cfg.deepspeed_config), cfg.deepspeed_config)
        config["deepspeed"] = ds
        spec, module = train_spec(cfg, run_id, ds), "benchmarks.training.train"
    return RunSpec(run_id=run_id, name=name,
                   argv=[sys.executable, "-m", module, "--run-dir", str(run_dir)],
                   env={**rank_env(cfg, repo_root, cache_dir, images), **compile_cache_env(cfg, run_dir)},
                   num_ranks=cfg.platform.world_size,
                   timeout_s=cfg.measure.timeout_s, run_dir=run_dir, spec=spec, config=config,
                   overrides=list(overrides))


def merge_overrides(base: list[str], run: list[str]) -> list[str]:
    """Command-line overrides, then the suite run's. A run's key replaces the same key; a
    command-line field inside a group the run selects still applies on top of it. Both warn."""
    def key(o: str) -> str:
        return o.lstrip("+~").split("=", 1)[0]
    run_keys = {key(o) for o in run}
    replaced = [o for o in base if key(o) in run_keys]
    if replaced:
        warnings.warn(f"the suite sets {sorted(key(o) for o in replaced)} in its runs; "
                      f"command-line {replaced} has no effect there", stacklevel=2)
    layered = [o for o in base if key(o) not in run_keys and key(o).split(".")[0] in run_keys]
    if layered:
        warnings.warn(f"command-line {layered} apply on top of the suite run's {sorted(run_keys)} "
                      "(every run of the suite gets them)", stacklevel=2)
    return [o for o in base if key(o) not in run_keys] + list(run)


def plan_nccl_tests_runs(cfg: BenchConfig, name: str, index: int, overrides: list[str], out_dir: Path,
                         repo_root: Path, cache_dir: Path, images: ImageDigests | None = None) -> list[RunSpec]:
    """One run per op of the real nccl-tests binaries: one process driving the node's GPUs (-g).
    A missing binary is an error before anything launches."""
    return [plan_nccl_tests_run(cfg, f"{name}-{op.value}", index + offset, op.value, overrides, out_dir, repo_root,
                                cache_dir, images) for offset, op in enumerate(cfg.collective.ops)]


def plan_nccl_tests_run(cfg: BenchConfig, name: str, index: int, op: str, overrides: list[str], out_dir: Path,
                        repo_root: Path, cache_dir: Path, images: ImageDigests | None = None) -> RunSpec:
    """The run of one op's nccl-tests binary (named `name`, the suite's run name and the op)."""
    c, p = cfg.collective, cfg.platform
    binary = binary_for(op, c.nccl_tests_dir)
    if binary is None:
        where = f"collective.nccl_tests_dir={c.nccl_tests_dir!r}" if c.nccl_tests_dir else "PATH"
        raise ConfigError(f"collective.source='nccl-tests' but the {op} binary is not in {where}; "
                          "build nccl-tests (make) and set collective.nccl_tests_dir, or use source=builtin")
    base = plan_run(cfg, name, index, overrides, out_dir, repo_root, cache_dir, images)
    base.spec.ops = [op]
    argv = command(binary, min_bytes=c.min_bytes, max_bytes=c.max_bytes, step_factor=c.step_factor,
                   step_bytes=c.step_bytes, gpus_per_proc=p.gpus_per_node, iters=c.iters,
                   warmup_iters=c.warmup_iters, check=c.check, dtype=c.dtype.value,
                   redop=c.redop.value)
    return dataclasses.replace(base, argv=argv, num_ranks=1, output="nccl-tests")


def plan_rerun(run: RunSpec, cfg: BenchConfig, name: str, out_dir: Path, repo_root: Path, cache_dir: Path,
               images: ImageDigests | None = None) -> RunSpec:
    """`run` planned again under another name (its index kept: 03-z2-mb2-ga4 as 03-z2-mb2-ga4-confirm1), its own
    run folder and id, everything else the same: a confirmation's rerun (harness/verdict/confirmation.py)."""
    index = int(run.run_id.split("-", 1)[0])
    if run.output == "nccl-tests":
        return plan_nccl_tests_run(cfg, name, index, run.spec.ops[0], run.overrides, out_dir, repo_root, cache_dir,
                                   images)
    return plan_run(cfg, name, index, run.overrides, out_dir, repo_root, cache_dir, images)
