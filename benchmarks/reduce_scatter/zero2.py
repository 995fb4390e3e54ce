"""Path 2 of the reduce-scatter gradient reduction (benchmarks/reduce_scatter/install.py installs it and
describes the others): ZeRO-2's balanced bucket shards.

2. ZeRO-2: BALANCED BUCKET SHARDS (`path == "balanced_buckets"`). ZeRO-2 must reduce each bucket
   as backward fills it, on every micro-step (it keeps only its partition's gradients). The seams:
   the three reduction seams of `reduce_ipg_grads` (path 3: `average_tensor`,
   `buffered_reduce_fallback`, `_buffered_reduce_fallback_preserving_fp32`), `copy_grads_in_partition`
   (a no-op here: nothing is copied out of the bucket) and `independent_gradient_partition_epilogue`.
   Bucketing, hooks, the extra-large-parameter bucket, overlap_comm's double buffers and the
   bookkeeping after each reduction (`params_already_reduced`, clearing other partitions'
   gradients) stay DeepSpeed's.
   - Each bucket of b elements (DeepSpeed's flat bucket, an oversized parameter's gradient, or the
     listed gradients without contiguous_gradients), scaled as the path it replaces (`_scaling`),
     in the communication dtype, padded with zeros to b' = balanced_bucket_elements(b, N, 2) (a
     multiple of 2N: DeepSpeed's nccl_start_alignment_factor), is reduce-scattered ONCE over the
     data-parallel group in N equal shards: rank r receives the reduced elements [r s, (r+1) s) of
     the bucket, s = b'/N. Each rank sends (N-1)/N of the bucket bytes (NCCL ring), the ideal,
     wherever the bucket lies in DeepSpeed's contiguous partitions. The bucket buffer itself is
     the input where it has room for the padding and is already in the communication dtype.
   - The reduced shard, cast to DeepSpeed's gradient accumulation dtype, is added into this rank's
     persistent BUCKET-SHARDED ACCUMULATOR (one run per piece of the shard, destination-major:
     ShardPlan in reduce_scatter_layout.py), copied on the first micro-step of an optimizer step.
     DeepSpeed accumulates the same values in the same order (param.grad / all_grad_tensors in the
     parameter dtype, or its fp32 partition buffer with bf16/fp16 parameters and fp32
     accumulation), so the sums are the same.
   - The layout (which parameters each bucket holds, in which order, per communication dtype) is
     recorded from the first backward; backward's hook order is deterministic, and every later
     backward's buckets are checked against it, bucket by bucket and in number: a difference
     (a parameter without a gradient in one micro-step, a different hook order) raises
     RuntimeError naming the bucket. During that first backward the shards are kept as they come
     and laid into the accumulator at its end.
   - At the accumulation boundary, in the epilogue after the last bucket (and, under overlap_comm,
     after DeepSpeed's device synchronisation), ONE all-to-all (`all_to_all_single` with split
     sizes, through deepspeed.comm: the micro-step instrument sees op all_to_all) sends every
     element of the accumulator to the rank whose DeepSpeed partition holds it; the received runs
     are written into a flat gradient partition per parameter group, built by DeepSpeed's own
     `_build_compact_grad_partition_buffer` (its views per parameter, alignment padding zero),
     which becomes `averaged_gradients[group]`: what the overflow check, the norm and the step
     read (the step takes the flat partition as is). Then DeepSpeed's epilogue ending (release the
     bucket buffers, clear param.grad).
   - Memory per rank: the accumulator, about Psi/N elements of the gradient accumulation dtype
     (accumulator_elements: sum over buckets of s; it lives from the first reduction of an
     optimizer step to the boundary), plus at the boundary the all-to-all receive buffer (again at
     most ~Psi/N, freed at once) and the flat gradient partitions (Psi/N, until the step: in place
     of DeepSpeed's own `grads_in_partition` / `all_grad_tensors`, which this path does not
     allocate). Temporaries per bucket: the padded input (b', unless the bucket buffer serves) and
     the shard (s).
   - Traffic per rank: per micro-step (N-1)/N x sum of b' (the gradient, padded to 2N per bucket),
     against 2(N-1)/N for DeepSpeed's all-reduce; per optimizer step one all-to-all of the
     accumulator (boundary_all_to_all_elements: at most ~Psi/N elements sent, in the
     accumulation dtype: fp32 with bf16 parameters and fp32 accumulation).
   - Streams as the path it replaces: under overlap_comm the scaling, the reduce-scatter and the
     accumulation run on the optimizer's reduction stream (`average_tensor`'s waits); the
     all-to-all runs on the compute stream after the epilogue's synchronisation.
   Used only where verified (`balanced_zero2_blockers`): the engine's managed gradient
   accumulation, one communication dtype, the data-parallel group for every parameter group, and
   the gradient accumulation dtype equal to the parameter dtype unless DeepSpeed's fp32 partition
   buffer is in use; overlap_comm and contiguous_gradients on or off, DeepSpeed's reduce_scatter /
   gradient_predivide_factor either way, several parameter groups, activation checkpointing. On 2
   ranks the result is bit-identical to DeepSpeed's (tests/integration/test_reduce_scatter.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from benchmarks.reduce_scatter.common import (OPTION, _INSTALLED_ATTR, _SHARDS_ATTR, ReduceScatterStats,
                                    _issue_reduce_scatter, _scaling)
from benchmarks.reduce_scatter.layout import ShardPlan, balanced_bucket_elements, plan_bucket_shards


@dataclass
class _Zero2Shards:
    """The balanced ZeRO-2 path's state on one optimizer (module docstring, path 2)."""
    spans: dict[int, tuple[int, int, int, int]]
    """param id -> (group, index in the group's flat order, first element in the flat group, elements)."""
    partition_size: tuple[int, ...]
    """DeepSpeed's partition size per parameter group."""
    align: int
    """Buckets are padded to a multiple of N x align (nccl_start_alignment_factor)."""
    acc_dtype: Any
    """DeepSpeed's gradient accumulation dtype: the accumulator's, the all-to-all's, the partitions'."""
    layout: Optional[list[tuple]] = None
    """Signature of each bucket of the first backward, in order (None until it ended)."""
    plan: Optional[ShardPlan] = None
    acc_runs: list = field(default_factory=list)
    """Per bucket: (offset in this rank's shard, offset in the accumulator, elements)."""
    recv_runs: list = field(default_factory=list)
    """(offset in the all-to-all output, group, offset in this rank's partition, elements)."""
    send_splits: list = field(default_factory=list)
    recv_splits: list = field(default_factory=list)
    accumulator: Any = None
    """This rank's bucket-sharded accumulator (destination-major), from the first reduction of an
    optimizer step to the boundary's all-to-all."""
    position: int = 0
    """Buckets reduced so far in the backward under way."""
    backwards: int = 0
    """Backward passes accumulated since the last boundary (0: the next one copies, not adds)."""
    first: list = field(default_factory=list)
    """The first backward's buckets as they come: (signature, spans, reduced shard)."""


