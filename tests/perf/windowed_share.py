"""The CPU share read over the steps at the run's median (load.at_median, harness/nodes.py) against the whole
window's, on the same records: default-cpu benches alternating a quiet one and one beside a CPU burner in spells
(both cores for 2-6 s every 5-20 s: tests/perf/confirm_spells.py's neighbour), each bench's records judged against
the shipped references twice: with the load at the median step (at_median, read again from each run's LOAD event
by this checkout, so that benches of an earlier reading are judged by this one) and without it (the share over the
whole window, as before it was kept). Printed per bench: the verdicts' counts both ways and every verdict
that differs; then the totals: the regressions the window's share left unexplained that the median steps' share
set aside as `not comparable`, and any quiet bench whose verdicts moved (there should be none). Figures in
docs/status.md.

    .venv/bin/python tests/perf/windowed_share.py [--rounds N] [--out DIR]
    .venv/bin/python tests/perf/windowed_share.py --judge DIR...   (bench folders already run)
"""
from __future__ import annotations

import argparse
import copy
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO_ROOT), str(Path(__file__).resolve().parent)]

from confirm_spells import beside_spells  # noqa: E402  (the neighbour)
from contract import events as ev  # noqa: E402
from harness.nodes import load_during  # noqa: E402
from harness.record import ResultRecord  # noqa: E402
from harness.verdict.compare import compare  # noqa: E402
from harness.verdict.record_files import load_records  # noqa: E402
from harness.verdict.references import load_references  # noqa: E402


def both_ways(rec: ResultRecord, run_dir: Path) -> tuple[ResultRecord, ResultRecord]:
    """(the record with its load at the median step as this checkout reads it from the run's LOAD event, the record
    as if it had kept no steps: its CPU share read over the whole window)."""
    windows = next((e["value"] for e in ev.read_events(run_dir / "events.jsonl") if e.get("key") == ev.LOAD), [])
    steps = (load_during(windows) or {}).get("at_median")
    d = copy.deepcopy(rec.to_dict())
    load = (d.get("environment") or {}).get("load") or {}
    load.pop("at_median", None)
    window = ResultRecord.from_dict(copy.deepcopy(d))
    if steps:
        load["at_median"] = steps
    return ResultRecord.from_dict(d), window


def judged(folder: Path, refs: list) -> tuple[Counter, Counter, list[str]]:
    """(counts at the median step, counts over the window only, each verdict that differs, in words)."""
    pairs = [both_ways(r, folder / "runs" / p.stem) for p, r in load_records([folder]).records
             if r.kind == "training"]
    now, before = compare([a for a, _ in pairs], refs), compare([b for _, b in pairs], refs)
    assert len(now) == len(before), "one comparison, the same pairs: only the share read differs"
    moved = [f"{v.benchmark} ZeRO-{v.config.get('zero_stage')} mb {v.config.get('micro_batch_size')} {v.metric}: "
             f"{b.verdict} -> {v.verdict} ({v.reason or ''})"[:300]
             for v, b in zip(now, before) if b.verdict != v.verdict]
    ran = (lambda vs: Counter(v.verdict for v in vs if v.verdict != "missing"))   # not the references' other runs
    return ran(now), ran(before), moved


def bench(out: Path) -> int:
    return subprocess.run([sys.executable, "-m", "harness", "bench", f"out={out}", "history=none",
                           "confirm_regressions=0"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=1800).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path, help="where the benches go (default: a temporary folder)")
    parser.add_argument("--judge", type=Path, nargs="+", help="judge these bench folders only; run nothing")
    ns = parser.parse_args()
    refs = load_references()
    folders = list(ns.judge or [])
    if not folders:
        root = ns.out or Path(tempfile.mkdtemp(prefix="windowed-share-"))
        for k in range(1, ns.rounds + 1):
            print(f"quiet-{k}: exit {bench(root / f'quiet-{k}')}", flush=True)
            print(f"spells-{k}: exit {beside_spells(k, lambda: bench(root / f'spells-{k}'))}", flush=True)
            folders += [root / f"quiet-{k}", root / f"spells-{k}"]
    total_now, total_before, quiet_moved = Counter(), Counter(), 0
    for folder in folders:
        now, before, moved = judged(folder, refs)
        total_now.update(now)
        total_before.update(before)
        quiet_moved += len(moved) if folder.name.startswith("quiet") else 0
        print(f"{folder.name}: median step {dict(now)}; whole window {dict(before)}")
        for line in moved:
            print(f"    {line}")
    print(f"all {len(folders)} benches: median step {dict(total_now)}; whole window {dict(total_before)}; "
          f"verdicts of quiet benches that moved: {quiet_moved}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
