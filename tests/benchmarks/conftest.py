"""What the perf benchmarks (tests/benchmarks/perf_*.py) share: the machine class their runs are saved
under, the bounds their figures must meet, the compare tolerance a benchmark declares for its own
time, and the summary printed after pytest-benchmark's table.

- Bounds are the harness's stated targets (docs/tests.md, docs/measurement.md): a figure that misses
  one fails its benchmark with a message naming the benchmark, the figure and the bound.
- A benchmark whose timed work is fixed by design (the probe, the pulse: timed loops of a set length)
  declares `compare_fail` ("median:25%", pytest-benchmark's --benchmark-compare-fail syntax and
  check); it is judged against the same benchmark in the saved run compared with, unless other
  processes loaded the box in either run (BUSY_CPUS: then "not judged", with the load). Benchmarks
  whose time moves with the machine's pace (a training run, a collective sweep) declare none: their
  gate is the ratio to a plain loop measured in the same rounds.

pytest also loads this file when `make test` walks tests/ (it collects nothing here, the files are
perf_*.py): every hook below does nothing unless a benchmark of this folder ran.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any, Optional

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
STORAGE_ROOT = REPO_ROOT / ".benchmarks"
"""Saved runs: STORAGE_ROOT/<machine class>/<pytest-benchmark's machine id>/NNNN_<commit>_<time>.json."""

BUSY_CPUS = 0.15
"""Other processes' load (CPUs' worth, benchmarks/node/machine.py busy_cpu_s) above which a run's time is
not judged against the saved run's (tests/perf/harness_cost.py flags the same load as noise)."""

ISA_LEVELS = (("amx_bf16", "amx"), ("avx512_bf16", "avx512bf16"), ("avx512f", "avx512"), ("avx2", "avx2"))
"""/proc/cpuinfo flag -> the class's ISA word, best first: what picks torch's CPU kernels (an AVX2 and an
AVX-512 box of one name differ 2x in fp32 matmul, AVX-512 BF16 ~10x in bf16: docs/measurement.md)."""


# --- the machine class -------------------------------------------------------------------------------

def machine_class(cpu_model: Optional[str], num_cpus: int, flags: set[str]) -> str:
    """'<cpu model>-<n>cpu-<isa>' ('amd-epyc-7763-64-core-2cpu-avx2'): runs are compared only within
    one class. The model loses (R), (TM), 'CPU', 'Processor' and the '@ 2.10GHz' clock."""
    model = (cpu_model or "").lower()
    model = re.sub(r"\((r|tm|c)\)|@.*$|\bcpu\b|\bprocessor\b", " ", model)
    slug = re.sub(r"[^a-z0-9]+", "-", model).strip("-") or "unknown-cpu"
    isa = next((word for flag, word in ISA_LEVELS if flag in flags), "baseline")
    return f"{slug}-{num_cpus}cpu-{isa}"


def this_machine_class() -> str:
    """This machine's class: /proc/cpuinfo's model and flags, the CPUs this process may use."""
    from benchmarks.node.machine import cpu_model
    from benchmarks.node.probe import cpu_flags

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return machine_class(cpu_model(), usable, cpu_flags())


# --- bounds --------------------------------------------------------------------------------------------

class Op(str, Enum):
    AT_LEAST = ">="
    AT_MOST = "<="
    BELOW = "<"


@dataclass(frozen=True)
class Bound:
    """A figure's stated threshold: `figure op limit unit`, and where it is stated."""
    figure: str          # what is bounded, as a reader says it: "harness/plain samples/s"
    op: Op
    limit: float
    unit: str            # "" for a ratio
    source: str          # "docs/tests.md: the harness's throughput target"

    def met(self, value: float) -> bool:
        return {Op.AT_LEAST: value >= self.limit, Op.AT_MOST: value <= self.limit,
                Op.BELOW: value < self.limit}[self.op]

    def text(self) -> str:
        return f"{self.op.value} {_fmt(self.limit, self.unit)}"


def _fmt(value: float, unit: str) -> str:
    return f"{value:.4g}" + (f" {unit}" if unit else "")


def miss(benchmark: str, bound: Bound, value: Optional[float], note: str = "") -> Optional[str]:
    """None when value meets the bound, else what `make perf` says: the benchmark, the figure, its
    value, the bound and where it is stated (and a note on the cause, such as a busy box)."""
    if value is not None and bound.met(value):
        return None
    got = "not measured" if value is None else _fmt(value, bound.unit)
    return (f"{benchmark}: {bound.figure} {got}, bound {bound.text()} ({bound.source})"
            + (f"; {note}" if note else ""))


