"""Whether the host's exchange latency reads the slow spells of a collective sweep on one cpu host. A first bench on
a fresh clone has judged gloo's small sizes regressed (reduce_scatter's lower quartile 1.73x) with no load to
explain it, and a rerun right after passed: a spell of the host, which no pulse read (the training runs' pulses time
matmul and memory; a collective sweep reads none). Per round: the exchange pulse (benchmarks/node/exchange.py, a
TCP ping-pong between two processes on the two CPUs), then two gloo ranks bound to those CPUs timing all_reduce and
reduce_scatter at 1-64 KiB (40 calls a size after 5 warm-up calls), then the pulse again. Prints each round, the
correlation of the pulse's lower quartile with each op's, and the rounds in a spell (the slower of its two pulses
1.15x the median round's or more, as harness/pace.py EXCHANGE_MOVED reads a record's) against the others.

On the 2-core Zen 5 VM, 2026-12-06, 100 rounds (tests/data/exchange_spells/zen5-2026-12-06.jsonl): see the figures
this prints with --from; docs/collectives.md "Slow spells" quotes them.

    .venv/bin/python tests/perf/exchange_spells.py [--rounds N] [--out FILE]    # measure (about 4.5 s a round)
    .venv/bin/python tests/perf/exchange_spells.py --from FILE                  # the figures of kept rounds
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.node.exchange import exchange, two_cpus  # noqa: E402

OPS = ("all_reduce", "reduce_scatter")
SIZES = [1024 * 2 ** i for i in range(7)]   # 1 KiB .. 64 KiB
CALLS, WARMUP = 40, 5
SPELL = 1.15
"""A round is in a spell when its pulse's lower quartile is this much over the median round's or more."""


def _rank(rank: int, port: int, cpus: tuple, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    if cpus[rank] is not None:
        os.sched_setaffinity(0, {cpus[rank]})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    out = {}
    for op in OPS:
        times = []
        for size in SIZES:
            x, half = torch.ones(size // 4), torch.empty(size // 8)
            dist.barrier()
            for i in range(WARMUP + CALLS):
                start = time.perf_counter()
                dist.all_reduce(x) if op == "all_reduce" else dist.reduce_scatter_tensor(half, x)
                if i >= WARMUP:
                    times.append((time.perf_counter() - start) * 1e6)
        times.sort()
        out[op] = {"p25_us": times[len(times) // 4], "median_us": times[len(times) // 2]}
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


def measure(rounds: int, out: Path) -> list[dict[str, Any]]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    cpus = two_cpus()
    rows = []
    with out.open("w") as f:
        for i in range(rounds):
            before = exchange()
            queue = ctx.Queue()
            ranks = [ctx.Process(target=_rank, args=(r, 29500 + 37 + i % 300, cpus, queue)) for r in (0, 1)]
            for p in ranks:
                p.start()
            swept = queue.get(timeout=300)
            for p in ranks:
                p.join()
            row = {"t": time.time(), "before": before, "after": exchange(), **swept}
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(f"round {i + 1}: pulse {pulse(row):.1f} us; " + ", ".join(
                f"{op} p25 {row[op]['p25_us']:.0f} us" for op in OPS), flush=True)
            rows.append(row)
    return rows


def pulse(row: dict[str, Any]) -> float:
    """A round's exchange pace: the slower of the pulses' lower quartiles before and after, as a record keeps it
    (load.pulse_exchange_us, harness/nodes.py): a spell at either end of the round is the one its sweeps ran in. (The
    mean, used before, read 12 spell rounds at 1.26x, the ops 1.52x and 1.62x: the same finding, on another scale
    than the records'.)"""
    return max(row["before"]["p25_us"], row["after"]["p25_us"])


def correlation(a: list[float], b: list[float]) -> float:
    ma, mb = statistics.mean(a), statistics.mean(b)
    cov = sum((x - ma) * (y - mb) for x, y in zip(a, b))
    return cov / (sum((x - ma) ** 2 for x in a) * sum((y - mb) ** 2 for y in b)) ** 0.5


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The correlation of the pulse with each op's lower quartile, and the spell rounds' ratios to the others'."""
    pulses = [pulse(r) for r in rows]
    typical = statistics.median(pulses)
    spell = [r for r in rows if pulse(r) >= SPELL * typical]
    calm = [r for r in rows if pulse(r) < SPELL * typical]
    out: dict[str, Any] = {"rounds": len(rows), "pulse_median_us": typical,
                           "pulse_range_us": (min(pulses), max(pulses)), "spell_rounds": len(spell)}
    for op in OPS:
        p25 = [r[op]["p25_us"] for r in rows]
        calm_p25 = statistics.median(r[op]["p25_us"] for r in calm)
        out[op] = {"correlation": correlation(pulses, p25), "calm_p25_us": calm_p25,
                   "spell_p25_us": statistics.median(r[op]["p25_us"] for r in spell) if spell else None,
                   # per spell round: how much more the op slowed than the pulse (harness/pace.py SPELL_SLOPE)
                   "slopes": sorted((r[op]["p25_us"] / calm_p25 - 1) / (pulse(r) / typical - 1) for r in spell)}
    if spell:
        out["spell_pulse_us"] = statistics.median(pulse(r) for r in spell)
    return out


def report(rows: list[dict[str, Any]]) -> None:
    f = figures(rows)
    low, high = f["pulse_range_us"]
    print(f"{f['rounds']} rounds; exchange pulse lower quartile {low:.1f}-{high:.1f} us, median "
          f"{f['pulse_median_us']:.1f}; {f['spell_rounds']} rounds in a spell (pulse >= {SPELL}x the median)")
    for op in OPS:
        o = f[op]
        spell = (f"; in the spells {o['spell_p25_us']:.0f} us ({o['spell_p25_us'] / o['calm_p25_us']:.2f}x) while the "
                 f"pulse read {f['spell_pulse_us']:.1f} us ({f['spell_pulse_us'] / f['pulse_median_us']:.2f}x)"
                 if o["spell_p25_us"] else "")
        slopes = f"; it slowed {o['slopes'][0]:.2f}-{o['slopes'][-1]:.2f}x as much as the pulse" if o["slopes"] else ""
        print(f"  {op}: lower quartile (1-64 KiB) against the pulse: correlation {o['correlation']:.2f}; "
              f"calm rounds {o['calm_p25_us']:.0f} us{spell}{slopes}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("exchange_spells.jsonl"))
    parser.add_argument("--from", dest="kept", type=Path)
    args = parser.parse_args()
    if args.kept:
        rows = [json.loads(line) for line in args.kept.read_text().splitlines() if line.strip()]
    else:
        rows = measure(args.rounds, args.out)
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
