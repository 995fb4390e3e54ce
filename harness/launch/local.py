"""Launching the ranks of a run. The local launcher starts N processes on this host.

Each rank runs in its own process session so that everything it starts (compilers, workers)
can be killed together. A run ends when every rank has exited, when one rank fails (the others
get ``grace_s`` to notice, then are killed: a peer stuck in a collective never returns), or at
its deadline (recorded as a timeout). No process is left behind in any case.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from ..atomic import write_text_atomic
from ..plan import RunSpec

if TYPE_CHECKING:
    from .container import Wrapper

PIDS_FILE = "pids.json"


@dataclass
class LaunchResult:
    exit_codes: dict[int, Optional[int]]
    """Exit code per rank; negative: killed by that signal; None: still running when killed."""
    timed_out: bool
    wall_s: float
    killed_ranks: list[int] = field(default_factory=list)
    """Ranks the launcher killed (after a peer failed, or at the deadline)."""
    cause: Optional[str] = None
    """Why the run ended when the ranks did not decide it (a cancelled, pre-empted or timed-out job)."""
    cause_status: str = "error"
    """The status that cause gives: error, or oom (the scheduler's memory limit)."""
    job: Optional[dict] = None
    """The scheduler's view of the run (Slurm: job id, state, exit code, node list, partition...)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _terminate(procs: dict[int, subprocess.Popen], ranks: list[int], wait_s: float = 5.0) -> None:
    for r in ranks:
        try:
            os.killpg(procs[r].pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    for r in ranks:
        try:
            procs[r].wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            pass
    for r in ranks:
        try:
            os.killpg(procs[r].pid, signal.SIGKILL)  # the whole group, even if the leader exited
        except ProcessLookupError:
            pass
        procs[r].wait()


class LocalLauncher:
    """Runs every rank as a local process (gloo on CPU, nccl on a single GPU node)."""

    def __init__(self, grace_s: float = 10.0, poll_s: float = 0.25,
                 on_poll: Optional[Callable[[], None]] = None, wrapper: Optional["Wrapper"] = None):
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.on_poll = on_poll
        self.wrapper = wrapper
        """Runs each rank inside the platform's image (harness.launch.container.Wrapper), if set."""

    def commands(self, run: RunSpec, port: int) -> list[tuple[list[str], dict[str, str]]]:
        """(argv, environment) of every rank, as they are started."""
        out = []
        for rank in range(run.num_ranks):
            env = {**run.env, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(run.num_ranks),
                   "LOCAL_WORLD_SIZE": str(run.num_ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
            argv = self.wrapper(run.argv, list(env), self.container_name(run, rank)) if self.wrapper else run.argv
            out.append((argv, env))
        return out

    @staticmethod
    def container_name(run: RunSpec, rank: int) -> str:
        return f"bench-{run.run_dir.parent.parent.name}-{run.run_id}-r{rank}"

    def run(self, run: RunSpec, cwd: Path) -> LaunchResult:
        port = free_port()
        procs: dict[int, subprocess.Popen] = {}
        start = time.monotonic()
        try:
            for rank, (argv, env) in enumerate(self.commands(run, port)):
                with open(run.run_dir / f"rank{rank}.log", "wb") as log:
                    procs[rank] = subprocess.Popen(argv, env={**os.environ, **env}, cwd=cwd, stdout=log,
                                                   stderr=subprocess.STDOUT, start_new_session=True)
            write_text_atomic(run.run_dir / PIDS_FILE, json.dumps({r: p.pid for r, p in procs.items()}))
            return self._wait(run, procs, start)
        finally:
            alive = [r for r, p in procs.items() if p.poll() is None]
            if alive:
                _terminate(procs, alive)
            if self.wrapper:  # a killed docker client leaves its container running
                self.wrapper.cleanup([self.container_name(run, r) for r in procs])

    def _wait(self, run: RunSpec, procs: dict[int, subprocess.Popen], start: float) -> LaunchResult:
        deadline = start + run.timeout_s
        failed_at: Optional[float] = None
        while True:
            codes = {r: p.poll() for r, p in procs.items()}
            alive = [r for r, c in codes.items() if c is None]
            if not alive:
                return LaunchResult(codes, False, time.monotonic() - start)
            now = time.monotonic()
            if failed_at is None and any(c not in (None, 0) for c in codes.values()):
                failed_at = now
            if now >= deadline or (failed_at is not None and now - failed_at >= self.grace_s):
                _terminate(procs, alive)
                codes = {r: (None if r in alive else c) for r, c in codes.items()}
                return LaunchResult(codes, failed_at is None, time.monotonic() - start, alive)
            if self.on_poll:
                self.on_poll()
            time.sleep(self.poll_s)