def _bucket_signature(bucket: Any, comm_dtype, numel: int) -> tuple:
    """What must be the same in every backward for a bucket to land in the same accumulator runs."""
    return (str(comm_dtype), tuple((int(g), int(pid)) for g, _, pid in bucket.params), int(numel))


def _describe(signature: tuple) -> str:
    dtype, members, numel = signature
    ids = ", ".join(str(pid) for _, pid in members[:8]) + (", ..." if len(members) > 8 else "")
    return f"{len(members)} parameters (ids {ids}; {numel} elements, {dtype})"


def _layout_error(state: _Zero2Shards, k: int, got: Optional[tuple]) -> RuntimeError:
    layout = state.layout or []
    want = layout[k] if k < len(layout) else None
    return RuntimeError(
        f"{OPTION}: ZeRO-2's bucket layout changed between micro-steps: bucket {k} of this backward "
        + (f"holds {_describe(got)}" if got is not None else f"is missing (this backward reduced {k} buckets)")
        + ", the first backward's " + (f"held {_describe(want)}" if want is not None else
                                       f"were {len(layout)} buckets in all")
        + ". The balanced reduce-scatter accumulates each bucket's shard in a fixed place, so every micro-step "
        "must fill the same buckets in the same order (every parameter with a gradient, the same backward hook "
        "order); use zero.gradient_collective=all_reduce for this model")


