"""Runs as Slurm jobs: the batch scripts, submission, waiting, and the job's end turned into a
LaunchResult.

One job per run; a sweep's runs (multirun) go in one job array. Inside a job, `srun` starts one
task per node: torchrun (inside the image when there is one), which rendezvouses over c10d on the
job's first node and starts the node's ranks. Each rank writes `rank<N>.log` and, when it exits,
`rank<N>.exit` in the run folder, so the harness learns every rank's exit code as with local
processes. The run folder and the repository must be on a filesystem the nodes share.

Without `sacct` (no accounting) a finished job's state comes from `squeue -t all` / `scontrol`
while slurmctld still holds it (MinJobAge, 300 s by default), which is long enough for the
harness's polling.
"""
from __future__ import annotations

import math
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from .config import ContainerRuntime, Device, PlatformConfig, SlurmConfig
from .container import SLURM_VARS, in_image, prefix
from .errors import HarnessError
from .launch import LaunchResult
from .plan import RunSpec, safe_name

SCRIPT_FILE = "job.sbatch"
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


def time_limit(run: RunSpec, s: SlurmConfig) -> str:
    """--time: the platform's, else measure.timeout_s plus the start-up allowance, in whole minutes."""
    if s.time_limit:
        return s.time_limit
    minutes = max(1, math.ceil((run.timeout_s + s.startup_s) / 60))
    return f"{minutes // 60}:{minutes % 60:02d}:00"


def _q(value: object) -> str:
    return shlex.quote(str(value))


