"""Integration tests: the real CLI, real rank processes (two gloo ranks), the tiny model."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@dataclass
class BenchRun:
    returncode: int
    stdout: str
    stderr: str
    out: Path

    def records(self) -> dict[str, dict]:
        return {p.stem: json.loads(p.read_text()) for p in sorted(self.out.glob("*.json"))
                if p.name != "suite.json"}


def harness_cmd(out: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "harness", "bench", f"out={out}", *overrides]


def run_bench(out: Path, *overrides: str, timeout: float = 900) -> BenchRun:
    proc = subprocess.run(harness_cmd(out, *overrides), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return BenchRun(proc.returncode, proc.stdout, proc.stderr, out)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def wait_for(predicate, timeout: float, what: str, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def assert_no_rank_left(run_dir: Path) -> None:
    pids = json.loads((run_dir / "pids.json").read_text())
    alive = {rank: pid for rank, pid in pids.items() if pid_alive(pid)}
    assert not alive, f"rank processes left behind: {alive}"


@pytest.fixture(scope="session")
def default_suite(tmp_path_factory) -> BenchRun:
    """The cpu default suite, as `make bench` runs it, with fewer steps."""
    out = tmp_path_factory.mktemp("default") / "out"
    return run_bench(out, "measure.warmup_steps=1", "measure.steps=2", "measure.profile_steps=2")
