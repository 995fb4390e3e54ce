"""A real reduce-scatter for the ZeRO-1/2 gradient reduction (`zero.gradient_collective=reduce_scatter`),
applied at run time to one DeepSpeed engine's optimizer.

The modules:
- benchmarks/reduce_scatter/install.py (this one): `install`, which patches DeepSpeed's optimizer instance
  and picks the path, and path 3, one padded reduce-scatter per bucket (the reduction seams of
  `reduce_ipg_grads`, patched under every path). Every public name of the modules below can be
  imported from here as well.
- benchmarks/reduce_scatter/common.py: what the paths share: the option and the verified DeepSpeed
  versions, what is refused (`check_supported`), where the balanced paths apply
  (`balanced_zero1_blockers`, `balanced_zero2_blockers`), `ReduceScatterStats`, the averaging
  (`_scaling`) and the collective (`_issue_reduce_scatter`, and which one each backend gets).
- benchmarks/reduce_scatter/zero1.py: path 1, ZeRO-1's balanced windows.
- benchmarks/reduce_scatter/zero2.py: path 2, ZeRO-2's balanced bucket shards.
- benchmarks/reduce_scatter/layout.py: the layouts (pieces, windows, shard plans), pure arithmetic
  without torch, which the performance model imports too.

What DeepSpeed 0.19.8 does (deepspeed/runtime/zero/stage_1_and_2.py, DeepSpeedZeroOptimizer):
- Backward hooks (`create_gradient_handling_hooks` -> `process_gradients` ->
  `reduce_independent_p_g_buckets_and_remove_grads`) put each gradient, in backward order, into
  the bucket of its communication dtype (`ipg_buckets`); with contiguous_gradients the gradient is
  copied into the bucket's flat buffer (two buffers that alternate under overlap_comm), without it
  the bucket only lists the gradient tensors. A bucket that would pass `reduce_bucket_size` is
  reduced by `reduce_ipg_grads`, and so is the rest at the end of backward
  (`independent_gradient_partition_epilogue`). ZeRO-2 does this on every micro-step; ZeRO-1 only at
  the gradient-accumulation boundary (hooks reduce only then when overlap_comm; otherwise
  engine.py `allreduce_gradients` -> `reduce_gradients` walks all parameters there).
- `reduce_ipg_grads` with contiguous_gradients calls `average_tensor(flat bucket)` (or the lone
  gradient of a parameter larger than a bucket). With `reduce_scatter: true` (default) that walks
  the bucket's parameters, finds which rank's partition each piece belongs to
  (`param_to_partition_ids`, `grad_start_offset`; the flat parameter group is cut into equal
  contiguous partitions, so one parameter can straddle two), divides the bucket by the
  data-parallel size, and then with `use_multi_rank_bucket_allreduce: true` (default)
  ALL-REDUCES the whole bucket (`allreduce_and_scatter` -> `allreduce_and_copy_with_multiple_ranks`
  -> `allreduce_bucket` -> `dist.all_reduce`) and copies back only the pieces of its own partition;
  with it false, it issues one `dist.reduce` per destination rank (`allreduce_no_retain(rank=dst)`).
  With `reduce_scatter: false` it all-reduces the bucket with `gradient_reduction_w_predivide`
  (gradient_predivide_factor / postscale_gradients). No reduce-scatter collective is ever issued.
- Without contiguous_gradients, `reduce_ipg_grads` calls `buffered_reduce_fallback` (or
  `_buffered_reduce_fallback_preserving_fp32` for bf16/fp16 parameters with fp32 gradient
  accumulation): flatten the bucket's gradients, divide by the data-parallel size, all-reduce
  (`allreduce_no_retain` -> `allreduce_and_copy`), copy everything back.
- Afterwards only this rank's partition of each gradient is read: ZeRO-2 copies its partition's
  gradients out of the bucket (`copy_grads_in_partition`) and drops the others; both stages build
  the optimizer's flat partition from `params_in_partition` with `get_flat_partition`, which narrows
  to the partition. The other ranks' pieces stay as they are (predivided, unreduced) in DeepSpeed's
  own reduce_scatter path as well. ZeRO-2 accumulates over the micro-steps in its epilogue: each
  micro-step's reduced partition gradients (param.grad, parameter dtype) are added into
  `all_grad_tensors` (the first micro-step's tensors themselves), or, with bf16/fp16 parameters and
  fp32 gradient accumulation, each reduced piece is added into its fp32 partition buffer
  (`_build_compact_grad_partition_buffer`, a `GradPartitionBufferGroup`) as it arrives; at the
  boundary that becomes `averaged_gradients`, and param.grad is cleared after every epilogue.

What this does, on the optimizer *instance* (nothing global changes). Three paths; `install` picks
one and says which, and why, in a log line on rank 0 (DeepSpeed's logger, at WARNING so that it
shows at DeepSpeed's default level) and in `ReduceScatterStats.path`:

1. ZeRO-1: BALANCED WINDOWS at the accumulation boundary (`path == "balanced_windows"`):
   benchmarks/reduce_scatter/zero1.py.

2. ZeRO-2: BALANCED BUCKET SHARDS (`path == "balanced_buckets"`): benchmarks/reduce_scatter/zero2.py.

3. Elsewhere (ZeRO-1 or ZeRO-2 where a blocker applies, or `install(..., balanced=False)`): ONE
   REDUCE-SCATTER PER BUCKET (`path == "per_bucket"`), padded.
- Replaces the three reduction seams of `reduce_ipg_grads`: `average_tensor` (contiguous_gradients),
  `buffered_reduce_fallback` and `_buffered_reduce_fallback_preserving_fp32` (without). Bucketing,
  hooks, the ZeRO-1/ZeRO-2 timing, the epilogue and the bookkeeping after the reduction
  (`params_already_reduced`, `copy_grads_in_partition`, clearing other partitions' gradients)
  stay DeepSpeed's. (These seams stay patched under path 1 too, where the buckets stay empty.)
- For each bucket it lists the same pieces (parameter, destination rank, offset, length) from the
  same tables, packs each destination's pieces into one chunk (bucket order kept inside a chunk),
  pads the chunks to the longest, issues ONE reduce-scatter over the data-parallel group through
  deepspeed.comm (the micro-step instrument sees op reduce_scatter), and writes this rank's reduced
  chunk back where DeepSpeed keeps its reduced values: the bucket (or the gradient tensors), and
  DeepSpeed's fp32 partition buffer where one is in use (`_get_compact_grad_partition_slice`).
- Averaging as the path it replaces: the bucket divided by the data-parallel size before
  (contiguous, `reduce_scatter: true`), gradient_predivide_factor / postscale_gradients as
  `gradient_reduction_w_predivide` (contiguous, `reduce_scatter: false`), the communication-dtype
  copy divided (without contiguous_gradients). On 2 ranks the result is bit-identical to
  DeepSpeed's (tests/integration/test_reduce_scatter.py).
- Streams as `average_tensor` / `allreduce_and_copy`: under overlap_comm everything (scaling,
  packing, the collective, write-back) runs on the optimizer's reduction stream after it waited
  for the bucket's producer streams, and the compute stream waits for earlier reductions; the
  gradient or bucket it reads is `record_stream`ed there (an oversized gradient outside this
  rank's partition is dropped by ZeRO-2 right after). Temporaries are allocated on that stream.
- Traffic per rank and bucket (NCCL ring): (N-1) x the padded chunk, i.e. (N-1)/N x bucket bytes
  only when the bucket's elements are spread evenly over the N partitions, against 2(N-1)/N for
  the ring all-reduce. DeepSpeed cuts the flat parameters into N contiguous partitions and fills
  buckets in backward (or, for ZeRO-1 without overlap_comm, parameter) order, so a bucket smaller
  than the whole gradient lies mostly in one or two partitions and is padded up to N x its size:
  then the reduce-scatter moves up to (N-1) x bucket bytes, MORE than the all-reduce from N = 3
  on. Only a bucket holding the whole gradient (reduce_bucket_size >= parameters, e.g.
  DeepSpeed's default 5e8 for models up to that size) is balanced. rank 0 warns once when a
  bucket's reduce-scatter would move more than its all-reduce. Pieces of other ranks' partitions
  are left unreduced in the bucket/gradients, as DeepSpeed's own reduce_scatter path leaves them;
  nothing reads them.

Every path counts real and padded elements in the `ReduceScatterStats` that `install` returns; the
collective each backend gets: benchmarks/reduce_scatter/common.py. Verified only with DeepSpeed
0.19.8 (VERIFIED_DEEPSPEED); any other version is refused.
"""
from __future__ import annotations

