"""The performance model: for one validated configuration, memory per rank (and whether it runs
out; harness/model/memory.py), communication per optimizer step, step time, throughput and hours
for a token budget.
Pure functions (no I/O); formulas are stated where they are used, with their sources:

- Model states: ZeRO paper (Rajbhandari et al. 2020, sec. 3 and 5, Fig. 1): per parameter
  2 + 2 + K bytes (fp16/bf16 parameters and gradients, K = 12: fp32 master, Adam m and v),
  partitioned 1/N by stage: P_os (K/N), P_os+g (2+K)/N, P_os+g+p (2+2+K)/N. DeepSpeed 0.19.8's
  estimators (estimate_zero2/zero3_model_states_mem_needs) are reproduced beside them.
- Activations: the method of Korthikanti et al. 2022 (sec. 4: count every tensor autograd keeps
  from forward to backward), derived here for transformers' LlamaForCausalLM: RMSNorm computed in
  fp32, SwiGLU, grouped-query attention, no dropout, causal SDPA (no s x s scores kept).
- FLOPs: PaLM appendix B (harness/model/flops.py). Collectives: nccl-tests PERFORMANCE.md bus-bandwidth
  factors (harness/collectives.py): time = size x factor(op, N) / busbw(size).
- What DeepSpeed allocates and issues per stage: deepspeed/runtime/zero/stage_1_and_2.py,
  stage3.py, engine.py and utils.py of 0.19.8 (see ../shared/DEEPSPEED_NOTES.md).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from ..config.choices import Device
from ..config.schema import BenchConfig
from ..config.split import with_split  # noqa: F401 (imported from here by reference_results/sources/sc25-pmbs)
from ..config.teacher import teacher_workload
from ..errors import HarnessError
from .calibration_types import Calibration
from .comm_layout import prefetch_exposed
from .flops import (forward_flops_per_token, llama_param_count, recompute_flops_per_token, recompute_fraction,
                    training_flops_per_token)
from .memory import MemoryEstimate, gradient_collective, layer_bytes_per_token, memory_estimate, offload_split, overlap_comm
from .offload import read_offload
from .offload_time import OffloadTime, offload_time
from .params import PARAMS, ModelParams
from .stack import fp8_cast_elements, fp8_linear_flops_per_token, math_attention, stack_notes, traffic_fraction
from .traffic import CommEstimate, Traffic, collective_time, comm_traffic, nccl_algorithm

# ---- prediction ------------------------------------------------------------------------------

@dataclass
class Prediction:
    config: dict[str, Any]
    memory: MemoryEstimate
    flops_per_step: float
    """FLOPs executed per rank per optimizer step (with the checkpointing recompute and the teacher)."""
    compute_s: float
    comm: list[CommEstimate]
    comm_s: float
    exposed_comm_s: float
    host_wait_s: float
    """Per step, the time the GPU waits on the host to issue its work (host_floor, measured)."""
    step_time_s: float
    samples_per_s: float
    """Global samples per second: micro_batch_size x grad_acc_steps x world_size / step_time_s."""
    tokens_per_s: float
    efficiency: float
    efficiency_source: str
    tokens: Optional[float]
    hours: Optional[float]
    overlap_rule: str = ""
    notes: list[str] = field(default_factory=list)
    offload_s: float = 0.0
    """Per step, what ZeRO-3's optimizer offload to the host adds (harness/model/offload_time.py): the host's
    Adam, the cast and copy of the updated parameters, the gradients' copies that outlast backward."""
    optimizer_s: float = 0.0
    """Per step, the optimizer step on a GPU (optimizer_step; params.optimizer_step_s)."""
    offload: Optional[dict[str, Any]] = None
    """offload_s by item (items_s) with its formulas; None without optimizer offload on a GPU."""

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("memory", "comm")}
        return {**d, "memory": self.memory.to_dict(), "comm": [c.to_dict() for c in self.comm]}


def executed_flops_per_step(cfg: BenchConfig) -> float:
    """Per rank per optimizer step: tokens x (6N + 12 L h s, PaLM appendix B; + the checkpointing
    recompute, flops.recompute_flops_per_token; + the teacher's forward 2N_t + 4 L_t h_t s)."""
    return sum(phase_flops(cfg).values()) * cfg.workload.grad_acc_steps


