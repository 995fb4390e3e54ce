"""The built-in collective sweep against a plain torch.distributed loop: tests/perf/collective_cost.py's
runs as a benchmark.

all_reduce on 2 gloo ranks over the same sizes (4-64 MiB), warm-up and iterations. Each round runs
benchmarks/comm/plain_collective.py first (pedantic's setup: not timed), then `python -m harness bench
kind=collective` (timed: one whole sweep, controller and ranks). Bound, from docs/tests.md: sweep/plain
busbw at the 2 largest sizes >= 0.97 (the median over rounds of each side). The time is saved and
compared, not bounded: gloo's bandwidth moves with the machine's pace; the ratio does not.
"""
from __future__ import annotations

import statistics

import pytest

from tests.benchmarks.conftest import Bound, Op
from tests.perf import collective_cost

RATIO = Bound("sweep/plain busbw, largest sizes", Op.AT_LEAST, collective_cost.TARGET, "",
              "docs/tests.md: the collective sweep's target")


def test_collective_sweep_vs_plain_loop(benchmark, figures, perf_settings, perf_out):
    argv = ["--rounds", str(perf_settings.rounds)] if perf_settings.rounds else []
    args = collective_cost.build_parser().parse_args(argv)
    work = perf_out / "collective-cost"
    print(f"\ncollective cost: all_reduce {args.min_bytes >> 20}-{args.max_bytes >> 20} MiB, 2 gloo ranks, "
          f"{args.rounds} rounds, interleaved; runs in {work}", flush=True)
    plain: dict[int, list[float]] = {}
    sweep: dict[int, list[float]] = {}
    errors: list[str] = []
    done = {"rounds": 0}

    def side(name: str, fn, into: dict[int, list[float]]) -> None:
        try:
            got = fn(args, work / f"{name}-{done['rounds']}")
        except collective_cost.RunFailed as exc:
            errors.append(f"round {done['rounds'] + 1} {name}: {exc}")
            return
        for size, bw in got.items():
            into.setdefault(size, []).append(bw)
        print(f"  round {done['rounds'] + 1} {name:<5} "
              + "  ".join(f"{s >> 20} MiB {bw:.3f} GB/s" for s, bw in got.items()), flush=True)

    def plain_round() -> None:                     # not timed
        side("plain", collective_cost.run_plain, plain)

    def sweep_round() -> None:                     # timed
        side("sweep", collective_cost.run_sweep, sweep)
        done["rounds"] += 1

    benchmark.pedantic(sweep_round, setup=plain_round, rounds=args.rounds, iterations=1, warmup_rounds=0)
    if errors:
        pytest.fail(f"{figures.benchmark}: {len(errors)} runs FAILED:\n" + "\n".join(errors), pytrace=False)

    figures.check(RATIO, collective_cost.largest_ratio(plain, sweep, args.largest))
    for size in sorted(plain):
        figures.note(f"sweep/plain busbw at {size >> 20} MiB",
                     statistics.median(sweep[size]) / statistics.median(plain[size]))
    largest = max(plain)
    figures.note(f"plain loop busbw at {largest >> 20} MiB", statistics.median(plain[largest]), "GB/s")
    figures.assert_met()