import types
from typing import Any, Optional

from benchmarks.reduce_scatter.common import (OPTION, _INSTALLED_ATTR, _SHARDS_ATTR, _WINDOWS_ATTR, ReduceScatterStats,
                                    _flat_layout, _issue_reduce_scatter, _scaling, balanced_zero1_blockers,
                                    balanced_zero2_blockers, check_supported)
from benchmarks.reduce_scatter.layout import Piece, plan_layout, split_param, window_numel
from benchmarks.reduce_scatter.zero1 import _epilogue, _mark_ready, _Zero1Windows
from benchmarks.reduce_scatter.zero2 import _epilogue_zero2, _keep_grads_in_bucket, _reduce_bucket_shards, _Zero2Shards


def install(engine: Any, balanced: bool = True) -> ReduceScatterStats:
    """Replace the ZeRO-1/2 gradient reduction of `engine.optimizer` (this instance only) with
    reduce-scatters: balanced windows at the accumulation boundary for ZeRO-1 where
    balanced_zero1_blockers finds nothing, balanced bucket shards for ZeRO-2 where
    balanced_zero2_blockers finds nothing (both only if `balanced`), else one padded reduce-scatter
    per bucket. Call after deepspeed.initialize, before the first backward."""
    check_supported(engine)
    opt = engine.optimizer
    from deepspeed import comm as dist
    from deepspeed.utils import logger

    stage = engine.zero_optimization_stage()
    blockers = balanced_zero1_blockers(engine) if stage == 1 else balanced_zero2_blockers(engine)
    if not balanced and not blockers:
        blockers = ["install(balanced=False)"]
    stats = ReduceScatterStats()
    world = dist.get_world_size(group=opt.dp_process_group)
    if not blockers and stage == 2:
        state = _Zero2Shards(_flat_layout(opt), tuple(int(p) for p in opt.partition_size),
                             int(opt.nccl_start_alignment_factor), opt.gradient_accumulation_dtype)
        stats.path = "balanced_buckets"
        setattr(opt, _SHARDS_ATTR, state)
        opt.copy_grads_in_partition = types.MethodType(_keep_grads_in_bucket, opt)
        opt.independent_gradient_partition_epilogue = types.MethodType(_epilogue_zero2, opt)
    elif not blockers:
        windows = tuple(window_numel(int(size), opt.reduce_bucket_size, world, opt.nccl_start_alignment_factor)
                        for size in opt.partition_size)
        state = _Zero1Windows(_flat_layout(opt), windows, next(iter(opt.ipg_buckets)),
                              opt.independent_gradient_partition_epilogue)
        stats.path, stats.window_numel = "balanced_windows", windows
        setattr(opt, _WINDOWS_ATTR, state)
        opt.reduce_ready_partitions_and_remove_grads = types.MethodType(_mark_ready, opt)
        opt.independent_gradient_partition_epilogue = types.MethodType(_epilogue, opt)
    setattr(opt, _INSTALLED_ATTR, stats)
    opt.average_tensor = types.MethodType(_average_tensor, opt)
    opt.buffered_reduce_fallback = types.MethodType(_buffered_reduce_fallback, opt)
    opt._buffered_reduce_fallback_preserving_fp32 = types.MethodType(_buffered_reduce_fallback_fp32, opt)

    if dist.get_rank() == 0:  # at WARNING: DeepSpeed's logger drops INFO by default, this must show
        if not blockers and stage == 2:
            align = int(opt.nccl_start_alignment_factor)
            logger.warning(f"{OPTION}: ZeRO-2 gradients reduce-scattered bucket by bucket in {world} equal shards "
                           f"of each bucket (padded to a multiple of {world * align} elements; (N-1)/N of the "
                           "bucket bytes per rank and micro-step), accumulated in a bucket-sharded buffer per "
                           "rank and sent to DeepSpeed's partitions by one all-to-all at the accumulation "
                           "boundary (benchmarks/reduce_scatter/install.py)")
        elif not blockers:
            groups = ", ".join(f"P={int(p)} W={w}" for p, w in zip(opt.partition_size, stats.window_numel))
            logger.warning(f"{OPTION}: ZeRO-{stage} gradients reduced at the accumulation boundary in balanced "
                        f"windows over the {world} partitions, one reduce-scatter of {world} x W elements per "
                        f"window ({groups}; (N-1)/N of the gradient bytes per rank) (benchmarks/reduce_scatter/install.py)")
        else:
            what = "balanced windows" if stage == 1 else "balanced bucket shards"
            logger.warning(f"{OPTION}: ZeRO-{stage} gradients reduced with one reduce-scatter per bucket, padded "
                        f"to {world} x the bucket's largest rank share; {what} not used: "
                        f"{'; '.join(blockers)} (benchmarks/reduce_scatter/install.py)")
    return stats