def phase_flops(cfg: BenchConfig) -> dict[str, float]:
    """FLOPs per micro-step per phase: forward a third of the training count, backward two thirds
    (PaLM appendix B: backward = 2 x forward), plus the recompute under checkpointing
    (flops.recompute_flops_per_token: the forward again for the layers checkpointed, or selective's
    matmuls not kept)."""
    w = cfg.workload
    tokens = w.micro_batch_size * w.seq_len
    train = training_flops_per_token(w, llama_param_count(w)).flops_per_token * tokens
    out = {"forward": train / 3, "backward": 2 * train / 3 + recompute_flops_per_token(w) * tokens}
    if w.distill is not None:
        t = teacher_workload(w)
        out["teacher"] = forward_flops_per_token(t, llama_param_count(t)).flops_per_token * tokens
    return out


OVERLAP_RULE = (
    "GPU: a collective on DeepSpeed's side stream hides behind the computation of its own phase of the same "
    "micro-step; exposed per micro-step = non-overlapped + max(the message that cannot overlap, overlapped - "
    "phase compute). Overlapped: ZeRO-3 parameter gathers (prefetch, always; the first cannot be prefetched) and, "
    "with overlap_comm, gradient reductions in backward (the last bucket is only ready when backward ends). "
    "Never overlapped: reductions without overlap_comm (issued on the compute stream), ZeRO-1's balanced "
    "reduce-scatter windows (zero.gradient_collective=reduce_scatter: issued after backward), ZeRO-0's all-reduce, "
    "the post-step all-gather and norm reductions. cpu/gloo: there are no streams; a collective overlaps only when "
    "DeepSpeed issues it with async_op=True and waits later, so that a gloo worker thread carries it while the rank "
    "computes: ZeRO-3's prefetched parameter gathers (deepspeed/runtime/zero/partition_parameters.py "
    "_dist_allgather_fn), message by message: each is issued as the module before it starts (one prefetch "
    "bucket ahead), so it hides only behind that module's compute (FLOP-proportional share of the phase), the "
    "first of each pass exposed whole; every other collective (ZeRO-0/1/2 all-reduce and all-gather, ZeRO-3's "
    "reduce-scatter, coalesced_collectives.py async_op=False) is a blocking call, exposed whole.")


def overlap_summary(config: dict[str, Any]) -> str:
    """OVERLAP_RULE as it applies to one configuration (a Prediction's config)."""
    stage, ov = config["zero_stage"], config["overlap_comm"]
    if config["world_size"] == 1:
        return "no collectives"
    if config["device"] != "cuda":
        if stage == 3 and not config["activation_checkpointing"]:
            return ("ZeRO-3's parameter gathers are issued async and carried by gloo's worker threads: each prefetched "
                    "behind the compute of the module before it (the first of each pass is exposed); the reduce-scatter "
                    "and the rest block")
        return "none: these gloo collectives are blocking calls"
    if stage == 0:
        return "none: ZeRO-0 all-reduces after backward"
    if stage in (1, 2):
        grads = ("none for gradients (ZeRO-1's balanced reduce-scatter windows run after backward)"
                 if stage == 1 and config.get("gradient_collective") == "reduce_scatter" else
                 "gradient reductions hide behind their micro-step's backward, except the last bucket" if ov else
                 "none for gradients (overlap_comm false: reduced on the compute stream)")
        return grads + "; the post-step all-gather is exposed"
    return ("parameter gathers are prefetched behind each phase's compute (the first of each pass is exposed); "
            + ("reduce-scatters hide behind backward except the last bucket" if ov
               else "reduce-scatters on the compute stream (overlap_comm false)"))


def _timed(cfg: BenchConfig, calib: Calibration,
           params: ModelParams = PARAMS) -> list[tuple[Traffic, list[float], list[CommEstimate]]]:
    out = []
    for tr in comm_traffic(cfg):
        times, estimates, seen = [], [], {}
        for size in tr.sizes:
            t, busbw, src = collective_time(tr.op, size, cfg, calib, params)
            times.append(t)
            seen.setdefault(size, [0, t, busbw, src])[0] += 1
        for size, (count, t, busbw, src) in seen.items():
            algo = nccl_algorithm(tr.op, size, cfg, calib, params)
            estimates.append(CommEstimate(tr.op, tr.phase, size, count * tr.microsteps, t, busbw, src,
                                          tr.what + (f" ({algo})" if algo else ""), tr.microsteps, tr.overlappable))
        out.append((tr, times, estimates))
    return out


