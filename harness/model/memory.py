"""Memory per rank, the first half of the performance model (harness/model/perfmodel.py): ZeRO model
states (ZeRO paper, Rajbhandari et al. 2020, sec. 3 and 5, Fig. 1, with DeepSpeed 0.19.8's own
estimators beside them), DeepSpeed's buffers, activations (Korthikanti et al. 2022's method,
derived for transformers' LlamaForCausalLM), the distillation teacher, ZeRO-3's offload to the host
(harness/model/offload.py: the GPU's share, and the host memory beside it), and the capacity a
configuration must fit in. Pure functions, no I/O, but for reading the offload settings of the user's
DeepSpeed JSON (`deepspeed_config=`) when the caller does not pass them.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Optional

from ..config.choices import Attention, CheckpointPolicy, Compile, Device, Kernels, Precision
from ..config.schema import BenchConfig, WorkloadConfig, grad_accum_precision
from ..config.teacher import llama_param_shapes, teacher_workload
from .flops import checkpointed_layers, llama_param_count
from .offload import HOST_RUNTIME_GIB, Offload, OffloadSplit, host_capacity_gib, read_offload, zero3_split

GIB = 2**30
ATTENTION = "sdpa"
"""The attention kernel the activation formula assumes: transformers' default,
scaled_dot_product_attention, whose flash / memory-efficient / cuDNN kernels keep q, k, v, the output
and a log-sum-exp per head, never the a x s x s scores. "math" (workload.attention=math, SDPA's math
backend) and "eager" (transformers' eager attention) add the score terms."""
FRAGMENTATION_FRACTION = 0.10
"""Share of device memory lost to the caching allocator (reserved but not allocatable). FITTED to
the out-of-memory boundary of both published tables (reference_results/sources/sc25-pmbs/
fit_model.py prints the bracket): with the paper's workloads every one of the 34 published cells
is called right for any value in about (0.07, 0.19) (the tightest cells: Model 2 ZeRO-1 mb 128,
OOM, and mb 64, run); 0.10, PyTorch's reserved-minus-allocated in training with varying block
sizes (the chunked distillation loss), is taken. It was 0.05, a guess, which called Model 2 ZeRO-1
mb 128 as fitting."""
DEVICE_RESERVE_GIB = 1.5
"""GPU memory outside PyTorch's allocator: CUDA context, cuBLAS workspaces, NCCL buffers (about
0.5 GiB each). The records' peak (torch.cuda.max_memory_allocated) excludes it, so it comes off
the capacity, not onto the estimate."""
CPU_RUNTIME_GIB = 0.5
"""On the cpu platform the records' peak is the peak RSS since setup (VmHWM, reset once the model is
built), which includes the interpreter with torch, transformers and DeepSpeed loaded: about 0.5 GiB
per rank."""
# DeepSpeed 0.19.8 defaults (runtime/zero/config.py, engine.py) for zero.* knobs left unset
DS_REDUCE_BUCKET = 500_000_000
DS_ALLREDUCE_BUCKET = 500_000_000   # engine.MEMORY_OPT_ALLREDUCE_SIZE: ZeRO-0's gradient all-reduce
DS_PREFETCH_BUCKET = 50_000_000
DS_MAX_LIVE = 1_000_000_000
DS_PERSISTENCE = 100_000
DS_MAX_REUSE = 1_000_000_000
DISTILL_CHUNK_ELEMENTS = 2**26      # benchmarks/training/distill.py CHUNK_ELEMENTS (not imported: it imports torch)
DISTILL_CHUNK_COPIES = 7            # "a block's intermediates peak at about 7 float32 copies" (same file)
COMPILE_ACTIVATION_FRACTION = 0.66
"""With workload.compile (torch; deepcompile takes it too), the share of the eager stack's activations
(activation_estimate's total: layers, head and backward work) a compiled micro-step keeps at its peak:
Inductor's partitioner recomputes cheap pointwise results in backward instead of saving them, and the
fused norms and loss keep no fp32 copies. MEASURED on one H100 (reference_results/sources/gpu-runs/
2026-11-27-h100-stack/gpu-stack, llama-440m ZeRO-1 mb 128): peak 33.44 GiB eager, 24.74 compiled;
less the model's 7.49 GiB of parameters, gradients, optimizer states and buckets, 25.95 and 17.25 GiB
of activations: 0.665. The 8B-shaped stack of the same records (4 layers, seq 2048, mb 4), whose head
is a larger share of its activations, checks it: 24.15 GiB measured compiled, 24.2 predicted."""
FP8_SAVED_INPUT_BYTES = 1
"""Under precision=fp8 with compile, bytes per element of each FP8 linear layer's input that its
backward no longer keeps: the compiled graph saves the e4m3 cast (1 byte) where bf16 (2) was kept.
COUNTED, not fitted: the distinct inputs of a decoder layer's linears, 3h + f elements a token (q/k/v,
o, gate/up, down). Against the records (same folder): llama-440m 20.52 GiB measured against 24.74
compiled bf16 (-4.22), this count -2.49 (the model is 1.7 GiB high there); the 8B-shaped stack -0.84
measured, -0.81 counted. Eager FP8 (torchao keeps its bf16 inputs): no saving, TO MEASURE."""


def dtype_bytes(p: Precision) -> int:
    return 4 if p == Precision.fp32 else 2


# ---- model states ----------------------------------------------------------------------------

def zero_model_states_bytes(psi: float, stage: int, n: int, k: float = 12, param_bytes: float = 2,
                            grad_bytes: float = 2) -> float:
    """Model-state bytes per rank, ZeRO paper sec. 3/5 and Fig. 1: baseline (2+2+K) Psi; P_os
    (2+2) Psi + K Psi/N; P_os+g 2 Psi + (2+K) Psi/N; P_os+g+p (2+2+K) Psi/N."""
    p, g = param_bytes * psi, grad_bytes * psi
    return {0: p + g + k * psi, 1: p + g + k * psi / n, 2: p + (g + k * psi) / n, 3: (p + g + k * psi) / n}[stage]


def deepspeed_zero2_estimate_bytes(psi: float, n: int) -> float:
    """estimate_zero2_model_states_mem_needs(cpu_offload=False), stage_1_and_2.py: 2 Psi +
    18 Psi/N (18 = 2 bf16 grads + 4 fp32 grads + 4 fp32 params + 8 Adam m, v)."""
    return 2 * psi + int(18 * psi / n)


def deepspeed_zero3_estimate_bytes(psi: float, largest_layer_params: float, n: int) -> float:
    """estimate_zero3_model_states_mem_needs(cpu_offload=False), stage3.py: 4 x largest layer's
    parameters + 18 Psi/N."""
    return 4 * largest_layer_params + int(18 * psi / n)


# ---- activations -----------------------------------------------------------------------------

def attention_of(w: WorkloadConfig, attention: Optional[str] = None) -> str:
    """The activation formula's attention kernel: the one given, else the workload's (math for
    workload.attention=math, which materialises the scores; sdpa's fused kernels for the others)."""
    return attention or ("math" if w.attention == Attention.math else ATTENTION)


def layer_bytes_per_token(w: WorkloadConfig, attention: Optional[str] = None, kernels: str = "eager") -> float:
    """Bytes one decoder layer keeps for backward per token (p = activation bytes, 2 for bf16):
    2 RMSNorms, each its fp32 input copy and normalised cast (4h + p h); their outputs, the q/k/v
    and gate/up inputs (2 p h); the o_proj input (p h); SwiGLU: gate, SiLU output, up, product
    (4 p f); attention core, sdpa: q after RoPE, k, v at the kv width, output (2 p h + 2 p kv)
    and the fp32 log-sum-exp (4 a); eager: q, k and v repeated to all heads (3 p h), the fp32
    softmax and its cast (4 + p) a s; math (SDPA's math backend, in float32 for bf16/fp16 inputs since
    torch 2.5): q, k and v in fp32 at all heads (12 h), the fp32 probabilities (4 a s) and the output
    (p h): 14,272 B a token a layer more than sdpa on llama-440m, where an H100 measured 14,290
    (attention=math against cudnn, 38.68 against 33.44 GiB at mb 128: reference_results/sources/
    gpu-runs/2026-11-27-h100-stack/attn). RoPE keeps only cos/sin; no dropout masks.
    kernels="liger" (Liger Kernel 0.8.5's autograd functions): each RMSNorm keeps its bf16 input
    and an fp32 rstd per token (p h + 4) instead of the fp32 copy and the cast, and SwiGLU keeps gate
    and up (the product is down_proj's input), not the SiLU output: 8h - 8 + p f bytes fewer. The
    roofline's traffic is counted on the eager set (kernels="eager", the default)."""
    p, h, f, a = dtype_bytes(w.precision), w.hidden_size, w.intermediate_size, w.num_heads
    kv = w.num_kv_heads * (h // a)
    if kernels not in ("eager", "liger"):
        raise ValueError(f"kernels={kernels!r}; valid: eager, liger")
    norms, swiglu = (2 * (p * h + 4), 3 * p * f) if kernels == "liger" else (2 * (4 * h + p * h), 4 * p * f)
    common = norms + 2 * p * h + p * h + swiglu
    attention = attention_of(w, attention)
    if attention == "sdpa":
        return common + 2 * p * h + 2 * p * kv + 4 * a
    if attention == "eager":
        return common + 3 * p * h + (4 + p) * a * w.seq_len
    if attention == "math":
        return common + 12 * h + 4 * a * w.seq_len + p * h
    raise ValueError(f"attention={attention!r}; valid: sdpa, eager, math")


def selective_bytes_per_token(w: WorkloadConfig) -> float:
    """Bytes a layer under the selective policy (benchmarks/training/checkpoint_policy.py) keeps per token:
    its input (p h), the saved matmul outputs q (p h), v (p kv), gate (p f), down (p h), and the
    attention kernel's output (p h) with its fp32 log-sum-exp (4 a)."""
    p, h, a = dtype_bytes(w.precision), w.hidden_size, w.num_heads
    return p * (4 * h + w.num_kv_heads * (h // a) + w.intermediate_size) + 4 * a


@dataclass(frozen=True)
class ActivationEstimate:
    layer_bytes_per_token: float
    stored_bytes: float
    """Kept from forward to backward: every layer's set (or, checkpointed, each layer's input)."""
    head_bytes: float
    """Logits and loss at their peak (start of backward)."""
    transient_bytes: float
    """Backward working set after the head: the recomputed layer (checkpointing) and gradients."""
    total_bytes: float
    formula: str


def activation_estimate(w: WorkloadConfig, attention: Optional[str] = None) -> ActivationEstimate:
    """Student activations of one micro-step (micro_batch_size x seq_len tokens) at their peak:
    stored + max(head, transient). Head, causal-LM loss (transformers' ForCausalLMLoss: logits
    upcast to fp32, log-softmax kept, its gradient and the input's): 12 V bytes per token.
    Head, distillation (benchmarks/training/distill.py): the student logits kept by the chunked loss
    (p V), their gradient accumulated from full-size slice gradients (2 p V), one chunk's fp32
    intermediates (7 x 4 x min(tokens x V, 2^26) bytes). The teacher's logits are teacher memory.
    The training stack (workload.kernels, compile, precision=fp8; harness/model/stack.py):
    kernels=liger keeps Liger's sets (layer_bytes_per_token; the final norm p h + 4 and the lm_head
    input p h) and its fused linear cross-entropy never materialises the logits: the head is the
    gradient of its input computed in forward (p h a token) and of the output weight (p V h), the
    logits of one chunk living only inside forward (distillation needs the logits: its head stays).
    compile: COMPILE_ACTIVATION_FRACTION of the whole (measured); with liger too (not measured),
    the smaller of the two. precision=fp8 with compile: FP8_SAVED_INPUT_BYTES less per element of the
    linears' inputs of every layer that keeps its set."""
    tokens, p, h, v = w.micro_batch_size * w.seq_len, dtype_bytes(w.precision), w.hidden_size, w.vocab_size
    liger, attention = w.kernels == Kernels.liger, attention_of(w, attention)
    layer = layer_bytes_per_token(w, attention, "liger" if liger else "eager")
    final = (2 * p * h + 4) if liger else (4 * h + 2 * p * h)   # final RMSNorm and the lm_head input (p h)
    work = p * (2 * h + 2 * w.intermediate_size)       # gradients flowing through a layer in backward
    k = checkpointed_layers(w)
    if k:   # a checkpointed layer keeps its input (selective: its set), the others theirs; one recomputed at a time
        own, own_f = ((selective_bytes_per_token(w), "selective") if w.checkpoint_policy == CheckpointPolicy.selective
                      else (p * h, "p h (checkpointed inputs)"))
        stored = (k * own + (w.num_layers - k) * layer + final) * tokens
        transient = (layer + work) * tokens
        kept = (f"L {own_f}" if k == w.num_layers else f"{k} x {own_f} + {w.num_layers - k} x layer")
    else:
        stored, transient = (w.num_layers * layer + final) * tokens, work * tokens
        kept = "L x layer"
    if w.distill is not None:
        head = 3.0 * p * v * tokens + DISTILL_CHUNK_COPIES * 4 * min(tokens * v, DISTILL_CHUNK_ELEMENTS)
        head_f = "3 p V + chunk"
    elif liger:
        head, head_f = float(p * h * tokens + p * v * h), "Liger's fused linear cross-entropy: p h + p V h"
    else:
        head, head_f = 12.0 * v * tokens, "12 V"
    total = stored + max(head, transient)
    formula = (f"tokens x ({kept} + {'2ph + 4' if liger else '4h + 2ph'}) + max(head {head_f}, backward work); layer = "
               f"{layer:.0f} B/token ({attention}{', Liger' if liger else ''}), tokens = {w.micro_batch_size} x {w.seq_len}")
    if w.compile != Compile.none:
        eager = activation_estimate(replace(w, compile=Compile.none, kernels=Kernels.eager), attention)
        scaled = eager.total_bytes * COMPILE_ACTIVATION_FRACTION
        if liger and total < scaled:     # compile x liger is not measured: the smaller of the two
            formula = f"compile x Liger (not measured): the smaller of Liger's count and compile's; {formula}"
        else:
            stored, head, transient, total = (x * COMPILE_ACTIVATION_FRACTION for x in
                                              (eager.stored_bytes, eager.head_bytes, eager.transient_bytes, eager.total_bytes))
            formula = (f"{COMPILE_ACTIVATION_FRACTION:g} x the eager set (compiled, measured): " + eager.formula
                       + (" (compile x Liger not measured: compile's is the smaller)" if liger else ""))
        if w.precision == Precision.fp8:
            saved = FP8_SAVED_INPUT_BYTES * (3 * h + w.intermediate_size) * (w.num_layers - k) * tokens
            stored, total = stored - saved, total - saved
            formula += f"; FP8: - {FP8_SAVED_INPUT_BYTES} B x (3h + f) per token of each layer that keeps its set"
    return ActivationEstimate(layer, stored, head, transient, total, formula)


# ---- memory ----------------------------------------------------------------------------------

@dataclass
class MemoryEstimate:
    """Bytes per rank at the peak, in GiB. total = runtime + params + grads + optimizer +
    teacher parameters + max(backward phase: activations + buffers + teacher logits; optimizer
    step: step_transient). fits = total <= capacity."""
    params_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    buffers_gib: float
    teacher_gib: float
    """Teacher parameters held by the rank plus its logits (kept through the student's backward)."""
    step_transient_gib: float
    """Alive only during the optimizer step (fp32 gradient partition, ...), not with activations."""
    runtime_gib: float
    total_gib: float
    capacity_gib: float
    fits: bool
    peak_phase: str
    """backward or step: which phase holds the peak."""
    formulas: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    host_gib: float = 0.0
    """Host memory the rank takes on a GPU platform (harness/model/offload.py): its runtime, and what
    ZeRO-3 offloads there; 0 on the cpu platform, whose device memory is the host's."""
    host_items_gib: dict[str, float] = field(default_factory=dict)
    """host_gib by item."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def param_tensors(w: WorkloadConfig) -> list[tuple[str, int, int]]:
    """(name, elements, ndim) of every parameter in forward order (transformers' state dict)."""
    return [(n, math.prod(s), len(s)) for n, s in llama_param_shapes(w).items()]


def capacity_gib(cfg: BenchConfig) -> float:
    """Usable memory: the declared size less FRAGMENTATION_FRACTION and, on GPUs, DEVICE_RESERVE_GIB."""
    p = cfg.platform
    reserve = DEVICE_RESERVE_GIB if p.device == Device.cuda else 0.0
    return p.mem_per_device_gib * (1 - FRAGMENTATION_FRACTION) - reserve


def zero_knob(cfg: BenchConfig, name: str, default: int) -> int:
    v = getattr(cfg.zero, name)
    return default if v is None else int(v)


def overlap_comm(cfg: BenchConfig) -> bool:
    """zero.overlap_comm, or DeepSpeed's default: true for stage 3 only (runtime/zero/config.py)."""
    return cfg.zero.overlap_comm if cfg.zero.overlap_comm is not None else cfg.zero.stage == 3


def accum_bytes(cfg: BenchConfig) -> int:
    """Bytes per element of the gradients as they accumulate over the micro-steps."""
    w = cfg.workload
    return dtype_bytes(grad_accum_precision(w.precision, cfg.zero.stage, w.grad_accum_dtype))


def bf16_optimizer(cfg: BenchConfig) -> bool:
    """DeepSpeed runs ZeRO-1 of a bf16/fp16 model with fp32 accumulation as its BF16_Optimizer."""
    return cfg.zero.stage == 1 and cfg.workload.precision != Precision.fp32 and accum_bytes(cfg) == 4


def gradient_collective(cfg: BenchConfig) -> str:
    return cfg.zero.gradient_collective.value


def memory_estimate(cfg: BenchConfig, attention: Optional[str] = None, offload: Optional[Offload] = None) -> MemoryEstimate:
    """Memory per rank of cfg (formulas in the result's `formulas`; see MemoryEstimate). `offload`: the
    DeepSpeed JSON's offload settings (offload.offload_settings of a planned run's JSON); None reads
    them from cfg.deepspeed_config."""
    offload = offload if offload is not None else read_offload(cfg.deepspeed_config)
    w, s, n = cfg.workload, cfg.zero.stage, cfg.platform.world_size
    tensors = param_tensors(w)
    psi = sum(t[1] for t in tensors)
    p = g = dtype_bytes(w.precision)                       # DeepSpeed keeps gradients in the model dtype
    mixed = w.precision != Precision.fp32
    cuda = cfg.platform.device == Device.cuda
    bucket = zero_knob(cfg, "reduce_bucket_size", DS_REDUCE_BUCKET)
    largest = max(t[1] for t in tensors)
    f: dict[str, str] = {}
    notes: list[str] = []
    # parameters and gradients
    if s < 3:
        params, f["params"] = p * psi, f"{p} Psi (full {w.precision.value} copy)"
    else:
        persist_t = zero_knob(cfg, "stage3_param_persistence_threshold", DS_PERSISTENCE)
        persistent = sum(t[1] for t in tensors if t[1] < persist_t)
        params = p * psi / n + p * persistent
        f["params"] = f"{p} Psi/N + {p} x persistent ({persistent} elements < {persist_t} kept whole)"
    a = accum_bytes(cfg)
    if bf16_optimizer(cfg):
        grads = (g + a) * psi
        f["grads"] = (f"{g} Psi param.grad + {a} Psi fp32 accumulation buffer (DeepSpeed's BF16_Optimizer: "
                      "ZeRO-1 with fp32 accumulation)")
    elif s < 2:
        grads, f["grads"] = g * psi, f"{g} Psi (full gradients accumulate in param.grad)"
    else:
        grads, f["grads"] = a * psi / n, f"{a} Psi/N (gradient partition, accumulated in {'fp32' if a == 4 else 'the model dtype'})"
    # optimizer: fp32 master (a clone even for fp32 under ZeRO-1/2, none needed under 0/3) + Adam m, v
    master = 4 if (mixed or s in (1, 2)) else 0
    k = master + 8
    shard = 1 if s == 0 else n
    optimizer = k * psi / shard
    f["optimizer"] = (f"K Psi{'/N' if s else ''}, K = {k} ({master} fp32 master + 8 Adam m, v"
                      + ("; DeepSpeed's ZeRO-1/2 clones the fp32 partition" if not mixed and s in (1, 2) else "") + ")")
    # DeepSpeed's buffers, alive in backward. On the cpu, untouched pages of an empty bucket are not
    # resident (peak RSS), so only what is written counts there.
    nbuf = 2 if (s in (1, 2) and overlap_comm(cfg)) else 1
    if s == 0:
        buffers, f["buffers"] = 0.0, "none in backward (the flattened all-reduce bucket is a step-phase buffer)"
    else:
        ipg = g * nbuf * (bucket if cuda else min(bucket, psi))
        touched = "" if cuda else " (min with Psi: pages written)"
        f["buffers"] = f"{g} x {nbuf} x reduce_bucket_size ({bucket:.3g}){touched}"
        buffers = ipg
        if s >= 2:                                         # ZeRO-1's full gradients are counted in grads
            buffers += g * largest
            f["buffers"] += f" + {g} x largest parameter ({largest}: its gradient before the hook copies it)"
        if s == 3:
            live = min(psi, zero_knob(cfg, "stage3_max_live_parameters", DS_MAX_LIVE)
                       + zero_knob(cfg, "stage3_prefetch_bucket_size", DS_PREFETCH_BUCKET))
            buffers += p * live
            f["buffers"] += f" + {p} x min(Psi, max_live_parameters + prefetch_bucket_size) gathered"
    # optimizer step
    if s == 0:
        step = (4 * psi if mixed else 0) + g * min(psi, DS_ALLREDUCE_BUCKET)
        f["step_transient"] = ("4 Psi fp32 gradients + " if mixed else "") + f"{g} x min(Psi, 5e8) all-reduce bucket"
    else:
        unfused = 1 if (not cuda and w.optimizer.value == "torch") else 0  # torch AdamW is fused only on CUDA
        copy = 0 if bf16_optimizer(cfg) else 1   # BF16_Optimizer's fp32 partition gradients are views of its buffer
        step = 4 * psi / n * (copy + unfused)
        f["step_transient"] = " + ".join(["4 Psi/N fp32 gradient partition"] * copy
                                         + ["4 Psi/N unfused AdamW temporary"] * unfused) or "none"
        if s == 2 and gradient_collective(cfg) == "reduce_scatter":   # benchmarks/reduce_scatter/install.py, balanced buckets
            step += g * psi / n
            f["step_transient"] += (f" + {g} Psi/N all-to-all receive buffer (gradient_collective=reduce_scatter: the "
                                    "bucket-sharded accumulator replaces DeepSpeed's gradient partition)")
    # activations, teacher
    act = activation_estimate(w, attention)
    f["activations"] = act.formula
    teacher_params = teacher_logits = 0.0
    if w.distill is not None:
        t = teacher_workload(w)
        tp, psi_t = dtype_bytes(t.precision), llama_param_count(t)
        teacher_params = tp * psi_t / (n if s == 3 else 1)
        teacher_logits = float(tp * t.vocab_size * w.micro_batch_size * w.seq_len)
        f["teacher"] = (f"{tp} Psi_t{'/N (sharded by ZeRO-3)' if s == 3 else ' (replica)'} + logits {tp} V x tokens")
        notes.append("the teacher's no_grad forward working set precedes the student's forward and is not "
                     "counted; under ZeRO-3 its gathered parameters are assumed released after its forward")
    host: dict[str, float] = {}
    if cuda:
        terms = {"params": params, "grads": grads, "optimizer": optimizer, "step": step, "teacher_params": teacher_params}
        host = offload_terms(cfg, offload, terms, f, notes)
        params, grads, optimizer, step, teacher_params = (terms[k] for k in ("params", "grads", "optimizer", "step",
                                                                             "teacher_params"))
    elif offload.active:
        notes.append("offload on the cpu platform moves states within the same host memory: counted as without it")
    runtime = 0.0 if cuda else CPU_RUNTIME_GIB * GIB
    backward_phase = act.total_bytes + buffers + teacher_logits
    base = runtime + params + grads + optimizer + teacher_params
    total = base + max(backward_phase, step)
    cap = capacity_gib(cfg)
    f["total"] = "runtime + params + grads + optimizer + teacher params + max(activations + buffers + teacher logits, step)"
    f["capacity"] = (f"{cfg.platform.mem_per_device_gib:g} GiB x (1 - {FRAGMENTATION_FRACTION})"
                     + (f" - {DEVICE_RESERVE_GIB} GiB (CUDA context, workspaces, NCCL)" if cuda else ""))
    if not cuda:
        notes.append("cpu: the limit is RLIMIT_DATA (virtual); the estimate follows the peak RSS (resident)")
    return MemoryEstimate(
        params_gib=params / GIB, grads_gib=grads / GIB, optimizer_gib=optimizer / GIB,
        activations_gib=act.total_bytes / GIB, buffers_gib=buffers / GIB,
        teacher_gib=(teacher_params + teacher_logits) / GIB, step_transient_gib=step / GIB,
        runtime_gib=runtime / GIB, total_gib=total / GIB, capacity_gib=cap, fits=total / GIB <= cap,
        peak_phase="backward" if backward_phase >= step else "step", formulas=f, notes=notes,
        host_gib=sum(host.values()) / GIB, host_items_gib={k: v / GIB for k, v in host.items()})


def offload_split(cfg: BenchConfig, o: Offload) -> OffloadSplit:
    """ZeRO-3's model states of one rank of cfg, split between the GPU and the host by `o`
    (offload.zero3_split over the rank's partition of every parameter, in order)."""
    w, n = cfg.workload, cfg.platform.world_size
    tensors = param_tensors(w)
    persist_t = zero_knob(cfg, "stage3_param_persistence_threshold", DS_PERSISTENCE)
    teacher = None
    if w.distill is not None:
        t = teacher_workload(w)
        teacher = [(math.ceil(e / n), dtype_bytes(t.precision)) for _, e, _ in param_tensors(t)]
    return zero3_split([math.ceil(e / n) for _, e, _ in tensors], sum(e for _, e, _ in tensors if e < persist_t),
                       accum_bytes(cfg), dtype_bytes(w.precision), o, teacher)


def offload_terms(cfg: BenchConfig, o: Offload, terms: dict[str, float], f: dict[str, str], notes: list[str]) -> dict[str, float]:
    """ZeRO-3's offload to the host (harness/model/offload.py) in place of the GPU terms it moves
    (params, grads, optimizer, step, teacher_params of `terms`, replaced there); returns the rank's host
    bytes by item: its runtime alone where nothing is offloaded."""
    s = cfg.zero.stage
    runtime = {"runtime": HOST_RUNTIME_GIB * GIB}
    if not o.active:
        return runtime
    if s != 3 or "nvme" in (o.optimizer, o.param):
        notes.append(f"offload (optimizer {o.optimizer}, param {o.param}) under ZeRO-{s} is not modelled (only ZeRO-3 "
                     "to the cpu): counted as if nothing were offloaded")
        return runtime
    sp = offload_split(cfg, o)
    if o.optimizer == "cpu":
        terms.update(grads=sp.gpu_grads, optimizer=sp.gpu_optimizer, step=sp.gpu_step)
        f["grads"] = "4 B x GPU sub-groups (their fp32 gradients; the accumulation buffer is on the host)"
        f["optimizer"] = f"12 B x GPU sub-groups ({sp.num_groups - sp.num_host_groups} of {sp.num_groups} stay: offload ratio {o.ratio:g})"
        f["step_transient"] = "4 B x the largest GPU sub-group (torch AdamW's foreach temporary, sqrt(v))"
    if o.param == "cpu":
        terms["params"] = sp.gpu_params
        f["params"] = "2 x persistent parameters (the partitions are on the host: offload_param)"
        if cfg.workload.distill is not None:
            terms["teacher_params"] = 0.0
            f["teacher"] = "logits only on the GPU (offload_param keeps the teacher's partitions on the host too)"
    items = "; ".join(f"{k} {v / GIB:.1f}" for k, v in sp.host.items())
    f["host"] = "; ".join(f"{k}: {v}" for k, v in sp.formulas.items())
    notes.append(f"host memory per rank (ZeRO-3 offload, {sp.num_host_groups} of {sp.num_groups} optimizer sub-groups on "
                 f"the host): {sp.host_bytes / GIB:.1f} GiB ({items}); x {cfg.platform.gpus_per_node} ranks per node")
    return sp.host


def host_fits(est: MemoryEstimate, ranks_per_node: int, available_gib: float) -> bool:
    """Whether a node's ranks fit its host memory (offload.host_capacity_gib of what is available)."""
    return ranks_per_node * est.host_gib <= host_capacity_gib(available_gib)
