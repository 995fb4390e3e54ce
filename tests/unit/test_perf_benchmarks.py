"""`make perf`'s benchmarks (tests/benchmarks/), without running one: the machine class their runs are
saved under, the message a missed bound fails `make perf` with, the declared compare tolerance, the
runner's pytest arguments, and that `make test` never collects them."""
from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
from types import SimpleNamespace

import pytest
from pytest_benchmark.utils import get_machine_id

from unit_helpers import REPO_ROOT
from tests.benchmarks import __main__ as runner
from tests.benchmarks.conftest import (ISA_LEVELS, Bound, FigureBook, Op, TimeChecks, check_times, machine_class,
                                       miss, run_label, summary, this_machine_class)

BENCH_DIR = REPO_ROOT / "tests" / "benchmarks"


@pytest.mark.parametrize("model, cpus, flags, expected", [
    ("AMD EPYC", 2, {"avx2", "fma"}, "amd-epyc-2cpu-avx2"),
    ("AMD EPYC 9654 96-Core Processor", 2, {"avx2", "avx512f", "avx512_bf16"}, "amd-epyc-9654-96-core-2cpu-avx512bf16"),
    ("Intel(R) Xeon(R) Platinum 8480+", 16, {"avx2", "avx512f", "avx512_bf16", "amx_bf16"},
     "intel-xeon-platinum-8480-16cpu-amx"),
    ("Intel(R) Core(TM) i7-8700 CPU @ 3.20GHz", 12, {"avx2"}, "intel-core-i7-8700-12cpu-avx2"),
    ("Intel(R) Xeon(R) CPU E5-2680 v2 @ 2.80GHz", 8, {"avx"}, "intel-xeon-e5-2680-v2-8cpu-baseline"),
    (None, 4, set(), "unknown-cpu-4cpu-baseline"),
])
def test_the_machine_class_is_the_cpu_model_its_cpus_and_its_best_isa(model, cpus, flags, expected):
    assert machine_class(model, cpus, flags) == expected


def test_this_machine_has_a_class_a_folder_name_can_carry():
    here = this_machine_class()
    assert re.fullmatch(r"[a-z0-9-]+-\d+cpu-(" + "|".join(w for _, w in ISA_LEVELS) + "|baseline)", here), here


RATIO = Bound("harness/plain samples/s", Op.AT_LEAST, 0.97, "", "docs/tests.md: the harness's throughput target")
MEMORY = Bound("peak memory the harness adds, worst rank", Op.BELOW, 5.0, "%",
               "docs/tests.md: the harness's memory target")


@pytest.mark.parametrize("bound, value, note, expected", [
    (RATIO, 0.98, "", None),
    (RATIO, 0.97, "", None),
    (RATIO, 0.9699, "", "test_harness_vs_plain_loop: harness/plain samples/s 0.9699, bound >= 0.97 "
                        "(docs/tests.md: the harness's throughput target)"),
    (RATIO, 0.91, "other processes kept up to 1.20 of this box's 2 CPUs busy",
     "test_harness_vs_plain_loop: harness/plain samples/s 0.91, bound >= 0.97 (docs/tests.md: the harness's "
     "throughput target); other processes kept up to 1.20 of this box's 2 CPUs busy"),
    (RATIO, None, "", "test_harness_vs_plain_loop: harness/plain samples/s not measured, bound >= 0.97 "
                      "(docs/tests.md: the harness's throughput target)"),
    (MEMORY, 4.9, "", None),
    (MEMORY, 5.0, "", "test_harness_vs_plain_loop: peak memory the harness adds, worst rank 5 %, bound < 5 % "
                      "(docs/tests.md: the harness's memory target)"),
])
def test_a_missed_bound_names_the_benchmark_the_figure_and_the_bound(bound, value, note, expected):
    assert miss("test_harness_vs_plain_loop", bound, value, note) == expected


def test_the_figures_are_kept_for_the_saved_run_and_a_miss_fails_the_benchmark():
    book = FigureBook("test_harness_vs_plain_loop", {})
    book.check(RATIO, 0.95)
    book.check(MEMORY, 1.234567)
    book.note("instrumentation: profile vs throughput step", 20.0, "%")
    assert [(f["name"], f["value"], f["bound"], f["verdict"]) for f in book.extra_info["figures"]] == [
        ("harness/plain samples/s", 0.95, ">= 0.97", "MISS"),
        ("peak memory the harness adds, worst rank", 1.2346, "< 5 %", "PASS"),
        ("instrumentation: profile vs throughput step", 20.0, "", "info")]
    with pytest.raises(pytest.fail.Exception, match=r"^test_harness_vs_plain_loop: harness/plain samples/s 0.95, "
                                                    r"bound >= 0.97"):
        book.assert_met()
    FigureBook("b", {}).assert_met()


