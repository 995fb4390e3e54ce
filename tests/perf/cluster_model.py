"""The performance model against the emulated cluster (issue 15): cpu-cluster step times predicted
from single-node runs of the same machine (the computation) and the cluster's own collective sweep
(the network), beside the measured ones.

    make cluster-up NODES=2 LINK=1gbit CLUSTER=pm                 # as root
    .venv/bin/python tests/perf/cluster_model.py --cluster pm [--rounds 3] [--suite default-cpu]
    make cluster-down CLUSTER=pm

Each round runs the suite on the single-node cpu platform (`bench platform=cpu suite=SUITE`) and on
the cluster (`bench platform=cpu-cluster suite=SUITE`, SUITE_CLUSTER naming it: every run a Slurm
job over both nodes), interleaved because a 2-core box drifts. The collective sweep runs once, in
the first round's cluster bench (the network the model reads); every other bench makes only the
suite's training runs (only=). The check is what
`python -m harness model --against CLUSTER... --compute-records CPU...` does (harness.model.check):
each cluster run predicted with the median single-node profile compute of its stage and split and
the cluster's collective sweeps, never calibrated on itself.

Noise: other processes on the box slow both sides (on a 2-core box one busy neighbour doubles a
step time). During every run this script samples how many CPUs' worth OTHER processes used (the
whole machine's busy time less the processes whose command line names this check's out folder:
its controllers, ranks and Slurm job steps); a record whose run saw more than --max-other-cpus is
left out of both the calibration and the check, and listed, beside the hypervisor's steal each record
kept (steal_cpus: not a gate; each side's share of the box widens that side of the bound, see
Verdict.bound). Printed: every run kept, then per
configuration the median over rounds. Exit status 0 whatever the figures, unless --max-error-pct is
given and a configuration's median |error| exceeds it; 1 if a bench failed (a run ending in error is
reported and the others checked) or nothing was quiet.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import psutil

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from harness.config.compose import compose  # noqa: E402
from harness.model.calibration import load_records  # noqa: E402
from harness.model.check import check_step_times, checkable, record_config  # noqa: E402
from harness.model.text import format_checks  # noqa: E402
from harness.record import ResultRecord  # noqa: E402


class OtherLoad:
    """(wall time, CPUs' worth used by processes whose command line does not name `mark`) samples:
    the CPU time of every other process since the previous sample (the kernel's own time for the
    cluster's network, softirq, is nobody's and not counted)."""

    def __init__(self, mark: str):
        self.mark = mark
        self.samples: list[tuple[float, float]] = []
        self._seen: dict[tuple[int, float], float] = {}
        self._last: Optional[float] = None

    def _ours(self, p: psutil.Process) -> bool:
        try:
            return p.pid == os.getpid() or self.mark in " ".join(p.cmdline())
        except psutil.Error:
            return True          # gone: nothing to count

    def sample(self) -> None:
        now, other, seen = time.monotonic(), 0.0, {}
        for p in psutil.process_iter():
            try:
                t, key = p.cpu_times(), (p.pid, p.create_time())
            except psutil.Error:
                continue
            seen[key] = t.user + t.system
            if self._last is not None and not self._ours(p):
                other += seen[key] - self._seen.get(key, seen[key] if p.create_time() < self._wall_last else 0.0)
        if self._last is not None:
            self.samples.append((time.time(), max(other, 0.0) / (now - self._last)))
        self._seen, self._last, self._wall_last = seen, now, time.time()

    def during(self, rec: ResultRecord) -> Optional[float]:
        """Mean over the record's run: from created_utc - wall_s to created_utc."""
        try:
            end = datetime.datetime.fromisoformat(rec.created_utc).timestamp()
            start = end - rec.wall_s
        except (TypeError, ValueError):
            return None
        xs = [v for t, v in self.samples if start <= t <= end + 2]
        return statistics.fmean(xs) if xs else None


def bench(argv: list[str], env: dict[str, str], log: Path, load: OtherLoad) -> int:
    load.sample()
    with open(log, "w", encoding="utf-8") as f:
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            time.sleep(2)
            load.sample()
    return proc.returncode


class BenchFailed(RuntimeError):
    """A bench exited with neither success nor "a run ended in error" (3)."""


@dataclass
class Verdict:
    """Per cluster configuration (run id): the median over the quiet rounds."""
    run_id: str
    predicted_s: float
    measured_s: float
    runs: int
    spread_pct: float = 0.0
    """How far apart the rounds' measured step times lay: (max - min) / median, percent (0 for one)."""
    compute_delta_pct: float = 0.0
    """How much longer (positive) or shorter (negative) the cluster's own profiled computation took
    than the single-node runs' (the model's computation), as a share of the measured step: both are
    measurements, of the same code on the same cores. Longer is shared_host_pct, shorter
    slower_calibration_pct; each widens one side of the bound."""

    @property
    def shared_host_pct(self) -> float:
        """How much longer the cluster computed (0 when no longer): two emulated nodes share this box's
        two cores, so the kernel's and gloo's work for the shaped TCP link lands on the cores the other
        rank computes on; a real cluster's nodes do not share cores, and the model has no term for it."""
        return max(0.0, self.compute_delta_pct)

    @property
    def slower_calibration_pct(self) -> float:
        """How much longer the single node computed (0 when no longer): the machine itself ran slower
        while the model was calibrated (the hypervisor's steal, work below the quiet gate, the host's
        drift between the sides' benches) and the prediction carries that time, which the cluster's
        runs did not spend. CI of 80bdd5b (2026-11-29): ZeRO-1 predicted 1.085 s, measured 0.890 s
        in two rounds 4 % apart, +21.9 %, its cluster runs at steal 0.07."""
        return max(0.0, -self.compute_delta_pct)

    steal_cpus: Optional[float] = None
    """The most CPUs' worth the hypervisor took during one of the configuration's cluster runs (None:
    not read), shown beside the error (steal_cpus())."""
    cluster_stolen_pct: float = 0.0
    """The largest share of the box the hypervisor took during one of the configuration's cluster runs
    (stolen_pct); widens the bound below."""
    calibration_stolen_pct: float = 0.0
    """The same of the single node's runs the model was calibrated on; widens the bound above."""

    @property
    def error_pct(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s * 100

    def bound(self, target_pct: float) -> tuple[float, float]:
        """The (lowest, highest) error in percent that meets target_pct: the target plus how far apart
        the rounds measured this configuration (a model error inside the measurement's own noise is
        not the model's; one round measures no spread, so it is judged on the target alone); below,
        plus the shared cores' measured cost (shared_host_pct), which the emulation has and a real
        cluster does not; above, plus how much slower the machine computed while calibrating than
        during the cluster's runs (slower_calibration_pct). Both widenings are one measurement's two
        signs, and a model wrong in what it adds to the computation (the network,
        the overlap) by more than the target still fails. Each side widens by the larger of that
        measurement and the share of the box the hypervisor took during that side's runs (stolen_pct):
        below, the cluster's runs; above, the single node's (the calibration). Steal lengthens the
        waits as well as the computation, which the compute delta alone does not see: on 2026-12-03 a
        ZeRO-1 check read -37.2 % with the hypervisor taking 0.91 of the 2 CPUs during the cluster's
        runs (ZeRO-2 and 3 -22.5 and -19.9 % at 0.97-0.98), and in CI +22.7 % against +20.5 % with
        the single node's runs stolen from."""
        spread = target_pct + self.spread_pct
        return (-(spread + max(self.shared_host_pct, self.cluster_stolen_pct)),
                spread + max(self.slower_calibration_pct, self.calibration_stolen_pct))

    def computed(self) -> str:
        """How the cluster's own computation compared with the single node's (the model's), in words."""
        if self.slower_calibration_pct:
            return (f"the cluster computed {self.slower_calibration_pct:.1f} % of the step shorter than the single "
                    "node (the machine slower while calibrating)")
        return f"the cluster computed {self.shared_host_pct:.1f} % of the step longer than the single node"

    def stolen(self) -> str:
        """The hypervisor's share of the box on each side, in words."""
        return (f"the hypervisor took up to {'-' if self.steal_cpus is None else f'{self.steal_cpus:.2f}'} CPUs "
                f"during the cluster's runs ({self.cluster_stolen_pct:.0f} % of the box counted), "
                f"{self.calibration_stolen_pct:.0f} % during the single node's")

    def within(self, target_pct: float) -> bool:
        low, high = self.bound(target_pct)
        return low <= self.error_pct <= high


class ClusterModelCheck:
    """Interleaved rounds of the suite on the single-node cpu platform and on the cluster, with the
    other load seen during each training run; the model checked on the quiet ones."""

    def __init__(self, cluster: str, suite: str, out: Path, max_other_cpus: float):
        self.cluster, self.suite, self.out, self.max_other_cpus = cluster, suite, out, max_other_cpus
        self.python = str(REPO_ROOT / ".venv" / "bin" / "python") if (REPO_ROOT / ".venv").exists() else sys.executable
        self.load = OtherLoad(str(out))
        self.dirs: dict[str, list[Path]] = {"cpu": [], "cluster": []}
        self.benches: dict[str, list[tuple[int, Path, Path]]] = {"cpu": [], "cluster": []}
        """Each bench of a side, failed ones too: (exit status, its out folder, its log)."""
        out.mkdir(parents=True, exist_ok=True)

    def round(self) -> None:
        k = len(self.dirs["cpu"])
        training = [r.name for r in compose([f"suite={self.suite}"]).suite.runs if r.kind.value == "training"]
        for side in ("cpu", "cluster"):
            d = self.out / f"{side}-{k}"
            cmd = [self.python, "-m", "harness", "bench", "confirm_regressions=0", f"platform={'cpu' if side == 'cpu' else 'cpu-cluster'}",
                   f"suite={self.suite}", f"out={d}"]
            if side == "cpu" or k > 0:   # the network is the first cluster round's sweep; a single node's calibrates nothing
                cmd.append(f"only=[{','.join(training)}]")
            log = self.out / f"{side}-{k}.log"
            rc = bench(cmd, {**os.environ, "SUITE_CLUSTER": self.cluster}, log, self.load)
            print(f"round {k + 1} {side}: exit {rc} ({d})", flush=True)
            self.benches[side].append((rc, d, log))
            if rc == 3:                     # bench: a run ended in error or timeout; the others are records
                print(f"  a run failed (its record says why; see {log}): checking the others")
            elif rc != 0:
                raise BenchFailed(f"bench on {side} exited {rc}: see {log}")
            self.dirs[side].append(d)

    def quiet(self) -> dict[str, list[ResultRecord]]:
        """The records of both sides whose run saw at most max_other_cpus of other work (printed, with
        the hypervisor's steal the record kept: shown, not a reason to leave a run out, see steal_cpus)."""
        kept: dict[str, list[ResultRecord]] = {"cpu": [], "cluster": []}
        print(f"other work during each training run (CPUs' worth; above {self.max_other_cpus:g}: left out), "
              "and the hypervisor's steal:")
        for side, folders in self.dirs.items():
            for d in folders:
                for rec in load_records([d]):
                    busy = self.load.during(rec) if rec.kind == "training" else 0.0
                    quiet = busy is not None and busy <= self.max_other_cpus
                    if rec.kind == "training":
                        stolen = steal_cpus(rec)
                        print(f"  {d.name}/{rec.run_id}: {'-' if busy is None else f'{busy:.2f}'}"
                              f", steal {'-' if stolen is None else f'{stolen:.2f}'}" + ("" if quiet else "  LEFT OUT"))
                    if quiet:
                        kept[side].append(rec)
        return kept

    def configurations(self) -> set[str]:
        """The cluster's training configurations (run ids), quiet or not."""
        return {rec.run_id for d in self.dirs["cluster"] for rec in checkable(load_records([d]))}

    def verdicts(self) -> list[Verdict]:
        """Per configuration with a quiet run on the cluster (and quiet calibration runs): the
        median predicted and measured step time over the rounds. Every checked run is printed."""
        kept = self.quiet()
        runs = [(rec, record_config(rec, compose)) for rec in checkable(kept["cluster"])]
        if not runs or not checkable(kept["cpu"]):
            return []
        rows = check_step_times(runs, kept["cluster"], kept["cpu"])
        print("\n" + format_checks(rows))
        by_run: dict[str, list] = {}
        for row in rows:
            by_run.setdefault(row.run_id, []).append(row)
        out = []
        for run_id, rs in sorted(by_run.items()):
            measured = [r.measured_step_time_s for r in rs]
            med = statistics.median(measured)
            longer = _median_compute(kept["cluster"], run_id) - _median_compute(kept["cpu"], run_id)
            stolen = [x for x in (steal_cpus(rec) for rec in kept["cluster"] if rec.run_id == run_id) if x is not None]
            share = {side: max((stolen_pct(rec) for rec in kept[side] if rec.run_id == run_id), default=0.0)
                     for side in ("cpu", "cluster")}
            out.append(Verdict(run_id, statistics.median(r.predicted_step_time_s for r in rs), med, len(rs),
                               100.0 * (max(measured) - min(measured)) / med if med else 0.0,
                               compute_delta_pct=100.0 * longer / med if med else 0.0,
                               steal_cpus=max(stolen) if stolen else None,
                               cluster_stolen_pct=share["cluster"], calibration_stolen_pct=share["cpu"]))
        return out


def steal_cpus(rec: ResultRecord) -> Optional[float]:
    """The CPUs' worth the hypervisor took from the box during the run (environment.load.steal_cpus,
    the median over a node's ranks, of the busiest node); None where the record has no reading.
    Shown beside other work, never a reason to leave a run out: on the 2-core VM that runs this it is
    there through whole rounds (2026-11-29: 0.10-0.30 CPUs during the single node's runs, 0.34-0.62
    during the cluster's), so a gate on it would leave nothing to judge. What it costs is counted
    instead: each side of a verdict's bound widens by the larger of the measured compute delta and
    that side's stolen share of the box (stolen_pct, Verdict.bound; a ZeRO-1 round at steal 0.62
    measured 1.277 s, the next at 0.44 1.055 s)."""
    load = (rec.environment or {}).get("load") or {}
    value = load.get("steal_cpus")
    return float(value) if isinstance(value, (int, float)) else None


STOLEN_AT_MOST_PCT = 30.0
"""The most of the box the hypervisor's steal may widen a bound by, as the link-rate test caps it
(tests/integration/test_cpu_cluster.py, through stolen_share): a model off by more than that still fails."""


def stolen_pct(rec: ResultRecord) -> float:
    """The share of the box, percent, the hypervisor took while the run measured (stolen_share of its
    environment). A wall time whose CPUs lost a share s reads up to 1/(1-s) longer, so an error read
    against it moves by about s."""
    return 100.0 * stolen_share(rec.environment)


def stolen_share(env: Optional[dict]) -> float:
    """The share of the box a record's hypervisor took while it measured (load.steal_cpus over the machine's
    CPUs), at most STOLEN_AT_MOST_PCT; 0 where the record does not say. The link-rate test reads it too."""
    stolen = ((env or {}).get("load") or {}).get("steal_cpus")
    cpu = ((env or {}).get("machine") or {}).get("cpu") or {}
    cpus = cpu.get("usable_cpus") or cpu.get("logical_cpus") or 2
    ok = isinstance(stolen, (int, float)) and stolen > 0
    return min(STOLEN_AT_MOST_PCT / 100.0, stolen / cpus) if ok else 0.0


def _median_compute(records: list[ResultRecord], run_id: str) -> float:
    """The median profile-mode computation of a step (its micro-steps' compute_s) over the records of
    run_id; 0 when none was profiled."""
    steps = [sum(m.get("compute_s", 0.0) for m in step)
             for rec in records if rec.run_id == run_id for step in rec.microsteps if step]
    return statistics.median(steps) if steps else 0.0


def run_rounds(check, rounds: int) -> bool:
    """check.round() `rounds` times; False (said why) when a bench failed."""
    try:
        for _ in range(rounds):
            check.round()
    except BenchFailed as exc:
        print(exc)
        return False
    return True


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", default="default", help="the testbed cluster's name (make cluster-up CLUSTER=)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--suite", default="default-cpu-cluster",
                        help="run on both platforms (default-cpu adds mb 2 x ga 4 and the distillation run)")
    parser.add_argument("--out", type=Path, help="keep the records here (default: a temporary folder)")
    parser.add_argument("--max-other-cpus", type=float, default=0.2,
                        help="leave out a run during which other processes used more CPUs' worth than this")
    parser.add_argument("--max-error-pct", type=float, help="exit 1 when a configuration's median |error| exceeds it")
    ns = parser.parse_args(argv)
    out = (ns.out or Path(tempfile.mkdtemp(prefix="cluster-model-"))).resolve()
    check = ClusterModelCheck(ns.cluster, ns.suite, out, ns.max_other_cpus)
    if not run_rounds(check, ns.rounds):
        return 1
    verdicts = check.verdicts()
    if not verdicts:
        print("no quiet run on one of the sides: run again when the box is idle")
        return 1
    print(f"\nmedian over the quiet rounds (of {ns.rounds}):")
    for v in verdicts:
        print(f"  {v.run_id:<22} model {v.predicted_s:.3f} s  measured {v.measured_s:.3f} s  "
              f"error {v.error_pct:+.1f} %  ({v.runs} run(s), measured {v.spread_pct:.1f} % apart; {v.computed()}; "
              f"{v.stolen()})")
    print(f"records in {out}")
    worst = max(abs(v.error_pct) for v in verdicts)
    return 1 if ns.max_error_pct is not None and worst > ns.max_error_pct else 0


if __name__ == "__main__":
    sys.exit(main())
