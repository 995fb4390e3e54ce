"""What one optimizer step communicates, collective by collective, per ZeRO stage and DeepSpeed knob
(comm_traffic), and how long a collective takes on the calibrated bus bandwidth (collective_time):
nccl-tests PERFORMANCE.md factors, time = size x factor(op, N) / busbw(size). The step-time model
(perfmodel.py) schedules them against the computation. Pure."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.reduce_scatter.layout import accumulator_elements, balanced_bucket_elements

from ..collectives import busbw_factor
from ..config.choices import Device
from ..config.schema import BenchConfig
from ..config.teacher import teacher_workload
from ..errors import ConfigError
from .calibration_types import Calibration
from .comm_layout import balanced_window_elements, gather_messages, pack, pack_members
from .memory import (DS_ALLREDUCE_BUCKET, DS_MAX_REUSE, DS_PERSISTENCE, DS_PREFETCH_BUCKET, DS_REDUCE_BUCKET,
                     bf16_optimizer, dtype_bytes, gradient_collective, overlap_comm, param_tensors, zero_knob)
from .params import PARAMS, ModelParams
from .topology import NCCL_SOURCE, Topology, nccl_choice

# ---- communication ---------------------------------------------------------------------------

@dataclass(frozen=True)
class CommEstimate:
    """Messages of one size of one collective in one phase, per optimizer step."""
    op: str
    phase: str
    """teacher | forward | backward | step (the instrument's phases)."""
    bytes: int
    """Message size, nccl-tests' size: the full buffer (an all-gather's output, a reduce-scatter's input)."""
    count: int
    """Messages of this size per optimizer step."""
    time_s: float
    """Time of one message: bytes x factor(op, N) / busbw."""
    busbw_gbps: float
    source: str
    what: str = ""
    microsteps: int = 1
    """Micro-steps of the optimizer step in which these messages are issued."""
    overlappable: bool = False
    """Issued on a side stream while the phase computes (see predict's overlap rule)."""

    @property
    def total_time_s(self) -> float:
        return self.count * self.time_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_time_s": self.total_time_s}


@dataclass(frozen=True)
class Traffic:
    """An ordered sequence of messages (bytes) issued in each of `microsteps` micro-steps."""
    op: str
    phase: str
    what: str
    sizes: tuple[int, ...]
    microsteps: int
    overlappable: bool
    unhidden: str = ""
    """Which message can never overlap: 'first' (nothing to prefetch behind) or 'last' (the last
    bucket is produced when backward ends)."""
    async_op: bool = False
    """Issued with async_op=True and waited for later: on gloo one of the process group's worker
    threads (ProcessGroupGloo Options.threads, 2) carries it while the rank's own thread computes,
    so an overlappable one hides on CPU too (ZeRO-3's prefetched parameter gathers)."""
    compute_share: tuple[float, ...] = ()
    """Per message, the share of its phase's compute spent in the modules whose parameters it
    carries (FLOP-proportional: their elements; the input embedding, a lookup, none): what the
    next message, prefetched one bucket ahead, can hide behind (prefetch_exposed)."""


def comm_traffic(cfg: BenchConfig) -> list[Traffic]:
    """The collectives DeepSpeed 0.19.8 issues per optimizer step (DEEPSPEED_NOTES.md):
    ZeRO-0: the engine all-reduces all gradients at the boundary (5e8-element buckets).
    ZeRO-1: the gradient buckets (reduce_bucket_size) are all-reduced once, at the boundary;
    ZeRO-2: on every micro-step. With zero.gradient_collective=reduce_scatter
    (benchmarks/reduce_scatter/install.py): ZeRO-1 reduce-scatters balanced windows of every rank's
    partition at the boundary, after backward (balanced_window_elements: N x W elements per
    message, ceil(P / W) per parameter group, not overlapped with backward); ZeRO-2 reduce-scatters
    each bucket in N equal shards every micro-step (balanced_bucket_elements) and moves the shards
    to DeepSpeed's partitions with one all-to-all at the boundary (accumulator_elements). After the
    step, ZeRO-1/2 all-gather the updated parameters: one all_gather_into_tensor per optimizer
    parameter group (utils.all_gather_into_tensor_dp_groups; allgather_bucket_size is not used
    when torch has it). A gradient-norm all-reduce of 4 bytes
    twice. ZeRO-3, every micro-step: parameter all-gathers in forward (prefetch_bucket_size
    messages; parameters under the persistence threshold stay whole) and again in backward (not
    the input embedding, whose backward needs no weight, nor the last module, still gathered, nor
    modules reused within max_reuse_distance), gradient reduce-scatter per bucket, and under
    distillation the teacher's forward gathers; one 8-byte norm all-reduce at the step."""
    w, s, ga = cfg.workload, cfg.zero.stage, cfg.workload.grad_acc_steps
    if cfg.platform.world_size == 1:
        return []
    tensors = param_tensors(w)
    g = dtype_bytes(w.precision)
    bucket = zero_knob(cfg, "reduce_bucket_size", DS_REDUCE_BUCKET)
    forward_order = [t[1] for t in tensors]
    backward_order = forward_order[::-1]
    if s == 0:
        return [Traffic("all_reduce", "backward", "gradient all-reduce (engine, at the boundary)",
                        tuple(g * m for m in pack(forward_order, DS_ALLREDUCE_BUCKET, crossing=True)), 1, False)]
    # the suite's torch AdamW has two parameter groups (weight decay on matrices only); DeepSpeed's one
    index_groups = ([[i for i, t in enumerate(tensors) if t[2] >= 2], [i for i, t in enumerate(tensors) if t[2] < 2]]
                    if w.optimizer.value == "torch" else [list(range(len(tensors)))])
    groups = [[tensors[i][1] for i in grp] for grp in index_groups]
    if bf16_optimizer(cfg):
        # DeepSpeed's BF16_Optimizer (ZeRO-1 with fp32 accumulation): the engine's bucketed all-reduce
        # of the full fp32 gradient buffer at the boundary, then the updated parameters gathered
        return [Traffic("all_reduce", "backward", "fp32 gradient all-reduce (BF16_Optimizer, at the boundary)",
                        tuple(4 * m for m in pack(forward_order, DS_ALLREDUCE_BUCKET, crossing=True)), 1, False),
                Traffic("all_gather", "step", "updated parameters, one per optimizer parameter group",
                        tuple(g * sum(grp) for grp in groups if grp), 1, False),
                Traffic("all_reduce", "step", "gradient norm", (8,), 1, False)]
    if s in (1, 2):
        n = cfg.platform.world_size
        hooks = s == 2 or overlap_comm(cfg)       # reduced from backward hooks, else after backward
        order = list(range(len(tensors)))[::-1] if hooks else [i for grp in index_groups for i in grp]
        buckets = [[order[k] for k in m] for m in pack_members([tensors[i][1] for i in order], bucket)]
        real = tuple(g * sum(tensors[i][1] for i in b) for b in buckets)
        when = " (every micro-step)" if s == 2 else " (at the boundary)"
        if gradient_collective(cfg) == "reduce_scatter" and s == 1:
            # benchmarks/reduce_scatter/install.py, balanced windows: per parameter group, window by window,
            # ONE reduce-scatter of [chunk_0 | ... | chunk_N-1], chunk r = W elements of rank r's
            # partition: message N x W elements, (N-1)/N of it sent per rank; issued after backward
            # on the compute stream (it needs every gradient), so never overlapped
            sizes = tuple(g * n * m for grp in groups for m in balanced_window_elements(sum(grp), n, bucket))
            grads = Traffic("reduce_scatter", "backward", "gradient reduce-scatter in balanced windows of every rank's "
                            f"partition, N x W elements each, padded to DeepSpeed's alignment only "
                            f"({sum(sizes) / sum(real):.2f}x the real bytes) (at the boundary, after backward)",
                            sizes, 1, False, "last")
        elif gradient_collective(cfg) == "reduce_scatter":
            # benchmarks/reduce_scatter/install.py, balanced buckets: each bucket, as backward fills it, ONE
            # reduce-scatter of the bucket itself in N equal shards (padded to N x 2 elements), every
            # micro-step; each rank accumulates its shards; at the boundary ONE all-to-all sends every
            # element to the rank whose DeepSpeed partition holds it (input: the rank's accumulator,
            # about Psi/N elements; (N-1)/N of it leaves the rank when buckets spread over partitions)
            numels = [sum(tensors[i][1] for i in b) for b in buckets]
            sizes = tuple(g * balanced_bucket_elements(m, n) for m in numels)
            return [Traffic("reduce_scatter", "backward", "gradient reduce-scatter per bucket in N equal shards "
                            f"(balanced: {sum(sizes) / sum(real):.2f}x the real bytes)" + when,
                            sizes, ga, overlap_comm(cfg), "last"),
                    Traffic("all_to_all", "backward", "bucket shards to DeepSpeed's partitions (at the boundary)",
                            (g * accumulator_elements(numels, n),), 1, False),
                    Traffic("all_gather", "step", "updated parameters, one per optimizer parameter group",
                            tuple(g * sum(grp) for grp in groups if grp), 1, False),
                    Traffic("all_reduce", "step", "gradient norm and overflow check", (4, 4), 1, False)]
        else:
            grads = Traffic("all_reduce", "backward", "gradient all-reduce per bucket" + when,
                            real, ga if s == 2 else 1, overlap_comm(cfg), "last")
        return [grads,
                Traffic("all_gather", "step", "updated parameters, one per optimizer parameter group",
                        tuple(g * sum(grp) for grp in groups if grp), 1, False),
                Traffic("all_reduce", "step", "gradient norm and overflow check", (4, 4), 1, False)]
    persist_t = zero_knob(cfg, "stage3_param_persistence_threshold", DS_PERSISTENCE)
    prefetch = zero_knob(cfg, "stage3_prefetch_bucket_size", DS_PREFETCH_BUCKET)
    reuse = zero_knob(cfg, "stage3_max_reuse_distance", DS_MAX_REUSE)
    gathered = [(name, e) for name, e, _ in tensors if e >= persist_t]
    kept, after = set(), 0
    for i in range(len(gathered) - 1, -1, -1):         # reused soon after its forward use: not released
        if i == len(gathered) - 1 or 2 * after < reuse:
            kept.add(i)
        after += gathered[i][1]
    bwd = [(name, e) for i, (name, e) in enumerate(gathered) if i not in kept and "embed_tokens" not in name][::-1]
    prefetched, how = True, "parameter gathers (prefetched)"
    if w.activation_checkpointing:
        # backward recomputes every checkpointed layer's forward, which gathers it again (the others are
        # gathered for their backward as without checkpointing, so every layer once); the recompute's
        # module order differs from the recorded trace, so DeepSpeed invalidates the trace ("Invalidate
        # trace cache") and fetches on demand: nothing prefetched behind computation
        bwd = [(name, e) for name, e in gathered if "embed_tokens" not in name][::-1]
        prefetched, how = False, "parameter gathers (on demand: checkpointing's recompute invalidates the prefetch trace)"
    # parameter gathers: partition_parameters._dist_allgather_fn, async_op=True (waited for when the
    # module needs them); gradient reduce-scatter: coalesced_collectives._torch_reduce_scatter_fn,
    # async_op=False (a blocking call on gloo; overlap_comm's side stream exists only on GPU)
    out = [Traffic("all_gather", "forward", how, microsteps=ga, overlappable=prefetched, unhidden="first",
                   async_op=True, **gather_messages(gathered, prefetch, g)),
           Traffic("all_gather", "backward", how, microsteps=ga, overlappable=prefetched, unhidden="first",
                   async_op=True, **gather_messages(bwd, prefetch, g)),
           Traffic("reduce_scatter", "backward", "gradient reduce-scatter per bucket",
                   tuple(g * m for m in pack(backward_order, bucket)), ga, overlap_comm(cfg), "last"),
           Traffic("all_reduce", "step", "gradient norm", (8,), 1, False)]
    if w.distill is not None:
        t = teacher_workload(w)
        tg = [(name, e) for name, e, _ in param_tensors(t) if e >= persist_t]
        out.insert(0, Traffic("all_gather", "teacher", "teacher parameter gathers (ZeRO-3 teacher)", microsteps=ga,
                              overlappable=True, unhidden="first", async_op=True,
                              **gather_messages(tg, prefetch, dtype_bytes(t.precision))))
    return [tr for tr in out if tr.sizes]


def platform_topology(cfg: BenchConfig, params: ModelParams = PARAMS) -> tuple[Topology, str]:
    """The declared topology NCCL's model runs on, and how its bus bandwidth was found: on one node
    the intra-node link; across nodes the slower of the intra-node link and the node's NICs together
    (a ring or tree crosses each node's NICs once per direction; nccl-tests' busbw is per rank) times
    the fabric's efficiency (harness/model/params.py)."""
    p = cfg.platform
    inter = p.nodes > 1
    busbw = p.inter_node_bw_gbps if inter else p.intra_node_bw_gbps
    name = "inter_node_bw_gbps" if inter else "intra_node_bw_gbps"
    if busbw <= 0:
        raise ConfigError(f"platform.{name}={busbw} is invalid for the performance model: declare the "
                          f"bandwidth or give --records with a measured sweep of the collectives")
    how = f"declared platform.{name} {busbw:g} GB/s per direction"
    if inter and p.device == Device.cuda:
        paper = p.fabric.value == "roce" and p.name in params.paper_roce_platforms
        eta = params.paper_roce_efficiency if paper else params.fabric_efficiency.get(p.fabric.value, 1.0)
        busbw = min(p.intra_node_bw_gbps or busbw, busbw * eta)
        how += (f" x {'the paper' + chr(39) + 's RoCE clusters, UNEXPLAINED,' if paper else p.fabric.value} efficiency "
                f"{eta:g} (capped by intra_node_bw_gbps {p.intra_node_bw_gbps:g})")
    arch = "ampere" if "A100" in p.gpu_model else "hopper"
    return Topology(p.nodes, p.gpus_per_node, busbw, rails=p.rails, arch=arch), how


def collective_time(op: str, size_bytes: int, cfg: BenchConfig, calib: Calibration,
                    params: ModelParams = PARAMS) -> tuple[float, float, str]:
    """(seconds, busbw GB/s, source) of one message. From the measured curve of the op when there is
    one: size x factor(op, N) / busbw(size) (the curve holds the latency). Otherwise from the declared
    topology (platform_topology): on GPUs, the algorithm and protocol NCCL's own tuning model picks
    and its time (harness/model/topology.py: ring or tree, latency growing with ranks and nodes);
    on CPUs (gloo) a ring at the declared bandwidth, no latency. params.nccl_model off: bytes x
    factor / busbw alone."""
    n = cfg.platform.world_size
    curve = calib.busbw.get(op)
    if curve is not None:
        busbw, source = curve.busbw_gbps(size_bytes), curve.source
        return size_bytes * busbw_factor(op, n) / (busbw * 1e9), busbw, source
    topo, how = platform_topology(cfg, params)
    if cfg.platform.device != Device.cuda or not params.nccl_model:
        return size_bytes * busbw_factor(op, n) / (topo.busbw_gbps * 1e9), topo.busbw_gbps, how + f" (no measured {op} curve)"
    c = nccl_choice(op, size_bytes, topo)
    busbw = size_bytes * busbw_factor(op, n) / (c.time_s * 1e9) if size_bytes else 0.0
    return c.time_s, busbw, (f"{how}; per message the algorithm and protocol {NCCL_SOURCE} picks on "
                             f"{topo.nodes} x {topo.gpus_per_node} (no measured {op} curve)")


def nccl_algorithm(op: str, size_bytes: int, cfg: BenchConfig, calib: Calibration,
                   params: ModelParams = PARAMS) -> str:
    """The algorithm/protocol collective_time took for a message ('ring/Simple'); '' where a measured
    curve or a cpu platform's ring gave the time."""
    if op in calib.busbw or cfg.platform.device != Device.cuda or not params.nccl_model:
        return ""
    return nccl_choice(op, size_bytes, platform_topology(cfg, params)[0]).name


BUSBW_OPS = ("all_reduce", "all_gather", "reduce_scatter")
BUSBW_SIZES = tuple(8 * 4 ** k for k in range(15))
"""8 B to 2 GiB by 4x: nccl-tests' -b 8 -e 2G -f 4."""


def busbw_table(cfg: BenchConfig, calib: Calibration, params: ModelParams = PARAMS,
                sizes: tuple[int, ...] = BUSBW_SIZES) -> list[dict[str, Any]]:
    """The bus-bandwidth curve the model uses on cfg's platform, nccl-tests style: per op and size the
    time, algbw, busbw and where it came from (a measured curve, carried or not, or NCCL's tuning
    model on the declared topology with the algorithm it picks): what to hold against a measured
    nccl-tests run of the same fabric (`python -m harness model --busbw`)."""
    n, out = cfg.platform.world_size, []
    for op in BUSBW_OPS:
        for size in sizes:
            t, busbw, src = collective_time(op, size, cfg, calib, params)
            out.append({"op": op, "size_bytes": size, "time_us": t * 1e6, "algbw_gbps": size / t / 1e9 if t else 0.0,
                        "busbw_gbps": size * busbw_factor(op, n) / t / 1e9 if t else 0.0,
                        "algorithm": nccl_algorithm(op, size, cfg, calib, params), "source": src})
    return out
