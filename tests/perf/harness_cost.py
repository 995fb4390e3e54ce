"""What the harness costs: `make perf`.

    .venv/bin/python tests/perf/harness_cost.py [--stage 2] [--rounds 4] [--steps 10] ...

Runs llama-tiny (ZeRO-2, mb 2 x ga 4 by default) on the cpu platform, alternately
  plain    benchmarks/training/plain_loop.py: a bare DeepSpeed loop, its ranks started here, and
  harness  `python -m harness bench suite=single ...`, the way `make bench` runs it,
with the SAME planned configuration: one TrainSpec (model, DeepSpeed JSON, ZeRO stage, batch
sizes, warm-up and measured steps) and one rank environment (DS_ACCELERATOR=cpu,
OMP_NUM_THREADS=1, ...), both from harness.bench.plan_suite. Rounds are interleaved
(plain, harness, plain, harness, ...) because a 2-core box drifts; each figure is the median
over rounds of the per-round figure. Printed:

1. throughput: harness samples/s (throughput mode) / plain samples/s      target >= 0.97
2. instrumentation: profile-mode vs throughput-mode step time of the harness record
   (informational: profile mode serialises and times every collective, it is not a throughput
   figure; profile steps always run last, after the measured ones)
3. peak memory per rank (ru_maxrss on cpu), harness vs plain, in percent  target < 5 %

Exit status 0 whatever the figures (a MISS is a result); 1 if a run crashed or timed out.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from contract.spec import SPEC_FILE  # noqa: E402
from harness.bench import plan_suite  # noqa: E402
from harness.launch.local import LocalLauncher  # noqa: E402

RATIO_TARGET = 0.97
MEM_TARGET_PCT = 5.0
BUSY_CPUS = 0.15  # other processes' load above which the figures are flagged as noisy


@dataclass
class Round:
    kind: str                       # plain | harness
    index: int
    wall_s: float = 0.0
    ok: bool = False
    error: str = ""
    samples_per_s: Optional[float] = None
    step_time_s: Optional[float] = None
    step_times_s: list[float] = field(default_factory=list)
    profile_step_time_s: Optional[float] = None
    overhead_pct: Optional[float] = None
    peak_mem_gib: list[float] = field(default_factory=list)   # per rank, rank order
    other_load: Optional[float] = None   # CPUs' worth of work by processes not of this run


class LoadMeter:
    """How busy the box was with OTHER work during a run: CPU time the whole machine spent
    (/proc/stat) minus what this script's children used (RUSAGE_CHILDREN, which includes the
    ranks: the harness controller waits for them, this script waits for it), per wall second."""

    def __init__(self):
        self.start = (time.monotonic(), self._busy(), self._ours())

    @staticmethod
    def _busy() -> Optional[float]:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
        except (OSError, ValueError):
            return None
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _ours() -> float:
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        self_ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime + self_ru.ru_utime + self_ru.ru_stime

    def other_cpus(self) -> Optional[float]:
        t0, busy0, ours0 = self.start
        busy1 = self._busy()
        if busy0 is None or busy1 is None:
            return None
        wall = time.monotonic() - t0
        return max((busy1 - busy0) - (self._ours() - ours0), 0.0) / wall if wall > 0 else None


def overrides(args: argparse.Namespace) -> list[str]:
    return ["suite=single", "platform=cpu", "workload=llama-tiny", f"zero=stage{args.stage}",
            f"workload.micro_batch_size={args.mb}", f"workload.grad_acc_steps={args.ga}",
            f"measure.warmup_steps={args.warmup}", f"measure.steps={args.steps}",
            f"measure.profile_steps={args.profile_steps}", f"measure.timeout_s={args.timeout}"]


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in lines[-n:])


def run_plain(args: argparse.Namespace, out: Path, index: int) -> Round:
    """Plan exactly what the harness would run, then start the plain loop's ranks on it."""
    r = Round("plain", index)
    run_dir = out / f"plain-{index}"
    run_dir.mkdir(parents=True)
    _, planned = plan_suite(overrides(args) + [f"out={run_dir}"])
    run = planned[0].run
    spec_path = run_dir / SPEC_FILE
    spec_path.write_text(run.spec.to_json(), encoding="utf-8")
    result_path = run_dir / "result.json"
    argv = [sys.executable, "-m", "benchmarks.training.plain_loop", "--spec", str(spec_path),
            "--out", str(result_path)]
    meter = LoadMeter()
    launch = LocalLauncher().run(dataclasses.replace(run, argv=argv, run_dir=run_dir,
                                                     timeout_s=args.timeout), cwd=REPO_ROOT)
    r.wall_s = launch.wall_s
    r.other_load = meter.other_cpus()
    if launch.timed_out:
        r.error = f"timed out after {args.timeout:g} s"
    elif any(launch.exit_codes.values()):
        r.error = f"rank exit codes {launch.exit_codes}"
    if not r.error and not result_path.exists():
        r.error = f"no {result_path.name} written"
    if r.error:
        r.error += f"; rank0.log ends:\n{_tail(run_dir / 'rank0.log')}"
        return r
    res = json.loads(result_path.read_text(encoding="utf-8"))
    r.ok = True
    r.samples_per_s = res["samples_per_s"]
    r.step_time_s = res["step_time_s"]
    r.step_times_s = res["step_times_s"]
    r.peak_mem_gib = [x["peak_mem_gib"] for x in sorted(res["ranks"], key=lambda x: x["rank"])]
    return r