def zero3_calls(cfg: BenchConfig, timed, params: ModelParams = PARAMS) -> int:
    """ZeRO-3 collective calls per optimizer step that carry the paper clusters' unexplained cost
    (params.zero3_unexplained_s): every parameter gather and gradient reduce-scatter of the
    micro-steps, on those platforms alone."""
    if (cfg.zero.stage != 3 or cfg.platform.device != Device.cuda
            or cfg.platform.name not in params.zero3_unexplained_platforms):
        return 0
    return sum(len(tr.sizes) * tr.microsteps for tr, _, _ in timed if tr.phase != "step")


def modules_with_parameters(num_layers: int) -> int:
    """Of transformers' LlamaForCausalLM: per layer q, k, v, o, gate, up, down and two RMSNorms;
    the embedding, the final norm and the LM head."""
    return 9 * num_layers + 3


def host_floor(cfg: BenchConfig, params: ModelParams = PARAMS) -> tuple[float, str]:
    """(seconds, how) the host spends per micro-step issuing it on a GPU platform (params
    host_base_s + host_s_per_module x modules; a teacher's modules count half: forward only);
    0 on cpu, where the host is the device and a measured efficiency holds it."""
    if cfg.platform.device != Device.cuda:
        return 0.0, ""
    kind = "sharded" if cfg.zero.stage == 3 else "replicated"
    modules = float(modules_with_parameters(cfg.workload.num_layers))
    if cfg.workload.distill is not None:
        modules += modules_with_parameters(teacher_workload(cfg.workload).num_layers) / 2
    compiled = compiled_floor_key(cfg)
    base, per = (params.compiled_host_floor[compiled] if compiled in params.compiled_host_floor
                 else (params.host_base_s[kind], params.host_s_per_module[kind]))
    return (base + per * modules, f"{modules:g} modules, {kind} parameters (ZeRO-{cfg.zero.stage})"
            + (f", {cfg.workload.compile.value}'s floor" if compiled in params.compiled_host_floor else ""))


def compiled_floor_key(cfg: BenchConfig) -> str:
    """Which of params.compiled_host_floor a compiled run's host floor is ('' for eager and for torch.compile
    under ZeRO-3, whose DeepSpeed hooks stay eager: the eager sharded floor); DeepCompile under ZeRO 1/2
    takes torch.compile's replicated one."""
    c = cfg.workload.compile.value
    if c == "none" or (c == "torch" and cfg.zero.stage == 3):
        return ""
    return "deepcompile/sharded" if cfg.zero.stage == 3 else "torch/replicated"


