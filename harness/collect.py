"""`python -m harness collect OUT`: the records of Slurm jobs that a person submitted from a dry run.

    python -m harness bench platform=... platform.launcher=slurm --dry-run out=OUT   # scripts only
    sbatch OUT/runs/*/job.sbatch          # or OUT/slurm/sweep-*.sbatch: one job array for a -m sweep
    python -m harness collect OUT         # again as more jobs end: it only adds what is new

The dry run left OUT/slurm/dry-run.json (its overrides, each batch script and the runs it holds).
collect plans the same runs again (every run's resolved config must still be the one in its folder:
the same checkout), finds each run's job (the run folder's `slurm-<id>.out`, which an array task
links as `slurm-<A>_<a>.out`; else the queue, by batch script: a pending job has no output yet) and
turns each job that has ended into the records `bench` would have written had it launched the job:
status and reason from the ranks' events and exit files and the job's end, `environment.slurm`
with the job's id, state, exit code and nodes, wall time from Slurm's RunTime. A job still pending
or running, or never submitted, is listed and left for a later collect; a record already in OUT is
never rewritten. Then summary.md, suite.json (with what is not collected yet) and compare.md cover
every record of the dry run so far.

Exit status: 0 every run recorded and none failed; 3 every run recorded and one ended in error or
timeout (as `bench`); 4 some runs not collected yet (run collect again later); 2 bad input.
"""
from __future__ import annotations

import argparse
import fcntl
import json
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml

from contract import events as ev

from .bench import (DRY_RUN_MANIFEST, EXIT_RUN_FAILED, PlannedRun, drop_compile_cache, plan_suite, run_records,
                    write_and_show, write_results)
from .errors import HarnessError
from .launch.local import LaunchResult
from .launch.slurm import (ACTIVE, JobInfo, final_state, job_result, jobs_of_scripts, output_file, rank_exit_codes,
                           use_client)
from .provenance import CONTENT_PREFIX
from .record import ResultRecord
from .verdict.record_files import load_record

EXIT_NOT_ALL_COLLECTED = 4
HEADINGS = {"collected": "already collected", "ended": "", "active": "not collected yet: ",
            "unsubmitted": "not collected, never submitted: ", "unknown": "not collected, state unknown: "}
LOCK_FILE = Path("slurm") / ".collect.lock"


@dataclass
class DryRunJob:
    """One batch script of the dry run and the runs it holds (an array's task i runs runs[i])."""
    script: Path
    array: bool
    runs: list[str]


@dataclass
class Found:
    """What collect found for one run."""
    run_id: str
    state: str
    """collected (its records are in OUT) | ended | active (pending, running) | unsubmitted | unknown"""
    job_id: Optional[str] = None
    info: Optional[JobInfo] = None
    note: str = ""
    records: list[ResultRecord] = field(default_factory=list)
    launch: Optional[LaunchResult] = None