def _bucket_pieces(opt: Any, bucket: Any) -> list[Piece]:
    """average_tensor's walk over the bucket (same tables), one piece per (parameter, partition)."""
    pieces: list[Piece] = []
    bucket_offset = 0
    for index, (group, idx_in_group, param_id) in enumerate(bucket.params):
        numel = opt.bit16_groups[group][idx_in_group].numel()
        starts = [(pid, int(opt.grad_start_offset[group][pid][param_id]))
                  for pid in opt.param_to_partition_ids[group][param_id]]
        pieces += split_param(index, bucket_offset, numel, starts)
        bucket_offset += numel
    return pieces


def _compact_output(opt: Any, bucket: Any, piece: Piece):
    """DeepSpeed's fp32 partition buffer slice for a piece of this rank (None when not in use)."""
    group, _, param_id = bucket.params[piece.index]
    return opt._get_compact_grad_partition_slice(group, piece.dst, param_id, piece.numel)


def _reduce_scatter(opt: Any, bucket: Any, pieces: list[Piece], views: list, comm_dtype,
                    prescale, postscale) -> None:
    """Pack `views` (the pieces' gradient elements) by destination, reduce-scatter over the
    data-parallel group, write this rank's reduced pieces back into their views and add them to
    DeepSpeed's fp32 partition buffer where it keeps one."""
    import torch
    from deepspeed import comm as dist
    from deepspeed.utils import logger

    group = opt.dp_process_group
    world, me = dist.get_world_size(group=group), dist.get_rank(group=group)
    layout = plan_layout(pieces, world)
    if layout.chunk_numel == 0:
        return
    stats: ReduceScatterStats = getattr(opt, _INSTALLED_ATTR)
    stats.num_collectives += 1
    stats.num_straddling += int(sum(1 for n in layout.dst_numel if n) > 1)
    stats.real_numel += layout.real_numel
    stats.padded_numel += layout.padded_numel
    if layout.padded_numel > 2 * layout.real_numel and not stats.warned:
        stats.warned = True
        if dist.get_rank() == 0:
            logger.warning(f"{OPTION}: a bucket of {layout.real_numel} elements spread as "
                           f"{list(layout.dst_numel)} over the {world} partitions is padded to "
                           f"{layout.padded_numel}: this reduce-scatter moves more than the "
                           "all-reduce it replaces (buckets much smaller than a partition)")

    ref = views[0]
    by_dst: list[list] = [[] for _ in range(world)]
    for piece, view in zip(pieces, views):
        by_dst[piece.dst].append(view)
    chunks = []
    for dst, dst_views in enumerate(by_dst):
        chunks += dst_views
        pad = layout.chunk_numel - layout.dst_numel[dst]
        if pad:
            chunks.append(torch.zeros(pad, dtype=ref.dtype, device=ref.device))
    packed = torch.cat(chunks)
    if packed.dtype != comm_dtype:
        packed = packed.to(comm_dtype)
    if prescale is not None:
        prescale(packed)
    reduced = torch.empty(layout.chunk_numel, dtype=comm_dtype, device=packed.device)
    _issue_reduce_scatter(reduced, packed, group, world)
    if postscale is not None:
        postscale(reduced)
    for piece, view, offset in zip(pieces, views, layout.chunk_offsets):
        if piece.dst != me:
            continue
        synced = reduced.narrow(0, offset, piece.numel)
        opt._add_to_grad_partition_buffer(_compact_output(opt, bucket, piece), synced)
        view.copy_(synced)


