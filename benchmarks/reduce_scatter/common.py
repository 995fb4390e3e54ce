"""What the reduce-scatter gradient reduction (benchmarks/reduce_scatter/install.py, which installs it) shares
between its three paths: the option and the DeepSpeed versions it is verified with, what it refuses
(`check_supported`) and where the balanced paths apply (`balanced_zero1_blockers`,
`balanced_zero2_blockers`), the counts it keeps (`ReduceScatterStats`), each parameter's place in
DeepSpeed's flat groups (`_flat_layout`), the averaging of the DeepSpeed path being replaced
(`_scaling`) and the collective itself (`_issue_reduce_scatter`).

Every path counts real and padded elements in the `ReduceScatterStats` that `install` returns.
The collective: `reduce_scatter_fn` (reduce_scatter_tensor; ncclReduceScatter on NCCL), on gloo the
list form `reduce_scatter`. Gloo has no reduce-scatter algorithm (ProcessGroupGloo: the tensor form
clones the input and all-reduces it, the list form all-reduces chunk by chunk); the list form is
the cheaper (torch 2.13, 20 MB, 2 ranks: ~1.0-1.5x the all-reduce's time, the tensor form ~1.8x).
On gloo the traffic is the all-reduce's: the saving is NCCL's only.

Verified only with DeepSpeed 0.19.8 (VERIFIED_DEEPSPEED); any other version is refused.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

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
                      "DeepSpeedZeroOptimizer (benchmarks/reduce_scatter/install.py), check them against "
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
    module docstring of benchmarks/reduce_scatter/install.py)."""
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


def _issue_reduce_scatter(output, packed, group, world: int) -> None:
    """ONE reduce-scatter (sum) of `packed` (world equal chunks) over `group` into `output`."""
    import torch
    from deepspeed import comm as dist

    if torch.distributed.get_backend(group) == "gloo":
        # gloo has no reduce-scatter of its own; its list form costs less than its tensor form
        dist.reduce_scatter(output, list(packed.chunk(world)), group=group)
    else:
        dist.reduce_scatter_fn(output, packed, group=group)


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
