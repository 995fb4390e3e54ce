"""One configuration at another (micro_batch_size, grad_acc_steps) split and ZeRO stage: the performance
model's sweep and cells (harness/model/perfmodel.py, validation.py) and the calibration's measured
configurations (harness/model/calibration_inputs.py), each checked by validate.validate()."""
from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Optional

from ..errors import ConfigError
from .choices import CheckpointPolicy
from .schema import BenchConfig, ZeroConfig
from .validate import validate

UNCHANGED_WARNINGS = (r"nccl_env \[.*\] has no effect on the cpu platform", r"measure\.inject_delay_s=")
"""What validate() warns about fields a split copies unchanged: said when the base was composed, not
again for every split of it."""


def with_split(cfg: BenchConfig, stage: int, micro_batch_size: int, grad_acc_steps: Optional[int] = None, *,
               activation_checkpointing: Optional[bool] = None, checkpoint_every_n_layers: Optional[int] = None,
               checkpoint_policy: Optional[str] = None, zero: Optional[ZeroConfig] = None) -> BenchConfig:
    """cfg at ZeRO `stage` and micro_batch_size x grad_acc_steps, validated; cfg is not changed.

    grad_acc_steps None: the split of cfg's C (workload.samples_per_step), C / micro_batch_size. Given:
    a measured configuration's own split, whose C is micro_batch_size x grad_acc_steps (the tune's
    micro-batch list, cfg's search space at cfg's C, is then not checked against it).
    activation_checkpointing, checkpoint_every_n_layers and checkpoint_policy None keep cfg's (with
    checkpointing off: every 1, full); zero (a measured configuration's own knobs) replaces cfg.zero,
    at `stage`. Raises ConfigError naming the field, the value and what is valid."""
    w = cfg.workload
    if grad_acc_steps is None:
        c, ga = w.samples_per_step, w.samples_per_step // micro_batch_size if micro_batch_size >= 1 else 0
    elif grad_acc_steps < 1:
        raise ConfigError(f"workload.grad_acc_steps={grad_acc_steps!r} is invalid: must be >= 1")
    else:
        c, ga = micro_batch_size * grad_acc_steps, grad_acc_steps
    ckpt = w.activation_checkpointing if activation_checkpointing is None else activation_checkpointing
    every = w.checkpoint_every_n_layers if checkpoint_every_n_layers is None else checkpoint_every_n_layers
    try:
        policy = w.checkpoint_policy if checkpoint_policy is None else CheckpointPolicy(checkpoint_policy)
    except ValueError:
        raise ConfigError(f"workload.checkpoint_policy={checkpoint_policy!r} is invalid: valid: "
                          f"{', '.join(p.value for p in CheckpointPolicy)}") from None
    if not ckpt:
        every, policy = 1, CheckpointPolicy.full
    out = replace(cfg, zero=replace(cfg.zero if zero is None else zero, stage=stage),
                  workload=replace(w, samples_per_step=c, micro_batch_size=micro_batch_size, grad_acc_steps=ga,
                                   activation_checkpointing=ckpt, checkpoint_every_n_layers=every,
                                   checkpoint_policy=policy))
    checked = out
    if c != w.samples_per_step and out.tune.micro_batch_sizes:
        checked = replace(out, tune=replace(out.tune, micro_batch_sizes=[]))
    with warnings.catch_warnings():
        for message in UNCHANGED_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        validate(checked)
    return out
