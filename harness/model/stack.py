"""The training stack in the performance model (issue 38): what workload.compile, workload.kernels and
precision=fp8 change in a GPU micro-step, each a mechanism with its measured figure
(harness/model/params.py, harness/model/memory.py) and, where no record shows it, named TO MEASURE.

- Memory-bound traffic (the roofline's activation passes, perfmodel.roofline_efficiency):
  compile x params.compile_memory_traffic (Inductor's fusion, measured kernel by kernel on H100s),
  kernels=liger x params.liger_memory_traffic (from one record pair); both: the smaller (not measured).
- FP8 (torchao float8, every decoder linear; not the output head): the linears' FLOPs at
  params.fp8_gemm_efficiency of the FP8 peak, the rest at gemm_efficiency of the bf16 one, plus the
  casts' traffic, params.fp8_cast_bytes per element of the linears' inputs, outputs and weights.
- Activation memory (memory.activation_estimate): Liger's kernels counted, compile's measured share,
  FP8's one-byte saved inputs.
- The host: the eager floor is kept (a compiled host floor is TO MEASURE: STACK_TO_MEASURE).
Pure, no I/O.
"""
from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from ..config.choices import Attention, CheckpointPolicy, Compile, CompileMode, Kernels, Precision
from ..config.schema import BenchConfig, WorkloadConfig
from .flops import checkpointed_layers, recompute_flops_per_token, recompute_fraction
from .params import PARAMS, ModelParams


class Stack(NamedTuple):
    """One (workload.compile, workload.kernels) choice."""
    compile: Compile
    kernels: Kernels

    @property
    def word(self) -> str:
        """eager, compile, liger, compile+liger, deepcompile, deepcompile+liger."""
        head = {"none": "", "torch": "compile", "deepcompile": "deepcompile"}[self.compile.value]
        tail = "liger" if self.kernels == Kernels.liger else ""
        return "+".join(p for p in (head, tail) if p) or "eager"

    def overrides(self) -> tuple[str, ...]:
        return (f"workload.compile={self.compile.value}", f"workload.kernels={self.kernels.value}")


STACK_CHOICES = tuple(Stack(c, k) for c in (Compile.none, Compile.torch) for k in (Kernels.eager, Kernels.liger))
"""What `model --sweep --stack` tries: eager, liger, compile, compile+liger (DeepCompile is a
workload.compile of its own, not measured: give it as the configuration's)."""

STACK_TO_MEASURE = {
    "compile_host_floor": "torch.compile under ZeRO-3: DeepSpeed's hooks stay eager (a graph break at each module), "
                          "so the eager sharded floor (host_base_s + host_s_per_module x modules) is kept: not measured "
                          "compiled (conf/suite/gpu-compile-host.yaml's c-z3 runs)",
    "deepcompile": "DeepCompile: its host floor measured at one shape (12 layers, mb 8, H200) and its GPU work as "
                   "torch.compile's; ZeRO's collectives as eager DeepSpeed schedules them",
    "compile_liger": "compile with Liger's kernels: not measured (the one try, a bare loop on an H100, failed inside "
                     "Inductor's autotuning); the smaller traffic and activation memory of the two are used",
    "fp8_eager": "FP8 without compile: not measured (torchao's casts run unfused); the compiled cast traffic and no "
                 "activation saving are used",
    "compile_mode": "compile_mode other than default: not measured; the default mode's figures are used",
    "attention": "workload.attention=flash, efficient or cudnn: as auto's fused kernels (an H100's cudnn run matched "
                 "auto's: 1.447 against 1.440 s a step, the same peak memory)",
    "attention_math": "attention=math: its float32 score products and kept scores counted, from one H100 record "
                      "(memory within 0.1 % of its +5.23 GiB; step -11 %: the rest of its time TO MEASURE)",
}
"""What the model cannot derive from a record yet, and what it does meanwhile (prediction notes)."""


def stack_of(w: WorkloadConfig) -> Stack:
    return Stack(w.compile, w.kernels)


def is_eager(w: WorkloadConfig) -> bool:
    """The paper's stack: no compile, transformers' kernels, not FP8, SDPA's own choice."""
    return (w.compile == Compile.none and w.kernels == Kernels.eager and w.precision != Precision.fp8
            and w.attention == Attention.auto)


def stack_words(w: WorkloadConfig) -> str:
    """The stack of a workload in words: its Stack word, with fp8 (and attention) when set."""
    parts = [stack_of(w).word] + (["fp8"] if w.precision == Precision.fp8 else [])
    if w.attention != Attention.auto:
        parts.append(f"attention {w.attention.value}")
    return " ".join(parts)


def eager_twin(cfg: BenchConfig) -> BenchConfig:
    """cfg on the eager stack: no compile, transformers' kernels, bf16 for fp8 (what an eager
    measurement of the same configuration ran)."""
    w = cfg.workload
    return replace(cfg, workload=replace(w, compile=Compile.none, compile_mode=CompileMode("default"),
                                         kernels=Kernels.eager, attention=Attention.auto,
                                         precision=Precision.bf16 if w.precision == Precision.fp8 else w.precision))


