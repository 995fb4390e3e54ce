"""How DeepSpeed 0.19.8 lays gradients and parameters out in messages: its bucket packing, its
ZeRO-1/2 flat partitions, the ZeRO-1 reduce-scatter's balanced windows, and ZeRO-3's prefetched
parameter gathers. Pure functions, used by the performance model (harness/model/perfmodel.py) to count
the collectives a configuration issues and what of them its computation can hide.
"""
from __future__ import annotations

from typing import Any

from benchmarks.reduce_scatter.layout import window_numel


def pack_members(elements: list[int], limit: int, crossing: bool = False) -> list[list[int]]:
    """Greedy packing of tensors (elements, in issue order) into messages, as positions in
    `elements`. crossing=False: DeepSpeed's gradient bucket (a full bucket is reduced before the
    tensor that would overflow it; a tensor larger than the bucket goes alone); crossing=True: the
    tensor that crosses the limit still joins (ZeRO-3's prefetch, the engine's ZeRO-0 all-reduce)."""
    out, cur, members = [], 0, []
    for i, e in enumerate(elements):
        if not crossing and cur and cur + e > limit:
            out.append(members)
            cur, members = 0, []
        cur += e
        members.append(i)
        if cur >= limit and (crossing or e > limit or cur == limit):
            out.append(members)
            cur, members = 0, []
    return out + ([members] if cur else [])


def pack(elements: list[int], limit: int, crossing: bool = False) -> list[int]:
    """The message sizes (elements) of pack_members."""
    return [sum(elements[i] for i in m) for m in pack_members(elements, limit, crossing)]


def zero_partition_size(group_elements: int, n: int) -> int:
    """Elements of each rank's ZeRO-1/2 partition of one optimizer parameter group, as DeepSpeed
    0.19.8 cuts it (runtime/zero/stage_1_and_2.py, DeepSpeedZeroOptimizer.__init__): the group's
    parameters are flattened in order and padded at the end to a multiple of
    nccl_start_alignment_factor (2) x N (flatten_dense_tensors_aligned; parameter_alignment,
    false by default, would pad between parameters and is not modelled), then
    get_data_parallel_partitions cuts that into N equal contiguous partitions:
    ceil(elements / 2N) x 2N / N. Rank r owns [r x size, (r + 1) x size) of the flat group."""
    align = 2 * n
    return -(-group_elements // align) * align // n


def balanced_window_elements(group_elements: int, n: int, bucket: int) -> list[int]:
    """Per-rank chunk elements w of each window of one optimizer parameter group under ZeRO-1 with
    zero.gradient_collective=reduce_scatter (benchmarks/reduce_scatter/install.py, balanced windows): the
    partition P = zero_partition_size is reduced W = window_numel(P, reduce_bucket_size, N) elements
    at a time (min(P, reduce_bucket_size // N), rounded down to 2), each window ONE reduce-scatter
    of N x w elements (w = W, the last min(W, P - o)): ceil(P / W) messages per group, N x P
    elements in all (the group padded to 2N only), each rank sending (N-1)/N of it."""
    size = zero_partition_size(group_elements, n)
    w = window_numel(size, bucket, n)
    return [min(w, size - o) for o in range(0, size, w)] if w else []


def gather_messages(named: list[tuple[str, int]], prefetch: int, elem_bytes: int) -> dict[str, Any]:
    """ZeRO-3's parameter gathers of one pass (parameters (name, elements) in fetch order): each
    message a prefetch bucket (the parameter that crosses the limit still joins), its bytes and
    its compute share (Traffic.compute_share)."""
    members = pack_members([e for _, e in named], prefetch or 1, crossing=True)
    work = [sum(named[i][1] for i in m if "embed_tokens" not in named[i][0]) for m in members]
    return {"sizes": tuple(elem_bytes * sum(named[i][1] for i in m) for m in members),
            "compute_share": tuple(x / (sum(work) or 1) for x in work)}


def prefetch_exposed(times: list[float], shares: tuple[float, ...], phase_s: float) -> float:
    """Exposed time of one pass's parameter gathers when each is issued as the module before it
    starts (PartitionedParameterCoordinator.fetch_sub_module: wait for the current module's
    parameters, then prefetch up to prefetch_bucket_size elements ahead, one message here): the
    first whole, then of each the part longer than the compute of the message before it."""
    return times[0] + sum(max(0.0, t - phase_s * c) for t, c in zip(times[1:], shares[:-1]))
