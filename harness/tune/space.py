"""The three search spaces of the tuning method, as candidates: pure, no I/O.

A candidate is one trial's settings: named parameters (what the search varies) and the Hydra
overrides that apply them on top of the tune's base overrides. Step 1 varies NCCL variables of a
standalone all-reduce sweep; step 2 the split of C = micro_batch_size x grad_acc_steps (C fixed,
every micro-batch a divisor of C) and the ZeRO stage (and, with tune.checkpointing, the activation
checkpointing: which layers, which ops; with tune.compile / tune.kernels, the training stack, each
combination the platform refuses left out); step 3 DeepSpeed's communication knobs of
the stage step 2 chose.
"""
from __future__ import annotations

import itertools
import json
import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from ..config.choices import Checkpointing, Compile, CompileMode, Kernels, Precision, checkpointing_of
from ..config.schema import BenchConfig
from ..config.stack import validate_stack
from ..errors import ConfigError
from ..model.flops import llama_param_count

DEEPSPEED_DEFAULT_BUCKET = 500_000_000
"""reduce_bucket_size / allgather_bucket_size / stage3_prefetch_bucket_size when unset (DeepSpeed 0.19)."""
BUCKET_FRACTIONS = (64, 16, 4)
"""Default step-3 bucket sizes: this fraction of the model's parameters, clipped to BUCKET_RANGE."""
BUCKET_RANGE = (100_000, 1_000_000_000)


@dataclass(frozen=True)
class Candidate:
    step: int
    params: tuple[tuple[str, Any], ...]
    """What the search varies, in a fixed order (name, value)."""
    overrides: tuple[str, ...] = field(default=())
    """Hydra overrides that apply the parameters (on top of the tune's base and earlier steps' best)."""

    @property
    def key(self) -> str:
        """Identity of the trial within its step: the same key is the same run."""
        return json.dumps([self.step, [list(p) for p in self.params]], sort_keys=True)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.params)

    def label(self) -> str:
        short = {"micro_batch_size": "mb", "grad_acc_steps": "ga", "stage": "z", "overlap_comm": "ov",
                 "gradient_collective": "gc", "bucket_size": "bkt", "contiguous_gradients": "cg",
                 "prefetch_bucket_size": "pf", "checkpointing": "ck-", "compile": "c-", "kernels": "k-"}
        parts = []
        for k, v in self.params:
            if isinstance(v, bool):
                v = int(v)
            elif k == "gradient_collective":
                v = {"all_reduce": "ar", "reduce_scatter": "rs"}[v]
            elif isinstance(v, int) and v >= 1_000_000 and v % 100_000 == 0:
                v = f"{v / 1e6:g}M"
            parts.append(f"{short.get(k, k.replace('NCCL_', '').lower())}{v}")
        return "-".join(str(p) for p in parts) or "default"


def grid(names: list[str], values: list[list[Any]]) -> list[tuple[tuple[str, Any], ...]]:
    return [tuple(zip(names, combo)) for combo in itertools.product(*values)]


def nccl_candidates(cfg: BenchConfig) -> list[Candidate]:
    """Step 1: every combination of tune.nccl_space, each an all-reduce sweep with those variables."""
    space = cfg.tune.nccl_space
    names = sorted(space)
    return [Candidate(1, params, tuple(f"+nccl_env.{k}={v}" for k, v in params))
            for params in grid(names, [list(space[n]) for n in names])]


def micro_batch_sizes(cfg: BenchConfig) -> list[int]:
    c = cfg.workload.samples_per_step
    return sorted(cfg.tune.micro_batch_sizes) or [b for b in range(1, c + 1) if c % b == 0]


def checkpointing_choices(cfg: BenchConfig) -> list[Checkpointing]:
    """Step 2's checkpointing choices (tune.checkpointing), [] when it varies none."""
    return [checkpointing_of(word) for word in cfg.tune.checkpointing]


def checkpointing_here(cfg: BenchConfig) -> Checkpointing:
    """The workload's own checkpointing, as a choice."""
    w = cfg.workload
    return (Checkpointing(True, w.checkpoint_every_n_layers, w.checkpoint_policy) if w.activation_checkpointing
            else checkpointing_of("none"))


def stack_choices(cfg: BenchConfig) -> list[tuple[tuple[str, Any], ...]]:
    """Step 2's training-stack choices: tune.compile x tune.kernels (each list once, in its order), as
    the params they add ((), ("compile", c), ("kernels", k) or both: only the lists given vary);
    [()] when neither is set."""
    compiles = list(dict.fromkeys(Compile(c).value for c in cfg.tune.compile))
    kernels = list(dict.fromkeys(Kernels(k).value for k in cfg.tune.kernels))
    return [tuple(p for p in (("compile", c) if c else None, ("kernels", k) if k else None) if p)
            for c in compiles or [None] for k in kernels or [None]]


def stack_overrides(choice: tuple[tuple[str, Any], ...]) -> tuple[str, ...]:
    """The overrides of a stack choice; without compile, torch.compile's mode back at its default."""
    d = dict(choice)
    out = tuple(f"workload.{k}={v}" for k, v in choice)
    return out + (("workload.compile_mode=default",) if d.get("compile") == "none" else ())


def stack_refusal(cfg: BenchConfig, stage: int, choice: tuple[tuple[str, Any], ...]) -> Optional[str]:
    """Why the platform refuses a stack choice at a ZeRO stage (config/stack.py validate_stack: Liger
    needs a GPU, DeepCompile CUDA and ZeRO 1-3, ...), None when it runs."""
    d = dict(choice)
    if not d:
        return None
    w = cfg.workload
    compiled = Compile(d.get("compile", w.compile.value))
    variant = replace(cfg, zero=replace(cfg.zero, stage=stage),
                      workload=replace(w, compile=compiled, kernels=Kernels(d.get("kernels", w.kernels.value)),
                                       compile_mode=CompileMode("default") if compiled == Compile.none else w.compile_mode))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            validate_stack(variant)
    except ConfigError as exc:
        return str(exc)
    return None


