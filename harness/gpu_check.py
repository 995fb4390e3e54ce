"""`make gpu-check` / `python -m harness gpu-check [overrides]`: the GPU path, true on the node it
runs on, in one command (at most about 8 minutes on one H100).

1. the node's GPUs are detected (torch: CUDA, count, name); without CUDA a clear message, exit 2;
2. the platform is the one whose declared GPU the detected one is (harness/hardware.py), on this
   node alone (nodes=1, local launcher, no container: the check runs in this environment), with
   the node's GPU count; `platform=...` on the command line chooses it instead;
3. the `gpu-check` suite runs (harness.bench; `suite=...` replaces it, e.g. gpu-check-cpu, the same
   flow at cpu size, which CI runs, or gpu-8b-h100 / gpu-8b-h200): every collective through nccl (a
   one-rank smoke, claiming no bandwidth, on one GPU), then the paper's Model 1 (llama-440m, as
   conf/workload defines it) under ZeRO 0, 1, 2, 3, compiled, and distilled from a larger teacher
   (llama-440m-kd, beside its twin without a teacher);
4. the instrument's cost: the ZeRO-2 run again as a bare DeepSpeed loop (benchmarks/training/plain_loop.py,
   the same TrainSpec), harness samples/s against plain samples/s;
5. gpu-check.md and gpu-check.json in OUT: per run MFU, measured peak memory beside the memory
   model's prediction, profile-mode overhead; the collectives' correctness; the plain-loop ratio;
   each distillation run's MFU with and without the teacher's forward beside its twin's, and the
   teacher's memory; for runs that offload to the host, the memory model's host figure.
Exit 0 when every run is ok (an OOM is a result, reported), 3 when a run failed.
"""
from __future__ import annotations

import dataclasses
import json
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from contract.spec import SPEC_FILE

from .atomic import write_bytes_atomic, write_text_atomic
from .bench import EXIT_RUN_FAILED, PlannedRun, bench, drop_compile_cache, plan_suite
from .config.choices import RunKind
from .config.compose import compose, group_options
from .config.schema import REPO_ROOT
from .errors import HarnessError
from .hardware import GPU_NAMES
from .launch.local import LocalLauncher
from .model.calibration import calibrate
from .model.memory import memory_estimate
from .model.offload import host_capacity_gib, offload_settings, read_meminfo
from .model.perfmodel import predict
from .report.summary import text_table
from .stack_view import STACK_HEADERS, break_lines, cache_label, stack_fields, stack_row, stack_words
from .tune.parity import stack_parity
from .record import ResultRecord, write_json_atomic
from .verdict.record_files import load_records

SUITE = "gpu-check"
OVERHEAD_RUN = "z2"
OVERHEAD_RUNS = ("z2", "z1-compile")
"""The suite runs whose configurations the plain DeepSpeed loop repeats (those the suite has): the
eager ZeRO-2 and the compiled ZeRO-1 (the bare loop compiles the same way: the instrument's cost on
the compiled path)."""
EXIT_NO_GPU = 2


@dataclass
class Detected:
    cuda: bool
    count: int = 0
    name: Optional[str] = None
    why: str = ""


def detect() -> Detected:
    """The node's CUDA devices as torch sees them (the ranks see the same)."""
    try:
        import torch
    except ImportError as exc:
        return Detected(False, why=f"torch cannot be imported ({exc})")
    if not torch.cuda.is_available():
        build = torch.version.cuda
        return Detected(False, why=(f"torch {torch.__version__} sees no CUDA device ("
                                    + (f"a CUDA {build} build: no GPU or driver visible" if build
                                       else "a CPU-only build of torch") + ")"))
    return Detected(True, torch.cuda.device_count(), torch.cuda.get_device_name(0))


