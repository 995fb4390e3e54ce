"""Runs as Slurm jobs: submission, waiting, and the job's end turned into a LaunchResult (the batch
scripts themselves are harness/launch/slurm_script.py).

One job per run; a sweep's runs (multirun) go in one job array. Each rank writes `rank<N>.exit` in
the run folder, so the harness learns every rank's exit code as with local processes. The run
folder and the repository must be on a filesystem the nodes share.

While it waits, the harness cancels a job running past measure.timeout_s (a timeout) and, with
platform.slurm.queue_limit_s, a job still pending past that limit (an error naming the limit and
Slurm's pending reason). Without `sacct` (no accounting) a finished job's state comes from
`squeue -t all` / `scontrol` while slurmctld still holds it (MinJobAge, 300 s by default), which is
long enough for the harness's polling.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from ..atomic import write_text_atomic
from ..config.schema import PlatformConfig, SlurmConfig
from ..errors import HarnessError
from ..plan import RunSpec
from .local import LaunchResult
from .slurm_script import array_output, array_script, array_script_path, batch_script, script_path

LOST_AFTER_S = 600.0
"""squeue failing this long: the runs are given up (their jobs cancelled) and recorded as errors."""
ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
          "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD"}
EXTERNAL_ENDS = {
    "CANCELLED": "was cancelled",
    "PREEMPTED": "was pre-empted",
    "NODE_FAIL": "ended by a node failure",
    "BOOT_FAIL": "ended by a node boot failure",
    "DEADLINE": "passed its deadline",
    "OUT_OF_MEMORY": "ran out of memory (Slurm's memory limit)",
    "REVOKED": "was revoked",
}
"""Job ends that the ranks did not cause: the root cause of the run's end, whatever they reported."""


# ---- talking to Slurm ------------------------------------------------------------------------

CLIENT_PREFIX: list[str] = []
"""platform.slurm.client_prefix of the platform whose jobs this process talks about (set by
use_client()): every Slurm client command runs through it."""


def use_client(prefix: list[str]) -> None:
    """Run the Slurm client commands through this argv prefix from now on ([]: directly)."""
    CLIENT_PREFIX[:] = list(prefix)


def _slurm(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    cmd = [*CLIENT_PREFIX, *cmd]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        if CLIENT_PREFIX:
            raise HarnessError(f"platform.slurm.client_prefix starts with `{cmd[0]}`, which does not exist: the "
                               "platform reaches its Slurm through it (cpu-cluster: no emulated cluster of the "
                               "name SUITE_CLUSTER gives is up; `make cluster-up` starts one)") from None
        raise HarnessError(f"`{cmd[0]}` is not on PATH: platform.launcher=slurm needs the Slurm client "
                           "commands (sbatch, squeue, scontrol, scancel) on this host") from None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"{cmd[0]} did not answer in {timeout:g} s")