def _average_tensor(self: Any, tensor, communication_data_type) -> None:
    """Replaces DeepSpeedZeroOptimizer.average_tensor: same streams, one reduce-scatter."""
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator()
    if self.overlap_comm:
        stream = self.reduction_stream
        if not accel.resolves_data_dependency():
            bucket = self.ipg_buckets[communication_data_type]
            for producer in bucket.copy_streams or {accel.current_stream()}:
                stream.wait_stream(producer)
            accel.current_stream().wait_stream(stream)
    else:
        stream = accel.current_stream()
    with accel.stream(stream):
        if self.overlap_comm and not accel.resolves_data_dependency():
            tensor.record_stream(stream)  # an oversized gradient may be dropped before this ends
        bucket = self.ipg_buckets[communication_data_type]
        if hasattr(self, _SHARDS_ATTR):
            _reduce_bucket_shards(self, bucket, [tensor], communication_data_type, contiguous=True)
            return
        pieces = _bucket_pieces(self, bucket)
        before, pre, post = _scaling(self, contiguous=True)
        if before is not None:
            before(tensor)
        views = [tensor.narrow(0, p.bucket_offset, p.numel) for p in pieces]
        if views:
            _reduce_scatter(self, bucket, pieces, views, communication_data_type, pre, post)