def _bucket_input(bucket: Any, parts: list, padded: int, comm_dtype):
    """The reduce-scatter input: the bucket's elements in the communication dtype, zero-padded to
    `padded`. DeepSpeed's own bucket buffer where it is that already and has room for the padding."""
    import torch

    numel = sum(int(t.numel()) for t in parts)
    if len(parts) == 1 and parts[0].dtype == comm_dtype and parts[0].is_contiguous():
        tensor = parts[0]
        if padded == numel:
            return tensor
        for buffer in bucket.buffer:
            if (buffer.data_ptr() == tensor.data_ptr() and buffer.dtype == comm_dtype
                    and buffer.numel() >= padded):
                packed = buffer.narrow(0, 0, padded)
                packed.narrow(0, numel, padded - numel).zero_()
                return packed
    packed = torch.empty(padded, dtype=comm_dtype, device=parts[0].device)
    offset = 0
    for tensor in parts:
        packed.narrow(0, offset, tensor.numel()).copy_(tensor.view(-1))
        offset += tensor.numel()
    if padded > numel:
        packed.narrow(0, numel, padded - numel).zero_()
    return packed


def _accumulate(state: _Zero2Shards, k: int, shard, fresh: bool) -> None:
    """Add (or, on the first backward of an optimizer step, copy) bucket k's reduced shard into the
    accumulator, run by run."""
    acc = state.accumulator
    for shard_offset, acc_offset, numel in state.acc_runs[k]:
        target, source = acc.narrow(0, acc_offset, numel), shard.narrow(0, shard_offset, numel)
        if fresh:
            target.copy_(source)
        else:
            target.add_(source)