@dataclass
class Figure:
    """One figure of a benchmark as saved in its extra_info and printed in the summary."""
    name: str
    value: Optional[float]
    unit: str = ""
    bound: str = ""          # "" for a figure kept for information
    verdict: str = "info"    # PASS | MISS | info


@dataclass
class FigureBook:
    """The figures of one benchmark: noted for information or checked against a Bound, kept in the
    benchmark's extra_info (so they are saved and compared), the misses raised at the end."""
    benchmark: str
    extra_info: dict[str, Any]
    misses: list[str] = field(default_factory=list)

    def _keep(self, figure: Figure) -> None:
        self.extra_info.setdefault("figures", []).append(asdict(figure))

    def note(self, name: str, value: Optional[float], unit: str = "") -> None:
        self._keep(Figure(name, None if value is None else round(value, 4), unit))

    def check(self, bound: Bound, value: Optional[float], note: str = "") -> None:
        missed = miss(self.benchmark, bound, value, note)
        self._keep(Figure(bound.figure, None if value is None else round(value, 4), bound.unit, bound.text(),
                          "PASS" if missed is None else "MISS"))
        if missed:
            self.misses.append(missed)

    def other_load(self, cpus: Optional[float]) -> None:
        """The other processes' load while the benchmark ran (its busiest round), in CPUs' worth: above
        BUSY_CPUS, in this run or in the saved one, its time is not judged."""
        if cpus is not None:
            self.extra_info["other_load_cpus"] = round(max(cpus, self.extra_info.get("other_load_cpus", 0.0)), 3)

    def compare_fail(self, spec: str) -> None:
        """Declare this benchmark's own --benchmark-compare-fail ("median:25%"), checked against the
        saved run compared with."""
        from pytest_benchmark.utils import parse_compare_fail

        parse_compare_fail(spec)   # the same syntax; a typo fails here, not at the end of the run
        self.extra_info["compare_fail"] = spec

    def assert_met(self) -> None:
        """Fail the benchmark (and `make perf`) with every miss, one a line."""
        if self.misses:
            pytest.fail("\n".join(self.misses), pytrace=False)


@dataclass(frozen=True)
class PerfSettings:
    rounds: Optional[int]    # every benchmark's rounds; None: each its own
    steps: Optional[int]     # the training runs' measured steps; None: tests/perf/harness_cost.py's


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("perf benchmarks", "make perf's benchmarks (tests/benchmarks)")
    group.addoption("--perf-rounds", type=int, default=None,
                    help="rounds of every perf benchmark (default: each its own, as make perf runs them)")
    group.addoption("--perf-steps", type=int, default=None,
                    help="measured optimizer steps of the training runs (default 10)")


@pytest.fixture(scope="session")
def perf_settings(request: pytest.FixtureRequest) -> PerfSettings:
    rounds, steps = request.config.getoption("perf_rounds"), request.config.getoption("perf_steps")
    for name, value in (("--perf-rounds", rounds), ("--perf-steps", steps)):
        if value is not None and value < 1:
            raise pytest.UsageError(f"{name} {value}: must be 1 or more")
    return PerfSettings(rounds, steps)


@pytest.fixture(scope="session")
def perf_out() -> Path:
    """Where the benchmarks' runs keep their logs and records: results/perf-<time>-benchmarks/."""
    out = REPO_ROOT / "results" / f"perf-{datetime.now():%Y%m%d-%H%M%S}-benchmarks"
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture
def figures(benchmark, request: pytest.FixtureRequest) -> FigureBook:
    return FigureBook(request.node.name, benchmark.extra_info)


# --- the declared compare tolerance and the summary -----------------------------------------------

def _session(config: pytest.Config):
    bs = getattr(config, "_benchmarksession", None)
    return bs if bs is not None and any(b and "figures" in b.extra_info for b in bs.benchmarks) else None


def run_label(path: Path) -> str:
    """A saved run's file as a reader names it: '0003 (commit 5a79e61, 2026-11-27 19:22)'."""
    m = re.match(r"(\d{4})_([0-9a-f]+)_(\d{4})(\d\d)(\d\d)_(\d\d)(\d\d)", path.stem)
    return f"{m[1]} (commit {m[2][:7]}, {m[3]}-{m[4]}-{m[5]} {m[6]}:{m[7]})" if m else path.stem


def _compared(bs) -> tuple[Optional[str], dict[str, dict[str, Any]]]:
    """(the saved run compared with, as run_label names it; its benchmarks by full name)."""
    for path, mapping in bs.compared_mapping.items():
        return run_label(Path(path)), mapping
    return None, {}