def test_a_declared_compare_tolerance_uses_pytest_benchmarks_syntax():
    book = FigureBook("test_node_probe", {})
    book.compare_fail("median:25%")
    assert book.extra_info["compare_fail"] == "median:25%"
    with pytest.raises(Exception, match="Could not parse"):
        book.compare_fail("median:25 %")


class _Bench(SimpleNamespace):
    """pytest-benchmark's Metadata as check_times() reads it: name, fullname, extra_info, stats by key."""

    def __getitem__(self, key):
        return self.stats[key]

    def __bool__(self):
        return True


def _bench(name: str, median: float, compare_fail: str = "", load: float | None = None) -> _Bench:
    info = {"figures": [], **({"compare_fail": compare_fail} if compare_fail else {}),
            **({"other_load_cpus": load} if load is not None else {})}
    return _Bench(name=name, fullname=f"tests/benchmarks/perf.py::{name}", stats={"median": median}, extra_info=info)


def test_only_a_benchmark_that_declared_a_tolerance_fails_on_its_time_growing_beyond_it():
    saved = {f"tests/benchmarks/perf.py::{n}": {"stats": {"median": 1.0}, "extra_info": {"other_load_cpus": 0.02}}
             for n in ("test_a", "test_b", "test_c", "test_busy")}
    now = [_bench("test_a", 1.30, "median:25%", 0.05),   # +30 %: beyond
           _bench("test_b", 1.20, "median:25%"),         # +20 %: within
           _bench("test_c", 2.00),                        # x2, but paced: declares none
           _bench("test_busy", 1.40, "median:25%", 1.7),  # beyond, on a busy box
           _bench("test_new", 9.0, "median:25%")]        # not in the saved run
    times = check_times(SimpleNamespace(benchmarks=now, compared_mapping={"0001_x.json": saved}))
    assert times.regressed == ["test_a: median 1.3 s against 1 s in the saved run (+30 %), beyond its declared "
                               "median:25%"]
    assert times.not_judged == ["test_busy: median 1.4 s against 1 s in the saved run (+40 %): other processes kept "
                                "up to 1.70 CPUs busy in one of the two runs (over 0.15): rerun on a quiet box"]
    assert check_times(SimpleNamespace(benchmarks=now, compared_mapping={})) == TimeChecks()


def test_the_busiest_load_of_a_benchmarks_rounds_is_kept():
    book = FigureBook("test_pace_pulse", {})
    for cpus in (0.1, None, 1.2, 0.3):
        book.other_load(cpus)
    assert book.extra_info["other_load_cpus"] == 1.2


def test_a_saved_run_is_named_by_number_commit_and_time():
    saved = "0003_5a79e61aa9f0b7c1d2e3f4a5b6c7d8e9f0a1b2c3_20261127_192254_uncommitted-changes.json"
    assert run_label(REPO_ROOT / saved) == "0003 (commit 5a79e61, 2026-11-27 19:22)"
    assert run_label(REPO_ROOT / "0001_unversioned_20261127_192254.json") == "0001_unversioned_20261127_192254"


def _save(folder, name: str, benchmarks: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps({"benchmarks": [{"fullname": b} for b in benchmarks]}))


def test_the_runner_compares_with_the_last_saved_run_of_its_class_that_holds_every_benchmark(tmp_path):
    every = runner.benchmark_names()
    assert {n.split("::")[1] for n in every} >= {"test_harness_vs_plain_loop", "test_collective_sweep_vs_plain_loop",
                                                   "test_node_probe", "test_pace_pulse"}
    assert runner.saved_runs(tmp_path) == []
    _save(tmp_path / "Other-Python-2.7-32bit", "0009_abc_20261127_000000.json", sorted(every))
    assert runner.compare_with(runner.saved_runs(tmp_path), every) is None
    own = tmp_path / get_machine_id()
    _save(own, "0002_abc_20261127_000000.json", sorted(every))
    _save(own, "0003_abc_20261127_010000.json", sorted(every))
    _save(own, "0010_abc_20261128_000000.json", ["tests/benchmarks/perf_probe.py::test_pace_pulse"])   # -k pulse
    (own / "notes.json").write_text("{}")
    runs = runner.saved_runs(tmp_path)
    assert [p.name[:4] for p in runs] == ["0002", "0003", "0010"]
    assert runner.compare_with(runs, every).name.startswith("0003_")
    assert runner.compare_with(runs[2:], every).name.startswith("0010_")   # none holds all: the last one


