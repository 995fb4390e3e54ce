"""How a collective sweep on one cpu host answers a busier host: gloo's short sweep (two ranks, 1K-4M, the
cpu platform's `cpu-short`) run quiet and beside a neighbour taking 0.5, 1.0 and 1.5 of the box's CPUs
(duty-cycled spinners at normal priority, as another job would), the levels interleaved round by round so
that a drift of the box, the hypervisor's steal included, falls on all of them. Per bench it prints the load
(environment.load: the neighbour, the hypervisor's steal, the ranks' CPU time and its share of the quiet
benches') and per op the sweep's speed against the quiet benches' median: average bus bandwidth now/quiet,
the small sizes' time quiet/now. Then the range of speeds read with other work and steal BUSY_HOST_CPUS or
more above the quiet benches', which harness/verdict/explained.py BUSY_HOST_SWEEP must hold (at_busy_host:
such a change is not comparable); tests/unit/test_busy_host.py keeps it so on the kept records
(tests/data/neighbour_collectives/graded/).

    .venv/bin/python tests/perf/busy_host.py [--rounds N] [--out DIR]    # measure (about 15 s a bench)
    .venv/bin/python tests/perf/busy_host.py --from DIR                  # the figures of kept records
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness.verdict.explained import BUSY_HOST_CPUS, BUSY_HOST_SWEEP  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
LEVELS = (0.0, 0.5, 1.0, 1.5)
"""The neighbour's CPUs: each level runs ceil(level) spinners, each busy level/ceil(level) of every 10 ms."""
SPINNER = ("import sys, time\nduty = float(sys.argv[1])\nwhile True:\n    t0 = time.perf_counter()\n"
           "    while time.perf_counter() - t0 < duty * 0.01:\n        pass\n"
           "    if duty < 1:\n        time.sleep((1 - duty) * 0.01)\n")
METRICS = ("avg_busbw_gbps", "small_time_us", "small_median_us")
"""The sweep's figures read against the quiet benches' (small_median_us where the records carry it)."""
SLOWER_IS_LOWER = ("small_time_us", "small_median_us")


def bench(out: Path, level: float) -> None:
    """One `bench suite=single kind=collective collective=cpu-short` into OUT beside `level` CPUs of neighbour."""
    n = math.ceil(level)
    spinners = [subprocess.Popen([sys.executable, "-c", SPINNER, str(level / n)]) for _ in range(n)]
    try:
        subprocess.run([sys.executable, "-m", "harness", "bench", "confirm_regressions=0", "platform=cpu", "suite=single", "kind=collective",
                        "collective=cpu-short", f"out={out}"], cwd=REPO_ROOT, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=900)
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def records(root: Path) -> list[dict[str, Any]]:
    """Every collective record under ROOT whose bench ran at a level: its folder is named `l<level>-r<round>`
    (the folder's name kept in `_bench`, its level in `_level`)."""
    out = []
    for path in sorted(root.glob("l*-r*/*.json")):
        rec = json.loads(path.read_text())
        if "metrics" not in rec or rec.get("status") != "ok" or rec.get("kind") != "collective":
            continue
        rec["_bench"], rec["_level"] = path.parent.name, float(path.parent.name.split("-")[0][1:])
        out.append(rec)
    return out


def load(rec: dict[str, Any], figure: str) -> float:
    return float((rec["environment"].get("load") or {}).get(figure) or 0.0)


