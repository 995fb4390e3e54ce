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

What this does, on the optimizer *instance* (nothing global changes). Two paths; `install` picks
one and says which, and why, in a log line on rank 0 (DeepSpeed's logger, at WARNING so that it
shows at DeepSpeed's default level) and in `ReduceScatterStats.path`:

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

2. Elsewhere (ZeRO-2, which must reduce on every micro-step and cannot wait for all gradients, and
   ZeRO-1 where a blocker applies or `install(..., zero1_balanced=False)`): ONE REDUCE-SCATTER PER
   BUCKET (`path == "per_bucket"`), padded.
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

Both paths count real and padded elements in the `ReduceScatterStats` that `install` returns.
The collective: `reduce_scatter_fn` (reduce_scatter_tensor; ncclReduceScatter on NCCL), on gloo the
list form `reduce_scatter`. Gloo has no reduce-scatter algorithm (ProcessGroupGloo: the tensor form
clones the input and all-reduces it, the list form all-reduces chunk by chunk); the list form is
the cheaper (torch 2.13, 20 MB, 2 ranks: ~1.0-1.5x the all-reduce's time, the tensor form ~1.8x).
On gloo the traffic is the all-reduce's: the saving is NCCL's only.

Verified only with DeepSpeed 0.19.8 (VERIFIED_DEEPSPEED); any other version is refused.
"""
from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any, Optional

from .reduce_scatter_layout import (Layout, Piece, Segment, Window, plan_layout, plan_windows,  # noqa: F401
                                    split_param, window_numel)

VERIFIED_DEEPSPEED = ("0.19.8",)
OPTION = "zero.gradient_collective=reduce_scatter"
_INSTALLED_ATTR = "_bench_reduce_scatter"
_WINDOWS_ATTR = "_bench_reduce_scatter_windows"


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
    path: str = "per_bucket"
    """balanced_windows (ZeRO-1 at the boundary) or per_bucket (see the module docstring)."""
    window_numel: tuple[int, ...] = ()
    """W per optimizer parameter group (balanced_windows only)."""
    num_collectives: int = 0
    num_straddling: int = 0
    """Buckets with pieces of more than one rank's partition (per_bucket only)."""
    real_numel: int = 0
    """Gradient elements reduced."""
    padded_numel: int = 0
    """Elements of the reduce-scatter inputs (real + padding)."""
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


def balanced_zero1_blockers(engine: Any) -> list[str]:
    """Why the balanced ZeRO-1 windows cannot replace the per-bucket path on this engine (none:
    they do). Call after check_supported."""
    opt = engine.optimizer
    blockers = []
    if engine.zero_optimization_stage() != 1 or opt.partition_gradients:
        blockers.append(f"ZeRO-{engine.zero_optimization_stage()} reduces on every micro-step, before all "
                        "gradients of the step exist")
        return blockers
    if getattr(engine, "pipeline_parallelism", False):
        blockers.append("pipeline parallelism (not verified)")
    if not engine.managed_gradient_accumulation():
        blockers.append("managed_gradient_accumulation=false (not verified)")
    if opt.use_grad_accum_attribute or any(opt._use_compact_grad_partition_buffer(i)
                                           for i in range(len(opt.bit16_groups))):
        blockers.append("gradients accumulate outside param.grad (grad_accum / fp32 partition buffer)")
    if len(opt.ipg_buckets) != 1:
        blockers.append(f"{len(opt.ipg_buckets)} communication dtypes (torch autocast)")
    if any(g is not opt.dp_process_group for g in opt.real_dp_process_group):
        blockers.append("a parameter group reduced over another process group")
    return blockers


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


def _zero1_layout(opt: Any) -> dict[int, tuple[int, int, int, int]]:
    """Each parameter's place in its group's flat buffer (round-robin order, parameter_alignment
    padding), checked against the tables DeepSpeed partitions with (a mismatch: refused)."""
    from deepspeed import comm as dist

    world = dist.get_world_size(group=opt.dp_process_group)
    spans = {}
    for g, params in enumerate(opt.round_robin_bit16_groups):
        size = int(opt.partition_size[g])
        flat = opt.bit16_groups_flat[g].numel()
        if flat != world * size:
            raise _refuse(f"parameter group {g}: flat buffer of {flat} elements is not {world} partitions of {size}")
        for k, (param, offset, meta) in enumerate(zip(params, opt.round_robin_bit16_offsets[g],
                                                      opt.round_robin_bit16_meta[g])):
            pid, numel = opt.get_param_id(param), meta.numel()
            spans[pid] = (g, k, int(offset), numel)
            if numel == 0:
                continue
            ranks = sorted(opt.param_to_partition_ids[g].get(pid, []))
            expect = list(range(offset // size, (offset + numel - 1) // size + 1))
            starts = [int(opt.grad_start_offset[g][r][pid]) for r in ranks]
            if ranks != expect or starts != [max(0, r * size - offset) for r in ranks]:
                raise _refuse(f"parameter group {g}, parameter {pid}: DeepSpeed's partition tables "
                              f"({ranks}, offsets {starts}) disagree with its flat offset {offset}; the "
                              "patched seam does not match this DeepSpeed")
    return spans


def install(engine: Any, zero1_balanced: bool = True) -> ReduceScatterStats:
    """Replace the ZeRO-1/2 gradient reduction of `engine.optimizer` (this instance only) with
    reduce-scatters: balanced windows at the accumulation boundary for ZeRO-1 where
    balanced_zero1_blockers finds nothing (and zero1_balanced), else one per bucket. Call after
    deepspeed.initialize, before the first backward."""
    check_supported(engine)
    opt = engine.optimizer
    from deepspeed import comm as dist
    from deepspeed.utils import logger

    blockers = balanced_zero1_blockers(engine)
    if not zero1_balanced and not blockers:
        blockers = ["install(zero1_balanced=False)"]
    stats = ReduceScatterStats()
    world = dist.get_world_size(group=opt.dp_process_group)
    if not blockers:
        windows = tuple(window_numel(int(size), opt.reduce_bucket_size, world, opt.nccl_start_alignment_factor)
                        for size in opt.partition_size)
        state = _Zero1Windows(_zero1_layout(opt), windows, next(iter(opt.ipg_buckets)),
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
        stage = engine.zero_optimization_stage()
        if not blockers:
            groups = ", ".join(f"P={int(p)} W={w}" for p, w in zip(opt.partition_size, stats.window_numel))
            logger.warning(f"{OPTION}: ZeRO-{stage} gradients reduced at the accumulation boundary in balanced "
                        f"windows over the {world} partitions, one reduce-scatter of {world} x W elements per "
                        f"window ({groups}; (N-1)/N of the gradient bytes per rank) (benchmarks/reduce_scatter.py)")
        else:
            logger.warning(f"{OPTION}: ZeRO-{stage} gradients reduced with one reduce-scatter per bucket, padded "
                        f"to {world} x the bucket's largest rank share; balanced windows not used: "
                        f"{'; '.join(blockers)} (benchmarks/reduce_scatter.py)")
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


def _issue_reduce_scatter(output, packed, group, world: int) -> None:
    """ONE reduce-scatter (sum) of `packed` (world equal chunks) over `group` into `output`."""
    import torch
    from deepspeed import comm as dist

    if torch.distributed.get_backend(group) == "gloo":
        # gloo has no reduce-scatter of its own; its list form costs less than its tensor form
        dist.reduce_scatter(output, list(packed.chunk(world)), group=group)
    else:
        dist.reduce_scatter_fn(output, packed, group=group)


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


# --- the balanced ZeRO-1 path ---------------------------------------------------------------------

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
