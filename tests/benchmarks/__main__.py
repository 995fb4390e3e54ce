"""`make perf`'s benchmark part:  python -m tests.benchmarks [pytest options, e.g. --perf-rounds 2]

Runs tests/benchmarks/perf_*.py under pytest-benchmark, saves the run in .benchmarks/<machine class>/
(tests/benchmarks/conftest.py machine_class) and, when a run of that class is saved there, compares
with the last one: pytest-benchmark's table shows each benchmark's time now and then, the summary
under it each figure now and then. The run compared with is the last saved one that holds every
benchmark (a run narrowed with -k saves only some of them). Exit status: pytest's (non-zero when a
figure misses its bound, a declared compare tolerance is exceeded or a run fails).
"""
from __future__ import annotations

import ast
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Optional

import pytest
from pytest_benchmark.utils import get_machine_id

from tests.benchmarks.conftest import REPO_ROOT, STORAGE_ROOT, this_machine_class

HERE = Path(__file__).resolve().parent
COLUMNS = "min,median,max,rounds"
"""Seconds, every row; a table per benchmark (--benchmark-group-by=name), so that the factor pytest-benchmark
prints beside each figure compares this run with the saved one, not one benchmark with another; short
names ('harness_vs_plain_loop (0002)') so that the table fits 120 columns."""


def saved_runs(storage: Path) -> list[Path]:
    """The runs saved in storage that pytest-benchmark's --benchmark-compare would read (its own
    machine id folder: system, Python, bits), oldest first."""
    return sorted((storage / get_machine_id()).glob("[0-9][0-9][0-9][0-9]_*.json"))


def benchmark_files() -> list[str]:
    return sorted(str(p.relative_to(REPO_ROOT)) for p in HERE.glob("perf_*.py"))


def benchmark_names() -> set[str]:
    """Every benchmark's full name as pytest-benchmark saves it ('tests/benchmarks/perf_probe.py::test_pace_pulse')."""
    return {f"{path}::{node.name}" for path in benchmark_files()
            for node in ast.parse((REPO_ROOT / path).read_text(encoding="utf-8")).body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def compare_with(runs: list[Path], expected: set[str]) -> Optional[Path]:
    """The last saved run that holds every benchmark (a run narrowed with -k saves only some), else
    the last saved run; None when none is saved."""
    def names(path: Path) -> set[str]:
        try:
            return {b["fullname"] for b in json.loads(path.read_text(encoding="utf-8"))["benchmarks"]}
        except (OSError, ValueError, KeyError, TypeError):
            return set()
    whole = [p for p in runs if expected <= names(p)]
    return (whole or runs or [None])[-1]


def pytest_args(storage: Path, compare: Optional[Path], extra: list[str]) -> list[str]:
    return ["-p", "no:cacheprovider", "-s", *benchmark_files(),
            "--benchmark-autosave", f"--benchmark-storage=file://{storage}",
            *([f"--benchmark-compare={compare.name.split('_', 1)[0]}"] if compare else []),
            "--benchmark-time-unit=s", f"--benchmark-columns={COLUMNS}", "--benchmark-group-by=name",
            "--benchmark-sort=name", "--benchmark-name=short", *extra]


def main(argv: list[str]) -> int:
    machine = this_machine_class()
    storage = STORAGE_ROOT / machine
    against = compare_with(saved_runs(storage), benchmark_names())
    args = pytest_args(storage, against, argv)
    print(f"make perf benchmarks, machine class {machine}: "
          + (f"compared with {against.relative_to(REPO_ROOT)}" if against
             else f"no run of this class saved in {storage.relative_to(REPO_ROOT)}/ yet: this one is the first"))
    print(shlex.join([Path(sys.executable).name, "-m", "pytest", *args]), flush=True)
    os.chdir(REPO_ROOT)
    return int(pytest.main(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
