"""How often a bench's first run reads a regression that its reruns do not, quiet and beside a neighbour in spells:
default-cpu benches with confirm_regressions=2, alternating a quiet one and one beside a CPU burner that takes both
cores for 2-6 s every 5-20 s (random, seeded by the round), every bench kept in one history store; then, with
--slowed, one bench slowed on purpose (measure.inject_delay_s=0.05) whose regressions should all repeat; then what
`python -m harness alarms --all` counts: per metric the first verdicts judged, the regressions read, how many were
confirmed, unsettled (a rerun read it too) or did not repeat (a false alarm), and the tolerance that would have
passed those. Figures of 2026-12-06 on the Zen 5 EPYC in docs/status.md (6 rounds and --slowed: about 18 min).
With --nightly, each round is a quiet night and a night beside the burner instead (the cpu nightly, --repeats 3, one
store): what each night's first repeat read alone against what its three repeats read (harness/nightly.py
first_repeat), the one-repeat nightly's false alarms (about 3 min a round). On the AVX-512 EPYC of family 25 model 17
(2026-12-07), 3 rounds: 337 first verdicts, no first repeat read a regression (docs/status.md).

    .venv/bin/python tests/perf/confirm_spells.py [--rounds N] [--slowed] [--nightly] [--out DIR]
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
from typing import Callable, TypeVar

T = TypeVar("T")

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


def beside_spells(seed: int, work: Callable[[], T]) -> T:
    """work(), with the neighbour (spells, seeded) running beside it from start to end."""
    neighbour = mp.Process(target=spells, args=(seed,))   # not daemonic: it starts the burners
    neighbour.start()
    try:
        return work()
    finally:
        neighbour.terminate()
        neighbour.join()


def bench(out: Path, store: str, *more: str) -> str:
    """One default-cpu bench into OUT, kept in STORE: its verdict counts line."""
    done = subprocess.run([sys.executable, "-m", "harness", "bench", f"out={out}", f"history={store}",
                           "confirm_regressions=2", *more], cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800)
    counts = [line for line in done.stdout.splitlines() if line.startswith("Compared with reference_results/")]
    return f"exit {done.returncode}; " + (counts[0] if counts else "no verdicts")


def night(out: Path, store: str, night_id: str) -> str:
    """One cpu nightly night of 3 repeats into OUT, kept in STORE: what its first repeat alone read."""
    done = subprocess.run([sys.executable, "-m", "harness", "nightly", "--night", night_id, "--repeats", "3",
                           "--store", store, "--fail-on", "none", f"out={out}"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=1800)
    alone = [line.strip() for line in done.stdout.splitlines() if "first repeat alone" in line]
    return f"exit {done.returncode}; " + (alone[0] if alone else "nothing judged alone")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--slowed", action="store_true", help="one more bench slowed on purpose")
    parser.add_argument("--nightly", action="store_true", help="nights of 3 repeats instead of benches")
    parser.add_argument("--out", type=Path, help="where the benches and the store go (default: a temporary folder)")
    ns = parser.parse_args()
    root = ns.out or Path(tempfile.mkdtemp(prefix="confirm-spells-"))
    root.mkdir(parents=True, exist_ok=True)   # the store's folder: a nightly never creates it
    store = f"sqlite:///{root.resolve() / 'history.sqlite'}"
    one = ((lambda name, k: night(root / name, store, f"2026-01-{k:02d}")) if ns.nightly else
           (lambda name, k: bench(root / name, store)))
    for k in range(1, ns.rounds + 1):
        print(f"quiet-{k}: {one(f'quiet-{k}', 2 * k - 1)}", flush=True)
        print(f"spells-{k}: {beside_spells(k, lambda: one(f'spells-{k}', 2 * k))}", flush=True)
    if ns.slowed and ns.nightly:
        print("--slowed is for benches; nights are not slowed", flush=True)
    elif ns.slowed:
        print(f"slowed: {bench(root / 'slowed', store, 'measure.inject_delay_s=0.05')}", flush=True)
    return subprocess.run([sys.executable, "-m", "harness", "alarms", "--store", store, "--all"], cwd=REPO_ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
