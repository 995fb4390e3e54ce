"""How far a rank's held-back share moves across quiet nights, and when one that lags a little more each night is
named (harness/straggler_trend.py). Runs the cpu nightly `--quiet` nights into a history store of its own, then one
night per `--delays` value with rank 1 sleeping that long after each micro-step (measure.inject_delay_s,
inject_delay_rank=1), and keeps each repeat's per-rank shares (harness/held_up.py shares) and whether its straggler
stood out, one line a record. From those lines it prints: the quiet nights' median shares, how many orderings of three
quiet nights the rule would name (none should be), and per delayed night each run's median share, whether the trend
names it and whether a repeat stood out.

On the 2-core Zen 5 VM, 2026-12-06, 8 quiet nights and delays 0.005, 0.01, 0.02, 0.03 s (3 repeats a night;
tests/data/straggler_nights/zen5-2026-12-06.jsonl): see the figures this prints with --from; CREEP_PCT's docstring
quotes them.

    .venv/bin/python tests/perf/straggler_nights.py [--quiet 8] [--delays 0.005,0.01,0.02,0.03] [--out FILE]
    .venv/bin/python tests/perf/straggler_nights.py --from FILE
(about 70 s a night)
"""
from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from harness.held_up import shares  # noqa: E402
from harness.straggler_trend import CREEP_NIGHTS, medians, rises  # noqa: E402
from harness.verdict.history import History  # noqa: E402

PLATFORM = "cpu"


def measure(quiet: int, delays: list[float], out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/history.sqlite"
        nights = [(f"2026-01-{i + 1:02d}", 0.0) for i in range(quiet)]
        nights += [(f"2026-02-{i + 1:02d}", d) for i, d in enumerate(delays)]
        for night, delay in nights:
            delayed = [f"measure.inject_delay_s={delay}", "measure.inject_delay_rank=1"] if delay else []
            done = subprocess.run([sys.executable, "-m", "harness", "nightly", "--night", night, "--store", url,
                                   "--reference", "none", "--fail-on", "none", f"out={tmp}/{night}", *delayed],
                                  cwd=REPO, capture_output=True, text=True)
            print(f"night {night} (delay {delay} s): exit {done.returncode}", flush=True)
        keep(url, dict(nights), out)


def keep(url: str, delays: dict[str, float], out: Path) -> None:
    """One line per training record of the store's nights in `delays` ({night: the delay it ran with})."""
    lines = []
    for night, rec in History(url).records(PLATFORM, sorted(delays)):
        found = shares(rec.steps)
        if found:
            straggler = (rec.environment.get("load") or {}).get("straggler") or {}
            lines.append({"night": night, "delay_s": delays[night], "run_id": rec.run_id,
                          "shares": {str(k): round(v, 3) for k, v in found.items()},
                          "stands_out": bool(straggler.get("stands_out"))})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(x, sort_keys=True) + "\n" for x in lines))
    print(f"kept {len(lines)} records' shares in {out}")


def figures(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """The quiet nights' medians, the orderings of three quiet nights named, and each delayed night's medians and
    whether the rule (over it and the nights before it, quiet ones first) names it."""
    nights = sorted({x["night"] for x in lines})
    delay = {x["night"]: x["delay_s"] for x in lines}
    runs = sorted({x["run_id"] for x in lines})
    med = {(n, r): medians([x["shares"] for x in lines if x["night"] == n and x["run_id"] == r])
           for n in nights for r in runs}
    stood = {(n, r): sum(x["stands_out"] for x in lines if x["night"] == n and x["run_id"] == r)
             for n in nights for r in runs}

    def named(trio: tuple[str, ...], run: str) -> bool:
        now = med[trio[-1], run]
        latest = max(now, key=now.get)
        return rises([med[n, run].get(latest, 0.0) for n in trio])

    quiet = [n for n in nights if not delay[n]]
    values = [v for n in quiet for r in runs for v in med[n, r].values()]
    orderings = list(itertools.permutations(quiet, CREEP_NIGHTS))
    out = {"quiet_nights": len(quiet), "quiet_median_pct": [round(min(values), 1), round(max(values), 1)],
           "quiet_orderings": len(orderings) * len(runs),
           "quiet_named": sum(named(trio, r) for trio in orderings for r in runs), "delayed": []}
    for i, n in enumerate(nights):
        if delay[n]:
            trio = tuple(nights[i - CREEP_NIGHTS + 1:i + 1])
            out["delayed"].append({"night": n, "delay_s": delay[n], "runs": {
                r: {"rank1_pct": round(med[n, r].get("1", 0.0), 1), "named": named(trio, r),
                    "stood_out_in": stood[n, r]} for r in runs}})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quiet", type=int, default=8)
    p.add_argument("--delays", default="0.005,0.01,0.02,0.03")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "straggler_nights.jsonl")
    p.add_argument("--from", dest="source", type=Path, help="print the figures of kept lines; run nothing")
    a = p.parse_args()
    path = a.source
    if path is None:
        measure(a.quiet, [float(d) for d in a.delays.split(",")], a.out)
        path = a.out
    found = figures([json.loads(x) for x in path.read_text().splitlines() if x.strip()])
    print(f"{found['quiet_nights']} quiet nights: each rank's median share {found['quiet_median_pct'][0]}-"
          f"{found['quiet_median_pct'][1]} %; named in {found['quiet_named']} of {found['quiet_orderings']} "
          f"orderings of {CREEP_NIGHTS} of them")
    for d in found["delayed"]:
        words = []
        for run, v in d["runs"].items():
            stood = f", stood out in {v['stood_out_in']} repeat(s)" if v["stood_out_in"] else ""
            words.append(f"{run} {v['rank1_pct']} %{' named' if v['named'] else ''}{stood}")
        print(f"{d['night']} rank 1 sleeping {d['delay_s']} s a micro-step: " + "; ".join(words))
    return 0


if __name__ == "__main__":
    sys.exit(main())