def speeds(recs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """{bench: {op: {metric: speed}}}: each figure against the quiet benches' median (level 0, steal under
    BUSY_HOST_CPUS; the least stolen quiet bench where none is), as a speed: bus bandwidth now/quiet, the
    small sizes' time quiet/now; and {bench: {"share": ...}}: the ranks' CPU time over the quiet benches'."""
    quiet = [r for r in recs if r["_level"] == 0 and load(r, "steal_cpus") < BUSY_HOST_CPUS]
    if not quiet:
        least = min((r for r in recs if r["_level"] == 0), key=lambda r: load(r, "steal_cpus"))
        quiet = [r for r in recs if r["_bench"] == least["_bench"]]
    base = {(r["benchmark"], m): [] for r in quiet for m in (*METRICS, "run_cpus")
            if m in r["metrics"] or m == "run_cpus"}
    for r in quiet:
        for m in METRICS:
            if m in r["metrics"]:
                base[(r["benchmark"], m)].append(r["metrics"][m]["value"])
        base[(r["benchmark"], "run_cpus")].append(load(r, "run_cpus"))
    mid = {k: statistics.median(v) for k, v in base.items()}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for r in recs:
        op = r["benchmark"]
        if (op, "run_cpus") not in mid:
            continue
        bench = out.setdefault(r["_bench"], {})
        bench[op] = {m: (mid[(op, m)] / r["metrics"][m]["value"] if m in SLOWER_IS_LOWER else
                         r["metrics"][m]["value"] / mid[(op, m)])
                     for m in METRICS if m in r["metrics"] and (op, m) in mid}
        bench["share"] = {"run_cpus": load(r, "run_cpus") / mid[(op, "run_cpus")]}
    return out


def under_load(recs: list[dict[str, Any]]) -> tuple[float, float]:
    """(lowest, highest) speed, over every op and metric, of the benches that ran with other work and steal
    together at least BUSY_HOST_CPUS above the quiet benches' (speeds()'s baseline)."""
    table = speeds(recs)
    by_bench = {r["_bench"]: r for r in recs}
    calm = [load(r, "other_cpus") + load(r, "steal_cpus") for r in recs
            if r["_level"] == 0 and load(r, "steal_cpus") < BUSY_HOST_CPUS]
    quiet = statistics.median(calm) if calm else 0.0
    found = [speed for bench, ops in table.items()
             if load(by_bench[bench], "other_cpus") + load(by_bench[bench], "steal_cpus") >= quiet + BUSY_HOST_CPUS
             for op, figures in ops.items() if op != "share" for speed in figures.values()]
    return (min(found), max(found)) if found else (1.0, 1.0)


def report(recs: list[dict[str, Any]]) -> None:
    table = speeds(recs)
    by_bench = {r["_bench"]: r for r in recs}
    ops = sorted({r["benchmark"] for r in recs})
    print(f"{len(recs)} records of {len(table)} benches; speeds against the quiet benches' median "
          f"(bus bandwidth now/quiet, small sizes' time quiet/now, their median call quiet/now where measured)")
    print(f"{'bench':<10}{'neighbour':>10}{'steal':>7}{'other':>7}{'ranks':>7}{'share':>7}  "
          + "".join(f"{op:>16}" for op in ops))
    for bench in sorted(table, key=lambda b: (by_bench[b]["_level"], b)):
        rec = by_bench[bench]
        cells = "".join(f"{'/'.join(f'{table[bench][op][m]:.2f}' for m in METRICS if m in table[bench][op]):>16}"
                        if op in table[bench] else f"{'-':>16}" for op in ops)
        print(f"{bench:<10}{rec['_level']:>10.1f}{load(rec, 'steal_cpus'):>7.2f}{load(rec, 'other_cpus'):>7.2f}"
              f"{load(rec, 'run_cpus'):>7.2f}{table[bench]['share']['run_cpus']:>7.2f}  {cells}")
    lo, hi = under_load(recs)
    print(f"beside other work or steal of {BUSY_HOST_CPUS:g} CPUs or more: {lo:.2f}-{hi:.2f}x the quiet speed; the "
          f"verdicts allow {BUSY_HOST_SWEEP[0]:g}-{BUSY_HOST_SWEEP[1]:g}x (harness/verdict/explained.py BUSY_HOST_SWEEP)")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="benches per level (default 3)")
    parser.add_argument("--out", type=Path, help="keep the records here (default: a temporary folder)")
    parser.add_argument("--from", dest="source", type=Path, help="print the figures of records kept by --out")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {args.rounds}")
    if args.source:
        recs = records(args.source)
        if not recs:
            print(f"no records of levels under {args.source} (folders l<level>-r<round>)", file=sys.stderr)
            return 1
        report(recs)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        for rnd in range(args.rounds):
            for level in LEVELS:
                out = root / f"l{level:g}-r{rnd}"
                print(f"round {rnd + 1}/{args.rounds}: neighbour {level:g} CPUs -> {out}", flush=True)
                bench(out, level)
        report(records(root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