def header(job_name: str, nodes: int, p: PlatformConfig, limit: str, output: str,
           array: Optional[str] = None) -> list[str]:
    s = p.slurm
    lines = ["#!/bin/bash", f"#SBATCH --job-name={safe_name(job_name)}", f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1"]
    if p.device == Device.cuda:
        lines.append(f"#SBATCH --gpus-per-node={p.gpus_per_node}")
    cpus = s.cpus_per_task or (p.gpus_per_node if p.device == Device.cpu else None)
    if cpus:
        lines.append(f"#SBATCH --cpus-per-task={cpus}")
    if s.exclusive:
        lines.append("#SBATCH --exclusive")
    lines.append(f"#SBATCH --time={limit}")
    for opt in ("partition", "account", "qos", "constraint"):
        if getattr(s, opt):
            lines.append(f"#SBATCH --{opt}={getattr(s, opt)}")
    if array:
        lines.append(f"#SBATCH --array={array}")
    lines += [f"#SBATCH --output={output}", "#SBATCH --no-requeue"]
    lines += [f"#SBATCH {a}" for a in s.extra_args]
    return lines


RANK_WRAPPER = ('d="$1"; shift; "$@" > "$d/rank$RANK.log" 2>&1; rc=$?; '
                'echo "$rc" > "$d/rank$RANK.exit"; exit "$rc"')
"""Runs one rank under torchrun: its output to rank<N>.log, its exit code to rank<N>.exit."""


def task_command(run: RunSpec, p: PlatformConfig, repo_root: Path, out_dir: Path, image: Optional[str]) -> str:
    """The srun line of one run: torchrun on every node (in the image, if any), or the nccl-tests
    binary once per node. One segment per line: srun, the container, torchrun, the rank."""
    nodes, c = p.nodes, p.container
    rank_argv = run.argv
    segments = [["srun", "--kill-on-bad-exit=1", f"--nodes={nodes}", "--ntasks-per-node=1"]]
    if c.runtime != ContainerRuntime.none:
        assert image is not None
        rank_argv = in_image(run.argv, c)
        segments.append([_q(w) for w in prefix(c, image=image, repo_root=repo_root, out_dir=out_dir,
                                               env_names=[*run.env, *SLURM_VARS],
                                               cuda=p.device == Device.cuda)])
    if run.output == "nccl-tests":
        segments.append([_q(w) for w in rank_argv])
        d = _q(run.run_dir)
        return (" \\\n    ".join(" ".join(seg) for seg in segments)
                + f" \\\n    > {d}/rank0.log 2>&1; rc=$?; echo \"$rc\" > {d}/rank0.exit; exit \"$rc\"")
    segments.append([_q(rank_argv[0]), "-m", "torch.distributed.run", f"--nnodes={nodes}",
                     f"--nproc-per-node={run.num_ranks // nodes}", "--rdzv-backend=c10d",
                     '--rdzv-endpoint="$head:$port"', '--rdzv-id="$SLURM_JOB_ID"', "--max-restarts=0",
                     "--no-python"])
    segments.append(["/bin/sh", "-c", _q(RANK_WRAPPER), "rank", _q(run.run_dir)])
    segments.append([_q(w) for w in rank_argv])
    return " \\\n    ".join(" ".join(seg) for seg in segments)


def body(run: RunSpec, p: PlatformConfig, repo_root: Path, out_dir: Path, image: Optional[str]) -> list[str]:
    """Everything after the #SBATCH lines for one run: its environment, the rendezvous, srun."""
    lines = [f"# run {run.run_id}: {run.num_ranks} ranks on {p.nodes} node(s); folder {run.run_dir}"]
    lines += [f"export {k}={_q(v)}" for k, v in sorted(run.env.items())]
    if run.output != "nccl-tests":
        lines += ['head="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
                  f"port=$(( {p.slurm.rdzv_port} + SLURM_JOB_ID % 1000 ))"]
    lines += [f"cd {_q(repo_root)}", task_command(run, p, repo_root, out_dir, image)]
    return lines


def batch_script(run: RunSpec, p: PlatformConfig, repo_root: Path, out_dir: Path, image: Optional[str]) -> str:
    lines = header(f"bench-{run.run_id}", p.nodes, p, time_limit(run, p.slurm),
                   str(run.run_dir / "slurm-%j.out"))
    lines += ["", "# Generated by `python -m harness bench` (platform " + p.name + "); submit with sbatch.",
              "set -uo pipefail", *body(run, p, repo_root, out_dir, image)]
    return "\n".join(lines) + "\n"


def array_script(runs: list[RunSpec], p: PlatformConfig, repo_root: Path, out_dir: Path,
                 image: Optional[str]) -> str:
    """One job array for a sweep: task i runs runs[i]."""
    limit = max((time_limit(r, p.slurm) for r in runs), key=_minutes)
    spec = f"0-{len(runs) - 1}" + (f"%{p.slurm.array_parallelism}" if p.slurm.array_parallelism else "")
    lines = header(f"bench-sweep-{runs[0].run_id}", p.nodes, p, limit, str(out_dir / "slurm" / "array-%A_%a.out"),
                   array=spec)
    lines += ["", "# Generated by `python -m harness bench -m` (platform " + p.name + "); submit with sbatch.",
              "set -uo pipefail", 'case "$SLURM_ARRAY_TASK_ID" in']
    for i, run in enumerate(runs):
        lines += [f"  {i})"] + ["    " + line.replace("\n", "\n    ")
                                for line in body(run, p, repo_root, out_dir, image)] + ["    ;;"]
    lines += ['  *) echo "no run for array task $SLURM_ARRAY_TASK_ID" >&2; exit 2 ;;', "esac"]
    return "\n".join(lines) + "\n"


def _minutes(limit: str) -> float:
    days, _, rest = limit.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if len(parts) == 1:
        minutes = float(parts[0])
    elif len(parts) == 2:
        minutes = parts[0] + parts[1] / 60
    else:
        minutes = parts[0] * 60 + parts[1] + parts[2] / 60
    return minutes + (int(days) * 1440 if days else 0)


# ---- talking to Slurm ------------------------------------------------------------------------

def _slurm(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
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


def queue_states(job_ids: list[str]) -> dict[str, JobInfo] | str:
    """Every task of these jobs that slurmctld still holds (including just-finished ones), by id
    (`123`, or `123_4` for array tasks); squeue's error message when it failed."""
    proc = _slurm(["squeue", "-h", "-r", "-t", "all", "-j", ",".join(job_ids), "-o", "%i|%T|%r|%N"])
    if proc.returncode != 0:
        if "Invalid job id" in proc.stderr:
            return {}
        return f"squeue exited {proc.returncode}: {proc.stderr.strip()[:300]}"
    found = {}
    for line in proc.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 4:
            found[parts[0]] = JobInfo(parts[0], parts[1], "" if parts[2] == "None" else parts[2], parts[3])
    return found


def final_state(job_id: str) -> JobInfo:
    """The finished job's state, exit code and nodes: scontrol, else sacct, else UNKNOWN."""
    proc = _slurm(["scontrol", "show", "job", "-o", job_id])
    if proc.returncode == 0 and "JobState=" in proc.stdout:
        fields = dict(re.findall(r"(\w+)=(\S*)", proc.stdout.splitlines()[0]))
        return JobInfo(job_id, fields.get("JobState", "UNKNOWN"), fields.get("Reason", ""),
                       fields.get("NodeList", ""), fields.get("ExitCode"), fields)
    proc = _slurm(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State,ExitCode,NodeList,Reason"])
    if proc.returncode == 0 and proc.stdout.strip():
        state, code, nodes, reason = (proc.stdout.strip().splitlines()[0].split("|") + [""] * 4)[:4]
        return JobInfo(job_id, state.split()[0], reason, nodes, code)
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


@dataclass
class _Watched:
    run: RunSpec
    job_id: str
    submitted: float
    started: Optional[float] = None
    last_state: str = ""
    timed_out: bool = False


class SlurmLauncher:
    """Submits runs as Slurm jobs and waits for them, printing their state as it changes."""

    def __init__(self, platform: PlatformConfig, repo_root: Path, out_dir: Path, image: Optional[str] = None,
                 on_poll: Optional[Callable[[RunSpec], None]] = None, stream=sys.stdout):
        self.platform = platform
        self.repo_root = repo_root
        self.out_dir = out_dir
        self.image = image
        self.on_poll = on_poll
        self.stream = stream

    def write_script(self, run: RunSpec) -> Path:
        path = run.run_dir / SCRIPT_FILE
        path.write_text(batch_script(run, self.platform, self.repo_root, self.out_dir, self.image), encoding="utf-8")
        return path

    def write_array_script(self, runs: list[RunSpec]) -> Path:
        path = self.out_dir / "slurm" / f"sweep-{runs[0].run_id}.sbatch"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(array_script(runs, self.platform, self.repo_root, self.out_dir, self.image), encoding="utf-8")
        return path

    def run(self, run: RunSpec, cwd: Path) -> LaunchResult:
        job_id = submit(self.write_script(run))
        self._say(f"  slurm job {job_id} submitted ({run.run_dir / SCRIPT_FILE})")
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
        (a timeout). Interrupted (Ctrl-C), the jobs are cancelled before the exception goes on."""
        now = time.monotonic()
        watched = {j: _Watched(run, j, now) for j, run in jobs.items()}
        done: dict[str, LaunchResult] = {}
        bases = sorted({j.split("_")[0] for j in jobs})
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
                if len(done) < len(watched):
                    time.sleep(self.platform.slurm.poll_s)
        except BaseException:
            cancel([j for j in watched if j not in done])
            raise
        return done

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
        run = w.run
        if self.on_poll:
            self.on_poll(run)
        codes = rank_exit_codes(run)
        missing = [r for r, c in codes.items() if c is None]
        wall = now - (w.started if w.started is not None else w.submitted)
        job = {"launcher": "slurm", "job_id": w.job_id, "state": info.state, "exit_code": info.exit_code,
               "nodelist": info.nodelist or None, "partition": info.fields.get("Partition") or self.platform.slurm.partition,
               "account": info.fields.get("Account") or self.platform.slurm.account,
               "qos": info.fields.get("QOS") or self.platform.slurm.qos}
        if "_" in w.job_id:
            job["array_job_id"], job["array_task_id"] = w.job_id.split("_", 1)
        self._say(f"  {run.run_id}: slurm job {w.job_id} ended {info.state}"
                  + (f" (exit {info.exit_code})" if info.exit_code else ""))
        out_file = self._output_file(w)
        cause, cause_status = None, "error"
        base = info.state.split()[0] if info.state else "UNKNOWN"
        if w.timed_out:
            cause = (f"exceeded measure.timeout_s={run.timeout_s:g} s; the harness cancelled slurm job "
                     f"{w.job_id}; ranks {missing} did not finish")
        elif base == "TIMEOUT":
            w.timed_out = True
            cause = f"slurm job {w.job_id} reached its time limit (--time); ranks {missing} did not finish"
        elif base in EXTERNAL_ENDS:
            cause = f"slurm job {w.job_id} {EXTERNAL_ENDS[base]} ({info.state}"
            cause += f", reason {info.reason})" if info.reason and info.reason != "None" else ")"
            cause_status = "oom" if base == "OUT_OF_MEMORY" else "error"
        elif len(missing) == len(codes) and base != "COMPLETED":
            tail = _tail(out_file) if out_file else ""
            cause = (f"slurm job {w.job_id} ended {info.state} (exit {info.exit_code}) before any rank "
                     f"reported; {out_file}" + (f": {tail}" if tail else ""))
        return LaunchResult(exit_codes=codes, timed_out=w.timed_out, wall_s=wall,
                            killed_ranks=missing if (cause or w.timed_out) else [],
                            cause=cause, cause_status=cause_status, job=job)

    def _output_file(self, w: _Watched) -> Optional[Path]:
        if "_" in w.job_id:
            base, task = w.job_id.split("_", 1)
            path = self.out_dir / "slurm" / f"array-{base}_{task}.out"
        else:
            path = w.run.run_dir / f"slurm-{w.job_id}.out"
        return path if path.exists() else None