def run_harness(args: argparse.Namespace, out: Path, index: int, plain_spec: Optional[dict]) -> Round:
    """`python -m harness bench ...` as `make bench` runs it; figures from its record."""
    r = Round("harness", index)
    bench_out = out / f"harness-{index}"
    _, planned = plan_suite(overrides(args) + [f"out={bench_out}"])
    run = planned[0].run
    argv = [sys.executable, "-m", "harness", "bench", "confirm_regressions=0", *overrides(args), f"out={bench_out}"]
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}  # as `make bench`
    log_path = out / f"harness-{index}.log"
    meter = LoadMeter()
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        code = proc.wait(timeout=args.timeout + 60)  # the harness enforces args.timeout itself
    except subprocess.TimeoutExpired:
        code = None
        r.error = f"harness controller still running after {args.timeout + 60:g} s"
    finally:
        if proc.poll() is None:
            _kill_group(proc.pid, signal.SIGINT)  # lets LocalLauncher kill its ranks
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid, signal.SIGKILL)
                proc.wait()
            pids = run.run_dir / "pids.json"
            if pids.exists():
                for pid in json.loads(pids.read_text()).values():
                    _kill_group(int(pid), signal.SIGKILL)
    r.wall_s = time.monotonic() - start
    r.other_load = meter.other_cpus()
    record_path = bench_out / f"{run.run_id}.json"
    if not r.error and code != 0:
        r.error = f"harness exited with code {code}"
    if not r.error and not record_path.exists():
        r.error = f"no record {record_path.name}"
    if r.error:
        r.error += f"; {log_path.name} ends:\n{_tail(log_path)}"
        return r
    rec = json.loads(record_path.read_text(encoding="utf-8"))
    if rec["status"] != "ok":
        r.error = f"record status {rec['status']}: {rec['reason']}"
        return r
    # The two sides must have run the same configuration (only the spec's run_id may differ).
    used = json.loads((run.run_dir / SPEC_FILE).read_text(encoding="utf-8"))
    if plain_spec is not None and {**used, "run_id": ""} != {**plain_spec, "run_id": ""}:
        r.error = f"harness spec.json differs from the plain loop's spec ({run.run_dir})"
        return r
    m = rec["metrics"]
    r.ok = True
    r.samples_per_s = m["samples_per_s"]["value"]
    r.step_time_s = m["step_time_s"]["value"]
    r.step_times_s = [s["step_time_s"] for s in rec["steps"]
                      if s["mode"] == "throughput" and not s["warmup"]]
    if "profile_step_time_s" in m:
        r.profile_step_time_s = m["profile_step_time_s"]["value"]
        r.overhead_pct = m["instrumentation_overhead_pct"]["value"]
    r.peak_mem_gib = [x["peak_mem_gib"] for x in sorted(rec["ranks"], key=lambda x: x["rank"])]
    return r


def _f(v: Optional[float], digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _median(values: list[Optional[float]]) -> Optional[float]:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*headers), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*r) for r in rows])


@dataclass
class Figures:
    """The medians over rounds that report() prints and tests/benchmarks/perf_harness.py bounds."""
    plain_samples_per_s: Optional[float]
    harness_samples_per_s: Optional[float]
    ratio: Optional[float]                       # harness / plain samples/s, target >= RATIO_TARGET
    paired_ratios: list[float]                   # the same, round by round
    harness_step_time_s: Optional[float]
    harness_profile_step_time_s: Optional[float]
    overhead_pct: Optional[float]                # profile vs throughput step time (information)
    plain_peak_mem_gib: list[Optional[float]]    # per rank
    harness_peak_mem_gib: list[Optional[float]]
    mem_added_pct: list[Optional[float]]         # per rank, target < MEM_TARGET_PCT
    worst_mem_added_pct: Optional[float]
    plain_spread_pct: Optional[float]            # the plain rounds alone, max - min over median (>= 2 rounds)
    busiest_other_load: Optional[float]          # CPUs' worth of other processes' work, the busiest run


