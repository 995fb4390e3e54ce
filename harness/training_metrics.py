"""A training run's metrics from its step events: throughput, MFU and the machine's efficiency, the profiled
steps' communication and waiting, memory, the teacher's share and the last loss.

The record builder (harness/record.py) calls `compute_metrics`; each metric gets its registered unit from
contract/metrics.py `measured`, as the collective records' do.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Optional

from contract.metrics import measured

from .config.schema import BenchConfig
from .config.teacher import teacher_workload
from .held_up import comm_held_up_for_peer_pct, comm_held_up_pct
from .model.flops import forward_flops_per_token, mfu_pct, training_flops_per_token
from .probe import efficiency_pct


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def finite(x: Any) -> Optional[float]:
    """A float for JSON, or None for NaN/inf/missing (a diverged loss must not lose the record)."""
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def compute_metrics(cfg: BenchConfig, steps: list[dict], ranks: list[dict], num_params: Optional[int],
                    teacher: Optional[dict] = None, probes: Optional[list[dict]] = None
                    ) -> tuple[dict[str, dict], Optional[dict]]:
    w, world = cfg.workload, cfg.platform.world_size
    timed = [s["step_time_s"] for s in steps if s["mode"] == "throughput" and not s["warmup"]]
    profiled = [s["step_time_s"] for s in steps if s["mode"] == "profile"]
    out: dict[str, dict] = {}
    flops = None
    if timed:
        med = statistics.median(timed)
        samples = w.micro_batch_size * w.grad_acc_steps * world
        samples_per_s = samples / med
        tokens_per_s = samples_per_s * w.seq_len
        out["samples_per_s"] = measured("samples_per_s", samples_per_s, "throughput")
        out["tokens_per_s"] = measured("tokens_per_s", tokens_per_s, "throughput")
        out["tokens_per_s_per_device"] = measured("tokens_per_s_per_device", tokens_per_s / world, "throughput")
        out["step_time_s"] = measured("step_time_s", med, "throughput", p10=percentile(timed, 10),
                                    p90=percentile(timed, 90), n=len(timed))
        if num_params:
            fm = training_flops_per_token(w, num_params)
            peak = cfg.platform.peak_tflops[w.precision.value]
            out["mfu_pct"] = measured("mfu_pct", mfu_pct(tokens_per_s / world, fm.flops_per_token, peak),
                                      "throughput")
            flops = {"formula": fm.formula, "flops_per_token": fm.flops_per_token,
                     "num_params": fm.num_params, "num_matmul_params": fm.num_matmul_params,
                     "peak_tflops_per_device": peak, "dtype": w.precision.value,
                     "source": "PaLM (Chowdhery et al. 2022) appendix B; peak declared by the platform"}
            tm = forward_flops_per_token(teacher_workload(w), teacher["num_params"]) if teacher else None
            parts = [(fm.flops_per_token, w.precision.value)] + ([(tm.flops_per_token, teacher["dtype"])] if tm else [])
            eff = efficiency_pct(tokens_per_s, parts, probes or [], world // max(cfg.platform.nodes, 1),
                                 cfg.platform.cpu_threads)
            if eff:   # against what this machine measured, not what its platform declares
                out["matmul_eff_pct"] = measured("matmul_eff_pct", eff[0], "throughput", **eff[1])
            if tm:
                with_teacher = fm.flops_per_token + tm.flops_per_token
                out["mfu_with_teacher_pct"] = measured("mfu_with_teacher_pct",
                                                       mfu_pct(tokens_per_s / world, with_teacher, peak), "throughput")
                flops["teacher"] = {"formula": tm.formula, "flops_per_token": tm.flops_per_token,
                                    "num_params": tm.num_params, "num_matmul_params": tm.num_matmul_params,
                                    "dtype": teacher["dtype"]}
                flops["flops_per_token_with_teacher"] = with_teacher
                flops["mfu_note"] = ("mfu_pct counts the student's training FLOPs only; "
                                     "mfu_with_teacher_pct adds the teacher's forward, both over the "
                                     f"declared {w.precision.value} peak")
    if profiled:
        pmed = statistics.median(profiled)
        out["profile_step_time_s"] = measured("profile_step_time_s", pmed, "profile", n=len(profiled))
        if timed:
            out["instrumentation_overhead_pct"] = measured("instrumentation_overhead_pct",
                                                           100.0 * (pmed / statistics.median(timed) - 1), "profile")
        comm = [sum(m["comm_s"] for m in s["microsteps"]) for s in steps if s["mode"] == "profile"]
        out["comm_time_s"] = measured("comm_time_s", statistics.median(comm), "profile", n=len(comm))
        out["comm_fraction_pct"] = measured("comm_fraction_pct", 100.0 * statistics.median(comm) / pmed, "profile")
        prof = [s["microsteps"] for s in steps if s["mode"] == "profile"]
        for name, share in (("comm_held_up_pct", comm_held_up_pct(prof)),
                            ("comm_held_up_for_peer_pct", comm_held_up_for_peer_pct(prof))):
            if share is not None:   # of that communication, the waiting; of it, for a peer (harness/held_up.py)
                out[name] = measured(name, share, "profile")
    if ranks:
        out["peak_mem_gib"] = measured("peak_mem_gib", max(r["peak_mem_gib"] for r in ranks), "throughput",
                                     source=ranks[0]["mem_source"])
    if teacher:
        out["teacher_mem_gib"] = measured("teacher_mem_gib", teacher["bytes_per_rank"] / 2**30, "throughput",
                                        source=f"teacher parameters held by one rank ({teacher['placement']}, "
                                               f"{teacher['dtype']}); included in peak_mem_gib")
    losses = [s["loss"] for s in steps if not s["warmup"] and finite(s["loss"]) is not None]
    if losses:
        out["final_loss"] = measured("final_loss", losses[-1], "throughput")
    return out, flops