def refused_stacks(cfg: BenchConfig) -> list[str]:
    """The stack choices left out of step 2, one line per reason: the choices, the stages, why."""
    by_why: dict[str, tuple[dict[str, None], dict[int, None]]] = {}
    for stage in sorted(cfg.tune.stages):
        for st in stack_choices(cfg):
            why = stack_refusal(cfg, stage, st)
            if why:
                choices, stages = by_why.setdefault(why, ({}, {}))
                choices.setdefault(" ".join(f"{k}={v}" for k, v in st), None)
                stages.setdefault(stage, None)
    return [f"{', '.join(choices)} at ZeRO-{'/'.join(map(str, stages))}: {why}"
            for why, (choices, stages) in by_why.items()]


def stack_here(cfg: BenchConfig) -> tuple[tuple[str, Any], ...]:
    """The workload's own stack as the params step 2 varies (those of tune.compile / tune.kernels)."""
    w = cfg.workload
    return ((("compile", w.compile.value),) if cfg.tune.compile else ()) + \
        ((("kernels", w.kernels.value),) if cfg.tune.kernels else ())


def batch_candidates(cfg: BenchConfig) -> list[Candidate]:
    """Step 2: (micro_batch_size, grad_acc_steps) with the product C fixed, x ZeRO stage, x each
    tune.checkpointing choice when there are any (the parameter `checkpointing`, its word), x each
    tune.compile x tune.kernels choice when there are any (the parameters `compile`, `kernels`),
    those the platform refuses at that stage left out (stack_refusal)."""
    c = cfg.workload.samples_per_step
    choices = checkpointing_choices(cfg)
    stacks = stack_choices(cfg)
    out = []
    for stage in sorted(cfg.tune.stages):
        allowed = [st for st in stacks if stack_refusal(cfg, stage, st) is None]
        for mb in micro_batch_sizes(cfg):
            params = (("stage", stage), ("micro_batch_size", mb), ("grad_acc_steps", c // mb))
            overrides = (f"zero=stage{stage}", f"workload.micro_batch_size={mb}", f"workload.grad_acc_steps={c // mb}")
            for st in allowed:
                out += [Candidate(2, params + (("checkpointing", ck.word),) + st,
                                  overrides + ck.overrides() + stack_overrides(st))
                        for ck in choices] or [Candidate(2, params + st, overrides + stack_overrides(st))]
    return out


def bucket_sizes(cfg: BenchConfig) -> list[int]:
    if cfg.tune.bucket_sizes:
        return sorted(set(cfg.tune.bucket_sizes))
    psi = llama_param_count(cfg.workload)
    lo, hi = BUCKET_RANGE
    return sorted({min(hi, max(lo, round(psi / f / 100_000) * 100_000)) for f in BUCKET_FRACTIONS})


def comm_candidates(cfg: BenchConfig, stage: int) -> list[Candidate]:
    """Step 3 for the chosen stage. ZeRO-1/2: overlap_comm x gradient collective (DeepSpeed's
    all-reduce or the suite's reduce-scatter) x bucket size (reduce and allgather buckets together)
    x contiguous_gradients. ZeRO-3: overlap_comm x reduce bucket x prefetch bucket x
    contiguous_gradients (its gradients are reduce-scattered anyway). Stage 0 has no ZeRO knobs."""
    buckets = bucket_sizes(cfg)
    if stage in (1, 2):
        params = grid(["overlap_comm", "gradient_collective", "bucket_size", "contiguous_gradients"],
                      [[False, True], ["all_reduce", "reduce_scatter"], buckets, [True, False]])
        return [Candidate(3, p, (f"zero.overlap_comm={str(d['overlap_comm']).lower()}",
                                 f"zero.gradient_collective={d['gradient_collective']}",
                                 f"zero.reduce_bucket_size={d['bucket_size']}",
                                 f"zero.allgather_bucket_size={d['bucket_size']}",
                                 f"zero.contiguous_gradients={str(d['contiguous_gradients']).lower()}"))
                for p in params for d in [dict(p)]]
    if stage == 3:
        prefetch = sorted(set(cfg.tune.prefetch_bucket_sizes)) or buckets
        params = grid(["overlap_comm", "bucket_size", "prefetch_bucket_size", "contiguous_gradients"],
                      [[False, True], buckets, prefetch, [True, False]])
        return [Candidate(3, p, (f"zero.overlap_comm={str(d['overlap_comm']).lower()}",
                                 f"zero.reduce_bucket_size={d['bucket_size']}",
                                 f"zero.stage3_prefetch_bucket_size={d['prefetch_bucket_size']}",
                                 f"zero.contiguous_gradients={str(d['contiguous_gradients']).lower()}"))
                for p in params for d in [dict(p)]]
    return []


def allreduce_sizes(cfg: BenchConfig) -> tuple[int, int]:
    """(smallest, largest) message of the workload's gradient all-reduce, in bytes: a bucket is
    reduce_bucket_size elements (DeepSpeed's default when unset, or the smallest step-3 bucket)
    of the gradient dtype, never more than all the gradients; step 1 sweeps between the two."""
    psi = llama_param_count(cfg.workload)
    elem = 4 if cfg.workload.precision == Precision.fp32 else 2
    largest = min(cfg.zero.reduce_bucket_size or DEEPSPEED_DEFAULT_BUCKET, psi) * elem
    smallest = min([largest] + [b * elem for b in bucket_sizes(cfg)])
    return max(1024, smallest), max(1024, largest)