def roofline_efficiency(cfg: BenchConfig, params: ModelParams = PARAMS) -> Optional[tuple[float, str]]:
    """(efficiency, how) of a GPU micro-step from its two kinds of work, when nothing was measured:
    its FLOPs at params.gemm_efficiency of the declared peak, plus its memory-bound traffic,
    params.activation_passes x the activation bytes its layers keep (a third again for the forward
    recomputed under checkpointing, times the share of layers checkpointed: either policy recomputes
    every elementwise op; a teacher's forward a third of its own, and a distillation loss
    params.distill_loss_bytes per logit element), at the GPU's HBM bandwidth (platform.hbm_gbps, the
    datasheet's, x params.hbm_fraction; else params.hbm_gbps by gpu_model; on a die measured, part of the
    time at the die's rate, params.on_die_traffic). None
    where the GPU's bandwidth is not declared. The training stack (harness/model/stack.py): compile and
    Liger's kernels scale the student's traffic (stack.traffic_fraction; the bytes are the eager set's);
    precision=fp8 runs the decoder linears' FLOPs at params.fp8_gemm_efficiency of the FP8 peak, the rest
    at the bf16 peak, and adds the casts' traffic (params.fp8_cast_bytes per stack.fp8_cast_elements)."""
    p, w = cfg.platform, cfg.workload
    hbm = p.hbm_gbps * params.hbm_fraction if p.hbm_gbps > 0 else params.hbm_gbps.get(p.gpu_model or "")
    if p.device != Device.cuda or not hbm:
        return None
    peak = p.peak_tflops[w.precision.value] * 1e12
    flops = sum(phase_flops(cfg).values())
    tokens = w.micro_batch_size * w.seq_len
    kept = w.num_layers * layer_bytes_per_token(w) * tokens * (1 + recompute_fraction(w) / 3)
    fraction, how = traffic_fraction(w, params)
    kept *= fraction
    loss = params.distill_loss_bytes * tokens * w.vocab_size if w.distill is not None else 0.0   # over both models' logits
    if w.distill is not None:       # the teacher's forward
        t = teacher_workload(w)
        kept += t.num_layers * layer_bytes_per_token(t) * tokens / 3
    fp8 = fp8_linear_flops_per_token(w) * tokens
    if fp8:
        bf16 = p.peak_tflops.get("bf16", peak / 2 / 1e12) * 1e12
        gemm = (flops - fp8) / (bf16 * params.gemm_efficiency) + fp8 / (peak * params.fp8_gemm_efficiency)
        casts = params.fp8_cast_bytes * fp8_cast_elements(w)
    else:
        gemm, casts = flops / (peak * params.gemm_efficiency), 0.0
    share, on_die = params.on_die_traffic.get(p.gpu_model or "", (0.0, hbm))
    math_s, math_words = math_attention(w, p.peak_tflops, params)
    seconds = gemm + math_s + (params.activation_passes * kept + loss) * ((1 - share) / hbm + share / on_die) / 1e9 + casts / (hbm * 1e9)
    text = (f"roofline, nothing measured: FLOPs at {params.gemm_efficiency:g} of peak + {params.activation_passes:g} x "
            "the activation bytes kept, at the GPU's HBM bandwidth (params.py; measured on an H200)")
    if share:
        text += f", {share:g} of that time at the die's {on_die:g} GB/s (measured on an H100 and an H200)"
    if how:
        text += f"; the stack's traffic {how}"
    if w.distill is not None:
        text += f"; distillation: the teacher's forward + {params.distill_loss_bytes:g} B a logit element (its loss)"
    text += math_words
    if fp8:
        text += (f"; FP8: the decoder linears' FLOPs at {params.fp8_gemm_efficiency:g} of the FP8 peak, the rest at the "
                 f"bf16 peak, + {params.fp8_cast_bytes:g} B a cast element")
    return flops / (peak * seconds), text


def _offload(cfg: BenchConfig, eff: float, params: ModelParams) -> Optional[OffloadTime]:
    """offload_time of cfg, its gradients' copies overlapping the step's backward passes: the GPU's
    backward at `eff`, or the host's share of its floor (FLOP-proportional) where issuing it takes longer."""
    w, flops = cfg.workload, phase_flops(cfg)
    gpu = flops["backward"] / (cfg.platform.peak_tflops[w.precision.value] * 1e12 * eff)
    host = host_floor(cfg, params)[0] * flops["backward"] / sum(flops.values())
    return offload_time(cfg, max(gpu, host) * w.grad_acc_steps, params)


def optimizer_step(cfg: BenchConfig, params: ModelParams = PARAMS, ranks: Optional[int] = None) -> float:
    """Seconds the optimizer step adds once a step on a GPU (params.optimizer_step_s: base + per module + per
    parameter the rank steps on its GPU: its partition under ZeRO 1-3, less what an optimizer offload steps on
    the host, which offload_time counts); 0 on the cpu platform (its host is its device: a measured efficiency
    holds it). Measured under ZeRO-1; ZeRO-3's own was larger and scattered: for it, a floor. `ranks`: the
    partition's ranks when not cfg's (a record's own run, inverted for cfg)."""
    o = params.optimizer_step_s
    if cfg.platform.device != Device.cuda or not o:
        return 0.0
    w = cfg.workload
    stepped = llama_param_count(w) / ((ranks or cfg.platform.world_size) if cfg.zero.stage >= 1 else 1)
    if cfg.zero.stage == 3 and cfg.deepspeed_config:
        off = read_offload(cfg.deepspeed_config)
        if off.optimizer == "cpu":
            sp = offload_split(cfg, off)
            stepped = sp.elements - sp.host_elements
    return o["base_s"] + o["s_per_module"] * modules_with_parameters(w.num_layers) + o["s_per_parameter"] * stepped