def traffic_fraction(w: WorkloadConfig, params: ModelParams = PARAMS) -> tuple[float, str]:
    """(fraction of the eager stack's memory-bound traffic, how) of a micro-step on w's stack."""
    compiled = w.compile != Compile.none
    liger = w.kernels == Kernels.liger
    if compiled and liger:
        f = min(params.compile_memory_traffic, params.liger_memory_traffic)
        return f, f"x {f:g} (compile x Liger, not measured: the smaller of compile's and Liger's)"
    if compiled:
        return params.compile_memory_traffic, f"x {params.compile_memory_traffic:g} (compiled: Inductor's fusion, measured)"
    if liger:
        return params.liger_memory_traffic, f"x {params.liger_memory_traffic:g} (Liger's kernels, measured)"
    return 1.0, ""


def fp8_linear_flops_per_token(w: WorkloadConfig) -> float:
    """The FLOPs per token of a training micro-step that torchao runs in FP8: every decoder linear
    (q, k, v, o, gate, up, down; not lm_head, benchmarks/training/stack.py fp8_filter), forward and both
    backward products, 6 x their parameters, plus the linears of checkpointing's recompute (full: all
    but attention's 4hs; selective: all of it). 0 unless precision=fp8."""
    if w.precision != Precision.fp8:
        return 0.0
    h, f = w.hidden_size, w.intermediate_size
    kv = w.num_kv_heads * (h // w.num_heads)
    linear = w.num_layers * (2 * h * h + 2 * h * kv + 3 * h * f)
    recompute = recompute_flops_per_token(w)
    if w.checkpoint_policy != CheckpointPolicy.selective:
        recompute -= checkpointed_layers(w) * 4.0 * h * w.seq_len
    return 6.0 * linear + recompute


def math_attention(w: WorkloadConfig, peak_tflops: dict[str, float], params: ModelParams = PARAMS) -> tuple[float, str]:
    """Under workload.attention=math, (seconds a micro-step, words) its score products take beyond the fused
    backends': SDPA's math backend computes bf16/fp16 inputs in float32 (since torch 2.5), so attention's
    12 L h s FLOPs a token (forward and backward; + 4 h s a layer full checkpointing recomputes) run at
    gemm_efficiency of the fp32 peak, not the precision's. Its score tensors' traffic is the roofline's own
    (memory.layer_bytes_per_token, math). (0, "") for the fused backends or an fp32 workload."""
    if w.attention != Attention.math or w.precision == Precision.fp32 or "fp32" not in peak_tflops:
        return 0.0, ""
    k = checkpointed_layers(w) if w.checkpoint_policy != CheckpointPolicy.selective else 0
    flops = (12.0 * w.num_layers + 4.0 * k) * w.hidden_size * w.seq_len * (w.micro_batch_size * w.seq_len)
    rest = peak_tflops.get("bf16" if w.precision == Precision.fp8 else w.precision.value, peak_tflops["fp32"])
    seconds = flops / (params.gemm_efficiency * 1e12) * (1 / peak_tflops["fp32"] - 1 / rest)
    return seconds, "; attention=math: its score products at the fp32 peak, its scores' traffic counted (one H100 record)"


def fp8_cast_elements(w: WorkloadConfig) -> float:
    """Elements torchao casts to FP8 per micro-step: each FP8 linear's input, output (its gradient in
    backward) and weight: tokens x L x (9h + 2kv + 3f) (q, k, v, o, gate, up, down: inputs 6h + f,
    outputs 3h + 2kv + 2f), a third again for the forward recomputed under checkpointing, plus the
    L (2h^2 + 2h kv + 3hf) weights. 0 unless precision=fp8."""
    if w.precision != Precision.fp8:
        return 0.0
    h, f = w.hidden_size, w.intermediate_size
    kv = w.num_kv_heads * (h // w.num_heads)
    tokens = w.micro_batch_size * w.seq_len
    io = tokens * w.num_layers * (9 * h + 2 * kv + 3 * f) * (1 + recompute_fraction(w) / 3)
    return io + w.num_layers * (2 * h * h + 2 * h * kv + 3 * h * f)


def stack_notes(cfg: BenchConfig, host_bound: bool) -> list[str]:
    """What a prediction on cfg's stack rests on that no record measured (STACK_TO_MEASURE)."""
    w = cfg.workload
    notes = []
    if w.compile == Compile.deepcompile:
        notes.append(STACK_TO_MEASURE["deepcompile"])
    if w.compile != Compile.none and w.kernels == Kernels.liger:
        notes.append(STACK_TO_MEASURE["compile_liger"])
    if w.precision == Precision.fp8 and w.compile == Compile.none:
        notes.append(STACK_TO_MEASURE["fp8_eager"])
    if w.compile != Compile.none and w.compile_mode.value != "default":
        notes.append(STACK_TO_MEASURE["compile_mode"])
    if w.attention != Attention.auto:
        notes.append(STACK_TO_MEASURE["attention_math" if w.attention == Attention.math else "attention"])
    if w.compile == Compile.torch and cfg.zero.stage == 3 and host_bound:
        notes.append("host-bound at the EAGER floor: " + STACK_TO_MEASURE["compile_host_floor"])
    return ["stack: " + n for n in notes]
