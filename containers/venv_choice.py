"""Which lock `make venv` installs, and why: requirements.lock (the CPU venv) or requirements-gpu.lock
(torch's CUDA build and its closure, liger-kernel, torchao). Standard library only: it runs with
the host's python3 before any venv exists.

In order, the first that applies:
1. VENV_KIND=gpu|cpu (empty: decide below);
2. a GPU platform named for this make (PLATFORM=h100 on the command line or in the environment;
   anything but cpu and cpu-cluster): gpu, also on a login node without a GPU, whose venv the
   ranks on the compute nodes share;
3. an NVIDIA GPU here (`nvidia-smi -L` lists one, or /proc/driver/nvidia exists): gpu;
4. else cpu.

    python -m containers.venv_choice --kind K --platform P [--platform-given] --query
        prints the lock's file name (the Makefile's VENV_LOCK)
    python -m containers.venv_choice ... --record VENV/.venv-lock
        prints `venv: gpu lock (requirements-gpu.lock): platform h100` and records the lock the
        venv is made from; when it held the other one, the venv is removed first (a switch
        reinstalls from scratch: pip would keep a torch 2.13.0+cpu for torch==2.13.0, and the
        nvidia-* wheels would stay in a CPU venv).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

LOCKS = {"cpu": "requirements.lock", "gpu": "requirements-gpu.lock"}
CPU_PLATFORMS = frozenset({"cpu", "cpu-cluster"})
NVIDIA_PROC = Path("/proc/driver/nvidia")
NVIDIA_SMI_TIMEOUT_S = 20


@dataclass(frozen=True)
class Choice:
    kind: str
    reason: str

    @property
    def lock(self) -> str:
        return LOCKS[self.kind]

    def line(self) -> str:
        return f"venv: {self.kind} lock ({self.lock}): {self.reason}"


def detect_gpu(proc: Path = NVIDIA_PROC, run: Callable[..., subprocess.CompletedProcess] = subprocess.run,
               which: Callable[[str], Optional[str]] = shutil.which) -> Optional[str]:
    """How an NVIDIA GPU was seen here, in words; None when none was."""
    smi = which("nvidia-smi")
    if smi:
        try:
            done = run([smi, "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            done = None
        gpus = [ln.split(" (UUID")[0] for ln in (done.stdout if done else "").splitlines() if ln.startswith("GPU ")]
        if done is not None and done.returncode == 0 and gpus:
            return f"nvidia-smi -L lists {len(gpus)} ({gpus[0]}{', ...' if len(gpus) > 1 else ''})"
    if proc.exists():
        return f"{proc} exists"
    return None


def choose(kind: str, platform: str, platform_given: bool,
           gpu: Callable[[], Optional[str]] = detect_gpu) -> Choice:
    """The lock for this make: see the module's docstring. `gpu` is only asked when it decides."""
    kind = kind.strip().lower()
    if kind:
        if kind not in LOCKS:
            raise ValueError(f"VENV_KIND={kind}: expected gpu or cpu (empty: decided from PLATFORM and this host)")
        return Choice(kind, f"VENV_KIND={kind}")
    if platform_given and platform not in CPU_PLATFORMS:
        return Choice("gpu", f"platform {platform}")
    seen = gpu()
    if seen:
        return Choice("gpu", f"NVIDIA GPU detected: {seen}; platform {platform}")
    return Choice("cpu", f"no NVIDIA GPU detected, platform {platform}")


def record(choice: Choice, path: Path) -> list[str]:
    """Write the chosen lock to `path` (VENV/.venv-lock) unless it is there already (its time then
    stays, so make sees nothing new); remove the venv first when it holds the other lock. A venv
    with no record predates the GPU lock: it holds requirements.lock. Returns what was done."""
    venv = path.parent
    is_venv = (venv / "pyvenv.cfg").exists()
    held = path.read_text().strip() if path.exists() else (LOCKS["cpu"] if is_venv else None)
    if path.exists() and held == choice.lock:
        return []
    said = []
    if is_venv and held is not None and held != choice.lock:
        shutil.rmtree(venv)
        said.append(f"venv: {venv} held {held}: removed, to be made again from {choice.lock}")
    venv.mkdir(parents=True, exist_ok=True)
    path.write_text(choice.lock + "\n")
    stamp = venv / ".installed"
    if held == choice.lock and stamp.exists():   # an existing CPU venv: nothing to reinstall
        os.utime(path, ns=(stamp.stat().st_atime_ns, stamp.stat().st_mtime_ns))
    return said


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m containers.venv_choice", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", default="", help="VENV_KIND: gpu, cpu, or empty")
    ap.add_argument("--platform", default="cpu")
    ap.add_argument("--platform-given", action="store_true", help="PLATFORM was set for this make")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--query", action="store_true", help="print the chosen lock's file name")
    what.add_argument("--record", type=Path, metavar="VENV/.venv-lock", help="say the choice and record it")
    ns = ap.parse_args(argv)
    try:
        choice = choose(ns.kind, ns.platform, ns.platform_given)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if ns.query:
        print(choice.lock)
        return 0
    print(choice.line())
    for line in record(choice, ns.record):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
