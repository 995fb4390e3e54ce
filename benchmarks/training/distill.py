"""Knowledge distillation on a rank: the loss, and the frozen teacher placed as the student's ZeRO
stage asks.

Loss (Hinton et al. 2015, "Distilling the Knowledge in a Neural Network"; the T^2 factor keeps the
soft term's gradients on the scale of the hard term's when T changes):

    loss = (1 - alpha) * CE(student, labels) + alpha * T^2 * KL(p_teacher^T || p_student^T)

with p^T = softmax(logits / T), both terms averaged over the valid tokens (the causal shift: the
logits at position i predict label i + 1; labels equal to ignore_index are not valid). Computed in
float32 whatever the logits' dtype (float64 stays float64).

Teacher placement: under ZeRO 0-2 every rank holds a full replica in the teacher's precision (bf16
by default); under ZeRO-3 the teacher is built inside ``deepspeed.zero.Init`` and driven by a
DeepSpeed engine without optimizer, so its parameters are sharded across ranks and all-gathered
module by module in its forward, like the student's. The teacher is in eval mode and runs under
``torch.no_grad()``; its parameters never require gradients.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from contract.spec import DistillSpec

IGNORE_INDEX = -100
TEACHER_SEED_OFFSET = 1
"""A random teacher is initialised from seed + this, so that it differs from the student."""


@dataclass
class DistillLoss:
    loss: torch.Tensor
    ce: torch.Tensor
    kl: torch.Tensor
    num_tokens: torch.Tensor
    """Valid tokens, a tensor: reading it as a number would synchronise the device every micro-step."""


# Elements of one [tokens, vocab] block the loss works on at a time (256 MiB in float32; a block's
# intermediates peak at about 7 such copies): with the 128256-token vocabulary of llama-8b-kd that
# is 523 tokens, where a whole micro-batch (64 x 512 tokens) would need 17 GB for each float32 copy.
CHUNK_ELEMENTS = 2**26


def _chunk_sums(s: torch.Tensor, t: torch.Tensor, y: torch.Tensor, temperature: float, ignore_index: int,
                dtype: torch.dtype) -> torch.Tensor:
    """[sum of CE, sum of KL] over one block of tokens, computed in `dtype`."""
    s, t = s.to(dtype), t.to(dtype)
    valid = y != ignore_index
    ce = F.cross_entropy(s, y, ignore_index=ignore_index, reduction="sum")
    log_ps = F.log_softmax(s / temperature, dim=-1)
    log_pt = F.log_softmax(t / temperature, dim=-1)
    kl = (F.kl_div(log_ps, log_pt, log_target=True, reduction="none").sum(-1) * valid).sum()
    return torch.stack([ce, kl])


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                      alpha: float, temperature: float, ignore_index: int = IGNORE_INDEX,
                      chunk_elements: int = CHUNK_ELEMENTS) -> DistillLoss:
    """(1 - alpha) CE + alpha T^2 KL(teacher || student) over the valid tokens (see the module doc).
    Logits are [batch, seq, vocab], labels [batch, seq] (the input ids, not yet shifted).

    Memory: the logits are never copied whole; blocks of at most `chunk_elements` are upcast, and
    each block's float32 intermediates are recomputed in backward (activation checkpointing)
    instead of kept, so the loss adds O(block) to the logits the model already holds."""
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} differ: the vocabularies must be the same")
    dtype = torch.float64 if student_logits.dtype == torch.float64 else torch.float32
    vocab = student_logits.shape[-1]
    # position i predicts label i + 1: shift the labels (views of the logits stay contiguous)
    y = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], ignore_index)], dim=1).reshape(-1)
    s, t = student_logits.reshape(-1, vocab), teacher_logits.reshape(-1, vocab)
    num_tokens = (y != ignore_index).sum()
    rows = max(1, chunk_elements // vocab)
    sums = torch.zeros(2, dtype=dtype, device=s.device)
    for i in range(0, y.numel(), rows):
        args = (s[i:i + rows], t[i:i + rows], y[i:i + rows], temperature, ignore_index, dtype)
        if s.requires_grad and y.numel() > rows:
            sums = sums + checkpoint(_chunk_sums, *args, use_reentrant=False)
        else:
            sums = sums + _chunk_sums(*args)
    ce, kl = sums / num_tokens.clamp(min=1)
    loss = (1.0 - alpha) * ce + alpha * temperature ** 2 * kl
    return DistillLoss(loss=loss, ce=ce, kl=kl, num_tokens=num_tokens)


def teacher_deepspeed_config(student: dict[str, Any], precision: str) -> dict[str, Any]:
    """DeepSpeed config of a ZeRO-3 teacher engine: the student's batch sizes and ZeRO-3 section
    (so its knobs govern the teacher's gathers too), the teacher's precision, no optimizer."""
    ds = {k: student[k] for k in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                  "train_batch_size") if k in student}
    ds.update({"steps_per_print": 10**9, "wall_clock_breakdown": False,
               "zero_optimization": dict(student.get("zero_optimization", {"stage": 3}))})
    if precision == "bf16":
        ds["bf16"] = {"enabled": True}
    elif precision == "fp16":
        ds["fp16"] = {"enabled": True}
    return ds


@dataclass
class Teacher:
    """A frozen teacher; ``logits(input_ids)`` runs its forward without gradients."""
    module: Any                  # the model, or the DeepSpeed engine that shards it (ZeRO-3)
    placement: str               # replica | zero3
    dtype: str
    num_params: int
    bytes_per_rank: int
    """Parameter bytes this rank holds (the full model for a replica; its shard under ZeRO-3)."""
    checkpoint: Optional[str]

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.module(input_ids=input_ids).logits

    def summary(self) -> dict[str, Any]:
        return {"placement": self.placement, "dtype": self.dtype, "num_params": self.num_params,
                "bytes_per_rank": self.bytes_per_rank, "checkpoint": self.checkpoint}


def build_teacher(spec: DistillSpec, student_ds: dict[str, Any], device: torch.device, seed: int) -> Teacher:
    """Build the teacher (random with seed + offset, or from its checkpoint), frozen, placed by the
    student's ZeRO stage: a replica for 0-2, ZeRO-3 shards for 3."""
    import deepspeed

    from benchmarks.training.model import DTYPES, build_model, initialise

    zero3 = student_ds.get("zero_optimization", {}).get("stage", 0) == 3
    ds = teacher_deepspeed_config(student_ds, spec.teacher_precision)
    dtype = DTYPES[spec.teacher_precision]
    state = torch.random.get_rng_state()  # the student's random stream is left as it was
    # No dtype= here: the config's bf16/fp16 sections decide. DeepSpeed 0.19.8's Init._set_dtype
    # ignores an explicit dtype where the accelerator lacks fp16 (the CPU): it makes it bf16.
    placed = deepspeed.zero.Init(config_dict_or_path=ds) if zero3 else contextlib.nullcontext()
    with placed:
        model = build_model(spec.teacher, device=device)
    torch.random.set_rng_state(state)
    model.requires_grad_(False)
    model.eval()
    if not zero3:
        model = model.to(dtype)
    if spec.teacher_checkpoint:
        load_checkpoint(model, [Path(f) for f in spec.teacher_files], zero3)
    else:
        initialise(model, seed + TEACHER_SEED_OFFSET, zero3)
    params = list(model.parameters())
    num_params = sum(getattr(p, "ds_numel", p.numel()) for p in params)
    local = sum((p.ds_tensor if zero3 else p).numel() * p.element_size() for p in params)
    module: Any = model
    if zero3:
        module, _, _, _ = deepspeed.initialize(model=model, config=ds)
        module.eval()
    return Teacher(module, "zero3" if zero3 else "replica", spec.teacher_precision, num_params, local,
                   spec.teacher_checkpoint)


@torch.no_grad()
def load_checkpoint(model: torch.nn.Module, files: list[Path], zero3: bool) -> None:
    """Copy every parameter from the checkpoint's .safetensors files (resolved and checked against
    the teacher's shape by the harness before launch). Under ZeRO-3 each parameter is gathered,
    rank 0 writes it, and it is re-partitioned on exit."""
    import deepspeed
    import torch.distributed as dist
    from safetensors import safe_open

    handles = [safe_open(str(f), framework="pt", device="cpu") for f in files]
    where = {name: h for h in handles for name in h.keys()}
    writer = not zero3 or dist.get_rank() == 0
    for name, param in model.named_parameters():  # a tied head is the embedding: listed once
        if name not in where:
            raise ValueError(f"teacher checkpoint {', '.join(map(str, files))} has no tensor {name}")
        with deepspeed.zero.GatheredParameters([param], modifier_rank=0, enabled=zero3):
            if writer:
                src = where[name].get_tensor(name)
                if tuple(src.shape) != tuple(param.shape):  # copy_ would broadcast some mismatches
                    raise ValueError(f"teacher checkpoint tensor {name} has shape {tuple(src.shape)}, "
                                     f"the teacher's is {tuple(param.shape)}")
                param.copy_(src.to(param.dtype))
