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
  own reduce_scatter path as well. ZeRO-2 accumulates over the micro-steps in its epilogue: each
  micro-step's reduced partition gradients (param.grad, parameter dtype) are added into
  `all_grad_tensors` (the first micro-step's tensors themselves), or, with bf16/fp16 parameters and
  fp32 gradient accumulation, each reduced piece is added into its fp32 partition buffer
  (`_build_compact_grad_partition_buffer`, a `GradPartitionBufferGroup`) as it arrives; at the
  boundary that becomes `averaged_gradients`, and param.grad is cleared after every epilogue.

What this does, on the optimizer *instance* (nothing global changes). Three paths; `install` picks
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

2. ZeRO-2: BALANCED BUCKET SHARDS (`path == "balanced_buckets"`). ZeRO-2 must reduce each bucket
   as backward fills it, on every micro-step (it keeps only its partition's gradients). The seams:
   the three reduction seams of `reduce_ipg_grads` (below: `average_tensor`,
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

Every path counts real and padded elements in the `ReduceScatterStats` that `install` returns.
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

from .reduce_scatter_layout import (Layout, Piece, Segment, ShardPlan, ShardSegment, Window,  # noqa: F401
                                    balanced_bucket_elements, plan_bucket_shards, plan_layout, plan_windows,
                                    split_param, window_numel)

VERIFIED_DEEPSPEED = ("0.19.8",)
OPTION = "zero.gradient_collective=reduce_scatter"
_INSTALLED_ATTR = "_bench_reduce_scatter"
_WINDOWS_ATTR = "_bench_reduce_scatter_windows"
_SHARDS_ATTR = "_bench_reduce_scatter_shards"


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
    """balanced_windows (ZeRO-1 at the boundary), balanced_buckets (ZeRO-2) or per_bucket (see the
    module docstring)."""
    window_numel: tuple[int, ...] = ()
    """W per optimizer parameter group (balanced_windows only)."""
    num_collectives: int = 0
    """Reduce-scatters issued."""
    num_straddling: int = 0
    """Buckets with pieces of more than one rank's partition (per_bucket only)."""
    real_numel: int = 0
    """Gradient elements reduced."""
    padded_numel: int = 0
    """Elements of the reduce-scatter inputs (real + padding)."""
    bucket_spans: tuple[tuple[tuple[int, int, int], ...], ...] = ()
    """balanced_buckets: the buckets of one backward (the same in every micro-step), in order, each
    its gradients as (parameter group, first element in the group's flat buffer, elements):
    plan_bucket_shards' input."""
    num_all_to_all: int = 0
    """balanced_buckets: boundary all-to-alls issued."""
    all_to_all_numel: int = 0
    """balanced_buckets: elements of this rank's all-to-all inputs (its accumulator), summed over
    the boundaries; unlike the other counts it differs from rank to rank."""
    accumulator_numel: int = 0
    """balanced_buckets: elements of this rank's bucket-sharded accumulator."""
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


def balanced_zero2_blockers(engine: Any) -> list[str]:
    """Why the balanced ZeRO-2 bucket shards cannot replace the per-bucket path on this engine
    (none: they do). Call after check_supported."""
    opt = engine.optimizer
    if engine.zero_optimization_stage() != 2 or not opt.partition_gradients:
        return [f"ZeRO-{engine.zero_optimization_stage()} does not partition gradients (the balanced bucket "
                "shards are ZeRO-2's)"]
    blockers = []
    if getattr(engine, "pipeline_parallelism", False):
        blockers.append("pipeline parallelism (not verified)")
    if not engine.managed_gradient_accumulation():
        blockers.append("managed_gradient_accumulation=false (not verified)")
    if opt.use_grad_accum_attribute:
        blockers.append("gradients accumulate in grad_accum (not verified)")
    compact = [bool(opt._use_compact_grad_partition_buffer(i)) for i in range(len(opt.bit16_groups))]
    if any(compact) and not all(compact):
        blockers.append("DeepSpeed's fp32 partition buffer in some parameter groups only (not verified)")
    if not any(compact) and opt.gradient_accumulation_dtype != opt.dtype:
        blockers.append(f"gradient accumulation dtype {opt.gradient_accumulation_dtype} differs from the "
                        f"parameter dtype {opt.dtype} without DeepSpeed's fp32 partition buffer (not verified)")
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


def _flat_layout(opt: Any) -> dict[int, tuple[int, int, int, int]]:
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
                           "boundary (benchmarks/reduce_scatter.py)")
        elif not blockers:
            groups = ", ".join(f"P={int(p)} W={w}" for p, w in zip(opt.partition_size, stats.window_numel))
            logger.warning(f"{OPTION}: ZeRO-{stage} gradients reduced at the accumulation boundary in balanced "
                        f"windows over the {world} partitions, one reduce-scatter of {world} x W elements per "
                        f"window ({groups}; (N-1)/N of the gradient bytes per rank) (benchmarks/reduce_scatter.py)")
        else:
            what = "balanced windows" if stage == 1 else "balanced bucket shards"
            logger.warning(f"{OPTION}: ZeRO-{stage} gradients reduced with one reduce-scatter per bucket, padded "
                        f"to {world} x the bucket's largest rank share; {what} not used: "
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


# --- the balanced ZeRO-2 path -----------------------------------------------------------------------

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
