"""Path 1 of the reduce-scatter gradient reduction (benchmarks/reduce_scatter/install.py installs it and
describes the others): ZeRO-1's balanced windows.

1. ZeRO-1: BALANCED WINDOWS at the accumulation boundary (`path == "balanced_windows"`).
   ZeRO-1 reduces only at the boundary, when every gradient of the step exists, so it need not
   follow the buckets. The seam: `reduce_ready_partitions_and_remove_grads` (the one call through
   which both DeepSpeed drivers hand a ready gradient to the buckets: the backward hooks under
   overlap_comm, `reduce_gradients`' parameter walk without it, and the engine's
   coalesce_grad_reduction flush) only records the parameter as pending, with DeepSpeed's checks
   (empty parameter, `ds_grad_is_ready`, a gradient reduced twice, a missing gradient); and
   `independent_gradient_partition_epilogue` (run by `reduce_gradients` after the walk, before
   DeepSpeed builds `averaged_gradients`) first reduces every pending gradient, then runs
   DeepSpeed's own epilogue unchanged. The reduction, per optimizer parameter group with partition
   size P (`partition_size`: DeepSpeed's, the flat group padded to a multiple of 2N and cut into N
   equal contiguous slices) and window W = `window_numel(P, reduce_bucket_size, N)` (N x W <= one
   DeepSpeed bucket): for each window offset o = 0, W, 2W, ... the input is
   [chunk_0 | chunk_1 | ... | chunk_{N-1}], chunk_r = flat gradient elements [r P + o, r P + o + w)
   (w = min(W, P - o)), copied from the pending parameters' `.grad` at their places in the flat
   group (`round_robin_bit16_offsets`: the layout of `bit16_groups_flat`, round-robin order and
   parameter_alignment padding included), zeros for alignment padding and for parameters that
   are not pending; ONE reduce-scatter over the data-parallel group (deepspeed.comm, the
   micro-step instrument sees op reduce_scatter) leaves rank `me` the reduced [me P + o, ... + w),
   which is written back into `.grad` of the parameters there: exactly the elements DeepSpeed's
   epilogue then reads (`get_all_grad_tensors` / `get_flat_partition` narrow each parameter in
   the partition to the partition) to build `averaged_gradients`, which the norm, the overflow
   check and the step use; the epilogue clears `param.grad` after it as always. The other ranks'
   pieces of a `.grad` stay as this rank computed them (DeepSpeed leaves them in a bucket or
   all-reduced; nothing reads them). Windows in which no pending gradient lies are skipped (all
   ranks have the same pending set). Averaging as the path it replaces (`_scaling`): divided by
   the data-parallel size in the parameter dtype before the cast to the communication dtype
   (contiguous_gradients, `reduce_scatter: true`: `average_tensor`), or on the communication-dtype
   copy (without contiguous_gradients: `allreduce_bucket(divide=True)`), or
   gradient_predivide_factor / postscale_gradients (contiguous, `reduce_scatter: false`:
   `gradient_reduction_w_predivide`). Everything runs on the current stream after backward: this
   path cannot overlap the boundary micro-step's backward as DeepSpeed's overlap_comm buckets do.
   Temporary memory: one N x W input (<= reduce_bucket_size elements: with contiguous_gradients
   packed in DeepSpeed's own, here unused, bucket buffer) and one W output at a time.
   Traffic per rank (NCCL ring): (N-1)/N x the group's gradient bytes padded to DeepSpeed's
   alignment (< 2N elements per group), whatever the bucket size.
   Used only where verified (`balanced_zero1_blockers`): ZeRO-1, the engine's managed gradient
   accumulation, no pipeline parallelism, gradients in `param.grad` in the parameter dtype (not
   `grad_accum` / the fp32 partition buffer: bf16/fp16 parameters with fp32 accumulation), one
   communication dtype (no torch autocast); overlap_comm and contiguous_gradients on or off,
   round_robin_gradients, DeepSpeed's reduce_scatter / use_multi_rank_bucket_allreduce either way;
   plus everything `check_supported` requires (DeepSpeedZeroOptimizer, no offload, MoE, ZenFlow,
   sequence parallelism, Muon). On 2 ranks the result is bit-identical to DeepSpeed's
   (tests/integration/test_reduce_scatter.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from benchmarks.reduce_scatter.common import (OPTION, _INSTALLED_ATTR, _WINDOWS_ATTR, ReduceScatterStats,
                                    _issue_reduce_scatter, _scaling)
from benchmarks.reduce_scatter.layout import plan_windows


@dataclass
class _Zero1Windows:
    """The balanced ZeRO-1 path's state on one optimizer."""
    spans: dict[int, tuple[int, int, int, int]]
    """param id -> (group, index in the group's flat order, first element in the flat group, elements)."""
    window: tuple[int, ...]
    """W per group."""
    comm_dtype: Any
    epilogue: Any
    """DeepSpeed's independent_gradient_partition_epilogue, bound."""
    pending: dict = field(default_factory=dict)
    """param id -> parameter whose gradient DeepSpeed would have reduced (this boundary)."""