def _step_time(cfg: BenchConfig, eff: float, timed,
               params: ModelParams = PARAMS) -> tuple[float, float, float, float, float]:
    """(compute_s, exposed_comm_s, host_wait_s, offload_s, optimizer_s) per optimizer step at an efficiency.
    host_wait_s: what the host adds where it takes longer to issue a micro-step than the GPU to run it (the
    micro-step's compute and exposed communication): ga x max(0, host floor - GPU). offload_s: what
    ZeRO-3's optimizer offload to the host adds (offload_time.offload_time; 0 without it). optimizer_s:
    the optimizer step on a GPU (optimizer_step)."""
    peak = cfg.platform.peak_tflops[cfg.workload.precision.value] * 1e12
    phase_s = {ph: fl / (peak * eff) for ph, fl in phase_flops(cfg).items()}
    compute = sum(phase_s.values()) * cfg.workload.grad_acc_steps
    cuda = cfg.platform.device == Device.cuda
    groups: dict[tuple[str, int], list[float]] = {}
    for tr, times, _ in timed:
        per_ms = groups.setdefault((tr.phase, tr.microsteps), [0.0, 0.0, 0.0])  # hidden-able, never, unhidden
        if tr.overlappable and tr.async_op and not cuda:       # OVERLAP_RULE, gloo: message by message
            per_ms[1] += prefetch_exposed(times, tr.compute_share, phase_s.get(tr.phase, 0.0))
        elif tr.overlappable and (cuda or tr.async_op):           # OVERLAP_RULE
            per_ms[0] += sum(times)
            per_ms[2] += times[0] if tr.unhidden == "first" else times[-1]
        else:
            per_ms[1] += sum(times)
    exposed_of = {key: key[1] * (never + (max(unhidden, hideable - phase_s.get(key[0], 0.0)) if hideable else 0.0))
                  for key, (hideable, never, unhidden) in groups.items()}
    exposed = sum(exposed_of.values())
    ga = cfg.workload.grad_acc_steps
    gpu_micro = sum(phase_s.values()) + sum(v for (phase, _), v in exposed_of.items() if phase != "step") / ga
    host_wait = ga * max(0.0, host_floor(cfg, params)[0] - gpu_micro)
    off = _offload(cfg, eff, params)
    return (compute, exposed + zero3_calls(cfg, timed, params) * params.zero3_unexplained_s, host_wait,
            off.added_s if off else 0.0, optimizer_step(cfg, params))


