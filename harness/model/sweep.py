"""The performance model's sweep: one configuration at every ZeRO stage and every split of its samples per step into
micro-batch x accumulation (and, asked, every checkpointing choice and every stack the platform allows), and the
fastest prediction that fits (`python -m harness model --sweep`, the tuner's ordering). Predicting each is
harness/model/perfmodel.py."""
from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Optional

from ..config.choices import Compile, CompileMode, checkpointing_of
from ..config.schema import BenchConfig
from ..config.split import with_split
from ..config.stack import validate_stack
from ..errors import ConfigError
from .perfmodel import Prediction
from .stack import STACK_CHOICES

CHECKPOINTING_CHOICES = tuple(checkpointing_of(w) for w in ("none", "every_4", "every_2", "selective", "full"))
"""(activation_checkpointing, checkpoint_every_n_layers, checkpoint_policy) a --checkpointing sweep
tries, from the least recompute to the most memory saved (`tune.checkpointing` names them so)."""


def sweep_configs(cfg: BenchConfig, stages: tuple[int, ...] = (1, 2, 3), checkpointing: bool = False,
                  stack: bool = False) -> list[BenchConfig]:
    """cfg at each stage x every (micro_batch_size, grad_acc_steps) whose product is C, each validated;
    with checkpointing, each of those at every CHECKPOINTING_CHOICES entry too (else cfg's own); with
    stack, each of those at every stack.STACK_CHOICES entry (workload.compile x workload.kernels) the
    platform allows (config/stack.py validate_stack: Liger's kernels need a GPU), else cfg's own."""
    c = cfg.workload.samples_per_step
    splits = [(s, mb) for s in stages for mb in range(1, c + 1) if c % mb == 0]
    ckpts = CHECKPOINTING_CHOICES if checkpointing else (None,)
    out = []
    with warnings.catch_warnings():
        if stack:   # fp8 without compile: validate() said so for cfg, not again for every variant
            warnings.filterwarnings("ignore", message="workload.precision=fp8 without", category=UserWarning)
        for base in (stack_variants(cfg) if stack else [cfg]):
            for s, mb in splits:
                for ck in ckpts:
                    try:
                        out.append(with_split(base, s, mb) if ck is None else
                                   with_split(base, s, mb, activation_checkpointing=ck.on,
                                              checkpoint_every_n_layers=ck.every_n_layers, checkpoint_policy=ck.policy))
                    except ConfigError:
                        if not stack:   # without --stack every split is cfg's own stack: an error is cfg's
                            raise
    return out


def stack_variants(cfg: BenchConfig) -> list[BenchConfig]:
    """cfg at each stack.STACK_CHOICES entry (compile mode left at its default for no compile), those
    the platform refuses (validate_stack) left out."""
    out = []
    for choice in STACK_CHOICES:
        w = replace(cfg.workload, compile=choice.compile, kernels=choice.kernels,
                    compile_mode=cfg.workload.compile_mode if choice.compile != Compile.none else CompileMode("default"))
        variant = replace(cfg, workload=w)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")   # fp8 without compile: said once for cfg, not per variant
                validate_stack(variant)
        except ConfigError:
            continue
        out.append(variant)
    return out


def fastest(preds: list[Prediction]) -> Optional[Prediction]:
    """The prediction of least step time among those that fit in memory (None if none does)."""
    fits = [p for p in preds if p.memory.fits]
    return min(fits, key=lambda p: p.step_time_s) if fits else None