def submit(script: Path, extra: Optional[list[str]] = None) -> str:
    """sbatch the script; the job id."""
    proc = _slurm(["sbatch", "--parsable", *(extra or []), str(script)])
    if proc.returncode != 0:
        raise HarnessError(f"sbatch {script} failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout.strip().split(";")[0]


def cancel(job_ids: list[str]) -> None:
    if job_ids:
        _slurm(["scancel", *job_ids])


@dataclass
class JobInfo:
    job_id: str
    state: str = "UNKNOWN"
    reason: str = ""
    nodelist: str = ""
    exit_code: Optional[str] = None
    fields: dict[str, str] = field(default_factory=dict)
    run_s: Optional[float] = None
    """How long the job ran (scontrol's RunTime, sacct's Elapsed), when Slurm still knows."""
    whole_array: bool = False
    """An array task that never had a record of its own (still pending when its array was cancelled
    or ended): the state is that of the array's remaining tasks."""


def _parse(line: str) -> Optional[JobInfo]:
    """One `%i|%T|%r|%N` squeue line."""
    parts = line.strip().split("|")
    if len(parts) != 4:
        return None
    return JobInfo(parts[0], parts[1], "" if parts[2] == "None" else parts[2], parts[3])


def queue_states(job_ids: list[str]) -> dict[str, JobInfo] | str:
    """Every task of these jobs that slurmctld still holds (including just-finished ones), by id
    (`123`, or `123_4` for array tasks); squeue's error message when it failed."""
    proc = _slurm(["squeue", "-h", "-r", "-t", "all", "-j", ",".join(job_ids), "-o", "%i|%T|%r|%N"])
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return {}
        return f"squeue exited {proc.returncode}: {proc.stderr.strip()[:300]}"
    return {info.job_id: info for info in map(_parse, proc.stdout.splitlines()) if info}


def jobs_of_scripts(scripts: list[Path]) -> dict[Path, list[JobInfo]] | str:
    """The jobs slurmctld holds (queued, running, just finished) whose batch script is one of these,
    by script; squeue's error message when it failed. Slurm keeps a script's absolute path."""
    proc = _slurm(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%r|%N|%o"])
    if proc.returncode != 0:
        return f"squeue exited {proc.returncode}: {proc.stderr.strip()[:300]}"
    wanted = {str(path.resolve()): path for path in scripts}
    found: dict[Path, list[JobInfo]] = {}
    for line in proc.stdout.splitlines():
        fields, _, command = line.strip().rpartition("|")
        info = _parse(fields)
        if info and command in wanted:
            found.setdefault(wanted[command], []).append(info)
    return found


def duration_s(text: Optional[str]) -> Optional[float]:
    """Slurm's [D-]HH:MM:SS (or MM:SS) as seconds; None when absent or unreadable."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.\d+)?", (text or "").strip())
    if not m:
        return None
    days, hours, minutes, seconds = (int(x or 0) for x in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def _job_info(job_id: str, fields: dict[str, str], whole_array: bool = False) -> JobInfo:
    return JobInfo(job_id, fields.get("JobState", "UNKNOWN"), fields.get("Reason", ""), fields.get("NodeList", ""),
                   fields.get("ExitCode"), fields, duration_s(fields.get("RunTime")), whole_array)


def _task_in(task: str, spec: str) -> bool:
    """Whether array task `task` is in scontrol's ArrayTaskId (`3`, `1-4`, `0,2-5%2`; 4294967294:
    the meta record of tasks that never had their own)."""
    spec = spec.split("%")[0]
    if spec == "4294967294":
        return True
    for part in filter(None, spec.split(",")):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (hi or lo).isdigit() and int(lo) <= int(task) <= int(hi or lo):
            return True
    return False


def final_state(job_id: str) -> JobInfo:
    """The finished job's state, exit code, nodes and run time: scontrol, else sacct, else (an
    array task that never started) its array's record, else UNKNOWN."""
    proc = _slurm(["scontrol", "show", "job", "-o", job_id])
    if proc.returncode == 0 and "JobState=" in proc.stdout:
        return _job_info(job_id, dict(re.findall(r"(\w+)=(\S*)", proc.stdout.splitlines()[0])))
    proc = _slurm(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,ExitCode,NodeList,Reason,Elapsed"])
    if proc.returncode == 0 and proc.stdout.strip():
        state, code, nodes, reason, elapsed = (proc.stdout.strip().splitlines()[0].split("|") + [""] * 5)[:5]
        return JobInfo(job_id, state.split()[0], reason, nodes, code, run_s=duration_s(elapsed))
    if "_" in job_id:  # a pending task of a cancelled array is folded into the array's own record
        base, task = job_id.split("_", 1)
        proc = _slurm(["scontrol", "show", "job", "-o", base])
        for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
            fields = dict(re.findall(r"(\w+)=(\S*)", line))
            if fields.get("JobId") == base and _task_in(task, fields.get("ArrayTaskId", "")):
                return _job_info(job_id, fields, whole_array=True)
    return JobInfo(job_id)


def rank_exit_codes(run: RunSpec) -> dict[int, Optional[int]]:
    """From rank<N>.exit: the code, negative for a signal (a shell reports 128 + N), None if absent."""
    ranks = 1 if run.output == "nccl-tests" else run.num_ranks
    codes: dict[int, Optional[int]] = {}
    for r in range(ranks):
        try:
            code = int((run.run_dir / f"rank{r}.exit").read_text().strip())
        except (OSError, ValueError):
            code = None
        codes[r] = -(code - 128) if code is not None and code > 128 else code
    return codes


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def job_result(run: RunSpec, job_id: str, info: JobInfo, s: SlurmConfig, out_file: Optional[Path],
               wall_s: float, timed_out: bool = False, queue_cause: Optional[str] = None) -> LaunchResult:
    """A finished job as the run's LaunchResult: the ranks' exit files, and the job's end as the
    cause when the ranks did not decide it. timed_out: the harness cancelled it past
    measure.timeout_s; queue_cause: the harness cancelled it still pending past queue_limit_s."""
    codes = rank_exit_codes(run)
    missing = [r for r, c in codes.items() if c is None]
    def known(name: str, declared: Optional[str]) -> Optional[str]:
        value = info.fields.get(name)
        return value if value and value not in ("(null)", "N/A") else declared

    job = {"launcher": "slurm", "job_id": job_id, "state": info.state, "exit_code": info.exit_code,
           "nodelist": info.nodelist or None, "partition": known("Partition", s.partition),
           "account": known("Account", s.account), "qos": known("QOS", s.qos)}
    if "_" in job_id:
        job["array_job_id"], job["array_task_id"] = job_id.split("_", 1)
    cause, cause_status = None, "error"
    base = info.state.split()[0] if info.state else "UNKNOWN"
    if timed_out:
        cause = (f"exceeded measure.timeout_s={run.timeout_s:g} s; the harness cancelled slurm job "
                 f"{job_id}; ranks {missing} did not finish")
    elif queue_cause and base == "CANCELLED":
        cause = f"slurm job {job_id} {queue_cause}"
    elif base == "TIMEOUT":
        timed_out = True
        cause = f"slurm job {job_id} reached its time limit (--time); ranks {missing} did not finish"
    elif base in EXTERNAL_ENDS:
        cause = f"slurm job {job_id} {EXTERNAL_ENDS[base]} ({info.state}"
        cause += f", reason {info.reason})" if info.reason and info.reason != "None" else ")"
        cause_status = "oom" if base == "OUT_OF_MEMORY" else "error"
    elif len(missing) == len(codes) and base != "COMPLETED":
        tail = _tail(out_file) if out_file else ""
        cause = (f"slurm job {job_id} ended {info.state} (exit {info.exit_code}) before any rank "
                 f"reported; {out_file}" + (f": {tail}" if tail else ""))
    return LaunchResult(exit_codes=codes, timed_out=timed_out, wall_s=wall_s,
                        killed_ranks=missing if (cause or timed_out) else [],
                        cause=cause, cause_status=cause_status, job=job)


def output_file(run: RunSpec, out_dir: Path, job_id: str) -> Optional[Path]:
    """Slurm's output of the job (an array task's in OUT/slurm/), if it exists."""
    path = array_output(out_dir, job_id) if "_" in job_id else run.run_dir / f"slurm-{job_id}.out"
    return path if path.exists() else None


@dataclass
class _Watched:
    run: RunSpec
    job_id: str
    submitted: float
    started: Optional[float] = None
    last_state: str = ""
    reason: str = ""
    """Slurm's pending reason at the last poll."""
    timed_out: bool = False
    queue_cause: Optional[str] = None
    """Set when the harness cancelled the job still pending past platform.slurm.queue_limit_s."""


class SlurmLauncher:
    """Submits runs as Slurm jobs and waits for them, printing their state as it changes."""

    def __init__(self, platform: PlatformConfig, repo_root: Path, out_dir: Path, image: Optional[str] = None,
                 on_poll: Optional[Callable[[RunSpec], None]] = None, stream=sys.stdout):
        self.platform = platform
        use_client(platform.slurm.client_prefix)
        self.repo_root = repo_root
        self.out_dir = out_dir
        self.image = image
        self.on_poll = on_poll
        self.stream = stream

    def write_script(self, run: RunSpec) -> Path:
        path = script_path(run)
        write_text_atomic(path, batch_script(run, self.platform, self.repo_root, self.out_dir, self.image))
        return path

    def write_array_script(self, runs: list[RunSpec]) -> Path:
        path = array_script_path(runs, self.out_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, array_script(runs, self.platform, self.repo_root, self.out_dir, self.image))
        return path

    def run(self, run: RunSpec, cwd: Path) -> LaunchResult:
        script = self.write_script(run)
        job_id = submit(script)
        self._say(f"  slurm job {job_id} submitted ({script})")
        return self.wait({job_id: run})[job_id]

    def run_array(self, runs: list[RunSpec]) -> dict[str, LaunchResult]:
        """The runs as one job array; their results by run id."""
        script = self.write_array_script(runs)
        job_id = submit(script)
        self._say(f"  slurm job array {job_id} submitted: {len(runs)} tasks ({script})")
        results = self.wait({f"{job_id}_{i}": run for i, run in enumerate(runs)})
        return {runs[i].run_id: results[f"{job_id}_{i}"] for i in range(len(runs))}

    def _say(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def wait(self, jobs: dict[str, RunSpec]) -> dict[str, LaunchResult]:
        """Poll until every job has ended; a run past measure.timeout_s once running is cancelled
        (a timeout), a job pending past platform.slurm.queue_limit_s too (an error). Interrupted
        (Ctrl-C), the jobs are cancelled before the exception goes on."""
        now = time.monotonic()
        watched = {j: _Watched(run, j, now) for j, run in jobs.items()}
        done: dict[str, LaunchResult] = {}
        bases = sorted({j.split("_")[0] for j in jobs})
        queued_s = dict.fromkeys(bases, 0.0)
        last_poll = now
        failing_since: Optional[float] = None
        try:
            while len(done) < len(watched):
                states = queue_states(bases)
                now = time.monotonic()
                if isinstance(states, str):
                    failing_since = failing_since or now
                    if now - failing_since > LOST_AFTER_S:
                        self._lose_contact(watched, done, states, now)
                    time.sleep(self.platform.slurm.poll_s)
                    continue
                failing_since = None
                for j, w in watched.items():
                    if j in done:
                        continue
                    info = states.get(j)  # squeue -r lists every array task, pending ones too
                    state = info.state if info else "GONE"
                    w.reason = info.reason if info else ""
                    if state != w.last_state and state != "GONE":
                        where = f" on {info.nodelist}" if info and info.nodelist and state == "RUNNING" else ""
                        why = f" ({info.reason})" if info and info.reason and state == "PENDING" else ""
                        self._say(f"  {w.run.run_id}: slurm job {j} {state}{where}{why}")
                        w.last_state = state
                    if state in ("RUNNING", "COMPLETING") and w.started is None:
                        w.started = now
                    if state in ACTIVE:
                        if w.started is not None and self.on_poll:
                            self.on_poll(w.run)
                        if w.started is not None and not w.timed_out and now - w.started > w.run.timeout_s:
                            self._say(f"  {w.run.run_id}: past measure.timeout_s={w.run.timeout_s:g} s; "
                                      f"cancelling slurm job {j}")
                            w.timed_out = True
                            cancel([j])
                        continue
                    done[j] = self._result(w, now)
                self._queue_limit(watched, done, queued_s, now - last_poll)
                last_poll = now
                if len(done) < len(watched):
                    time.sleep(self.platform.slurm.poll_s)
        except BaseException:
            cancel([j for j in watched if j not in done])
            raise
        return done

    def _queue_limit(self, watched: dict[str, _Watched], done: dict[str, LaunchResult],
                     queued_s: dict[str, float], dt: float) -> None:
        """Count each job's time in the queue (an array's: while none of its tasks runs, so tasks
        waiting for their siblings' CPUs do not count) and cancel what is still pending past
        platform.slurm.queue_limit_s."""
        limit = self.platform.slurm.queue_limit_s
        if limit is None:
            return
        for base in queued_s:
            tasks = [w for j, w in watched.items() if j.split("_")[0] == base and j not in done]
            pending = [w for w in tasks if w.last_state == "PENDING" and w.queue_cause is None]
            if not pending or any(w.last_state in ACTIVE - {"PENDING"} for w in tasks):
                continue
            queued_s[base] += dt
            if queued_s[base] <= limit:
                continue
            for w in pending:
                w.queue_cause = (f"pending {queued_s[base]:.1f} s > platform.slurm.queue_limit_s={limit:g} "
                                 f"(reason: {w.reason or 'none given'}); cancelled")
                self._say(f"  {w.run.run_id}: slurm job {w.job_id} {w.queue_cause}")
            cancel([w.job_id for w in pending])

    def _lose_contact(self, watched: dict[str, _Watched], done: dict[str, LaunchResult], error: str,
                      now: float) -> None:
        lost = [j for j in watched if j not in done]
        self._say(f"  Slurm has not answered for {LOST_AFTER_S:g} s ({error}); giving up slurm jobs {lost}")
        cancel(lost)
        for j in lost:
            w = watched[j]
            codes = rank_exit_codes(w.run)
            done[j] = LaunchResult(codes, False, now - (w.started or w.submitted),
                                   [r for r, c in codes.items() if c is None],
                                   cause=f"lost contact with Slurm for {LOST_AFTER_S:g} s ({error}); "
                                         f"slurm job {j} cancelled", job={"launcher": "slurm", "job_id": j,
                                                                           "state": "UNKNOWN"})

    def _result(self, w: _Watched, now: float) -> LaunchResult:
        info = final_state(w.job_id)
        if self.on_poll:
            self.on_poll(w.run)
        self._say(f"  {w.run.run_id}: slurm job {w.job_id} ended {info.state}"
                  + (f" (exit {info.exit_code})" if info.exit_code else ""))
        return job_result(w.run, w.job_id, info, self.platform.slurm, output_file(w.run, self.out_dir, w.job_id),
                          now - (w.started if w.started is not None else w.submitted), w.timed_out, w.queue_cause)
