"""The performance model's global parameters: the few numbers it cannot derive from a
configuration, each with its value and where it comes from. FITTED ones were fitted once to the
published SC'25 PMBS tables by reference_results/sources/sc25-pmbs/fit_model.py (rerun it to
refit; `python -m harness model --validate` reports how well they do with every published cell
held out of the efficiency calibration). DECLARED ones come from a cited figure, not a fit.

MEASURED ones were read off this suite's own records on real hardware (the records named).
They apply to GPU platforms (device cuda). On the cpu platform the collectives are gloo's,
synchronous and measured (busbw curves), and the host is the device: ZeRO-3's bookkeeping is part
of the measured per-stage efficiency, so none of them is used there.
Pure data, no I/O.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .memory import COMPILE_ACTIVATION_FRACTION, FRAGMENTATION_FRACTION

HBM_FRACTION = 0.894
"""Of a datasheet's HBM bandwidth, what the probe's triad reached on a one-GPU H200 node (4,292 of 4,800 GB/s)."""


@dataclass(frozen=True)
class Param:
    name: str
    value: float
    unit: str
    kind: str
    """fitted | declared | measured | assumed | to measure (the value the model uses meanwhile)"""
    source: str


@dataclass(frozen=True)
class ModelParams:
    fabric_efficiency: dict[str, float] = field(default_factory=lambda: {"ib": 1.0, "roce": 1.0, "tcp": 0.15})
    """Achieved fraction of the declared per-direction inter-node bandwidth (platform.inter_node_bw_gbps)
    for the large collectives of training, per fabric. InfiniBand: its line rate, 1.0 (FITTED on the
    published Model 1 and Model 2 tables, the grid's bound: the ib-a100 cells need no more than
    200 GB/s per node). RoCE: DECLARED the same, 1.0: Meta ran both a RoCE and an InfiniBand
    24k-H100 cluster at 400 Gb/s per GPU for Llama 3 "without any network bottlenecks" (Building
    Meta's GenAI Infrastructure, engineering.fb.com, 2024-03-12). The paper's own RoCE clusters reach
    far less: paper_roce_efficiency, named unexplained. tcp (no RDMA): ASSUMED, the paper's RoCE figure."""
    paper_roce_efficiency: float = 0.15
    """What the paper's RoCE clusters (paper_roce_platforms) reach of their 200 GB/s per node: the
    roce-a100 cells run 3-25 % slower than ib-a100's on the same GPUs and NVLink, most where ZeRO-3
    gathers every layer on demand. FITTED on the published Model 1 and Model 2 tables (every point of
    a grid, each scored by leave-one-out): 30 GB/s per node. UNEXPLAINED: a property of those two
    clusters (their fabric's configuration is not published), not of RoCE; applied to no other platform."""
    paper_roce_platforms: tuple[str, ...] = ("roce-a100", "roce-h100")
    host_s_per_module: dict[str, float] = field(default_factory=lambda: {"replicated": 0.315e-3, "sharded": 1.56e-3})
    """Host seconds per module with parameters per micro-step (its forward and backward), by how
    the stage holds parameters: replicated (ZeRO 0-2: the eager forward and backward, DeepSpeed's
    gradient hooks) or sharded (ZeRO-3: besides, each module's gather, release and partition
    bookkeeping around it). A micro-step takes at least host_base_s + this x modules, however fast
    the GPU: the host issues its work. MEASURED on a one-GPU H200 node (16-core Xeon VM, torch 2.11,
    DeepSpeed 0.19.8, transformers 5.17): llama-440m's shape with 6, 12 and 24 layers (57, 111, 219
    modules) at mb 8 x ga 4, where the GPU's share of a micro-step is a few ms; the least-squares
    line through the three, residuals under 1.3 ms (replicated) and 19 ms (sharded)
    (reference_results/sources/gpu-runs/2026-11-26-h200, suites gpu-zero3-host, gpu-zero3-layers).
    Sharded minus replicated, 1.25 ms a module, is ZeRO-3's own host cost: 0.62 ms per fetch (a
    forward and a backward one), as tests/perf/zero3_fetch_cost.py reads on the cpu platform
    (0.33-0.69 ms). A host of another speed or software stack has other figures."""
    host_base_s: dict[str, float] = field(default_factory=lambda: {"replicated": 10.4e-3, "sharded": 1.9e-3})
    """The same line's intercept: host seconds per micro-step that do not grow with the modules. MEASURED
    with host_s_per_module."""
    compiled_host_floor: dict[str, tuple[float, float]] = field(default_factory=lambda: {
        "torch/replicated": (3.09e-3, 0.091e-3), "deepcompile/sharded": (3.09e-3, 0.296e-3)})
    """(host_base_s, host_s_per_module) of a compiled micro-step, by workload.compile and how the stage
    holds parameters: the host issues a few graphs instead of each module's kernels and hooks. MEASURED
    on the one-GPU H200 node (reference_results/sources/gpu-runs/2026-12-04-h200/gpu-compile-host, llama-440m's
    shape at mb 8 x ga 4, tests/perf/host_floor.py): torch.compile under ZeRO-1 at 6 and 12 layers
    (57, 111 modules: 8.3 and 13.2 ms a micro-step, against eager's 28.4 and 45.4 ms); DeepCompile under
    ZeRO-3 at 12 layers alone (111 modules: 36.0 ms, after its passes at step 5, against eager ZeRO-3's
    175 ms): its base is taken as torch.compile's, the rest per module. torch.compile under ZeRO-3 keeps
    DeepSpeed's hooks eager (a graph break at each module): the eager sharded floor; DeepCompile under
    ZeRO 1/2 takes torch.compile's replicated floor (neither measured)."""
    optimizer_step_s: dict[str, float] = field(default_factory=lambda: {
        "base_s": 4.17e-3, "s_per_module": 0.199e-3, "s_per_parameter": 4.63e-11})
    """The optimizer step on a GPU, once a step, exposed after backward: base + per module with parameters +
    per parameter the rank steps on its GPU (its partition, N / ranks, under ZeRO 1-3; less what an optimizer
    offload steps on the host, which offload_time counts). MEASURED as what each
    step took beyond its micro-steps' model (the host floor's fit leaves each step's last micro-step out), on
    the one-GPU H200 node: llama-440m's shape under ZeRO-1 at mb 8, eager at 6, 12 and 24 layers (22.7, 37.1,
    76.5 ms; 2026-11-26-h200) and compiled at 6 and 12 (23.4, 38.4 ms; 2026-12-04-h200); and on the H100
    (2026-11-27-h100-stack): the last micro-step of compiled llama-440m (24 layers) and of the 8B-shaped
    stack (4 layers, 1.13e9 parameters) over their others' median, 60 and 64.5 ms. The least-squares plane
    through the seven: residuals under 1 ms on the H200, +-8 ms between the two GPUs' 24-layer runs. The H200's
    five alone give 0.244 ms a module and 4.98e-11 s a parameter: the same split. DeepSpeed's step and the
    copies back into each parameter, tensor by tensor and not compiled; how much of it is the host's and how
    much the GPU's is not measured. ZeRO-3's own took more (its eager residuals over this plane's predecessors,
    58-507 ms, scatter too widely for a fit of their own): the plane is a floor there, and keeps a sweep from
    preferring ZeRO-3 for the optimizer step it would otherwise not be charged."""
    zero3_unexplained_s: float = 0.09
    """Seconds per ZeRO-3 collective call (each parameter gather and gradient reduce-scatter of the
    micro-steps) on the paper's clusters alone (zero3_unexplained_platforms): what made the paper's
    Model 2 ZeRO-3 cells 2-3x slower than ZeRO-1 at the same micro-batch (27.9 s per micro-step at
    mb 64 on ib-a100) and no mechanism of this model explains: the bytes take about 0.3 s, the
    measured host cost (host_s_per_module) under 1 s, memory was not short (24-54 GiB of 70.5).
    UNEXPLAINED, named as such: FITTED on those cells, applied to no other platform (the published
    runs of other sources and a measured H200 need none: `model --validate`)."""
    zero3_unexplained_platforms: tuple[str, ...] = ("ib-a100", "roce-a100", "roce-h100")
    """The platforms (conf/platform/) that describe the paper's clusters."""
    gemm_efficiency: float = 0.74
    """Fraction of the declared bf16 peak the model's matrix products (and attention) reach when
    nothing was measured on the platform. MEASURED on the one-GPU H200 node: llama-440m's GEMM shapes at 16384
    tokens (q/k/v/o, gate/up, down, lm_head; forward, dgrad, wgrad) ran at 650-782 TFLOP/s, median
    736 of 989 (reference_results/sources/gpu-runs/2026-11-26-h200/compute_breakdown_mb128.json)."""
    activation_passes: float = 17.9
    """Memory-bound device traffic of a micro-step (elementwise, norms, casts, RoPE's concatenations,
    softmax and loss) in multiples of the activation bytes its layers keep for backward
    (memory.layer_bytes_per_token x layers x tokens). MEASURED on the one-GPU H200 node: 92.5 ms of such
    kernels per llama-440m micro-step at mb 128 x seq 128, at the probe's 4.29 TB/s triad, over
    22.17 GB kept (compute_breakdown_mb128.json; 24-29 at mb 8, where kernels are small)."""
    on_die_traffic: dict[str, tuple[float, float]] = field(default_factory=lambda: {
        k: (0.54, 4800.0 * HBM_FRACTION) for k in ("H100-SXM5-80GB", "H200-SXM-141GB")})
    """Per GPU model, (share, GB/s): the share of the memory-bound kernels' time that does not follow the
    HBM bandwidth but the die (its SMs, clocks and 50 MB L2), and the rate at which that share moves
    activation_passes' bytes. Elsewhere all of it follows the HBM (share 0: measured on no other die).
    MEASURED on GH100, the die of both the H100 and the H200 (132 SMs at 1,980 MHz; only their HBM
    differs: the model's 2,995 and 4,291 GB/s, 1.43x; the probes' triads 3,030 and 4,292): the same
    micro-step's memory-bound kernels took 111.0 ms on the H100 and 92.5 on the H200 (llama-440m,
    mb 128 x seq 128), 1.20x, not 1.43x. A share of 0.46 following the HBM gives it (1 + 0.46 x 0.43);
    the rest moves at the H200's rate, where activation_passes was measured, so the H200 is as before.
    Checked on a second shape (hidden 2048, seq 1024, mb 8, 8 layers): 38.67 against 32.39 ms, 1.19x,
    predicted 1.20x. At mb 8 x seq 128, where the kernels are small, 10.03 against 9.21 ms: 1.09x
    (reference_results/sources/gpu-runs/2026-11-26-h200 and 2026-11-27-h100, compute_breakdown_*.json)."""
    distill_loss_bytes: float = 356.0
    """A distilled run's loss (benchmarks/training/distill.py: CE and KL over temperature-scaled
    log-softmaxes, in float32, chunked and recomputed in backward), beyond the student's own CE:
    memory-bound traffic in bytes per logit element (micro-batch x sequence x vocabulary) a micro-step,
    moved as activation_passes' bytes. MEASURED on the one-GPU H200 node, llama-440m mb 128 x seq 128
    with and without its teacher, the same day (reference_results/sources/gpu-runs/2026-12-04-h200/
    gpu-check-kd, the profiled micro-steps' phase medians): forward 54.07 -> 65.96 ms and backward
    99.62 -> 131.25 ms, 43.5 ms over 524M logit elements at 4,291 GB/s. A count of the loss's passes
    gives about 190 B (the casts, three log-softmaxes, the KL and their backward with the recompute):
    as activation_passes, the figure holds the kernels' distance from the triad. Not scaled by the
    training stack: the loss runs outside the compiled module, and Liger's fused loss needs labels."""
    compile_memory_traffic: float = 0.260
    """With workload.compile (torch; deepcompile takes it too), the memory-bound traffic of a micro-step
    as a fraction of the eager stack's (activation_passes x this): Inductor fuses the elementwise
    chains, norms, RoPE and the loss into few kernels. MEASURED on H100 80GB HBM3 nodes (torch 2.11,
    tests/gpu/compute_breakdown.py, llama-440m's shape at mb 128 x seq 128, device time of every
    kernel but the matrix products and attention): eager 111.0 ms of 169.6
    (reference_results/sources/gpu-runs/2026-11-27-h100/compute_breakdown_mb128.json, the issue's 95.6 ms of
    'elementwise' plus softmax/loss, norms and copies), compiled 28.9 ms of 93.7
    (reference_results/sources/gpu-runs/2026-11-27-h100-stack/compute_breakdown_compiled_mb128.json:
    elementwise 11.3 + reduce/norm 7.8 + other 2.6, and 7.2 ms of Inductor pointwise kernels,
    triton_poi_..._bmm_cat_cos_..., RoPE's cos/sin fused with its tiny inv_freq bmm, that the script's
    classifier files under 'gemm' because their names contain 'bmm'): 28.9 / 111.0 = 0.260 (the
    elementwise class alone, 11.3 + 7.8 of 95.6, would say 0.20). The two ran on two H100s of the same
    triad (3,030 GB/s), so memory-bound times compare; their GEMMs do not (the stack's node was power
    capped: 713 against 774 TFLOP/s in the probe), so compile carries no GEMM term. Cross-check from
    the harness's step times on one node (711 -> 1265 samples/s): 0.29."""
    liger_memory_traffic: float = 0.468
    """With workload.kernels=liger (eager), the same fraction: Liger's fused RMSNorm, RoPE, SwiGLU and
    the fused linear cross-entropy (no logits) replace transformers' chains of kernels. DERIVED from
    one record pair on one H100 (reference_results/sources/gpu-runs/2026-11-27-h100-stack/gpu-stack,
    llama-440m ZeRO-1 mb 128 x ga 8): the step fell from 1.440 s (eager) to 0.968 s (Liger), 59.0 ms a
    micro-step, taken off the eager micro-step's 111.0 ms of memory-bound kernels (the matrix products
    assumed unchanged): 1 - 59.0 / 111.0 = 0.468. From the profiled micro-steps alone (their medians,
    173.2 and 103.6 ms) it would be 0.37: the Liger run's last micro-step (the optimizer's) took 49 ms
    more than eager's, and its steps spread +-6 %. TO MEASURE: a kernel breakdown of the Liger
    micro-step (tests/gpu/compute_breakdown.py has no Liger switch)."""
    fp8_gemm_efficiency: float = 0.74
    """Under precision=fp8, the fraction of the declared FP8 peak (platform.peak_tflops.fp8) the FP8
    linear layers' matrix products reach. ASSUMED: gemm_efficiency, the bf16 figure measured on the
    H200 (the probe measures no FP8 matmul). TO MEASURE: an FP8 GEMM probe."""
    fp8_cast_bytes: float = 9.5
    """Under precision=fp8 (torchao float8 training, tensorwise), bytes of HBM traffic per element of
    every FP8 linear layer's input, output and weight per micro-step: the amax reductions and casts
    to e4m3/e5m2 of inputs, weights and output gradients, and their transposed copies for the weight
    gradients. FITTED on two record pairs on one H100, compiled, FP8 against bf16 (reference_results/
    sources/gpu-runs/2026-11-27-h100-stack): llama-440m mb 128 x ga 8, 0.8095 -> 0.8504 s a step
    (+5.1 ms a micro-step: its linears are too narrow, hidden 1024, for FP8 to pay), and an 8B-shaped
    stack (4 layers, seq 2048, mb 4 x ga 2), 0.2323 -> 0.1955 s (-18.4 ms); what is left of each
    difference once the linears' FLOPs run at fp8_gemm_efficiency of the FP8 peak instead of
    gemm_efficiency of the bf16 one is 9.87 and 9.17 bytes per element (9.18e9 and 3.56e9 elements a
    micro-step): 9.5. A count of the casts (amax read 2 B, cast read 2 B and write 1 B, a transposed
    copy 3 B) gives 8. Measured with compile only: without it (torchao's casts unfused) TO MEASURE."""
    hbm_fraction: float = HBM_FRACTION
    """Of a datasheet's HBM bandwidth, the share a triad reaches: 4,292 of 4,800 GB/s, MEASURED by the
    probe on the one-GPU H200 node. Applied to hbm_gbps below and to a platform's declared platform.hbm_gbps."""
    hbm_gbps: dict[str, float] = field(default_factory=lambda: {
        k: v * HBM_FRACTION for k, v in (("A100-SXM4-40GB", 1555.0), ("A100-SXM4-80GB", 2039.0),
                                         ("H100-SXM5-80GB", 3350.0), ("H200-SXM-141GB", 4800.0))})
    """Achievable HBM bandwidth per GPU model, GB/s: NVIDIA's datasheet figure (A100 40GB SXM 1,555;
    A100 80GB SXM 2,039; H100 SXM 3,350; H200 4,800) x 0.894 (hbm_fraction), the fraction of it the
    probe's triad reached on the H200 (4,292 of 4,800). DECLARED (the datasheets) x MEASURED (the
    fraction, one GPU)."""
    offload_adam_elements_per_s: float = 0.237e9
    """DeepSpeedCPUAdam's rate per host thread, elements a second (harness/model/offload_time.py). MEASURED
    on a one-GPU H200 node's host (16-core AVX-512/AMX Xeon VM, tests/gpu/offload_rates.py, 1e8 elements,
    reference_results/sources/gpu-runs/2026-12-04-h200/offload-rates.json): 0.740e9 at 1 thread, 3.80e9 at
    16, so 0.237e9 a thread when the 16 share the memory (a rank runs the node's cores). A 2-core AVX-512
    Xeon VM read 0.76e9 at 1 thread and 1.44e9 at 2 (reference_results/sources/offload-rates/)."""
    offload_cast_elements_per_s: float = 0.321e9
    """The fp32 -> bf16 cast into a fresh host tensor, elements a second per thread: MEASURED there as
    offload_adam_elements_per_s is (0.774e9 at 1 thread, 5.13e9 at 16: 0.321e9 a thread)."""
    offload_host_threads: int = 16
    """Threads of a rank (train.py rank_threads: its share of the node's cores). ASSUMED: the one-GPU
    nodes' 16 cores; a DGX H100 has 112 cores for 8 GPUs (14 a rank)."""
    offload_host_gbps: float = 106.0
    """Host memory bandwidth a rank gets, GB/s: the cap on its host Adam and cast at many threads. MEASURED
    on the H200 node's host: what its Adam moved at 16 threads (3.80e9 elements/s x 28 B); the node's
    triad read 79.7 GB/s, which Adam's own count exceeds, so the cap is set no tighter than the kernel's own.
    A DGX H100 (two sockets of 8 DDR5-4800 channels, 614 GB/s, over 8 GPUs) gives a rank about 75."""
    pcie_pinned_gbps: float = 54.0
    """GPU <-> host copies of pinned memory, GB/s a direction. MEASURED on the H200 node (PCIe Gen5 x16):
    54.0 both ways (offload_rates.py, bf16 tensors of 1e8 elements)."""
    pcie_pageable_gbps: float = 4.9
    """Host -> GPU copies of pageable memory (the driver stages them through its own pinned buffers), GB/s.
    DERIVED on the H200 node: the cast and copy of an updated fp32 sub-group into a bf16 GPU tensor (what
    stage3.py does) ran at 3.30 GB/s of bf16 (60.6 ms for 1e8 elements), the cast alone 19.5 ms at 16
    threads: 41.1 ms for 2e8 bytes of pageable copy."""
    nccl_model: bool = True
    """Collectives on GPUs without a measured curve take the time NCCL's own tuning model gives the
    algorithm and protocol it picks (harness/model/topology.py: latencies and caps DECLARED by NCCL's
    src/graph/tuning.cc); off, bytes x factor / busbw alone (no latency)."""
    outliers: tuple[tuple[str, str, int, int], ...] = (("roce-a100", "llama-8b-kd", 2, 64),)
    """Published cells never used to calibrate another (platform, benchmark, ZeRO stage, micro-batch):
    roce-a100 ZeRO-2 mb 64 (25.74 samples/s) is 2.4x below ib-a100's 62.13 and 2.3x below its own
    ZeRO-1 at the same micro-batch, where every other roce-a100 cell is within 25 % of ib-a100's:
    an outlier of the paper's own. It is still predicted and reported."""

    def table(self) -> list[Param]:
        """Every parameter, for printing."""
        fit = "reference_results/sources/sc25-pmbs/fit_model.py on the published Model 1 and Model 2 tables"
        how = {"ib": ("fitted", fit + " (the grid's bound: line rate)"),
               "roce": ("declared", "as InfiniBand: Meta's RoCE and IB 24k-GPU clusters, 'without any network bottlenecks' "
                                    "(engineering.fb.com, 2024-03-12)"),
               "tcp": ("assumed", "no published tcp cell: the paper's RoCE figure")}
        out = [Param(f"fabric_efficiency.{k}", v, "x inter_node_bw_gbps", *how.get(k, ("declared", "")))
               for k, v in self.fabric_efficiency.items()]
        out.append(Param("paper_roce_efficiency", self.paper_roce_efficiency, "x inter_node_bw_gbps", "fitted",
                         fit + " (UNEXPLAINED, on " + ", ".join(self.paper_roce_platforms) + " only)"))
        gpu = "reference_results/sources/gpu-runs/2026-11-26-h200 (H200 node; 6, 12, 24 layers at mb 8)"
        out += [Param(f"host_s_per_module.{k}", v, "s per module per micro-step", "measured", gpu)
                for k, v in self.host_s_per_module.items()]
        out += [Param(f"host_base_s.{k}", v, "s per micro-step", "measured", gpu) for k, v in self.host_base_s.items()]
        cb = "reference_results/sources/gpu-runs/2026-11-26-h200/compute_breakdown_mb128.json (torch.profiler, H200)"
        out += [Param("gemm_efficiency", self.gemm_efficiency, "of the declared peak (no measured efficiency)", "measured", cb),
                Param("activation_passes", self.activation_passes, "x activation bytes kept, per micro-step", "measured", cb)]
        pair = "compute_breakdown_*.json of reference_results/sources/gpu-runs/2026-11-26-h200 and 2026-11-27-h100 (H100 against H200 at two shapes: 1.20x and 1.19x the time, for 1.43x the HBM)"
        out += [Param(f"on_die_traffic.{k}.{what}", v, unit, "measured", pair)
                for k, (share, rate) in self.on_die_traffic.items()
                for what, v, unit in (("share", share, "of the memory-bound kernels' time"), ("gbps", round(rate, 1), "GB/s"))]
        out.append(Param("distill_loss_bytes", self.distill_loss_bytes, "B per logit element, per micro-step", "measured",
                         "reference_results/sources/gpu-runs/2026-12-04-h200/gpu-check-kd (H200: llama-440m with and without "
                         "its teacher, +43.5 ms a micro-step)"))
        stack = "reference_results/sources/gpu-runs/2026-11-27-h100-stack"
        out += [Param("compile_memory_traffic", self.compile_memory_traffic, "x activation_passes, compiled", "measured",
                      f"{stack}/compute_breakdown_compiled_mb128.json against reference_results/sources/gpu-runs/2026-11-27-h100/"
                      "compute_breakdown_mb128.json (H100s: 28.9 of 111.0 ms of memory-bound kernels)"),
                Param("liger_memory_traffic", self.liger_memory_traffic, "x activation_passes, Liger's kernels", "measured",
                      f"{stack}/gpu-stack 00-z1 and 03-z1-liger (H100: 1.440 -> 0.968 s a step)"),
                Param("fp8_gemm_efficiency", self.fp8_gemm_efficiency, "of the declared FP8 peak", "assumed",
                      "gemm_efficiency (bf16, H200); TO MEASURE: an FP8 GEMM probe"),
                Param("fp8_cast_bytes", self.fp8_cast_bytes, "B per FP8 linear input, output and weight element, per micro-step",
                      "fitted", f"{stack}: FP8 against bf16, compiled, llama-440m and the 8B-shaped stack (9.87, 9.17)"),
                Param("memory_model.COMPILE_ACTIVATION_FRACTION", COMPILE_ACTIVATION_FRACTION, "of the eager activations",
                      "measured", f"{stack}/gpu-stack 00-z1 and 01-z1-compile (H100: 25.95 -> 17.25 GiB)"),
                *(Param(f"compiled_host_floor.{k}.{what}", v, unit, "measured",
                        "reference_results/sources/gpu-runs/2026-12-04-h200/gpu-compile-host (H200 node; "
                        + ("6 and 12 layers" if k.startswith("torch") else "12 layers; the base torch.compile's") + " at mb 8)")
                  for k, (base, per) in self.compiled_host_floor.items()
                  for what, v, unit in (("host_base_s", base, "s per micro-step"),
                                        ("host_s_per_module", per, "s per module per micro-step")))]
        rates = "tests/gpu/offload_rates.py on the H200 node: reference_results/sources/gpu-runs/2026-12-04-h200"
        out += [Param("offload_adam_elements_per_s", self.offload_adam_elements_per_s, "elements/s per host thread",
                      "measured", rates + " (3.80e9 at 16 threads)"),
                Param("offload_cast_elements_per_s", self.offload_cast_elements_per_s, "elements/s per host thread",
                      "measured", rates + " (5.13e9 at 16 threads)"),
                Param("offload_host_threads", float(self.offload_host_threads), "threads per rank", "assumed",
                      "the one-GPU nodes' 16 cores (a DGX H100: 14 a GPU)"),
                Param("offload_host_gbps", self.offload_host_gbps, "GB/s of host memory per rank", "measured",
                      rates + " (Adam's 16 threads x 28 B; its triad 79.7)"),
                Param("pcie_pinned_gbps", self.pcie_pinned_gbps, "GB/s a direction, pinned", "measured", rates),
                Param("pcie_pageable_gbps", self.pcie_pageable_gbps, "GB/s host -> GPU, pageable", "measured",
                      rates + " (derived: the cast and copy at 3.30 GB/s, less the cast)")]
        units = {"base_s": "s per step", "s_per_module": "s per module per step", "s_per_parameter": "s per parameter per step"}
        out += [Param(f"optimizer_step_s.{k}", v, units[k], "measured", "reference_results/sources/gpu-runs/2026-11-26-h200, 2026-12-04-h200 (ZeRO-1 mb 8: 6, 12, 24 "
                      "layers) and 2026-11-27-h100-stack (llama-440m and the 8B-shaped stack)")
                for k, v in self.optimizer_step_s.items()]
        out.append(Param("hbm_fraction", self.hbm_fraction, "of a datasheet's HBM bandwidth", "measured",
                         "reference_results/sources/gpu-runs/2026-11-26-h200 (the probe's triad)"))
        out += [Param(f"hbm_gbps.{k}", v, "GB/s", "declared", "NVIDIA datasheet x 0.894 (the H200 probe's triad fraction)")
                for k, v in self.hbm_gbps.items()]
        out += [Param("zero3_unexplained_s", self.zero3_unexplained_s, "s per ZeRO-3 collective call", "fitted",
                      fit + " (ZeRO-3 cells; UNEXPLAINED, on " + ", ".join(self.zero3_unexplained_platforms) + " only)"),
                Param("memory_model.FRAGMENTATION_FRACTION", FRAGMENTATION_FRACTION, "of device memory", "fitted",
                      fit + " (the OOM boundary: any value in about 0.065-0.187 calls all 34 cells)"),
                Param("nccl_model", float(self.nccl_model), "1: ring/tree x LL/LL128/Simple latencies and caps",
                      "declared", "NCCL src/graph/tuning.cc (NVIDIA/nccl 5067397): harness/model/topology.py")]
        return out


PARAMS = ModelParams()
"""The shipped values."""

IDEAL = ModelParams(fabric_efficiency={"ib": 1.0, "roce": 1.0, "tcp": 1.0}, paper_roce_efficiency=1.0, zero3_unexplained_s=0.0,
                    nccl_model=False,
                    host_s_per_module={"replicated": 0.0, "sharded": 0.0}, host_base_s={"replicated": 0.0, "sharded": 0.0},
                    optimizer_step_s={})
"""No fitted or measured term and no latency: the model's pure formulas (bytes x factor / declared
bandwidth), what the unit tests check the formulas with."""
