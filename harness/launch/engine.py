"""What docker or podman need on this host to build and run at all, found by looking at the host
(shared by `make containers` and the harness's rank wrapper, harness/launch/container.py):

- podman's default OCI runtime, crun, refuses a host whose cgroups are in hybrid mode (cgroup v1
  controllers plus a v2 `unified` mount): "cgroups in hybrid mode not supported". There
  `--runtime runc` works (runc must be installed; if it is not, the message says so).
- docker and podman set a container's open-files and process limits to their own defaults, which
  fail with "setrlimit RLIMIT_NOFILE: Operation not permitted" where the defaults exceed this
  host's hard limits (a container host, a tight login node). Passing this process's own limits
  (`--ulimit nofile=SOFT:HARD --ulimit nproc=SOFT:HARD`) lies within them; nproc is also capped
  at kernel.pid_max, the limit podman's conmon runs with (measured: 32768 works, 32769 fails with
  "error setting rlimit type 6").
- rootless podman is noted (it needs subuid/subgid ranges; a root-owned storage is not its own).
- the ranks run under `--init` (a PID 1 that forwards signals and reaps, so a cancelled run's ranks
  die); podman's init is catatonit, a package of its own that Debian only recommends, so
  `apt-get install --no-install-recommends podman` leaves it out, and every rank then exits 125
  ("container-init binary not found on the host"). init_problem says so before anything launches.
Standard library only."""
from __future__ import annotations

import os
import resource
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ENGINES = ("docker", "podman")
PODMAN_INIT = "/usr/libexec/podman/catatonit"
"""podman's init binary when no containers.conf sets engine.init_path (podman 4 and 5)."""
CONTAINERS_CONF = ("/usr/share/containers/containers.conf", "/etc/containers/containers.conf")
"""The system-wide containers.conf files, later overriding earlier (a user's own and $CONTAINERS_CONF follow)."""


@dataclass(frozen=True)
class EngineArgs:
    name: str
    global_args: list[str] = field(default_factory=list)
    """Before the subcommand (`podman --runtime runc run ...`)."""
    limit_args: list[str] = field(default_factory=list)
    """For `build` and `run` (`--ulimit ...`)."""
    notes: list[str] = field(default_factory=list)
    """Why each argument is there, for `make containers` to print."""
    problem: Optional[str] = None
    """Why the engine cannot run containers here (None: it can, with these arguments)."""


def hybrid_cgroups(root: Path = Path("/sys/fs/cgroup")) -> bool:
    """cgroup v1 controllers with a v2 hierarchy beside them (what crun refuses)."""
    try:
        mounts = Path("/proc/self/mounts").read_text(encoding="utf-8").splitlines()
    except OSError:
        return False
    fields = [ln.split() for ln in mounts]
    kinds = {f[2] for f in fields if len(f) > 2 and f[1].startswith(str(root))}
    return "cgroup" in kinds and "cgroup2" in kinds


def pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 1 << 15


def _limit(res: int, name: str, cap: int = 1 << 20) -> str:
    soft, hard = resource.getrlimit(res)
    hard = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
    soft = hard if soft == resource.RLIM_INFINITY else min(soft, hard)
    return f"{name}={soft}:{hard}"


def engine_args(name: str, hybrid: Optional[bool] = None, which=shutil.which) -> EngineArgs:
    """The arguments `name` needs on this host (see the module's text)."""
    if name not in ENGINES:
        return EngineArgs(name)
    hybrid = hybrid_cgroups() if hybrid is None else hybrid
    global_args, notes, problem = [], [], None
    if name == "podman" and hybrid:
        if which("runc") is None:
            problem = ("this host's cgroups are in hybrid mode, which podman's default runtime crun refuses, "
                       "and runc is not installed (apt-get install runc)")
        else:
            global_args = ["--runtime", "runc"]
            notes.append("--runtime runc: cgroups in hybrid mode (crun refuses them)")
    limits = ["--ulimit", _limit(resource.RLIMIT_NOFILE, "nofile"), "--ulimit", _limit(resource.RLIMIT_NPROC, "nproc", pid_max())]
    notes.append(f"{' '.join(limits)}: this process's own limits (the engine's defaults may exceed the host's)")
    if name == "podman" and os.geteuid() != 0:
        notes.append("rootless podman: images live in this user's storage (~/.local/share/containers)")
    return EngineArgs(name, global_args, limits, notes, problem)


def podman_init_path(conf_files: Optional[list[Path]] = None) -> str:
    """The init binary podman runs for `--init`: the last engine.init_path set in its containers.conf
    files (the system's, the user's, $CONTAINERS_CONF), else PODMAN_INIT."""
    if conf_files is None:
        user = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "containers" / "containers.conf"
        conf_files = [Path(f) for f in CONTAINERS_CONF] + [user]
        if os.environ.get("CONTAINERS_CONF"):
            conf_files.append(Path(os.environ["CONTAINERS_CONF"]))
    path = PODMAN_INIT
    for f in conf_files:
        try:
            data = tomllib.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        path = (data.get("engine") or {}).get("init_path") or path
    return path


def init_problem(name: str, conf_files: Optional[list[Path]] = None) -> Optional[str]:
    """Why `name run --init` cannot start a container on this host, None when it can (docker ships its
    docker-init with the daemon)."""
    if name != "podman":
        return None
    path = podman_init_path(conf_files)
    if Path(path).is_file():
        return None
    return (f"podman runs each rank with --init, whose init binary {path} is not on this host "
            "(containers.conf engine.init_path); install it: apt-get install catatonit")
