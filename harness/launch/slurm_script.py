"""The Slurm batch scripts of runs: one job per run, or one job array for a sweep (task i runs
run i). Pure text from the plan; nothing here talks to Slurm (harness/launch/slurm.py does).

Inside a job, `srun` starts one task per node: torchrun (inside the image when there is one), which
rendezvouses over c10d on the job's first node and starts the node's ranks. Each rank writes
`rank<N>.log` and, when it exits, `rank<N>.exit` in the run folder. Slurm's own output is
`slurm-<jobid>.out` in the run folder; an array task's is `OUT/slurm/array-<A>_<a>.out`, linked
from its run folder as `slurm-<A>_<a>.out`, so every run folder names the job that ran it.
"""
from __future__ import annotations

import math
import os
import shlex
from pathlib import Path
from typing import Optional

from ..config.choices import ContainerRuntime, Device
from ..config.schema import PlatformConfig, SlurmConfig
from ..plan import RunSpec, safe_name
from .container import SLURM_VARS, in_image, prefix

SCRIPT_FILE = "job.sbatch"


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


def script_path(run: RunSpec) -> Path:
    """Where a run's own batch script is written."""
    return run.run_dir / SCRIPT_FILE


def array_script_path(runs: list[RunSpec], out_dir: Path) -> Path:
    """Where a sweep's job-array script is written (named after its first run)."""
    return out_dir / "slurm" / f"sweep-{runs[0].run_id}.sbatch"


def array_output(out_dir: Path, job_id: str) -> Path:
    """Slurm's output file of array task `<A>_<a>`."""
    return out_dir / "slurm" / f"array-{job_id}.out"


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
    lines = header(f"bench-sweep-{runs[0].run_id}", p.nodes, p, limit, str(array_output(out_dir, "%A_%a")),
                   array=spec)
    lines += ["", "# Generated by `python -m harness bench -m` (platform " + p.name + "); submit with sbatch.",
              "set -uo pipefail", 'case "$SLURM_ARRAY_TASK_ID" in']
    task = '"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"'
    for i, run in enumerate(runs):
        # the run folder names its job, as a single job's slurm-<id>.out does (collect reads it)
        link = (f"ln -sfn {_q(os.path.relpath(out_dir / 'slurm', run.run_dir))}/array-{task}.out "
                f"{_q(run.run_dir)}/slurm-{task}.out")
        comment, *rest = body(run, p, repo_root, out_dir, image)
        lines += [f"  {i})"] + ["    " + line.replace("\n", "\n    ") for line in [comment, link, *rest]] + ["    ;;"]
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