def _reduce_bucket_shards(opt: Any, bucket: Any, parts: list, comm_dtype, contiguous: bool) -> None:
    """ONE balanced reduce-scatter of a ZeRO-2 bucket (`parts`: its flat buffer, an oversized
    gradient, or its listed gradients, in bucket order), this rank's reduced shard added into its
    accumulator. Runs on the caller's stream (the reduction stream under overlap_comm)."""
    import torch
    from deepspeed import comm as dist

    state: _Zero2Shards = getattr(opt, _SHARDS_ATTR)
    stats: ReduceScatterStats = getattr(opt, _INSTALLED_ATTR)
    group = opt.dp_process_group
    world, me = dist.get_world_size(group=group), dist.get_rank(group=group)
    numel = sum(int(t.numel()) for t in parts)
    if numel == 0:
        return
    listed = sum(int(opt.bit16_groups[g][k].numel()) for g, k, _ in bucket.params)
    if listed != numel:
        raise RuntimeError(f"{OPTION}: a ZeRO-2 bucket of {numel} elements lists parameters of {listed}; the "
                           "patched seam does not match this DeepSpeed")
    signature = _bucket_signature(bucket, comm_dtype, numel)
    k = state.position
    if state.layout is not None and (k >= len(state.layout) or state.layout[k] != signature):
        raise _layout_error(state, k, signature)
    state.position += 1

    before, pre, post = _scaling(opt, contiguous)
    if before is not None:        # average_tensor: the bucket, in place, in its own dtype
        for tensor in parts:
            before(tensor)
    padded = balanced_bucket_elements(numel, world, state.align)
    packed = _bucket_input(bucket, parts, padded, comm_dtype)
    if pre is not None:           # allreduce_bucket / gradient_reduction_w_predivide: the comm copy
        pre(packed)
    shard = torch.empty(padded // world, dtype=comm_dtype, device=packed.device)
    _issue_reduce_scatter(shard, packed, group, world)
    if post is not None:
        post(shard)
    if shard.dtype != state.acc_dtype:  # DeepSpeed: copied back into the gradient / added to fp32
        shard = shard.to(state.acc_dtype)
    stats.num_collectives += 1
    stats.real_numel += numel
    stats.padded_numel += padded

    if state.layout is None:      # the first backward: kept until its end fixes the layout
        spans = []
        for _, _, pid in bucket.params:
            g, _, start, size = state.spans[int(pid)]
            spans.append((g, start, size))
        state.first.append((signature, tuple(spans), shard))
        return
    if state.accumulator is None:
        state.accumulator = torch.empty(state.plan.accumulator_numel(me), dtype=state.acc_dtype,
                                        device=shard.device)
    _accumulate(state, k, shard, fresh=state.backwards == 0)


def _end_backward(opt: Any, state: _Zero2Shards) -> None:
    """After a backward's last bucket: fix the layout after the first backward (and lay its shards
    into the accumulator), else check that this backward reduced as many buckets."""
    import torch
    from deepspeed import comm as dist
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator()
    group = opt.dp_process_group
    world, me = dist.get_world_size(group=group), dist.get_rank(group=group)
    if state.layout is None:
        first, state.first = state.first, []
        buckets = [spans for _, spans, _ in first]
        plan = plan_bucket_shards(buckets, state.partition_size, world, state.align)
        for (_, _, shard), numel in zip(first, plan.shard_numel):
            assert shard.numel() == numel, (shard.numel(), numel)
        state.layout = [signature for signature, _, _ in first]
        state.plan = plan
        state.acc_runs = plan.accumulator_runs(me)
        state.recv_runs = plan.receive_runs(me)
        state.send_splits = list(plan.send_numel[me])
        state.recv_splits = [row[me] for row in plan.send_numel]
        stats: ReduceScatterStats = getattr(opt, _INSTALLED_ATTR)
        stats.bucket_spans = tuple(tuple(spans) for spans in buckets)
        stats.accumulator_numel = plan.accumulator_numel(me)
        state.accumulator = torch.empty(plan.accumulator_numel(me), dtype=state.acc_dtype,
                                        device=accel.current_device_name())
        for k, (_, _, shard) in enumerate(first):
            if opt.overlap_comm and not accel.resolves_data_dependency():
                shard.record_stream(accel.current_stream())   # made on the reduction stream
            _accumulate(state, k, shard, fresh=True)
    elif state.position != len(state.layout):
        raise _layout_error(state, state.position, None)
    state.position = 0
    state.backwards += 1


def _redistribute(opt: Any, state: _Zero2Shards) -> None:
    """At the accumulation boundary: ONE all-to-all from the bucket-sharded accumulators to
    DeepSpeed's partitions; the received runs make `averaged_gradients` (flat partitions per group,
    as DeepSpeed's fp32 partition buffer is built)."""
    import torch
    from deepspeed import comm as dist
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator()
    stats: ReduceScatterStats = getattr(opt, _INSTALLED_ATTR)
    device = accel.current_device_name()
    acc = state.accumulator
    if acc is None:               # no bucket at all
        acc = torch.empty(0, dtype=state.acc_dtype, device=device)
    received = torch.empty(sum(state.recv_splits), dtype=state.acc_dtype, device=device)
    dist.all_to_all_single(received, acc, output_split_sizes=list(state.recv_splits),
                           input_split_sizes=list(state.send_splits), group=opt.dp_process_group)
    stats.num_all_to_all += 1
    stats.all_to_all_numel += int(acc.numel())
    if opt.overlap_comm and not accel.resolves_data_dependency():
        acc.record_stream(accel.current_stream())   # allocated on the reduction stream
    state.accumulator = None
    del acc
    partitions = []
    for i in range(len(opt.bit16_groups)):
        grad_group = opt._build_compact_grad_partition_buffer(i)   # zeros, DeepSpeed's views per parameter
        opt.averaged_gradients[i] = grad_group
        partitions.append(grad_group.flat_partition)
    for offset, g, dst_offset, numel in state.recv_runs:
        partitions[g].narrow(0, dst_offset, numel).copy_(received.narrow(0, offset, numel))
    state.backwards = 0


def _keep_grads_in_bucket(self: Any, param, group_idx=None) -> None:
    """Replaces DeepSpeedZeroOptimizer.copy_grads_in_partition (balanced ZeRO-2): this rank's
    reduced values are in its accumulator, not in the bucket; DeepSpeed would copy the (here
    unreduced) bucket slice of each parameter of its partition into `grads_in_partition`, Psi/N
    elements per micro-step, which nothing reads on this path."""


def _epilogue_zero2(self: Any) -> None:
    """Replaces DeepSpeedZeroOptimizer.independent_gradient_partition_epilogue (balanced ZeRO-2):
    DeepSpeed's steps without the accumulation of param.grad into all_grad_tensors, and at the
    accumulation boundary the all-to-all into averaged_gradients."""
    from deepspeed.accelerator import get_accelerator

    state: _Zero2Shards = getattr(self, _SHARDS_ATTR)
    self.reduce_ipg_grads()
    for i in range(len(self.params_already_reduced)):
        self.params_already_reduced[i] = False
    accel = get_accelerator()
    if self.overlap_comm:
        if not accel.resolves_data_dependency():
            accel.synchronize()
        # It is safe to clear previously reduced grads of other partitions
        self._clear_previous_reduced_grads()
    _end_backward(self, state)
    if self.is_gradient_accumulation_boundary():
        _redistribute(self, state)
    self._release_ipg_buffers()
    self._clear_param_grad_only()
    self._epilogue_ran_this_backward = True