def platform_overrides(detected: Detected, user: list[str]) -> list[str]:
    """The platform of the detected GPU, on this node alone; the user's `platform=` wins."""
    chosen = next((a.split("=", 1)[1] for a in user if a.startswith("platform=")), None)
    if chosen is None:
        models = [m for m, pattern in GPU_NAMES.items() if re.search(pattern, detected.name or "", re.I)]
        candidates = []
        for name in group_options("platform"):
            p = compose([f"platform={name}"]).platform
            if p.gpu_model in models:
                candidates.append((p.nodes, p.gpus_per_node != detected.count, name))
        if not candidates:
            raise HarnessError(f"no platform in conf/platform/ declares the detected GPU {detected.name!r}; "
                               "add one (and its model to harness/hardware.py GPU_NAMES) or pass platform=<name>")
        chosen = min(candidates)[2]
    return [f"platform={chosen}", f"platform.gpus_per_node={detected.count}", "platform.nodes=1",
            "platform.launcher=local", "platform.container.runtime=none", "platform.container.image=null"]


def plain_loop(p: PlannedRun, out: Path) -> dict[str, Any]:
    """The same TrainSpec as a bare DeepSpeed loop (no events, no timers, no instrument)."""
    run_dir = out / f"{p.run.run_id}-plain"
    run_dir.mkdir(parents=True, exist_ok=True)
    spec_path = run_dir / SPEC_FILE
    write_text_atomic(spec_path, p.run.spec.to_json())
    result = run_dir / "result.json"
    argv = [sys.executable, "-m", "benchmarks.training.plain_loop", "--spec", str(spec_path), "--out", str(result)]
    # a compiled run's: the compilers' caches its harness run filled (kept by bench for it, dropped by gpu_check),
    # so the bare loop loads the graphs and kernels the harness compiled cold instead of compiling them again
    # (its steps are what it measures, not its compile: 65 s of a 2-core box's gpu-check-cpu, ~50 s of an H100's)
    plain = dataclasses.replace(p.run, argv=argv, run_dir=run_dir)
    launch = LocalLauncher().run(plain, cwd=REPO_ROOT)
    if launch.timed_out or any(launch.exit_codes.values()) or not result.exists():
        return {"ok": False, "reason": (f"timed out after {p.run.timeout_s:g} s" if launch.timed_out
                                        else f"rank exit codes {launch.exit_codes}; see {run_dir}/rank0.log")}
    return {"ok": True, **json.loads(result.read_text(encoding="utf-8"))}


