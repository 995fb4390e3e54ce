"""The harness against a bare DeepSpeed loop: tests/perf/harness_cost.py's runs as a benchmark.

llama-tiny, ZeRO-2, mb 2 x ga 4 on the cpu platform (2 gloo ranks), both sides planned alike by
harness.bench.plan_suite. Each round runs the plain loop first (pedantic's setup: not timed), then
`python -m harness bench` as `make bench` runs it (timed: the benchmark's time is one whole bench,
controller, probe, ranks and record). Bounds, from docs/tests.md: harness/plain samples/s, the
median over rounds, >= 0.97; the peak memory the harness adds on any rank < 5 %. The time is saved
and compared, not bounded: it moves with the machine's pace (docs/measurement.md), the ratio does not.
"""
from __future__ import annotations

import json
import os
import statistics

import pytest

from contract.spec import SPEC_FILE
from tests.benchmarks.conftest import Bound, Op
from tests.perf import harness_cost

RATIO = Bound("harness/plain samples/s", Op.AT_LEAST, harness_cost.RATIO_TARGET, "",
              "docs/tests.md: the harness's throughput target")
MEMORY = Bound("peak memory the harness adds, worst rank", Op.BELOW, harness_cost.MEM_TARGET_PCT, "%",
               "docs/tests.md: the harness's memory target")


def test_harness_vs_plain_loop(benchmark, figures, perf_settings, perf_out):
    argv = ["--out", str(perf_out / "harness-cost")]
    if perf_settings.rounds:
        argv += ["--rounds", str(perf_settings.rounds)]
    if perf_settings.steps:
        argv += ["--steps", str(perf_settings.steps)]
    args = harness_cost.build_parser().parse_args(argv)
    args.out.mkdir(parents=True)
    harness_cost.use_venv_tools()
    print(f"\nharness cost: llama-tiny ZeRO-{args.stage}, mb {args.mb} x ga {args.ga}, {args.rounds} rounds "
          f"of warm-up {args.warmup} + {args.steps} steps, interleaved; logs in {args.out}", flush=True)
    rounds: list[harness_cost.Round] = []
    plain_spec: dict[str, dict] = {}

    def plain_round() -> None:                     # not timed
        r = harness_cost.run_plain(args, args.out, len(rounds) // 2 + 1)
        rounds.append(r)
        print(harness_cost.describe(r), flush=True)
        if r.ok:
            plain_spec["spec"] = json.loads((args.out / f"plain-{r.index}" / SPEC_FILE).read_text(encoding="utf-8"))

    def harness_round() -> None:                   # timed
        r = harness_cost.run_harness(args, args.out, rounds[-1].index, plain_spec.get("spec"))
        rounds.append(r)
        print(harness_cost.describe(r), flush=True)

    benchmark.pedantic(harness_round, setup=plain_round, rounds=args.rounds, iterations=1, warmup_rounds=0)
    print(harness_cost.report(args, rounds), flush=True)

    failed = [r for r in rounds if not r.ok]
    if failed:
        pytest.fail(f"{figures.benchmark}: {len(failed)} of {len(rounds)} runs FAILED (logs in {args.out}):\n"
                    + "\n".join(f"round {r.index} {r.kind}: {r.error}" for r in failed), pytrace=False)
    fig = harness_cost.figures(rounds)
    busy = ""
    if fig.busiest_other_load is not None and fig.busiest_other_load > harness_cost.BUSY_CPUS:
        busy = (f"other processes kept up to {fig.busiest_other_load:.2f} of this box's {os.cpu_count()} CPUs "
                "busy: rerun on a quiet box before blaming the harness")
    figures.check(RATIO, fig.ratio, busy)
    figures.check(MEMORY, fig.worst_mem_added_pct)
    figures.note("plain loop samples/s", fig.plain_samples_per_s)
    figures.note("harness samples/s", fig.harness_samples_per_s)
    figures.note("harness/plain, worst round", min(fig.paired_ratios, default=None))
    figures.note("instrumentation: profile vs throughput step", fig.overhead_pct, "%")
    figures.note("plain rounds' own spread (noise)", fig.plain_spread_pct, "%")
    walls = {(r.kind, r.index): r.wall_s for r in rounds}
    figures.note("seconds a bench adds to the plain loop's",
                 statistics.median(walls[("harness", i)] - walls[("plain", i)] for _, i in walls), "s")
    figures.note("other processes' load, busiest run", fig.busiest_other_load, "CPUs")
    figures.other_load(fig.busiest_other_load)
    figures.assert_met()