def figures(rounds: list[Round]) -> Figures:
    ok = [r for r in rounds if r.ok]
    plain = [r for r in ok if r.kind == "plain"]
    harness = [r for r in ok if r.kind == "harness"]
    p_sps = _median([r.samples_per_s for r in plain])
    h_sps = _median([r.samples_per_s for r in harness])
    plain_by_round = {r.index: r for r in plain}
    nranks = max((len(r.peak_mem_gib) for r in ok), default=0)
    p_mem = [_median([r.peak_mem_gib[i] for r in plain if len(r.peak_mem_gib) > i]) for i in range(nranks)]
    h_mem = [_median([r.peak_mem_gib[i] for r in harness if len(r.peak_mem_gib) > i]) for i in range(nranks)]
    add = [100.0 * (h / p - 1) if h and p else None for p, h in zip(p_mem, h_mem)]
    sps = [r.samples_per_s for r in plain]
    return Figures(
        plain_samples_per_s=p_sps, harness_samples_per_s=h_sps,
        ratio=h_sps / p_sps if p_sps and h_sps else None,
        paired_ratios=[h.samples_per_s / plain_by_round[h.index].samples_per_s
                       for h in harness if h.index in plain_by_round],
        harness_step_time_s=_median([r.step_time_s for r in harness]),
        harness_profile_step_time_s=_median([r.profile_step_time_s for r in harness]),
        overhead_pct=_median([r.overhead_pct for r in harness]),
        plain_peak_mem_gib=p_mem, harness_peak_mem_gib=h_mem, mem_added_pct=add,
        worst_mem_added_pct=max((a for a in add if a is not None), default=None),
        plain_spread_pct=(100.0 * (max(sps) - min(sps)) / statistics.median(sps)) if len(sps) >= 2 else None,
        busiest_other_load=max((r.other_load for r in rounds if r.other_load is not None), default=None))


def report(args: argparse.Namespace, rounds: list[Round]) -> str:
    ok = [r for r in rounds if r.ok]
    plain = [r for r in ok if r.kind == "plain"]
    lines = ["", "Rounds (interleaved; step s = median of the measured throughput-mode steps)"]
    rows = []
    for r in rounds:
        load = _f(r.other_load, 2)
        if not r.ok:
            rows.append([str(r.index), r.kind, "FAILED", "-", "-", "-", "-", f"{r.wall_s:.0f}", load])
            continue
        spread = f"{min(r.step_times_s):.3f}-{max(r.step_times_s):.3f}" if r.step_times_s else "-"
        rows.append([str(r.index), r.kind, f"{r.samples_per_s:.3f}", f"{r.step_time_s:.3f}", spread,
                     _f(r.profile_step_time_s) if r.kind == "harness" else "",
                     " / ".join(f"{g:.3f}" for g in r.peak_mem_gib), f"{r.wall_s:.0f}", load])
    lines.append(_table(["round", "run", "samples/s", "step s", "step s min-max", "profile step s",
                         "peak GiB per rank", "wall s", "other load (CPUs)"], rows))

    def verdict(passed: Optional[bool]) -> str:
        return "-" if passed is None else ("PASS" if passed else "MISS")

    fig = figures(rounds)
    p_sps, h_sps, ratio, paired = fig.plain_samples_per_s, fig.harness_samples_per_s, fig.ratio, fig.paired_ratios
    h_step, h_prof, overhead = fig.harness_step_time_s, fig.harness_profile_step_time_s, fig.overhead_pct
    p_mem, h_mem, add = fig.plain_peak_mem_gib, fig.harness_peak_mem_gib, fig.mem_added_pct
    worst, nranks = fig.worst_mem_added_pct, len(p_mem)

    rows = [["throughput samples/s", _f(p_sps), _f(h_sps),
             f"harness/plain {_f(ratio)}" + (f" (per round {', '.join(f'{x:.3f}' for x in paired)})"
                                              if paired else ""),
             f">= {RATIO_TARGET:.2f}", verdict(None if ratio is None else ratio >= RATIO_TARGET)],
            ["step s, throughput -> profile", "", f"{_f(h_step)} -> {_f(h_prof)}",
             f"instrumentation costs {'-' if overhead is None else f'{overhead:+.1f} %'}",
             "(none, info)", "-"]]
    for i, (p, h, a) in enumerate(zip(p_mem, h_mem, add)):
        rows.append([f"peak memory rank {i} GiB", _f(p), _f(h),
                     "harness adds " + ("-" if a is None else f"{a:+.1f} %"),
                     f"< {MEM_TARGET_PCT:g} %", verdict(None if a is None else a < MEM_TARGET_PCT)])
    lines += ["", "Harness cost (medians over rounds)",
              _table(["figure", "plain", "harness", "result", "target", "verdict"], rows)]
    overall = [None if ratio is None else ratio >= RATIO_TARGET,
               None if worst is None else worst < MEM_TARGET_PCT]
    if len(plain) >= 2:
        def spread(values: list[float]) -> float:
            return 100.0 * (max(values) - min(values)) / statistics.median(values)
        mem_spread = max(spread([r.peak_mem_gib[i] for r in plain]) for i in range(nranks))
        lines += ["", f"noise reference: the {len(plain)} plain rounds alone differ by "
                      f"{spread([r.samples_per_s for r in plain]):.1f} % in samples/s and up to "
                      f"{mem_spread:.1f} % in peak memory"]
    busiest = max((r.other_load for r in rounds if r.other_load is not None), default=None)
    if busiest is not None and busiest > BUSY_CPUS:
        lines += ["", f"NOTE: other processes kept up to {busiest:.2f} of this box's {os.cpu_count()} CPUs busy "
                      "during the runs (column 'other load');\n      the ranks need every CPU, so the "
                      "throughput figures measure that load as much as the harness: rerun on a quiet box."]
    lines.append("")
    lines.append(f"throughput {verdict(overall[0])}, memory {verdict(overall[1])}"
                 + ("" if len(ok) == len(rounds) else
                    f"; {len(rounds) - len(ok)} of {len(rounds)} runs FAILED (see above)"))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--stage", type=int, default=2, choices=(0, 1, 2, 3), help="ZeRO stage")
    parser.add_argument("--rounds", type=int, default=4, help="runs of each side, interleaved (2 cannot resolve a 3%% target on a noisy 2-core box)")
    parser.add_argument("--mb", type=int, default=2, help="micro-batch size")
    parser.add_argument("--ga", type=int, default=4, help="gradient accumulation steps")
    parser.add_argument("--warmup", type=int, default=2, help="warm-up optimizer steps")
    parser.add_argument("--steps", type=int, default=10, help="measured optimizer steps")
    parser.add_argument("--profile-steps", type=int, default=3, help="harness profile-mode steps")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    parser.add_argument("--out", type=Path, default=None,
                        help="working directory (default: results/perf-<timestamp>)")
    return parser