@dataclass
class Summary:
    platform: str
    device: str
    training: list[dict[str, Any]] = field(default_factory=list)
    collectives: list[dict[str, Any]] = field(default_factory=list)
    plain: list[dict[str, Any]] = field(default_factory=list)
    parity: list[dict[str, Any]] = field(default_factory=list)
    """Each stack variant's losses against its eager twin (harness/tune/parity.py stack_parity)."""
    distillation: list[dict[str, Any]] = field(default_factory=list)
    """Each distillation run beside its twin without a teacher (same student, stage, split, stack)."""
    host_available_gib: Optional[float] = None
    """MemAvailable of the node when the summary was written (None: not readable)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _value(rec: ResultRecord, metric: str) -> Optional[float]:
    m = rec.metrics.get(metric)
    return m.get("value") if isinstance(m, dict) else None


def _offload_times(p: PlannedRun, rec: ResultRecord) -> dict[str, Optional[float]]:
    """An offloaded run's step time and optimizer-step phase (the median over its profiled steps of the
    last micro-step's `step` phase) beside the performance model's (harness/model/offload_time.py)."""
    phases = [x for x in (step[-1].get("phase_s", {}).get("step") for step in rec.microsteps if step) if x is not None]
    try:
        pred = predict(p.cfg, calibrate([], p.cfg, []))
    except (HarnessError, ValueError, KeyError):   # the report keeps the measurement; the model's column says '-'
        pred = None
    return {"step_time_s": _value(rec, "step_time_s"), "optimizer_step_s": statistics.median(phases) if phases else None,
            "predicted_step_time_s": pred.step_time_s if pred else None,
            "predicted_offload_step_s": ((pred.offload or {}).get("step_s") if pred else None)}


def summarise(records: dict[str, ResultRecord], planned: list[PlannedRun], platform: str, device: str,
              plain: Optional[dict[str, dict[str, Any]]]) -> Summary:
    """Per training run: status, ZeRO stage, samples/s, MFU, measured peak beside the memory
    model's, profile-mode overhead; per collective: smoke or busbw, wrong elements; the plain
    loop's samples/s against the harness's for the same configuration."""
    s = Summary(platform, device)
    for p, rec in ((p, records.get(rid)) for p in planned for rid in p.run.record_ids()):
        if rec is None:
            continue
        if p.cfg.kind == RunKind.training:
            offload = offload_settings(getattr(p.run.spec, "deepspeed", None))
            est = memory_estimate(p.cfg, offload=offload)
            measured = _value(rec, "peak_mem_gib")
            s.training.append({
                "run": p.run.name, "workload": p.cfg.workload.name, "zero": p.cfg.zero.stage,
                "status": rec.status, "reason": rec.reason,
                "micro_batch_size": p.cfg.workload.micro_batch_size, "grad_acc_steps": p.cfg.workload.grad_acc_steps,
                "samples_per_s": _value(rec, "samples_per_s"), "mfu_pct": _value(rec, "mfu_pct"),
                "peak_mem_gib": measured, "predicted_peak_gib": est.total_gib, "predicted_oom": not est.fits,
                "peak_error_pct": (100 * (est.total_gib - measured) / measured) if measured else None,
                "profile_overhead_pct": _value(rec, "instrumentation_overhead_pct"),
                "stack": stack_label(p.cfg.workload), **stack_fields(rec.metrics, rec.environment.get("stack")),
                "mfu_with_teacher_pct": _value(rec, "mfu_with_teacher_pct"), "teacher_mem_gib": _value(rec, "teacher_mem_gib"),
                "predicted_teacher_gib": est.teacher_gib if p.cfg.workload.distill is not None else None,
                "offload": (f"optimizer {offload.optimizer} (ratio {offload.ratio:g}), param {offload.param}"
                            if offload.active else None), "predicted_host_gib": est.host_gib,
                **(_offload_times(p, rec) if offload.active else {})})
            continue
        smoke = rec.smoke
        rows = rec.rows or (smoke or {}).get("rows") or []
        wrong = sum((r[k] or {}).get("num_wrong") or 0 for r in rows for k in ("out_of_place", "in_place"))
        s.collectives.append({"op": rec.benchmark, "status": rec.status, "smoke": bool(smoke),
                              "sizes": len(rows), "num_wrong": wrong, "avg_busbw_gbps": _value(rec, "avg_busbw_gbps")})
    names = {rid: p.run.name for p in planned for rid in p.run.record_ids()}
    for sp in stack_parity(list(records.values())):
        s.parity.append({"run": names.get(sp.variant.run_id, sp.variant.run_id),
                         "eager": names.get(sp.eager.run_id, sp.eager.run_id), **sp.parity.to_dict(), "why": sp.why})
    s.distillation = distillation_rows(s.training)
    for name, result in (plain or {}).items():
        harness = next((t for t in s.training if t["run"] == name), None)
        ratio = (harness["samples_per_s"] / result["samples_per_s"]
                 if result.get("ok") and harness and harness["samples_per_s"] else None)
        s.plain.append({**{k: result.get(k) for k in ("ok", "reason", "samples_per_s")}, "run": name,
                        "harness_over_plain": ratio, "compile_cache": cache_label(result.get("compile_cache"))})
    return s


def distillation_rows(training: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each distillation run beside its twin: the same student without a teacher (workload name less
    `-kd`), at the same ZeRO stage, micro-batch split and stack; the teacher's cost in throughput and
    the peak memory it adds, measured and as the memory model has it."""
    rows = []
    for t in (t for t in training if t["workload"].endswith("-kd")):
        twin = next((u for u in training if u["workload"] == t["workload"][:-3] and all(
            u[k] == t[k] for k in ("zero", "micro_batch_size", "grad_acc_steps", "stack"))), None)
        both = twin is not None and t["peak_mem_gib"] is not None and twin["peak_mem_gib"] is not None
        rows.append({"run": t["run"], "twin": twin["run"] if twin else None,
                     "samples_per_s": t["samples_per_s"], "twin_samples_per_s": twin["samples_per_s"] if twin else None,
                     "mfu_pct": t["mfu_pct"], "mfu_with_teacher_pct": t["mfu_with_teacher_pct"],
                     "twin_mfu_pct": twin["mfu_pct"] if twin else None,
                     "teacher_mem_gib": t["teacher_mem_gib"], "predicted_teacher_gib": t["predicted_teacher_gib"],
                     "added_peak_gib": t["peak_mem_gib"] - twin["peak_mem_gib"] if both else None,
                     "predicted_added_peak_gib": t["predicted_peak_gib"] - twin["predicted_peak_gib"] if twin else None})
    return rows


