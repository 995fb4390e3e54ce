"""The performance model's output as text: one prediction's breakdown, or a sweep's table
(`python -m harness model`)."""
from __future__ import annotations

import statistics

from ..config.choices import Compile, Kernels
from .check import StepTimeCheck
from .perfmodel import Prediction, overlap_summary
from .sweep import fastest
from .stack import Stack


def _gib(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def checkpointing(c: dict) -> str:
    """A prediction config's activation checkpointing in words."""
    every, policy = c.get("checkpoint_every_n_layers", 1), c.get("checkpoint_policy", "full")
    if not c["activation_checkpointing"]:
        return "off"
    return "on" + (f" for 1 layer in {every}" if every > 1 else "") + (f", {policy}" if policy != "full" else "")


def stack(c: dict) -> str:
    """A prediction config's training stack (compile x kernels) in one word (harness/model/stack.py)."""
    return Stack(Compile(c.get("compile", "none")), Kernels(c.get("kernels", "eager"))).word


def describe(pred: Prediction) -> str:
    c = pred.config
    attention = c.get("attention", "auto")
    return (f"{c['workload']} on {c['platform']}: {c['world_size']} ranks ({c['nodes']} node(s)), ZeRO-{c['zero_stage']}, "
            f"micro-batch {c['micro_batch_size']} x grad-acc {c['grad_acc_steps']}, seq {c['seq_len']}, {c['precision']}; "
            f"overlap_comm {str(c['overlap_comm']).lower()}, gradient collective {c['gradient_collective']}, "
            f"activation checkpointing {checkpointing(c)}"
            + (f"; stack {stack(c)}" if stack(c) != "eager" else "")
            + (f", attention {attention}" if attention != "auto" else ""))


def format_prediction(pred: Prediction) -> str:
    """The breakdown of one prediction: memory terms, each collective, compute, step time, hours."""
    m = pred.memory
    lines = [describe(pred), "", f"memory per rank {'GiB':>12}   formula"]
    for name, value, key in (("params", m.params_gib, "params"), ("grads", m.grads_gib, "grads"),
                             ("optimizer", m.optimizer_gib, "optimizer"), ("activations", m.activations_gib, "activations"),
                             ("buffers", m.buffers_gib, "buffers"), ("teacher", m.teacher_gib, "teacher"),
                             ("step transient", m.step_transient_gib, "step_transient"), ("runtime", m.runtime_gib, "")):
        if value or key in ("params", "grads", "optimizer", "activations"):
            lines.append(f"  {name:<16} {_gib(value):>11}   {m.formulas.get(key, '')}")
    verdict = "fits" if m.fits else "OUT OF MEMORY"
    lines += [f"  {'total':<16} {_gib(m.total_gib):>11}   peak in {m.peak_phase}; {m.formulas['total']}",
              f"  {'capacity':<16} {_gib(m.capacity_gib):>11}   {m.formulas['capacity']} -> {verdict}"]
    lines += [f"  note: {n}" for n in m.notes]
    peak = pred.flops_per_step / (pred.compute_s * pred.efficiency) / 1e12 if pred.compute_s else 0.0
    lines += ["", f"compute: {pred.flops_per_step:.3g} FLOP per rank per step / ({peak:g} TFLOP/s x efficiency "
                  f"{pred.efficiency:.3f}) = {pred.compute_s:.4g} s", f"  efficiency: {pred.efficiency_source}"]
    sources: list[str] = []
    lines += ["", f"communication per optimizer step (N = {pred.config['world_size']}):",
              f"  {'op':<15}{'phase':<10}{'message B':>13}{'count':>7}{'busbw GB/s':>12}{'time s':>10}{'total s':>10}  what [source]"]
    for e in pred.comm:
        if e.source not in sources:
            sources.append(e.source)
        lines.append(f"  {e.op:<15}{e.phase:<10}{e.bytes:>13}{e.count:>7}{e.busbw_gbps:>12.4g}{e.time_s:>10.3g}"
                     f"{e.total_time_s:>10.3g}  {e.what} [{sources.index(e.source) + 1}]")
    lines += [f"  [{i + 1}] {s}" for i, s in enumerate(sources)]
    lines += [f"  total {pred.comm_s:.4g} s, exposed {pred.exposed_comm_s:.4g} s",
              f"  overlap: {overlap_summary(pred.config)}"]
    lines += [f"  note: {n}" for n in pred.notes]
    if pred.offload:
        o = pred.offload
        lines += ["", f"optimizer offload to the host: {pred.offload_s:.4g} s a step = step {o['step_s']:.4g} (host Adam, cast, "
                      f"parameters to the GPU; not overlapped) + gradients' copies outlasting backward {o['exposed_grads_s']:.4g}"]
        lines += [f"  {k:<24}{v:>9.4g} s  {o['formulas'][k]}" for k, v in o["items_s"].items()]
    lines += ["", f"step time {pred.step_time_s:.4g} s = compute {pred.compute_s:.4g} + exposed communication "
                  f"{pred.exposed_comm_s:.4g}" + (f" + waiting on the host {pred.host_wait_s:.4g}" if pred.host_wait_s else "")
              + (f" + optimizer offload {pred.offload_s:.4g}" if pred.offload_s else "")
              + (f" + the optimizer step {pred.optimizer_s:.4g}" if pred.optimizer_s else ""),
              f"throughput {pred.samples_per_s:.4g} samples/s, {pred.tokens_per_s:.4g} tokens/s (global)"]
    if pred.hours is not None:
        lines.append(f"hours for {pred.tokens:.3g} tokens: {pred.hours:.4g}")
    return "\n".join(lines)


def format_sweep(preds: list[Prediction]) -> str:
    """One row per configuration: memory, fits/OOM, step time, samples/s, hours."""
    if not preds:
        return "no configuration"
    c = preds[0].config
    several = len({checkpointing(p.config) for p in preds}) > 1
    stacks = len({stack(p.config) for p in preds}) > 1
    lines = [f"{c['workload']} on {c['platform']}: {c['world_size']} ranks, C = {c['micro_batch_size'] * c['grad_acc_steps']}, "
             f"seq {c['seq_len']}, {c['precision']}"
             + ("" if several else f", activation checkpointing {checkpointing(c)}")
             + ("" if stacks or stack(c) == "eager" else f", stack {stack(c)}"),
             f"{'ZeRO':>4} {'mb':>5} {'ga':>5} " + (f"{'stack':<14} " if stacks else "")
             + (f"{'checkpointing':<25} " if several else "")
             + f"{'mem GiB':>9} {'of GiB':>7} {'':<4} {'step s':>9} {'comm s':>8} {'exposed':>8} {'samples/s':>10} "
             f"{'hours':>9}  efficiency"]
    sources: list[str] = []
    for p in preds:
        m, k = p.memory, p.config
        if p.efficiency_source not in sources:
            sources.append(p.efficiency_source)
        hours = f"{p.hours:.4g}" if p.hours is not None else "-"
        ckpt = (f"{stack(k):<14} " if stacks else "") + (f"{checkpointing(k):<25} " if several else "")
        lines.append(f"{k['zero_stage']:>4} {k['micro_batch_size']:>5} {k['grad_acc_steps']:>5} {ckpt}{m.total_gib:>9.4g} "
                     f"{m.capacity_gib:>7.4g} {'ok' if m.fits else 'OOM':<4} {p.step_time_s:>9.4g} {p.comm_s:>8.3g} "
                     f"{p.exposed_comm_s:>8.3g} {p.samples_per_s:>10.4g} {hours:>9}  {p.efficiency:.3f} [{sources.index(p.efficiency_source) + 1}]")
    lines += [f"[{i + 1}] {s}" for i, s in enumerate(sources)]
    busbw = sorted({e.source for p in preds for e in p.comm})
    lines += ["busbw: " + "; ".join(busbw)] if busbw else []
    if preds[0].hours is None:
        lines.append("(give --tokens for the hours column)")
    best = fastest(preds)
    lines.append("fastest that fits: " + ("none" if best is None else
                 f"ZeRO-{best.config['zero_stage']} mb {best.config['micro_batch_size']} x ga {best.config['grad_acc_steps']}"
                 + (f", stack {stack(best.config)}" if stacks or stack(best.config) != "eager" else "")
                 + f", activation checkpointing {checkpointing(best.config)}: {best.step_time_s:.4g} s a step, "
                 f"{best.samples_per_s:.4g} samples/s"))
    return "\n".join(lines)


def format_checks(rows: list[StepTimeCheck], max_error_pct: float | None = None) -> str:
    """Predicted against measured step time, one row per run, with the calibration's sources."""
    if not rows:
        return "no ok training record with a measured step time to check"
    width = max(22, *(len(r.label) + 2 for r in rows))
    lines = [f"{'run':<{width}}{'platform':<13}{'ZeRO':>4} {'mb x ga':>8} {'model s':>9} {'measured s (p10-p90)':>24} "
             f"{'error %':>8} {'compute s':>10} {'comm s':>8} {'load':>5}  efficiency"]
    sources: list[str] = []
    for r in rows:
        if r.efficiency_source not in sources:
            sources.append(r.efficiency_source)
        spread = (f" ({r.measured_p10_s:.3f}-{r.measured_p90_s:.3f})"
                  if r.measured_p10_s is not None and r.measured_p90_s is not None else "")
        load = f"{r.load_avg_1m:.2f}" if r.load_avg_1m is not None else "-"
        flag = " !" if max_error_pct is not None and abs(r.error_pct) > max_error_pct else ""
        lines.append(f"{r.label:<{width}}{r.platform:<13}{r.zero_stage:>4} {r.micro_batch_size:>3} x {r.grad_acc_steps:<3} "
                     f"{r.predicted_step_time_s:>9.3f} {r.measured_step_time_s:>9.3f}{spread:<15} {r.error_pct:>+8.1f} "
                     f"{r.compute_s:>10.3f} {r.exposed_comm_s:>8.3f} {load:>5}  [{sources.index(r.efficiency_source) + 1}]{flag}")
    errors = sorted(abs(r.error_pct) for r in rows)
    median = statistics.median(errors)
    lines += [f"[{i + 1}] {s}" for i, s in enumerate(sources)]
    busbw = sorted({s for r in rows for s in r.busbw_sources})
    lines += ["busbw: " + "; ".join(busbw)] if busbw else []
    lines.append(f"|error| median {median:.1f} %, max {errors[-1]:.1f} % over {len(rows)} run(s)"
                 + (f"; {sum(e > max_error_pct for e in errors)} above {max_error_pct:g} % (marked !)"
                    if max_error_pct is not None else ""))
    lines.append("error = (model - measured) / measured; load = 1-minute load average when the run started")
    return "\n".join(lines)


def format_busbw(rows: list[dict], title: str) -> str:
    """busbw_table as nccl-tests prints a sweep: one block per op, sources numbered."""
    lines, sources = [title], []
    for op in dict.fromkeys(r["op"] for r in rows):
        lines += ["", f"  {op}", f"  {'size B':>12} {'time us':>11} {'algbw GB/s':>11} {'busbw GB/s':>11}  algorithm [source]"]
        for r in (r for r in rows if r["op"] == op):
            if r["source"] not in sources:
                sources.append(r["source"])
            lines.append(f"  {r['size_bytes']:>12} {r['time_us']:>11.4g} {r['algbw_gbps']:>11.4g} {r['busbw_gbps']:>11.4g}  "
                         f"{r['algorithm'] or '-'} [{sources.index(r['source']) + 1}]")
    return "\n".join(lines + [""] + [f"  [{i + 1}] {s}" for i, s in enumerate(sources)])
