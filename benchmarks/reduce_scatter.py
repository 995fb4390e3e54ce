"""A real reduce-scatter for the ZeRO-1/2 gradient reduction (`zero.gradient_collective=reduce_scatter`),
applied at run time to one DeepSpeed engine's optimizer.

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
  own reduce_scatter path as well.

What this does, on the optimizer *instance* (nothing global changes):
- Replaces the three reduction seams of `reduce_ipg_grads`: `average_tensor` (contiguous_gradients),
  `buffered_reduce_fallback` and `_buffered_reduce_fallback_preserving_fp32` (without). Bucketing,
  hooks, the ZeRO-1/ZeRO-2 timing, the epilogue and the bookkeeping after the reduction
  (`params_already_reduced`, `copy_grads_in_partition`, clearing other partitions' gradients)
  stay DeepSpeed's.
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
- The collective: `reduce_scatter_fn` (reduce_scatter_tensor; ncclReduceScatter on NCCL), on gloo
  the list form `reduce_scatter`. Gloo has no reduce-scatter algorithm (ProcessGroupGloo: the
  tensor form clones the input and all-reduces it, the list form all-reduces chunk by chunk); the
  list form is the cheaper (torch 2.13, 20 MB, 2 ranks: ~1.0-1.5x the all-reduce's time, the tensor
  form ~1.8x). On gloo the traffic is the all-reduce's: the saving below is NCCL's only.

Traffic per rank and bucket (NCCL ring): (N-1) x the padded chunk, i.e. (N-1)/N x bucket bytes
only when the bucket's elements are spread evenly over the N partitions, against 2(N-1)/N for the
ring all-reduce. DeepSpeed cuts the flat parameters into N contiguous partitions and fills buckets
in backward (or, for ZeRO-1 without overlap_comm, parameter) order, so a bucket smaller than the
whole gradient lies mostly in one or two partitions and is padded up to N x its size: then the
reduce-scatter moves up to (N-1) x bucket bytes, MORE than the all-reduce from N = 3 on. Only a
bucket holding the whole gradient (reduce_bucket_size >= parameters, e.g. DeepSpeed's default 5e8
for models up to that size) is balanced. `install` returns counters of real and padded elements;
rank 0 warns once when a bucket's reduce-scatter would move more than its all-reduce. Pieces of
other ranks' partitions are left unreduced in the bucket/gradients, as DeepSpeed's own
reduce_scatter path leaves them; nothing reads them.

Verified only with DeepSpeed 0.19.8 (VERIFIED_DEEPSPEED); any other version is refused.
"""
from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Optional, Sequence

VERIFIED_DEEPSPEED = ("0.19.8",)
OPTION = "zero.gradient_collective=reduce_scatter"
_INSTALLED_ATTR = "_bench_reduce_scatter"


class GradientCollectiveError(RuntimeError):
    """The reduce-scatter gradient reduction cannot be applied to this DeepSpeed / engine."""


def _refuse(why: str) -> GradientCollectiveError:
    return GradientCollectiveError(f"{OPTION} refused: {why}; use zero.gradient_collective=all_reduce")


def check_version(installed: str) -> None:
    """Refuse any DeepSpeed but the verified ones: the patched methods are private internals."""
    if installed not in VERIFIED_DEEPSPEED:
        raise _refuse(f"installed DeepSpeed {installed} is not a verified version "
                      f"(verified: {', '.join(VERIFIED_DEEPSPEED)}); it replaces private methods of "
                      "DeepSpeedZeroOptimizer (benchmarks/reduce_scatter.py), check them against "
                      f"DeepSpeed {installed} before adding it to VERIFIED_DEEPSPEED")


# --- the layout of one bucket: pure, no torch ---------------------------------------------------

@dataclass(frozen=True)
class Piece:
    """A run of one parameter's gradient that belongs to one rank's partition."""
    dst: int              # data-parallel rank whose partition holds these elements
    index: int            # the parameter's position in the bucket
    param_offset: int     # first element, within the parameter
    bucket_offset: int    # first element, within the flat bucket
    numel: int


@dataclass(frozen=True)
class Layout:
    """Where each piece goes in the reduce-scatter input: chunk `dst`, at `chunk_offsets[i]`."""
    world_size: int
    chunk_numel: int                  # every chunk padded to this (the longest destination)
    chunk_offsets: tuple[int, ...]    # per piece, within its destination's chunk
    dst_numel: tuple[int, ...]        # real elements per destination

    @property
    def real_numel(self) -> int:
        return sum(self.dst_numel)

    @property
    def padded_numel(self) -> int:
        return self.world_size * self.chunk_numel


def plan_layout(pieces: Sequence[Piece], world_size: int) -> Layout:
    """Each destination's pieces back to back in bucket order, chunks padded to equal length."""
    fill = [0] * world_size
    offsets = []
    for p in pieces:
        if not 0 <= p.dst < world_size:
            raise ValueError(f"piece for rank {p.dst} outside the group of {world_size}")
        offsets.append(fill[p.dst])
        fill[p.dst] += p.numel
    return Layout(world_size, max(fill, default=0), tuple(offsets), tuple(fill))


