"""`make perf`, part 2: the built-in collective sweep against a minimal torch.distributed loop.

    .venv/bin/python tests/perf/collective_cost.py [--rounds 3] [--min-bytes 4194304] [--max-bytes 67108864]

All-reduce over the same sizes, same ranks, same iterations: the sweep through the harness
(`bench suite=single kind=collective`, its record's out-of-place busbw) and
benchmarks/comm/plain_collective.py, interleaved over rounds. Prints busbw per size and the ratio
sweep/plain at the largest sizes (target 0.97 or better). Exit status 0 unless a run failed (1).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from contract.spec import SPEC_FILE  # noqa: E402
from harness.bench import plan_suite  # noqa: E402
from harness.collectives import algbw_gbps, busbw_factor  # noqa: E402
from harness.launch.local import LocalLauncher  # noqa: E402

TARGET = 0.97


class RunFailed(RuntimeError):
    """One side's run failed; the message says which and where its output is."""


def overrides(args: argparse.Namespace) -> list[str]:
    return ["suite=single", "kind=collective", "collective=main", "collective.ops=[all_reduce]",
            f"collective.min_bytes={args.min_bytes}", f"collective.max_bytes={args.max_bytes}",
            "collective.step_factor=2", f"collective.warmup_iters={args.warmup}",
            f"collective.iters={args.iters}", "collective.in_place=false", "collective.check=false"]


def run_plain(args: argparse.Namespace, work: Path) -> dict[int, float]:
    _, planned = plan_suite(overrides(args) + [f"out={work}"])
    run = planned[0].run
    run.run_dir.mkdir(parents=True)
    (run.run_dir / SPEC_FILE).write_text(run.spec.to_json(), encoding="utf-8")
    result = run.run_dir / "result.json"
    argv = [sys.executable, "-m", "benchmarks.comm.plain_collective", "--spec", str(run.run_dir / SPEC_FILE),
            "--out", str(result)]
    launch = LocalLauncher().run(dataclasses.replace(run, argv=argv), cwd=REPO_ROOT)
    if any(launch.exit_codes.values()) or launch.timed_out or not result.exists():
        raise RunFailed(f"plain loop failed: {launch}; see {run.run_dir}")
    times = json.loads(result.read_text())["time_us"]
    return {int(size): algbw_gbps(int(size), t) * busbw_factor("all_reduce", run.num_ranks)
            for size, t in times.items()}


def run_sweep(args: argparse.Namespace, work: Path) -> dict[int, float]:
    proc = subprocess.run([sys.executable, "-m", "harness", "bench", "confirm_regressions=0", *overrides(args), f"out={work}"],
                          cwd=REPO_ROOT, capture_output=True, text=True)
    records = sorted(work.glob("*-all_reduce.json"))
    if proc.returncode != 0 or not records:
        raise RunFailed(f"sweep failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    rows = json.loads(records[0].read_text())["rows"]
    return {r["size_bytes"]: r["out_of_place"]["busbw_gbps"] for r in rows}


def largest_ratio(plain: dict[int, list[float]], sweep: dict[int, list[float]], largest: int) -> float:
    """sweep/plain busbw at the `largest` largest sizes: the median over those sizes of the ratio of
    each side's median over rounds (small messages on gloo are latency, not the sweep's cost)."""
    top = sorted(plain)[-largest:]
    return statistics.median(statistics.median(sweep[s]) / statistics.median(plain[s]) for s in top)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-bytes", type=int, default=1 << 22)
    parser.add_argument("--max-bytes", type=int, default=1 << 26)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--largest", type=int, default=2, help="sizes the ratio is taken over")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.monotonic()
    plain: dict[int, list[float]] = {}
    sweep: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="collective-cost-") as tmp:
        for i in range(args.rounds):
            for name, fn, into in (("plain", run_plain, plain), ("sweep", run_sweep, sweep)):
                try:
                    got = fn(args, Path(tmp) / f"{name}-{i}")
                except RunFailed as exc:
                    print(exc, file=sys.stderr)
                    return 1
                for size, bw in got.items():
                    into.setdefault(size, []).append(bw)
                print(f"round {i + 1} {name:<5} " + "  ".join(f"{s >> 20} MiB {bw:.3f}" for s, bw in got.items()),
                      flush=True)
    sizes = sorted(plain)
    print(f"\nall_reduce busbw GB/s (median of {args.rounds} interleaved rounds, 2 gloo ranks)")
    print(f"{'size B':>12} {'plain loop':>11} {'sweep':>9} {'ratio':>7}")
    for size in sizes:
        p, s = statistics.median(plain[size]), statistics.median(sweep[size])
        print(f"{size:>12} {p:>11.3f} {s:>9.3f} {s / p:>7.3f}")
    top = sizes[-args.largest:]
    ratio = largest_ratio(plain, sweep, args.largest)
    verdict = "PASS" if ratio >= TARGET else "MISS"
    print(f"\nsweep/plain busbw at the {len(top)} largest sizes: {ratio:.3f} (target >= {TARGET}) {verdict}")
    print(f"total {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