@dataclass
class TimeChecks:
    """The declared compare tolerances against the saved run: what grew beyond one, and what was not
    judged because other work loaded the box in one of the two runs."""
    regressed: list[str] = field(default_factory=list)
    not_judged: list[str] = field(default_factory=list)


def check_times(bs) -> TimeChecks:
    """Each benchmark that declared compare_fail, against the same benchmark in the saved run."""
    from pytest_benchmark.utils import parse_compare_fail

    _, old = _compared(bs)
    out = TimeChecks()
    for bench in bs.benchmarks:
        spec = bench.extra_info.get("compare_fail") if bench else None
        if not spec or bench.fullname not in old:
            continue
        check = parse_compare_fail(spec)
        before = old[bench.fullname]["stats"]
        if not check.fails(bench, before):
            continue
        now_v, then_v = bench[check.field], before[check.field]
        what = (f"{bench.name}: {check.field} {now_v:.4g} s against {then_v:.4g} s in the saved run"
                + (f" ({100 * (now_v / then_v - 1):+.0f} %)" if then_v else ""))
        loads = [x for x in (bench.extra_info.get("other_load_cpus"),
                             old[bench.fullname].get("extra_info", {}).get("other_load_cpus")) if x is not None]
        if loads and max(loads) > BUSY_CPUS:
            out.not_judged.append(f"{what}: other processes kept up to {max(loads):.2f} CPUs busy in one of the "
                                  f"two runs (over {BUSY_CPUS:g}): rerun on a quiet box")
        else:
            out.regressed.append(f"{what}, beyond its declared {spec}")
    return out


_TIMES = pytest.StashKey[TimeChecks]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    bs = _session(session.config)
    if bs is None:
        return
    times = check_times(bs)
    session.config.stash[_TIMES] = times
    if times.regressed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def summary(now: dict[str, dict[str, Any]], saved: dict[str, dict[str, Any]], source: Optional[str],
            times: TimeChecks) -> list[str]:
    """The lines under pytest-benchmark's table. now, saved: each benchmark's extra_info by its name, in
    this run and in the saved run compared with (source); times: the declared tolerances. First how it
    went, then each miss, then every figure grouped under its benchmark, now and in the saved run."""
    verdicts = [f["verdict"] for info in now.values() for f in info.get("figures", [])]
    lines = [f"figures: {verdicts.count('PASS')} PASS, {verdicts.count('MISS')} MISS, "
             f"{verdicts.count('info')} for information; time regressions: {len(times.regressed)}"
             + (f", {len(times.not_judged)} not judged" if times.not_judged else ""),
             f"compared with the saved run {source}" if source
             else "no saved run of this machine class to compare with"]
    rows: list[list[str]] = []
    for name in sorted(now):
        spec = now[name].get("compare_fail")
        rows.append([name + (f"  (its time: {spec} against the saved run)" if spec else "")])
        before = {f["name"]: f.get("value") for f in saved.get(name, {}).get("figures", [])}
        for f in now[name].get("figures", []):
            value = "-" if f["value"] is None else _fmt(f["value"], f["unit"])
            then = before.get(f["name"])
            rows.append(["  " + f["name"], value, "-" if then is None else _fmt(then, f["unit"]),
                         f["bound"] or "-", f["verdict"]])
            if f["verdict"] == "MISS":
                lines.append(f"  MISS {name}: {f['name']} {value}, bound {f['bound']}")
    lines += [f"  REGRESSION {line}" for line in times.regressed]
    lines += [f"  not judged: {line}" for line in times.not_judged]
    headers = ["figure", "now", "saved run", "bound", "verdict"]
    widths = [max([len(h)] + [len(r[i]) for r in rows if len(r) > 1]) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines += ["", fmt.format(*headers).rstrip(), fmt.format(*("-" * w for w in widths))]
    lines += [(fmt.format(*r) if len(r) > 1 else r[0]).rstrip() for r in rows]
    return lines


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter) -> None:
    """After pytest-benchmark's table: how it went, then every figure now and in the run compared with."""
    bs = _session(terminalreporter.config)
    if bs is None:
        return
    source, old = _compared(bs)
    now = {b.name: b.extra_info for b in bs.benchmarks if b and "figures" in b.extra_info}
    saved = {b.name: old[b.fullname].get("extra_info", {}) for b in bs.benchmarks if b and b.fullname in old}
    terminalreporter.section("make perf: the harness's own cost", sep="-")
    for line in summary(now, saved, source, terminalreporter.config.stash.get(_TIMES, TimeChecks())):
        terminalreporter.write_line(line)