def _reduce_listed_grads(self: Any, grads, communication_data_type) -> None:
    """The bucket without contiguous_gradients: its gradient tensors, in allreduce_and_copy's
    stream discipline."""
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator()
    bucket = self.ipg_buckets[communication_data_type]
    if grads is not bucket.grads:
        raise RuntimeError(f"{OPTION}: DeepSpeedZeroOptimizer reduced a gradient list that is not "
                           "its bucket's; the patched seam does not match this DeepSpeed")
    if not grads:
        return
    if len({g.dtype for g in grads}) != 1 or not all(g.is_contiguous() for g in grads):
        raise RuntimeError(f"{OPTION}: a gradient bucket mixes dtypes or holds non-contiguous "
                           "gradients; not supported")
    if self.overlap_comm:
        if not accel.resolves_data_dependency():
            accel.synchronize()
        self._clear_previous_reduced_grads()
        stream = self.reduction_stream
    else:
        stream = accel.current_stream()
    with accel.stream(stream):
        if hasattr(self, _SHARDS_ATTR):
            _reduce_bucket_shards(self, bucket, [g.view(-1) for g in grads], communication_data_type,
                                  contiguous=False)
        else:
            pieces = _bucket_pieces(self, bucket)
            _, pre, post = _scaling(self, contiguous=False)
            views = [grads[p.index].view(-1).narrow(0, p.param_offset, p.numel) for p in pieces]
            if views:
                _reduce_scatter(self, bucket, pieces, views, communication_data_type, pre, post)
        if self.overlap_comm and not accel.resolves_data_dependency():
            for grad in grads:
                grad.record_stream(stream)


def _buffered_reduce_fallback(self: Any, rank: Optional[int], grads, communication_data_type,
                              elements_per_buffer=500000000, log=None) -> None:
    """Replaces DeepSpeedZeroOptimizer.buffered_reduce_fallback (reduce_ipg_grads' call only)."""
    if rank is not None:
        raise RuntimeError(f"{OPTION}: buffered_reduce_fallback called with rank={rank}; the patched "
                           "seam does not match this DeepSpeed")
    _reduce_listed_grads(self, grads, communication_data_type)


def _buffered_reduce_fallback_fp32(self: Any, grads, grad_params, communication_data_type,
                                   elements_per_buffer) -> None:
    """Replaces DeepSpeedZeroOptimizer._buffered_reduce_fallback_preserving_fp32."""
    _reduce_listed_grads(self, grads, communication_data_type)
