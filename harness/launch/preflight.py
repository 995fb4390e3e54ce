"""Before launch: lock files left in torch's extension folder, and DeepSpeed ops the runs need.

torch.utils.cpp_extension guards each JIT-built extension with a lock FILE,
<TORCH_EXTENSIONS_DIR>/<op>/lock (torch.utils.file_baton.FileBaton): created with O_EXCL and held
OPEN by the process that builds or loads the op, removed when it is done. A process killed in
between leaves the file, and every later JIT load of that op waits for it forever (no timeout).
The suite's ranks no longer JIT-load anything (benchmarks/node/ops.py), but the folder is the checkout's
cache that tests, perf scripts and older checkouts share, so before launch each lock file there is
named and judged:
- held open by a live process: a build or load in progress; left alone, and said so;
- held by no process (looked for twice, 0.2 s apart, among the processes of the file's owner, in
  /proc/*/fd): stale; removed, saying which file and why it was stale;
- not knowable (no /proc, or a file of another user when not root): left alone, with the command
  that checks and removes it.

And the ops each launched run will load (benchmarks.node.ops.needed_ops) must be built for the
installation the ranks run (checked for runs outside a container: an image carries its own): an
optional one that is missing is a note (DeepSpeed runs without it); any other is built here, once,
by the controller before anything launches (`python -m benchmarks.node.ops build`, a process of its own:
under the build folder's flock(2), which the kernel drops when a holder dies, so a killed build
never blocks the next; a killed build's torch lock file is named and removed), never in a rank.
Only for runs launched on this host: the cpu ops are compiled for the building CPU (-march=native),
so for Slurm runs it is a refusal before launch naming the run, the setting that needs the op and
the command to run on a compute node. A build that fails is, for bench, an error record of each run
that needs the op, with the build's output's end, and the other runs go on (gpu-check's eager runs
are not lost to DeepCompile's op); called alone, check_ops refuses.

And the host memory of the runs launched on this host with CUDA ranks: what the memory model puts
there (harness/model/offload.py: each rank's runtime and what ZeRO-3 offloads) against 0.9 x this
host's MemAvailable. A run that would not fit is refused before anything launches, naming its GPU and
host figures and what would fit: host memory that runs out is no recorded OOM, as a GPU's is, but the
kernel's OOM killer (offloaded states are pinned and cannot be swapped). A GPU the model calls
too small is still launched: its OOM is a result the suites record (the paper's OOM cells).
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Optional, Protocol, Sequence

from benchmarks.node.ops import BY_NAME, Op, build_command, needed_ops, state
from contract.spec import TrainSpec

from ..config.choices import ContainerRuntime, Device, LauncherKind
from ..config.schema import REPO_ROOT, BenchConfig
from ..config.stack import check_packages
from ..errors import ConfigError
from ..model.memory import memory_estimate
from ..model.offload import HOST_RESERVE_FRACTION, host_capacity_gib, offload_settings, read_meminfo
from ..plan import RunSpec

PROC = Path("/proc")
RECHECK_S = 0.2
"""FileBaton.release closes its descriptor, then removes the file: a lock seen without a holder
twice, this far apart, is no release in progress."""
_noted: set[str] = set()


class Planned(Protocol):
    cfg: BenchConfig
    run: RunSpec


@dataclass
class LockFile:
    path: Path
    size_bytes: int
    age_s: float
    holders: Optional[list[int]]
    """Processes that have it open; None: could not be told."""
    libraries: list[Path]
    """The op's built libraries beside it (the build had finished before the lock was left)."""

    @property
    def stale(self) -> bool:
        return self.holders == []


def find_locks(extensions_dir: Path) -> list[Path]:
    """torch's lock files: <extensions_dir>/<extension>/lock."""
    return sorted(p for p in extensions_dir.glob("*/lock") if p.is_file()) if extensions_dir.is_dir() else []