def predict(cfg: BenchConfig, calib: Calibration, tokens: Optional[float] = None,
            params: ModelParams = PARAMS) -> Prediction:
    """Memory, communication, step time and throughput of cfg; hours for `tokens` when given.
    step_time_s = compute (executed FLOPs / (declared peak x efficiency)) + exposed communication
    (OVERLAP_RULE) + the wait on a host slower than the GPU (host_floor) + what an optimizer offload
    to the host adds (offload_time) + the optimizer step on a GPU (optimizer_step; the cpu platform's is not
    modelled apart: a measured efficiency contains it).
    With no measured efficiency a GPU takes its roofline (roofline_efficiency)."""
    if tokens is not None and not (isinstance(tokens, (int, float)) and math.isfinite(tokens) and tokens > 0):
        raise HarnessError(f"tokens={tokens!r} is invalid: a positive number of tokens, e.g. 2e9")
    w, p = cfg.workload, cfg.platform
    eff, eff_source = calib.efficiency(w.micro_batch_size), calib.efficiency_source
    roofline = None if calib.efficiency_by_mb else roofline_efficiency(cfg, params)
    if roofline is not None:
        eff, eff_source = roofline
    if not (eff > 0 and math.isfinite(eff)):
        raise HarnessError(f"efficiency {eff} ({eff_source}) is not a positive number")
    timed = _timed(cfg, calib, params)
    compute, exposed, host_wait, offload_s, optimizer_s = _step_time(cfg, eff, timed, params)
    comm = [e for _, _, es in timed for e in es]
    step = compute + exposed + host_wait + offload_s + optimizer_s
    samples_per_s = w.micro_batch_size * w.grad_acc_steps * p.world_size / step
    tokens_per_s = samples_per_s * w.seq_len
    config = {"platform": p.name, "workload": w.name, "nodes": p.nodes, "world_size": p.world_size,
              "zero_stage": cfg.zero.stage, "micro_batch_size": w.micro_batch_size,
              "grad_acc_steps": w.grad_acc_steps, "seq_len": w.seq_len, "precision": w.precision.value,
              "activation_checkpointing": w.activation_checkpointing,
              "checkpoint_every_n_layers": w.checkpoint_every_n_layers,
              "checkpoint_policy": w.checkpoint_policy.value, "overlap_comm": overlap_comm(cfg),
              "gradient_collective": gradient_collective(cfg), "device": p.device.value,
              "compile": w.compile.value, "kernels": w.kernels.value, "attention": w.attention.value}
    notes = [] if p.world_size > 1 else ["one rank: no collectives"]
    if eff > 1:
        notes.append(f"efficiency {eff:.3f} is above the declared peak: the calibration's measurement is faster than "
                     "this model allows (a wrong peak, FLOP count or workload definition?)")
    notes += list(calib.warnings)
    calls = zero3_calls(cfg, timed, params)
    if calls:
        notes.append(f"ZeRO-3 on {p.name}: {calls} collective calls per step x "
                     f"{params.zero3_unexplained_s:g} s each, UNEXPLAINED (params.zero3_unexplained_s, fitted on the "
                     "paper's ZeRO-3 cells, applied on the paper's clusters alone)")
    if host_wait > 0:
        floor, how = host_floor(cfg, params)
        notes.append(f"host-bound: issuing a micro-step takes the host {floor * 1e3:.1f} ms ({how}; params.host_s_per_module, "
                     f"measured), more than the GPU's work; {host_wait:.4g} s per step waiting on the host")
    notes += stack_notes(cfg, host_wait > 0)
    off = _offload(cfg, eff, params)
    if off:
        notes += off.notes
    if cfg.zero.allgather_bucket_size is not None and cfg.zero.stage in (1, 2):
        notes.append("zero.allgather_bucket_size has no effect: DeepSpeed 0.19.8 all-gathers each parameter "
                     "group whole with all_gather_into_tensor (runtime/utils.py)")
    return Prediction(config=config, memory=memory_estimate(cfg), flops_per_step=executed_flops_per_step(cfg),
                      compute_s=compute, comm=comm, comm_s=sum(c.total_time_s for c in comm), exposed_comm_s=exposed,
                      host_wait_s=host_wait, step_time_s=step, samples_per_s=samples_per_s, tokens_per_s=tokens_per_s, efficiency=eff,
                      efficiency_source=eff_source, tokens=tokens,
                      hours=tokens / tokens_per_s / 3600 if tokens else None, overlap_rule=OVERLAP_RULE, notes=notes,
                      offload_s=offload_s, optimizer_s=optimizer_s, offload={"items_s": off.items, "formulas": off.formulas, "step_s": off.step_s,
                                                    "exposed_grads_s": off.exposed_grads_s} if off else None)


MAX_EFFICIENCY = 4.0
"""The largest efficiency an inversion returns: above 1 the measurement beats the declared peak
(reported with a warning, never dropped); above this, the model's communication alone is slower."""


def efficiency_for_step_time(cfg: BenchConfig, calib: Calibration, step_time_s: float,
                             params: ModelParams = PARAMS) -> Optional[float]:
    """The efficiency at which the model's step time equals a measured one (bisection: the step
    time falls as efficiency rises). None when even MAX_EFFICIENCY is slower than the measurement
    (the modelled communication alone exceeds it)."""
    timed = _timed(cfg, calib, params)

    def step(e: float) -> float:
        return sum(_step_time(cfg, e, timed, params))

    lo, hi = 1e-6, MAX_EFFICIENCY
    if step(hi) > step_time_s:
        return None
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if step(mid) > step_time_s else (lo, mid)
    return hi