def load_manifest(out: Path) -> tuple[dict[str, Any], list[DryRunJob]]:
    if not out.is_dir():
        raise HarnessError(f"{out} is not a folder: collect needs the out= folder of a `bench --dry-run`")
    path = out / DRY_RUN_MANIFEST
    if not path.exists():
        what = ("it holds the results of a `bench` that launched its runs itself (suite.json): nothing to collect"
                if (out / "suite.json").exists() else
                "its runs are local (launch.sh), which collect does not read" if any(out.glob("runs/*/launch.sh"))
                else "it is not the folder of a `bench platform.launcher=slurm --dry-run out=...`")
        raise HarnessError(f"{out} has no {DRY_RUN_MANIFEST}: {what}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        jobs = [DryRunJob(out / j["script"], bool(j["array"]), [str(r) for r in j["runs"]]) for j in data["jobs"]]
        overrides, multirun = [str(o) for o in data["overrides"]], bool(data["multirun"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HarnessError(f"{path} is unreadable ({type(exc).__name__}: {exc}); was it edited?") from None
    return {**data, "overrides": overrides, "multirun": multirun}, jobs


def first_difference(a: Any, b: Any, path: str = "") -> Optional[str]:
    """The first dotted key where two plain (YAML) trees differ, with both values; None if equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            diff = first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
            if diff:
                return diff
        return None
    return None if a == b else f"{path or '<root>'}: dry run {a!r}, now {b!r}"


def made_with(manifest: dict[str, Any]) -> str:
    """The suite a dry run was planned with, as its manifest names it (harness/provenance.py suite_identity): a
    commit, or the content hash of a copy of the suite outside its git checkout (a copy has no commit)."""
    made = manifest.get("suite_commit")
    if isinstance(made, str) and made.startswith(CONTENT_PREFIX):
        return f"the copy of the suite that made it (its files hash to {made}; it had no commit of its own)"
    return f"the checkout that made it ({made or 'commit unknown'})"


def replan(out: Path, manifest: dict[str, Any], jobs: list[DryRunJob]) -> dict[str, PlannedRun]:
    """The dry run's runs planned again, each checked against the config its folder holds."""
    _, planned = plan_suite(manifest["overrides"], manifest["multirun"], out=out)
    by_id = {p.run.run_id: p for p in planned}
    for run_id in (r for j in jobs for r in j.runs):
        p = by_id.get(run_id)
        if p is None:
            raise HarnessError(f"the dry run's run {run_id} is not in the suite as it plans now "
                               f"({', '.join(by_id) or 'no runs'}): conf/ or the code changed since the dry run; "
                               f"collect with {made_with(manifest)}")
        try:
            stored = yaml.safe_load((p.run.run_dir / "config.yaml").read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise HarnessError(f"{p.run.run_dir / 'config.yaml'} is unreadable ({exc})") from None
        diff = first_difference(stored, yaml.safe_load(yaml.safe_dump(p.run.config, sort_keys=False)))
        if diff:
            raise HarnessError(f"run {run_id}: its resolved config differs from the dry run's ({diff}): conf/ or "
                               f"the code changed since; collect with {made_with(manifest)}")
    return by_id


def _job_order(job_id: str) -> tuple[int, int]:
    base, _, task = job_id.partition("_")
    return (int(base) if base.isdigit() else -1, int(task) if task.isdigit() else -1)


def find(p: PlannedRun, job: DryRunJob, queue: dict[Path, list[JobInfo]] | str, out: Path) -> Found:
    """The run's job and whether it has ended: the newest job that its folder or the queue names."""
    run = p.run
    task = str(job.runs.index(run.run_id))
    queued: dict[str, JobInfo] = {}
    for i in [] if isinstance(queue, str) else queue.get(job.script, []):
        if job.array and "_" not in i.job_id:  # an ended array's own record: tasks that never started
            queued.setdefault(f"{i.job_id}_{task}", replace(i, job_id=f"{i.job_id}_{task}", whole_array=True))
        elif (i.job_id.split("_", 1)[1] == task) if job.array else "_" not in i.job_id:
            queued[i.job_id] = i
    named = {f.name[len("slurm-"):-len(".out")] for f in run.run_dir.glob("slurm-*.out")}
    ids = sorted(set(queued) | {j for j in named if ("_" in j) == job.array}, key=_job_order)
    if not ids:
        if isinstance(queue, str):
            return Found(run.run_id, "unknown", note=f"no slurm-*.out in its folder, and the queue cannot be read ({queue})")
        return Found(run.run_id, "unsubmitted", note=f"no slurm-*.out in its folder, no job of its script in the "
                                                     f"queue; submit it: sbatch {job.script}")
    job_id = ids[-1]
    info = queued.get(job_id)
    if info is not None and info.state in ACTIVE:
        where = f" on {info.nodelist}" if info.nodelist and info.state != "PENDING" else ""
        why = f" ({info.reason})" if info.reason else ""
        return Found(run.run_id, "active", job_id, info, note=f"slurm job {job_id} {info.state}{where}{why}")
    codes = rank_exit_codes(run)
    if isinstance(queue, str) and None in codes.values():
        return Found(run.run_id, "unknown", job_id, note=f"slurm job {job_id}: the queue cannot be read ({queue}) "
                                                         "and not every rank has reported: it may still run")
    ended = final_state(job_id)
    if ended.state == "UNKNOWN" and info is not None:
        ended = replace(info, fields=ended.fields or info.fields)
    if ended.whole_array and None not in codes.values():  # its ranks ran: the array's state is not its own
        ended = JobInfo(job_id)
    if ended.state in ACTIVE:  # it moved on between squeue and scontrol
        return Found(run.run_id, "active", job_id, ended, note=f"slurm job {job_id} {ended.state}")
    return Found(run.run_id, "ended", job_id, ended, note=f"slurm job {job_id} ended {ended.state}")


def events_span_s(run_dir: Path) -> Optional[float]:
    times = [e["time_ms"] for e in ev.read_events(run_dir / ev.EVENTS_FILE) if isinstance(e.get("time_ms"), int)]
    return (max(times) - min(times)) / 1000.0 if len(times) > 1 else None


def launch_of(p: PlannedRun, found: Found, out: Path) -> LaunchResult:
    """The ended job as bench's launcher would have reported it (wall time: Slurm's RunTime)."""
    assert found.job_id is not None and found.info is not None
    wall = found.info.run_s if found.info.run_s is not None else (events_span_s(p.run.run_dir) or 0.0)
    return job_result(p.run, found.job_id, found.info, p.cfg.platform.slurm, output_file(p.run, out, found.job_id), wall)


@contextmanager
def locked(out: Path) -> Iterator[None]:
    """One collect at a time on a folder."""
    path = out / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise HarnessError(f"another `collect` is working on {out}; wait for it to finish") from None
        yield


def _stored(out: Path, record_id: str) -> Optional[ResultRecord]:
    path = out / f"{record_id}.json"
    if not path.exists():
        return None
    try:
        return load_record(path)
    except HarnessError as exc:
        raise HarnessError(f"{exc}; move it away and collect again") from None


def collect(out: Path) -> int:
    out = out.resolve()
    manifest, jobs = load_manifest(out)
    with locked(out):
        planned = replan(out, manifest, jobs)
        for p in list(planned.values())[:1]:   # the Slurm clients as the platform reaches them
            use_client(p.cfg.platform.slurm.client_prefix)
        run_jobs = {r: j for j in jobs for r in j.runs}
        order = [r for j in jobs for r in j.runs]
        stored = {r: [_stored(out, i) for i in planned[r].run.record_ids()] for r in order}
        todo = [r for r in order if not all(stored[r])]
        if not todo:
            n = sum(len(v) for v in stored.values())
            raise HarnessError(f"{out} is already collected: every run of its dry run has its records ({n}); "
                               "nothing to do")
        print(f"collect {out}: suite {manifest.get('suite')}, {len(order)} runs in {len(jobs)} batch script(s) "
              f"({DRY_RUN_MANIFEST})", flush=True)
        others = len(planned) - len(order)
        if others:
            print(f"  ({others} run(s) of the dry run are local (launch.sh): collect does not read them)")
        queue = jobs_of_scripts([j.script for j in jobs])
        found: dict[str, Found] = {}
        for r in order:  # every record is built before any is written
            if r not in todo:
                found[r] = Found(r, "collected")
                continue
            f = found[r] = find(planned[r], run_jobs[r], queue, out)
            if f.state == "ended":
                f.launch = launch_of(planned[r], f, out)
                f.records = run_records(planned[r], f.launch, out)
                drop_compile_cache(planned[r].run)
        written = []
        for r in order:
            f = found[r]
            print(f"  {r}: {HEADINGS[f.state]}{f.note}", flush=True)
            for record in f.records:
                if stored[r][planned[r].run.record_ids().index(record.run_id)] is None:
                    write_and_show(record, planned[r].run, f.launch, out)
                    written.append(record.run_id)
        waiting = {r: f.note for r, f in found.items() if f.state not in ("ended", "collected")}
        new = {rec.run_id: rec for f in found.values() for rec in f.records}
        records = [rec for rec in (kept or new.get(i) for r in order
                                   for i, kept in zip(planned[r].run.record_ids(), stored[r])) if rec is not None]
        if written:
            write_results(records, out, str(manifest.get("suite")), manifest["overrides"],
                          next(iter(planned.values())).cfg.history,
                          collected_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          not_collected=waiting)
        print(f"\ncollected {len(written)} new record(s); {len(order) - len(waiting)} of {len(order)} runs recorded"
              + (f"; {len(waiting)} not collected yet: run `python -m harness collect {out}` again once their jobs "
                 "end" if waiting else ""), flush=True)
    if waiting:
        return EXIT_NOT_ALL_COLLECTED
    return EXIT_RUN_FAILED if any(r.status in ("error", "timeout") for r in records) else 0


def cli(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness collect", description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the out= folder of `bench platform.launcher=slurm --dry-run`")
    ns = parser.parse_args(args)
    return collect(ns.out)