def _mark_ready(self: Any, param, i: int) -> None:
    """Replaces DeepSpeedZeroOptimizer.reduce_ready_partitions_and_remove_grads (balanced ZeRO-1):
    at the boundary, where DeepSpeed would put the gradient into a bucket, record it as pending,
    with DeepSpeed's checks (reduce_independent_p_g_buckets_and_remove_grads)."""
    if not self.is_gradient_accumulation_boundary():   # ZeRO-1 reduces only at the boundary
        return
    if param.numel() == 0 or not getattr(param, "ds_grad_is_ready", True):
        return
    state: _Zero1Windows = getattr(self, _WINDOWS_ATTR)
    param_id = self.get_param_id(param)
    if param_id in state.pending:
        raise RuntimeError(f"{OPTION}: the gradient of parameter {param_id} was handed for reduction twice "
                           "in one accumulation boundary (DeepSpeed: multiple gradient reductions are not "
                           "supported)")
    if self.get_gradient_for_reduction(param) is None:
        raise RuntimeError(f"{OPTION}: parameter {param_id} handed for reduction without a gradient")
    state.pending[param_id] = param


def _epilogue(self: Any) -> None:
    """Replaces DeepSpeedZeroOptimizer.independent_gradient_partition_epilogue (balanced ZeRO-1):
    reduce the pending gradients in balanced windows, then DeepSpeed's epilogue (which builds
    averaged_gradients from param.grad and clears param.grad)."""
    state: _Zero1Windows = getattr(self, _WINDOWS_ATTR)
    if state.pending:
        pending, state.pending = state.pending, {}
        _reduce_windows(self, state, pending)
    state.epilogue()


def _window_buffer(opt: Any, numel: int, device):
    """Where a window's input is packed: with contiguous_gradients, DeepSpeed's own bucket buffer
    (setup_buckets allocated it for this backward, reduce_bucket_size elements of the gradient
    dtype; empty and unused on this path), else a new tensor."""
    import torch

    bucket = next(iter(opt.ipg_buckets.values()))
    if opt.contiguous_gradients and bucket.buffer and bucket.elements == 0:
        buffer = bucket.buffer[bucket.index]
        if buffer.numel() >= numel and buffer.dtype == opt.dtype and buffer.device == device:
            return buffer
    return torch.empty(numel, dtype=opt.dtype, device=device)


def _reduce_windows(opt: Any, state: _Zero1Windows, pending: dict) -> None:
    """Reduce-scatter the pending gradients window by window (module docstring, path 1) and write
    this rank's reduced elements back into their param.grad."""
    import torch
    from deepspeed import comm as dist

    group = opt.dp_process_group
    world, me = dist.get_world_size(group=group), dist.get_rank(group=group)
    stats: ReduceScatterStats = getattr(opt, _INSTALLED_ATTR)
    before, pre, post = _scaling(opt, contiguous=opt.contiguous_gradients)
    grads: dict[tuple[int, int], Any] = {}
    spans: dict[int, list[tuple[int, int, int]]] = {}
    for param_id, param in pending.items():
        g, k, start, numel = state.spans[param_id]
        grad = opt.get_gradient_for_reduction(param)
        if grad is None or grad.numel() != numel or grad.dtype != opt.dtype:
            raise RuntimeError(f"{OPTION}: parameter {param_id}'s gradient is "
                               + ("gone" if grad is None else f"{grad.numel()} x {grad.dtype}")
                               + f", expected {numel} x {opt.dtype}")
        if not grad.is_contiguous():
            grad = param.grad = grad.contiguous()
        grads[(g, k)] = grad.view(-1)
        spans.setdefault(g, []).append((k, start, numel))
    for g in sorted(spans):
        windows = plan_windows(spans[g], int(opt.partition_size[g]), world, state.window[g])
        if not windows:
            continue
        device = next(iter(grads.values())).device
        buffer = _window_buffer(opt, max(w.padded_numel for w in windows), device)
        for window in windows:
            w = window.numel
            packed = buffer.narrow(0, 0, window.padded_numel)
            if window.real_numel < window.padded_numel:
                packed.zero_()
            for s in window.segments:
                packed.narrow(0, s.chunk * w + s.chunk_offset, s.numel).copy_(
                    grads[(g, s.param)].narrow(0, s.param_offset, s.numel))
            if before is not None:        # average_tensor: the bucket, in the parameter dtype
                before(packed)
            if packed.dtype != state.comm_dtype:
                packed = packed.to(state.comm_dtype)
            if pre is not None:           # allreduce_bucket / gradient_reduction_w_predivide: the comm copy
                pre(packed)
            reduced = torch.empty(w, dtype=state.comm_dtype, device=device)
            _issue_reduce_scatter(reduced, packed, group, world)
            if post is not None:
                post(reduced)
            for s in window.segments:
                if s.chunk == me:
                    grads[(g, s.param)].narrow(0, s.param_offset, s.numel).copy_(
                        reduced.narrow(0, s.chunk_offset, s.numel))
            stats.num_collectives += 1
            stats.real_numel += window.real_numel
            stats.padded_numel += window.padded_numel