def use_venv_tools() -> None:
    """The environment both sides run in (this process's, inherited by the ranks)."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO_ROOT / ".cache" / "torch_extensions"))
    # Both sides load DeepSpeed's ops as `make venv` built them (benchmarks/node/ops.py: no JIT build);
    # should anything else JIT-build into .cache/torch_extensions, it must use the same ninja:
    # ninja 1.11 (/usr/bin) and 1.13 (the venv's) do not read each other's .ninja_log and rebuild
    # from scratch. Use the venv's tools, as an activated venv does.
    venv_bin = str(Path(sys.executable).parent)
    if os.environ.get("PATH", "").split(os.pathsep)[0] != venv_bin:
        os.environ["PATH"] = venv_bin + os.pathsep + os.environ.get("PATH", "")


def describe(r: Round) -> str:
    """One run's progress line."""
    what = (f"{r.samples_per_s:.3f} samples/s, step {r.step_time_s:.3f} s, peak "
            + " / ".join(f"{g:.3f}" for g in r.peak_mem_gib) + " GiB") if r.ok else f"FAILED: {r.error}"
    return f"  round {r.index} {r.kind:<7} {what}  ({r.wall_s:.0f} s, other load {_f(r.other_load, 2)} CPUs)"


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    out = (args.out or REPO_ROOT / "results" / f"perf-{datetime.now():%Y%m%d-%H%M%S}").resolve()
    if out.exists() and any(out.iterdir()):
        parser.error(f"--out {out} is not empty; choose a new directory")
    out.mkdir(parents=True, exist_ok=True)
    use_venv_tools()

    print(f"harness cost: llama-tiny ZeRO-{args.stage}, mb {args.mb} x ga {args.ga}, cpu platform "
          f"(2 gloo ranks, OMP_NUM_THREADS=1, DS_ACCELERATOR=cpu); warm-up {args.warmup} + measured "
          f"{args.steps} steps each, harness also {args.profile_steps} profile steps; "
          f"{args.rounds} rounds, interleaved; logs in {out}", flush=True)
    started = time.monotonic()
    rounds: list[Round] = []
    plain_spec = None
    for index in range(1, args.rounds + 1):
        for kind in ("plain", "harness"):
            r = (run_plain(args, out, index) if kind == "plain"
                 else run_harness(args, out, index, plain_spec))
            if kind == "plain" and r.ok:
                plain_spec = json.loads((out / f"plain-{index}" / SPEC_FILE).read_text(encoding="utf-8"))
            rounds.append(r)
            print(describe(r), flush=True)
    print(report(args, rounds))
    print(f"\ntotal {time.monotonic() - started:.0f} s", flush=True)
    return 0 if all(r.ok for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
