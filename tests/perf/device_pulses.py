"""A pulse of one device while the others wait against every device's at once (docs/measurement.md, "Every device at
once"): per round, the fp32 pulse on CPU 0 alone (benchmarks/node/probe.py pulse, as the first rank reads it:
at_once of one device), then one process pinned to each CPU reading its own at once (Pulses.own_start, as every rank
reads it); printed per round, then each reading's range and the rounds in which a CPU read at once below 1 -
PACE_NOISE_PCT of the pulses alone's median. On a GPU node each process takes its own GPU instead (--gpus N).

    .venv/bin/python tests/perf/device_pulses.py [--rounds 20] [--pause-s 0] [--gpus N]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.node.probe import Pulses  # noqa: E402
from harness.probe import PACE_NOISE_PCT  # noqa: E402


def _one(slot: int, device: str, barrier, q) -> None:
    if device == "cuda":
        import torch

        torch.cuda.set_device(slot)
    else:
        os.sched_setaffinity(0, {slot})
    p = Pulses(device)
    barrier.wait()
    p.own_start()
    q.put((slot, p.own_before))


def at_once(slots: list[int], device: str) -> list[float]:
    barrier, q = mp.Barrier(len(slots)), mp.Queue()
    procs = [mp.Process(target=_one, args=(s, device, barrier, q)) for s in slots]
    for p in procs:
        p.start()
    got = sorted(q.get(timeout=120) for _ in slots)
    for p in procs:
        p.join(timeout=60)
    return [x or 0.0 for _, x in got]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--pause-s", type=float, default=0.0, help="idle time between rounds")
    ap.add_argument("--gpus", type=int, default=0, help="read N GPUs instead of the CPUs")
    ns = ap.parse_args()
    mp.set_start_method("fork")
    device = "cuda" if ns.gpus else "cpu"
    slots = list(range(ns.gpus)) if ns.gpus else sorted(os.sched_getaffinity(0))
    solo, together = [], []
    for k in range(ns.rounds):
        solo.append(at_once(slots[:1], device)[0])   # the first device's alone, as the first rank reads it
        together.append(at_once(slots, device))
        print(f"round {k}: alone {solo[-1]:.1f}, at once {', '.join(f'{x:.1f}' for x in together[-1])}", flush=True)
        time.sleep(ns.pause_s)
    usual = statistics.median(solo)
    floor = usual * (1 - PACE_NOISE_PCT[device] / 100)
    low = [(k, min(r)) for k, r in enumerate(together) if min(r) < floor]
    print(f"alone: {min(solo) / usual:.2f}-{max(solo) / usual:.2f}x of its median {usual:.1f}; at once, the slowest "
          f"device: {min(min(r) for r in together) / usual:.2f}-{max(min(r) for r in together) / usual:.2f}x; "
          f"below {floor:.1f} (the pulse's noise) in {len(low)} of {ns.rounds} rounds"
          + (f": {', '.join(f'round {k} {x / usual:.2f}x' for k, x in low)}" if low else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
