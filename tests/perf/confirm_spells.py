"""How often a bench's first run reads a regression that its reruns do not, quiet and beside a neighbour in spells:
default-cpu benches with confirm_regressions=2, alternating a quiet one and one beside a CPU burner that takes both
cores for 2-6 s every 5-20 s (random, seeded by the round), every bench kept in one history store; then, with
--slowed, one bench slowed on purpose (measure.inject_delay_s=0.05) whose regressions should all repeat; then what
`python -m harness alarms --all` counts: per metric the first verdicts judged, the regressions read, how many were
confirmed, unsettled (a rerun read it too) or did not repeat (a false alarm), and the tolerance that would have
passed those. Figures of 2026-12-06 on the Zen 5 EPYC in docs/status.md (6 rounds and --slowed: about 18 min).

    .venv/bin/python tests/perf/confirm_spells.py [--rounds N] [--slowed] [--out DIR]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def _burn(until: float) -> None:
    while time.time() < until:
        pass


def spells(seed: int) -> None:
    """The neighbour: every 5-20 s, two busy processes for 2-6 s, until terminated (its burners with it: a
    burner outliving it would load the next quiet bench)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))     # exit: multiprocessing ends its daemonic burners
    rng = random.Random(seed)
    while True:
        time.sleep(rng.uniform(5, 20))
        until = time.time() + rng.uniform(2, 6)
        burners = [mp.Process(target=_burn, args=(until,), daemon=True) for _ in range(2)]
        for p in burners:
            p.start()
        for p in burners:
            p.join()


def bench(out: Path, store: str, *more: str) -> str:
    """One default-cpu bench into OUT, kept in STORE: its verdict counts line."""
    done = subprocess.run([sys.executable, "-m", "harness", "bench", f"out={out}", f"history={store}",
                           "confirm_regressions=2", *more], cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800)
    counts = [line for line in done.stdout.splitlines() if line.startswith("Compared with reference_results/")]
    return f"exit {done.returncode}; " + (counts[0] if counts else "no verdicts")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--slowed", action="store_true", help="one more bench slowed on purpose")
    parser.add_argument("--out", type=Path, help="where the benches and the store go (default: a temporary folder)")
    ns = parser.parse_args()
    root = ns.out or Path(tempfile.mkdtemp(prefix="confirm-spells-"))
    store = f"sqlite:///{root.resolve() / 'history.sqlite'}"
    for k in range(1, ns.rounds + 1):
        print(f"quiet-{k}: {bench(root / f'quiet-{k}', store)}", flush=True)
        neighbour = mp.Process(target=spells, args=(k,))
        neighbour.start()
        try:
            print(f"spells-{k}: {bench(root / f'spells-{k}', store)}", flush=True)
        finally:
            neighbour.terminate()
            neighbour.join()
    if ns.slowed:
        print(f"slowed: {bench(root / 'slowed', store, 'measure.inject_delay_s=0.05')}", flush=True)
    return subprocess.run([sys.executable, "-m", "harness", "alarms", "--store", store, "--all"], cwd=REPO_ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
