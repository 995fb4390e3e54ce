"""What the capability probe and the pace pulses cost a bench (benchmarks/node/probe.py).

- node_probe: once per node per bench, before the first run measures, the node's other ranks waiting
  for it. Timed here in this process (the ranks have torch loaded when they probe: so is it here), a
  fresh bench folder each round so that it measures instead of reading. Bound, docs/measurement.md:
  10 s a node at most.
- pulse: twice per training run (right before and right after it measures). Bound,
  docs/measurement.md: the two under a second a run.
- pulse_triad, the memory pulse: beside each pulse. Bound the same: the two under a second a run.

Both are timed loops of a set length (REPEATS x REPEAT_S, PULSE_REPEATS x PULSE_S), so their time
does not move with the machine's pace as a training run's does: each declares median:25% against the
saved run compared with, which catches work added to them. Not quite fixed: each repeat ends on the
first check past its length (every 4th product), so a slower machine overshoots more (a pulse read
0.33 s with 1.6 CPUs of other work, 0.44 s with 1.7): a run on a busy box is not judged
(tests/benchmarks/conftest.py BUSY_CPUS).
"""
from __future__ import annotations

import itertools
import time

import pytest
import torch  # noqa: F401  (loaded before the first round, as in a rank)

from benchmarks.node.machine import busy_cpu_s, own_cpu_s
from benchmarks.node.probe import node_probe, pulse, pulse_triad
from tests.benchmarks.conftest import Bound, Op

PROBE = Bound("probe seconds a node", Op.AT_MOST, 10.0, "s", "docs/measurement.md: the probe's budget")
PULSES = Bound("two pulses' seconds a run", Op.BELOW, 1.0, "s", "docs/measurement.md: under a second a run")
MEMORY_PULSES = Bound("two memory pulses' seconds a run", Op.BELOW, 1.0, "s",
                      "docs/measurement.md: under a second a run")
COMPARE_FAIL = "median:25%"


def test_node_probe(benchmark, figures, perf_settings, tmp_path):
    folders = (tmp_path / f"bench-{i}" for i in itertools.count(1))
    results: list[dict] = []

    def fresh_bench():                             # not timed
        return (next(folders), "cpu", True), {}

    def probe(out_dir, device, first_on_node):     # timed
        results.append(node_probe(out_dir, device, first_on_node))

    benchmark.pedantic(probe, setup=fresh_bench, rounds=perf_settings.rounds or 5, iterations=1, warmup_rounds=0)
    failed = [r.get("error") for r in results if not r or r.get("error")]
    if failed:
        pytest.fail(f"{figures.benchmark}: {len(failed)} of {len(results)} probes failed: {failed}", pytrace=False)
    figures.compare_fail(COMPARE_FAIL)
    figures.check(PROBE, benchmark.stats.stats.median)
    last = results[-1]
    figures.note("fp32 matmul, last probe", last["matmul"]["fp32"]["best"], "GFLOP/s")
    figures.note("bf16 matmul, last probe", last["matmul"]["bf16"]["best"], "GFLOP/s")
    figures.note("triad, last probe", last["triad"]["best"], "GB/s")
    load = max((r["other_cpus"] for r in results if r.get("other_cpus") is not None), default=None)
    figures.note("other processes' load, busiest probe", load, "CPUs")
    figures.other_load(load)
    figures.assert_met()


def test_pace_pulse(benchmark, figures, perf_settings):
    _pulses(benchmark, figures, perf_settings, "pace")


def test_memory_pulse(benchmark, figures, perf_settings):
    _pulses(benchmark, figures, perf_settings, "memory")


def _pulses(benchmark, figures, perf_settings, which: str) -> None:
    """One pulse timed a round (pulse, or pulse_triad for "memory"); two of them are a run's cost."""
    paces: list = []
    read = pulse if which == "pace" else pulse_triad

    def one_pulse():                               # timed
        paces.append(read("cpu"))

    t0, busy0, own0 = time.monotonic(), busy_cpu_s(), own_cpu_s()
    benchmark.pedantic(one_pulse, rounds=perf_settings.rounds or 10, iterations=1, warmup_rounds=0)
    busy1, wall = busy_cpu_s(), time.monotonic() - t0
    load = (max(0.0, (busy1 - busy0) - (own_cpu_s() - own0)) / wall
            if busy0 is not None and busy1 is not None and wall > 0 else None)
    if None in paces:
        pytest.fail(f"{figures.benchmark}: {paces.count(None)} of {len(paces)} pulses read nothing", pytrace=False)
    figures.compare_fail(COMPARE_FAIL)
    figures.check(PULSES if which == "pace" else MEMORY_PULSES, 2 * benchmark.stats.stats.median)
    figures.note(*(("pulse fp32 matmul, best", max(paces), "GFLOP/s") if which == "pace"
                   else ("memory pulse triad, best", max(paces), "GB/s")))
    figures.note("other processes' load", load, "CPUs")
    figures.other_load(load)
    figures.assert_met()