def holders(path: Path, proc: Path = PROC) -> Optional[list[int]]:
    """Pids of the processes that have `path` open, among those of the file's owner (the only
    ones that can hold a FileBaton it created); None when that cannot be told."""
    if not (proc / "self" / "fd").is_dir():
        return None
    try:
        owner = path.stat().st_uid
    except FileNotFoundError:
        return []
    if owner != os.getuid() and os.getuid() != 0:
        return None
    target, found = str(path.resolve()), []
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            if pid_dir.stat().st_uid != owner:
                continue
            fds = list((pid_dir / "fd").iterdir())
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone meanwhile
        except PermissionError:
            return None
        for fd in fds:
            try:
                if os.readlink(fd) == target:
                    found.append(int(pid_dir.name))
                    break
            except OSError:
                continue
    return found


def inspect(path: Path, proc: Path = PROC, recheck_s: float = RECHECK_S) -> Optional[LockFile]:
    """The lock at `path` (None if it went away while looked at)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    found = holders(path, proc)
    if found == []:
        time.sleep(recheck_s)
        if not path.exists():
            return None  # a release in progress
        found = holders(path, proc)
    return LockFile(path, st.st_size, time.time() - st.st_mtime, found,
                    sorted(path.parent.glob("*.so")))


def command_line(pid: int, proc: Path = PROC) -> str:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(raw.decode(errors="replace").split("\0")).strip()[:200] or "?"


def describe(lock: LockFile) -> str:
    built = (f"; {lock.libraries[0].name} beside it was built {age(lock.libraries[0])} ago, so a "
             "process was killed while loading the op" if lock.libraries else "; no library beside it: "
             "a build was killed")
    return f"{lock.path} ({lock.size_bytes} bytes, {age_text(lock.age_s)} old{built})"


def age(path: Path) -> str:
    return age_text(time.time() - path.stat().st_mtime)


def age_text(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def clear_stale_locks(extensions_dir: Path, proc: Path = PROC, recheck_s: float = RECHECK_S) -> list[str]:
    """Judge every lock file under `extensions_dir`; remove the stale ones. Returns one message per
    lock (what it is and what was done)."""
    messages = []
    for path in find_locks(extensions_dir):
        lock = inspect(path, proc, recheck_s)
        if lock is None:
            continue
        if lock.stale:
            path.unlink(missing_ok=True)
            messages.append(f"removed stale lock file {describe(lock)}: no process has it open. torch's "
                            "JIT loader would have waited on it forever (the suite's runs load prebuilt "
                            "ops and never wait on it)")
        elif lock.holders:
            who = ", ".join(f"pid {pid} ({command_line(pid, proc)})" for pid in lock.holders)
            messages.append(f"lock file {lock.path} is held by {who}: a build or load in progress; left "
                            "alone (the suite's runs do not wait on it)")
        else:
            messages.append(f"lock file {describe(lock)}: cannot tell whether a live process holds it "
                            f"(no /proc, or another user's file); left alone. If `fuser {shlex.quote(str(path))}` "
                            f"prints no pid, remove it: rm -f {shlex.quote(str(path))}")
    return messages


class Need(NamedTuple):
    """A run that needs an op that is not built, and whether its ranks run on this host."""
    run_id: str
    op: Op
    problem: str
    local: bool


def check_ops(planned: Sequence[Planned], failed: Optional[dict[str, str]] = None) -> list[str]:
    """Notes for optional ops that are not built; a required op that is not is built here for runs
    launched on this host, and a ConfigError for a Slurm run (module docstring). A build here that fails
    is a ConfigError too, or, given `failed`, each run that needs the op is put in it (run id -> why, the
    build's output's end), so that bench records those runs as errors and launches the others."""
    notes: list[str] = []
    missing: dict[tuple[str, str], Need] = {}
    needing: dict[tuple[str, str], list[str]] = {}
    for p in planned:
        spec = p.run.spec
        if p.cfg.platform.container.runtime != ContainerRuntime.none or not isinstance(spec, TrainSpec):
            continue
        accelerator = p.run.env.get("DS_ACCELERATOR", "cpu")
        for op in needed_ops(accelerator, spec.deepspeed):
            st = state(op, accelerator)
            if st.problem is None:
                continue
            if not op.optional:
                need = Need(p.run.run_id, op, st.problem, p.cfg.platform.launcher == LauncherKind.local)
                if need.local:
                    needing.setdefault((op.name, accelerator), []).append(p.run.run_id)
                found = missing.setdefault((op.name, accelerator), need)
                if found.local and not need.local:     # one run elsewhere needing it: it is built there
                    missing[(op.name, accelerator)] = need
            elif op.name not in _noted:
                _noted.add(op.name)
                notes.append(f"note: DeepSpeed op {op.name} {st.problem}; runs go on without it, as "
                             f"DeepSpeed does where it is unsupported (loaded by {op.loaded_by}; the suite's "
                             f"runs never call it). Build it once: {build_command([op.name], accelerator)}")
    here = {key: v for key, v in missing.items() if v.local}
    for accelerator in sorted({acc for _, acc in here}):
        names = [n for n, acc in here if acc == accelerator]
        problem = _build_here(names, accelerator, {n: here[(n, accelerator)] for n in names})
        if problem is not None and failed is None:
            raise ConfigError(f"{problem.head}, so nothing was launched:\n{problem.output}")
        if problem is not None:
            print(f"{problem.head}:\n{problem.output}\nthe runs that need them are recorded as errors; the others go on",
                  flush=True)
            for name in names:
                failed.update({run_id: problem.short for run_id in needing[(name, accelerator)]})
    elsewhere = {key: v for key, v in missing.items() if not v.local}
    if elsewhere:
        lines = [f"run {run_id} needs DeepSpeed op {op.name} ({op.loaded_by}), which is {problem}"
                 for run_id, op, problem, _ in elsewhere.values()]
        accelerators = sorted({acc for _, acc in elsewhere})
        commands = [build_command([n for n, a in elsewhere if a == acc], acc) for acc in accelerators]
        raise ConfigError("; ".join(lines) + ". Its ranks run on Slurm's nodes, and the cpu ops are compiled for "
                          "the CPU that builds them: build them once on a compute node (e.g. srun -N1 "
                          "<command>), about 30 s each on 2 cores, then run again: " + " && ".join(commands))
    return notes


class BuildFailure(NamedTuple):
    """A build here that left an op unusable: `head` (the ops, the build's exit, those still not usable) and
    `output` (its output's end, the command), printed or refused with; `short`, a run's record's reason (its
    output's telling lines, the command)."""
    head: str
    output: str
    short: str


TELLING = ("error", "Error", "not found", "FAILED", "No such file")
"""Words of the lines of a build's output a record's reason keeps."""


def _build_here(names: list[str], accelerator: str, why: dict[str, Need]) -> Optional[BuildFailure]:
    """Build `names` in a process of its own, its output shown; what went wrong when one is still not
    usable afterwards."""
    for name in names:
        run_id, op, problem, _ = why[name]
        print(f"run {run_id} needs DeepSpeed op {name} ({op.loaded_by}), which is {problem}: building it now, "
              "once, before anything launches", flush=True)
    argv = [sys.executable, "-m", "benchmarks.node.ops", "build", *names, "--accelerator", accelerator]
    started = time.monotonic()
    result = subprocess.run(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(result.stdout.rstrip(), flush=True)
    still = [f"{n}: {st.problem}" for n in names for st in [state(BY_NAME[n], accelerator)] if st.problem]
    if result.returncode != 0 or still:
        lines = result.stdout.strip().splitlines()
        telling = list(dict.fromkeys(ln.strip()[:200] for ln in lines if any(w in ln for w in TELLING)))[-3:] \
            or [ln[:200] for ln in lines[-1:]]
        command = f"build them by hand to see why: {build_command(names, accelerator)}"
        return BuildFailure(
            f"building DeepSpeed op(s) {', '.join(names)} failed (exit {result.returncode}"
            + (f"; {'; '.join(still)}" if still else "") + ")",
            "\n".join(lines[-15:]) + "\n" + command,
            f"DeepSpeed op(s) {', '.join(names)} did not build before launch (exit {result.returncode}): "
            + " | ".join(telling) + f"; {command}")
    print(f"DeepSpeed op(s) {', '.join(names)} ready ({time.monotonic() - started:.0f} s)", flush=True)
    return None


def check_host_memory(planned: Sequence[Planned], meminfo: Optional[dict[str, float]] = None) -> None:
    """ConfigError for the runs launched on this host with CUDA ranks whose host memory, as the memory
    model has it, exceeds host_capacity_gib of this host's MemAvailable (`meminfo`: MemTotal and
    MemAvailable in GiB; None reads /proc/meminfo, and a host without it is not judged)."""
    local = [p for p in planned if isinstance(p.run.spec, TrainSpec) and p.cfg.platform.device == Device.cuda
             and p.cfg.platform.launcher == LauncherKind.local]
    meminfo = meminfo if meminfo is not None else (read_meminfo() if local else None)
    if not local or not meminfo:
        return
    available = meminfo.get("MemAvailable", meminfo["MemTotal"])
    cap, problems = host_capacity_gib(available), []
    for p in local:
        offload = offload_settings(p.run.spec.deepspeed)
        est = memory_estimate(p.cfg, offload=offload)
        need = p.run.num_ranks * est.host_gib
        if need <= cap:
            continue
        items = ", ".join(f"{k} {v:.1f}" for k, v in est.host_items_gib.items())
        gpu = f"{est.total_gib:.1f} of {est.capacity_gib:.1f} GiB per GPU ({'fits' if est.fits else 'OUT OF MEMORY'})"
        room = est.capacity_gib - est.total_gib
        what = (f"keep more on the GPU, which has {room:.1f} GiB to spare (a lower zero_optimization.offload_optimizer.ratio "
                f"than {offload.ratio:g}" + (f" in {p.cfg.deepspeed_config})" if p.cfg.deepspeed_config else ")") + ", or "
                if offload.optimizer == "cpu" and room > 0 else "")
        problems.append(f"run {p.run.run_id} ({p.cfg.workload.name}, ZeRO-{p.cfg.zero.stage}) needs {need:.1f} GiB of host "
                        f"memory ({p.run.num_ranks} rank(s) x {est.host_gib:.1f} GiB: {items}) where this host has "
                        f"{cap:.1f} ({1 - HOST_RESERVE_FRACTION:g} x {available:.1f} GiB available of "
                        f"{meminfo['MemTotal']:.1f}), beside {gpu}: {what}run it on a node with at least "
                        f"{need / (1 - HOST_RESERVE_FRACTION):.0f} GiB available")
    if problems:
        raise ConfigError("the memory model says these runs do not fit this host's memory, so nothing was launched "
                          "(host memory that runs out is no recorded OOM but the kernel's OOM killer: offloaded "
                          "states are pinned): " + "; ".join(problems))


def check(planned: Sequence[Planned]) -> dict[str, str]:
    """Everything above, printed, before the planned runs are launched; the runs that cannot launch
    (run id -> why: an op they need did not build here), to be recorded as errors."""
    check_packages([p.cfg for p in planned if isinstance(p.run.spec, TrainSpec)])
    check_host_memory(planned)
    dirs = sorted({Path(p.run.env["TORCH_EXTENSIONS_DIR"]) for p in planned if "TORCH_EXTENSIONS_DIR" in p.run.env})
    failed: dict[str, str] = {}
    for message in check_ops(planned, failed) + [m for d in dirs for m in clear_stale_locks(d)]:
        print(message, flush=True)
    return failed