def test_the_runner_saves_every_run_and_compares_only_when_one_is_saved(tmp_path):
    saved = tmp_path / "0003_abc_20261127_010000.json"
    first, later = runner.pytest_args(tmp_path, None, []), runner.pytest_args(tmp_path, saved, ["--perf-rounds", "2"])
    assert f"--benchmark-storage=file://{tmp_path}" in first and "--benchmark-autosave" in first
    assert not [a for a in first if a.startswith("--benchmark-compare")]
    assert "--benchmark-compare=0003" in later and later[-2:] == ["--perf-rounds", "2"]
    assert [a for a in first if a.endswith(".py")] == ["tests/benchmarks/perf_collective.py",
                                                       "tests/benchmarks/perf_harness.py",
                                                       "tests/benchmarks/perf_probe.py"]


def _make_test_argvs() -> list[list[str]]:
    """The pytest arguments of each phase of `make test`'s recipe, as the Makefile spells them."""
    recipe = (REPO_ROOT / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    recipe = recipe.replace("\\\n", " ")
    return [shlex.split(part.split("||", 1)[0].split(";", 1)[0]) for part in recipe.split("-m pytest")[1:]]


def test_make_test_never_collects_the_benchmarks():
    """`make test` collects tests/unit, then tests/ without it in two phases (what measures the box, alone; the rest,
    two at a time, and what of those failed, again alone), with pytest's own rules: run the two-at-a-time phase's rules on tests/benchmarks/ alone (a whole
    collection takes minutes) and nothing may be collected, although every perf_*.py holds benchmarks."""
    unit, alone, whole, again = _make_test_argvs()
    assert unit[-1] == "tests/unit" and "-n" in unit
    assert alone[alone.index("-m") + 1] == "measuring" and "-n" not in alone
    assert whole[whole.index("-m") + 1] == "not measuring" and "-n" in whole
    # what failed beside another worker runs again alone: the same selection, the list the phase wrote
    assert again[again.index("-m") + 1] == "not measuring" and "-n" not in again
    assert again[again.index("--only-from") + 1] == whole[whole.index("--failed-to") + 1]
    for phase in (alone, whole, again):
        assert "tests" in phase and "--ignore=tests/unit" in phase
    for path in sorted(BENCH_DIR.glob("perf_*.py")):
        tree = ast.parse(path.read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name.startswith("test_") for n in tree.body), path
    assert len(list(BENCH_DIR.glob("perf_*.py"))) == 3 and not list(BENCH_DIR.glob("test_*.py"))
    rules, skip = [], 0   # the phase's own arguments, less its workers (-n, --dist: the collection is one process's)
    # and the file its failures go to
    for a in whole:
        if skip or a == "tests" or a == "--no-loadscope-reorder":
            skip = 0
        elif a in ("-n", "--dist", "--failed-to"):
            skip = 1
        else:
            rules.append(a)
    out = subprocess.run([sys.executable, "-m", "pytest", *rules, "--collect-only",
                          "-p", "no:cacheprovider", "tests/benchmarks"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 5 and "no tests collected" in out.stdout, out.stdout[-2000:] + out.stderr[-2000:]


def test_the_summary_says_how_it_went_first_then_each_figure_under_its_benchmark_now_and_then():
    book = FigureBook("test_harness_vs_plain_loop", {})
    book.check(RATIO, 0.95, "a busy box")
    book.note("plain loop samples/s", 4.86)
    probe = FigureBook("test_node_probe", {})
    probe.compare_fail("median:25%")
    probe.check(Bound("probe seconds a node", Op.AT_MOST, 10.0, "s", "docs/measurement.md"), 4.359)
    saved = {"test_node_probe": {"figures": [{"name": "probe seconds a node", "value": 4.1, "unit": "s"}]}}
    lines = summary({"test_node_probe": probe.extra_info, "test_harness_vs_plain_loop": book.extra_info}, saved,
                    "0001 (commit 9e945f9, 2026-11-27 19:34)",
                    TimeChecks(["test_node_probe: median 9 s against 4 s ..."], ["test_pace_pulse: ..."]))
    assert lines[:5] == [
        "figures: 1 PASS, 1 MISS, 1 for information; time regressions: 1, 1 not judged",
        "compared with the saved run 0001 (commit 9e945f9, 2026-11-27 19:34)",
        "  MISS test_harness_vs_plain_loop: harness/plain samples/s 0.95, bound >= 0.97",
        "  REGRESSION test_node_probe: median 9 s against 4 s ...",
        "  not judged: test_pace_pulse: ..."]
    assert lines[8:] == [
        "test_harness_vs_plain_loop",
        "  harness/plain samples/s  0.95     -          >= 0.97  MISS",
        "  plain loop samples/s     4.86     -          -        info",
        "test_node_probe  (its time: median:25% against the saved run)",
        "  probe seconds a node     4.359 s  4.1 s      <= 10 s  PASS"]
    assert max(len(line) for line in lines) <= 120