def stack_label(w: Any) -> str:
    """The run's training stack in a few words: eager, compile, compile+fp8, liger, attn=math, ..."""
    return stack_words({k: getattr(w, k).value for k in ("compile", "kernels", "precision", "attention")})


def _f(x: Optional[float], fmt: str = ".1f") -> str:
    return "-" if x is None else format(x, fmt)


def markdown(s: Summary) -> str:
    lines = [f"# gpu-check on {s.device} (platform {s.platform})", "",
             "| run | ZeRO | mb x ga | status | samples/s | MFU % | peak GiB | predicted GiB | error % | profile overhead % |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for t in s.training:
        status = t["status"] + (f" ({t['reason']})" if t["reason"] else "")
        lines.append(f"| {t['run']} | {t['zero']} | {t['micro_batch_size']} x {t['grad_acc_steps']} | {status} | "
                     f"{_f(t['samples_per_s'])} | {_f(t['mfu_pct'])} | {_f(t['peak_mem_gib'], '.2f')} | "
                     f"{_f(t['predicted_peak_gib'], '.2f')}{' (OOM)' if t['predicted_oom'] else ''} | "
                     f"{_f(t['peak_error_pct'], '+.1f')} | {_f(t['profile_overhead_pct'])} |")
    stacked = [t for t in s.training if t.get("stack", "eager") != "eager"]
    if stacked:
        lines += ["", text_table(STACK_HEADERS, [stack_row(t["run"], t["stack"], t) for t in stacked], markdown=True)]
        breaks = [f"- {line}" for t in stacked for line in break_lines(t["run"], t)]
        lines += ["", *breaks] if breaks else []
    if s.distillation:
        lines += ["", "| distilled | twin | samples/s (twin) | MFU % | MFU+teacher % | twin MFU % | teacher GiB "
                      "| model GiB | added peak GiB (model) |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {d['run']} | {d['twin'] or '-'} | {_f(d['samples_per_s'])} ({_f(d['twin_samples_per_s'])}) | "
                  f"{_f(d['mfu_pct'])} | {_f(d['mfu_with_teacher_pct'])} | {_f(d['twin_mfu_pct'])} | "
                  f"{_f(d['teacher_mem_gib'], '.2f')} | {_f(d['predicted_teacher_gib'], '.2f')} | "
                  f"{_f(d['added_peak_gib'], '+.2f')} ({_f(d['predicted_added_peak_gib'], '+.2f')}) |" for d in s.distillation]
        lines += ["", "MFU % counts the student's training FLOPs; MFU+teacher % adds the teacher's forward "
                      "(2 N_t + 4 L_t h_t s a token). teacher GiB: its parameters on the rank (the record's teacher_mem_gib); "
                      "model GiB: the memory model's teacher term, parameters + logits. Added peak: the run's peak less "
                      "its twin's (the teacher, and the distillation loss's head in place of cross-entropy's)."]
    offloaded = [t for t in s.training if t.get("offload")]
    if offloaded:
        cap = f"{host_capacity_gib(s.host_available_gib):.1f}" if s.host_available_gib else "-"
        lines += ["", "| run | offload | host GiB per rank (model) | host capacity GiB (0.9 x available now) | step s (model) "
                      "| optimizer step s, profiled (model: host Adam, cast, parameters up) |", "|---|---|---|---|---|---|"]
        lines += [f"| {t['run']} | {t['offload']} | {_f(t['predicted_host_gib'])} | {cap} | {_f(t.get('step_time_s'), '.3f')} "
                  f"({_f(t.get('predicted_step_time_s'), '.3f')}) | {_f(t.get('optimizer_step_s'), '.3f')} "
                  f"({_f(t.get('predicted_offload_step_s'), '.3f')}) |" for t in offloaded]
    lines += ["", "| collective | status | sizes | #wrong | avg busbw GB/s |", "|---|---|---|---|---|"]
    for c in s.collectives:
        busbw = "smoke: one rank, no bandwidth" if c["smoke"] else _f(c["avg_busbw_gbps"], ".2f")
        lines.append(f"| {c['op']} | {c['status']} | {c['sizes']} | {c['num_wrong']} | {busbw} |")
    if s.parity:
        lines += ["", "| variant | against | loss parity | max relative difference | tolerance | why that tolerance |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {q['run']} | {q['eager']} | {'ok' if q['ok'] else 'FAIL'} | {_f(q['max_rel_diff'], '.1e')} | "
                  f"{q['tolerance']:.0e} | {q['why']} |" for q in s.parity]
    for p in s.plain:
        lines += ["", (f"Instrument's cost: harness {p['run']} throughput = {_f(p['harness_over_plain'], '.3f')} x "
                       f"a bare DeepSpeed loop of the same TrainSpec ({_f(p['samples_per_s'])} samples/s"
                       + (f"; {p['compile_cache']}" if p.get("compile_cache")
                          else "") + ")")
                  if p["ok"] else f"Instrument's cost ({p['run']}): the plain loop failed: {p['reason']}"]
    return "\n".join(lines) + "\n"


def gpu_check(args: list[str], detected: Optional[Detected] = None) -> int:
    """Run the check; `detected` replaces detection (tests on cpu pass platform=cpu and a stand-in)."""
    detected = detected or detect()
    if not detected.cuda:
        print("error: gpu-check needs a node with NVIDIA GPUs and a CUDA build of torch: "
              f"{detected.why}. On a machine without a GPU use `make bench` (the cpu platform).",
              file=sys.stderr)
        return EXIT_NO_GPU
    user = [a for a in args if not a.startswith("platform=")]
    suite = [] if any(a.startswith("suite=") for a in user) else [f"suite={SUITE}"]   # the user's suite wins
    overrides = [*suite, *platform_overrides(detected, args), *user]
    out, planned = plan_suite(overrides)
    print(f"gpu-check: {detected.count} x {detected.name} -> platform {planned[0].cfg.platform.name}", flush=True)
    rc = bench(overrides + ([] if any(a.startswith("out=") for a in user) else [f"out={out}"]),
               keep_compile_cache=OVERHEAD_RUNS)
    records = {path.stem: rec for path, rec in load_records([out]).records}
    plain: dict[str, dict[str, Any]] = {}
    try:
        for target in (p for p in planned if p.run.name in OVERHEAD_RUNS):
            ran = records.get(target.run.run_id)
            if ran is not None and ran.status == "ok":
                print(f"gpu-check: the instrument's cost: {target.run.name} as a bare DeepSpeed loop", flush=True)
                plain[target.run.name] = plain_loop(target, out)
    finally:
        for p in planned:
            drop_compile_cache(p.run)
    s = summarise(records, planned, planned[0].cfg.platform.name, f"{detected.count} x {detected.name}", plain)
    s.host_available_gib = (read_meminfo() or {}).get("MemAvailable")
    text = markdown(s)
    print("\n" + text)
    write_bytes_atomic(out / "gpu-check.md", text.encode("utf-8"))
    write_json_atomic(out / "gpu-check.json", s.to_dict())
    failed = rc != 0 or any(not p["ok"] for p in plain.values()) or any(q["ok"] is False for q in s.parity)
    return EXIT_RUN_FAILED if failed else 0
