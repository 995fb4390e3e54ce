"""Planning: BenchConfig -> DeepSpeed config -> TrainSpec -> RunSpec. Pure: no I/O, no processes."""
from __future__ import annotations

import copy
import json
import re
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.spec import DataSpec, ModelSpec, OptimizerSpec, TrainSpec

from .config import BenchConfig, Device, OptimizerImpl, Precision, to_dict
from .errors import ConfigError

ZERO_KNOBS = ("overlap_comm", "reduce_scatter", "contiguous_gradients", "reduce_bucket_size",
              "allgather_bucket_size", "stage3_prefetch_bucket_size",
              "stage3_param_persistence_threshold", "stage3_max_live_parameters")


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
    spec: TrainSpec
    config: dict[str, Any]
    overrides: list[str] = field(default_factory=list)


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
    if w.precision == Precision.bf16:
        ds["bf16"] = {"enabled": True}
    elif w.precision == Precision.fp16:
        ds["fp16"] = {"enabled": True}
    if w.optimizer == OptimizerImpl.deepspeed:
        ds["optimizer"] = {"type": "AdamW", "params": {
            "lr": w.lr, "betas": list(w.betas), "eps": w.eps, "weight_decay": w.weight_decay}}
    return ds


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(merged.get(k), dict):
            merged[k] = _deep_merge(merged[k], v)
        else:
            merged[k] = copy.deepcopy(v)
    return merged


def merge_user_deepspeed(generated: dict[str, Any], user: dict[str, Any], source: str) -> dict[str, Any]:
    """Merge a user's DeepSpeed JSON over the generated one.

    Keys the suite also sets (batch sizes, ZeRO stage and knobs, precision, clipping) must agree:
    a differing value is an error naming the config field to set instead, because the figures
    (samples/s, MFU, memory) are computed from the suite's config. Everything else comes from
    the user's file, and the merged result is what the run uses and records.
    """
    if "train_batch_size" in user and "train_batch_size" not in generated:
        raise ConfigError(f"{source}: train_batch_size is set by the suite")
    gen_flat, user_flat = _flatten(generated), _flatten(user)
    where = {"train_micro_batch_size_per_gpu": "workload.micro_batch_size",
             "gradient_accumulation_steps": "workload.grad_acc_steps",
             "train_batch_size": "workload.micro_batch_size x grad_acc_steps x ranks",
             "gradient_clipping": "workload.grad_clip", "zero_optimization.stage": "zero.stage"}
    conflicts = [f"{key}={user_flat[key]!r} (suite: {gen_flat[key]!r}; set "
                 f"{where.get(key, 'zero.' + key.split('.')[-1] if key.startswith('zero_') else 'workload.precision')} instead)"
                 for key in sorted(gen_flat) if key in user_flat and user_flat[key] != gen_flat[key]
                 and key not in ("steps_per_print", "wall_clock_breakdown")]
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


def train_spec(cfg: BenchConfig, run_id: str, ds: dict[str, Any]) -> TrainSpec:
    w, p, m, d = cfg.workload, cfg.platform, cfg.measure, cfg.data
    model = ModelSpec(vocab_size=w.vocab_size, hidden_size=w.hidden_size,
                      intermediate_size=w.intermediate_size, num_layers=w.num_layers,
                      num_heads=w.num_heads, num_kv_heads=w.num_kv_heads,
                      max_position_embeddings=w.seq_len, tie_embeddings=w.tie_embeddings,
                      rope_theta=w.rope_theta, rms_norm_eps=w.rms_norm_eps)
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
        activation_checkpointing=w.activation_checkpointing)


def rank_env(cfg: BenchConfig, repo_root: Path, cache_dir: Path) -> dict[str, str]:
    """Environment shared by every rank of a run (per-rank variables are the launcher's)."""
    env = {"PYTHONPATH": str(repo_root), "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TORCH_EXTENSIONS_DIR": str(cache_dir / "torch_extensions"),
           "TRITON_CACHE_DIR": str(cache_dir / "triton")}
    if cfg.platform.device == Device.cpu:
        env["DS_ACCELERATOR"] = "cpu"
        env["OMP_NUM_THREADS"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        env["DS_ACCELERATOR"] = "cuda"
    env.update({k: str(v) for k, v in cfg.platform.nccl_env.items()})
    return env


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "run"


def plan_run(cfg: BenchConfig, name: str, index: int, overrides: list[str], out_dir: Path,
             repo_root: Path, cache_dir: Path) -> RunSpec:
    ds = deepspeed_config(cfg)
    if cfg.deepspeed_config:
        ds = merge_user_deepspeed(ds, load_user_deepspeed(cfg.deepspeed_config), cfg.deepspeed_config)
    run_id = f"{index:02d}-{safe_name(name)}"
    run_dir = out_dir / "runs" / run_id
    config = to_dict(cfg)
    config.pop("suite", None)
    config["deepspeed"] = ds
    return RunSpec(run_id=run_id, name=name,
                   argv=[sys.executable, "-m", "benchmarks.train", "--run-dir", str(run_dir)],
                   env=rank_env(cfg, repo_root, cache_dir), num_ranks=cfg.platform.world_size,
                   timeout_s=cfg.measure.timeout_s, run_dir=run_dir,
                   spec=train_spec(cfg, run_id, ds), config=config, overrides=list(overrides))


def merge_overrides(base: list[str], run: list[str]) -> list[str]:
    """Command-line overrides, then the suite run's; a run's key replaces the same key (warned)."""
    def key(o: str) -> str:
        return o.lstrip("+~").split("=", 1)[0]
    run_keys = {key(o) for o in run}
    replaced = [o for o in base if key(o) in run_keys]
    if replaced:
        warnings.warn(f"the suite sets {sorted(key(o) for o in replaced)} for its runs; "
                      f"command-line {replaced} has no effect there", stacklevel=2)
    return [o for o in base if key(o) not in run_keys] + list(run)
