"""The performance model at scale on the emulated cluster (issue 28, item 3): calibrated on 2-node runs
alone, it predicts the same suite on 3 and 4 nodes.

    make cluster-up NODES=4 LINK=1gbit CLUSTER=sc                   # as root
    .venv/bin/python tests/perf/cluster_scale.py --cluster sc [--rounds 2] [--nodes 2 3 4]
    make cluster-down CLUSTER=sc

Each round runs `bench platform=cpu-cluster platform.nodes=N suite=SUITE` for every N, interleaved
(a 2-core box drifts). Then, from the quiet 2-node records only (--calibrate-nodes):
- the network: each collective's busbw curve at 2 ranks, carried to N ranks as a ring
  (harness/model/topology.py: the latency part grows with the ring's steps, the bandwidth part with
  nccl-tests' factor), printed beside the curve measured at N;
- the computation: each 2-node run's profile-mode compute, carried to N ranks by the share of a core
  each rank gets (the nodes share this machine's cores: platform.shared_host);
- every N-node training run predicted with those (harness.model.check), never with its own records.
Printed per configuration (nodes x run): the median predicted and measured step time over the
quiet rounds and the error. Runs during which other processes used more than --max-other-cpus
CPUs' worth are left out (tests/perf/cluster_model.py's OtherLoad). Exit status 0 whatever the
figures, unless --max-error-pct is given and a configuration's median |error| exceeds it; 1 if a
bench failed or nothing was quiet.

Where the 2-core box limits this: 3 and 4 ranks share 2 cores, so a rank computes at 2/3 and 1/2
of its 2-node speed and gloo's own threads and the kernel's network work compete with it; only the
link rate (tc, 1 Gbit/s) is a real per-node resource.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Optional

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from harness.config.compose import compose  # noqa: E402
from harness.model.calibration import busbw_curves, load_records  # noqa: E402
from harness.model.check import check_step_times, checkable, record_config  # noqa: E402
from harness.record import ResultRecord  # noqa: E402
from tests.perf.cluster_model import BenchFailed, OtherLoad, bench, run_rounds  # noqa: E402


class ScaleCheck:
    def __init__(self, cluster: str, suite: str, nodes: list[int], out: Path, max_other_cpus: float):
        self.cluster, self.suite, self.nodes, self.out = cluster, suite, nodes, out
        self.max_other_cpus = max_other_cpus
        self.python = str(REPO_ROOT / ".venv" / "bin" / "python") if (REPO_ROOT / ".venv").exists() else sys.executable
        self.load = OtherLoad(str(out))
        self.dirs: dict[int, list[Path]] = {n: [] for n in nodes}
        out.mkdir(parents=True, exist_ok=True)

    def round(self) -> None:
        for n in self.nodes:
            k = len(self.dirs[n])
            d = self.out / f"n{n}-{k}"
            cmd = [self.python, "-m", "harness", "bench", "confirm_regressions=0", "platform=cpu-cluster", f"platform.nodes={n}",
                   f"suite={self.suite}", f"out={d}", "history=none"]
            log = self.out / f"n{n}-{k}.log"
            rc = bench(cmd, {**os.environ, "SUITE_CLUSTER": self.cluster}, log, self.load)
            print(f"round {k + 1}, {n} nodes: exit {rc} ({d})", flush=True)
            if rc not in (0, 3):
                raise BenchFailed(f"bench on {n} nodes exited {rc}: see {log}")
            self.dirs[n].append(d)

    def quiet(self, n: int) -> list[ResultRecord]:
        kept = []
        for d in self.dirs[n]:
            for rec in load_records([d]):
                busy = self.load.during(rec) if rec.kind == "training" else 0.0
                if self.max_other_cpus == float("inf") or (busy is not None and busy <= self.max_other_cpus):
                    kept.append(rec)
                elif rec.kind == "training":
                    print(f"  left out (other work {'-' if busy is None else f'{busy:.2f}'} CPUs): {d.name}/{rec.run_id}")
        return kept


def curve_table(base: list[ResultRecord], measured: list[ResultRecord], n: int) -> list[str]:
    """Per op: the 2-node curve carried to n ranks against the curve measured at n, per size."""
    if not measured:
        return []
    cfg = compose(["platform=cpu-cluster", f"platform.nodes={n}"])
    carried, own = busbw_curves(base, cfg), busbw_curves(measured, cfg)
    lines = [f"busbw at {n} nodes, GB/s: carried from 2 nodes / measured (error %)"]
    for op in sorted(set(carried) & set(own)):
        cells, errs = [], []
        for size, bw in own[op].points:
            got = carried[op].busbw_gbps(size)
            errs.append((got - bw) / bw * 100)
            cells.append(f"{size >> 10}K {got:.3f}/{bw:.3f} ({errs[-1]:+.0f})")
        big = [e for (s, _), e in zip(own[op].points, errs) if s >= 1 << 20]
        lines.append(f"  {op:<15} " + "  ".join(cells))
        lines.append(f"  {'':<15} median |error| {statistics.median(abs(e) for e in errs):.0f} % over all sizes, "
                     f"{statistics.median(abs(e) for e in big):.0f} % at 1 MiB and above" if big else "")
    return lines


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", default="default", help="the testbed cluster's name (make cluster-up CLUSTER=)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 3, 4], help="node counts, the first calibrates")
    parser.add_argument("--suite", default="default-cpu-cluster")
    parser.add_argument("--out", type=Path, help="keep the records here (default: a temporary folder)")
    parser.add_argument("--max-other-cpus", type=float, default=0.2)
    parser.add_argument("--max-error-pct", type=float, help="exit 1 when a configuration's median |error| exceeds it")
    parser.add_argument("--reuse", action="store_true", help="check the records already in --out (n<N>-<k> folders)")
    ns = parser.parse_args(argv)
    out = (ns.out or Path(tempfile.mkdtemp(prefix="cluster-scale-"))).resolve()
    check = ScaleCheck(ns.cluster, ns.suite, ns.nodes, out, ns.max_other_cpus)
    if ns.reuse:
        check.max_other_cpus = float("inf")
        for n in ns.nodes:
            check.dirs[n] = sorted(out.glob(f"n{n}-[0-9]*/"))
    elif not run_rounds(check, ns.rounds):
        return 1
    base_n, *others = ns.nodes
    base = check.quiet(base_n)
    if not checkable(base):
        print(f"no quiet {base_n}-node training run: run again when the box is idle")
        return 1
    worst, rows_out = 0.0, []
    for n in others:
        recs = check.quiet(n)
        print("\n".join(curve_table(base, recs, n)))
        runs = [(rec, record_config(rec, compose)) for rec in checkable(recs)]
        if not runs:
            continue
        by_run: dict[str, list] = {}
        for row in check_step_times(runs, base):
            by_run.setdefault(row.run_id, []).append(row)
        for run_id, rs in sorted(by_run.items()):
            pred = statistics.median(r.predicted_step_time_s for r in rs)
            meas = statistics.median(r.measured_step_time_s for r in rs)
            err = (pred - meas) / meas * 100
            worst = max(worst, abs(err))
            rows_out.append(f"  {n} nodes {run_id:<16} model {pred:.3f} s (compute {statistics.median(r.compute_s for r in rs):.3f}, "
                            f"exposed comm {statistics.median(r.exposed_comm_s for r in rs):.3f})  measured {meas:.3f} s  "
                            f"error {err:+.1f} %  ({len(rs)} run(s))")
            src = rs[0].efficiency_source
    if not rows_out:
        print("no quiet run to check")
        return 1
    print(f"\ncalibrated on {base_n} nodes only ({len(checkable(base))} quiet training runs); median over the quiet rounds:")
    print("\n".join(rows_out))
    print(f"  computation: {src}")
    print(f"records in {out}")
    return 1 if ns.max_error_pct is not None and worst > ns.max_error_pct else 0


if __name__ == "__main__":
    sys.exit(main())