def split_param(index: int, bucket_offset: int, numel: int,
                starts: Sequence[tuple[int, int]]) -> list[Piece]:
    """A parameter's pieces from (partition id, offset in the parameter) of each partition it
    touches, as average_tensor computes them: each runs to the next partition's offset."""
    starts = sorted(starts, key=lambda t: t[1])
    pieces = []
    for k, (dst, offset) in enumerate(starts):
        end = starts[k + 1][1] if k + 1 < len(starts) else numel
        if end > offset:
            pieces.append(Piece(dst, index, offset, bucket_offset + offset, end - offset))
    return pieces


@dataclass(frozen=True)
class Scale:
    """An in-place division or multiplication, as DeepSpeed writes it (x/3 and x*(1/3) differ)."""
    op: str               # div | mul
    value: float

    def __call__(self, tensor) -> None:
        if self.op == "div":
            tensor.div_(self.value)
        else:
            tensor.mul_(self.value)


@dataclass
class ReduceScatterStats:
    """What the installed reduction did so far (all ranks count the same)."""
    num_collectives: int = 0
    num_straddling: int = 0
    """Buckets with pieces of more than one rank's partition."""
    real_numel: int = 0
    padded_numel: int = 0
    warned: bool = False


# --- the DeepSpeed side ------------------------------------------------------------------------

def check_supported(engine: Any) -> None:
    """Refuse, with the reason, whatever this reduction was not written and verified for."""
    import deepspeed
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    check_version(deepspeed.__version__)
    stage = engine.zero_optimization_stage()
    if stage not in (1, 2):
        raise _refuse(f"ZeRO stage {stage} "
                      + ("has no partitioned gradients to reduce-scatter into" if stage == 0 else
                         "reduce-scatters its gradients natively (reduce_scatter_coalesced)"))
    opt = engine.optimizer
    if type(opt) is not DeepSpeedZeroOptimizer:
        raise _refuse(f"the engine's optimizer is {type(opt).__module__}.{type(opt).__name__}, not "
                      "DeepSpeedZeroOptimizer (bf16 ZeRO-1 with fp32 gradient accumulation gets "
                      "BF16_Optimizer; ZenFlow its own)")
    unsupported = {"MoE layers (expert data-parallel groups)": opt.has_moe_layers,
                   "optimizer offload": opt.cpu_offload,
                   "ZenFlow": opt.zenflow,
                   "sequence parallelism": opt.sequence_parallel_size != 1,
                   "AutoEP tensor-parallel folding": getattr(opt, "autoep_folding_tp_group", None) is not None,
                   "the Muon optimizer": "muon" in type(opt.optimizer).__name__.lower()}
    for what, present in unsupported.items():
        if present:
            raise _refuse(f"not verified with {what}")
    if getattr(opt, _INSTALLED_ATTR, None) is not None:
        raise _refuse("already installed on this optimizer")


def install(engine: Any) -> ReduceScatterStats:
    """Replace the ZeRO-1/2 gradient reduction of `engine.optimizer` (this instance only) with one
    reduce-scatter per bucket. Call after deepspeed.initialize, before the first backward."""
    check_supported(engine)
    opt = engine.optimizer
    stats = ReduceScatterStats()
    setattr(opt, _INSTALLED_ATTR, stats)
    opt.average_tensor = types.MethodType(_average_tensor, opt)
    opt.buffered_reduce_fallback = types.MethodType(_buffered_reduce_fallback, opt)
    opt._buffered_reduce_fallback_preserving_fp32 = types.MethodType(_buffered_reduce_fallback_fp32, opt)
    from deepspeed import comm as dist
    from deepspeed.utils import logger

    if dist.get_rank() == 0:
        logger.info(f"{OPTION}: ZeRO-{engine.zero_optimization_stage()} gradients reduced with one "
                    "reduce-scatter per bucket (benchmarks/reduce_scatter.py)")
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
    if torch.distributed.get_backend(group) == "gloo":
        # gloo has no reduce-scatter of its own; its list form costs less than its tensor form
        dist.reduce_scatter(reduced, list(packed.chunk(world)), group=group)
    else:
        dist.reduce_scatter_fn(reduced, packed, group=group)
    if postscale is not None:
        postscale(reduced)
    for piece, view, offset in zip(pieces, views, layout.chunk_offsets):
        if piece.dst != me:
            continue
        synced = reduced.narrow(0, offset, piece.numel)
        opt._add_to_grad_partition_buffer(_compact_output(opt, bucket, piece), synced)
        view.copy_(synced)


def _scaling(opt: Any, contiguous: bool) -> tuple[Optional[Scale], Optional[Scale], Optional[Scale]]:
    """The averaging of the DeepSpeed path being replaced, as (scale the bucket in place before
    packing, scale the packed copy, scale the reduced chunk), the same operations in the same order."""
    from deepspeed import comm as dist

    world = dist.get_world_size(group=opt.dp_process_group)
    average = Scale("div", world / float(opt.sequence_parallel_size))
    if not opt.gradient_average:
        return None, None, None
    if contiguous and opt.reduce_scatter:     # average_tensor: tensor.div_ on the bucket
        return average, None, None
    if not contiguous:                        # allreduce_bucket(divide=True): on the comm-dtype copy
        return None, average, None
    # contiguous, reduce_scatter: false -> gradient_reduction_w_predivide
    if not opt.postscale_gradients:
        return None, average, None
    factor = opt.gradient_predivide_factor
    pre = Scale("mul", 1. / factor) if factor != 1.0 else None
    post = Scale("mul", factor / average.value) if factor != world else None
    return None, pre, post


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
