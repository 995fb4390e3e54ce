"""A real single-node Slurm (slurmctld + slurmd + munged) on localhost, for integration tests.

Follows ../shared/SLURM_NOTES.md (Debian 12, root, no systemd): install the Debian packages when
missing, then start each daemon ourselves in the foreground as a child process with a private
munge key/socket, a private slurm.conf, private state/spool/log/pid paths and free ports, so it
coexists with any other Slurm on the box and never touches daemons it did not start.

    with SlurmCluster(tmp_dir) as cluster:
        subprocess.run(["sbatch", "--wrap", "true"], env=cluster.client_env())

If the test process dies without `stop()`, the kernel SIGTERMs the daemons (PR_SET_PDEATHSIG);
as a second line, each cluster keeps a registry entry under `REGISTRY_DIR`, and the next
`start()` kills the daemons a dead owner's entry names (only if their command line still names
that cluster's private folders, so recycled pids and other Slurm daemons are never touched).
"""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed import system
from testbed.system import cmdline as _cmdline, find_binary, pid_alive as _pid_alive, tail as _tail
from testbed.system import terminate as _terminate

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
# binary -> package that provides it
BINARIES = {"slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client",
            "squeue": "slurm-client", "sinfo": "slurm-client", "scancel": "slurm-client",
            "scontrol": "slurm-client", "srun": "slurm-client", "munged": "munge"}
REGISTRY_DIR = Path(tempfile.gettempdir()) / "suite-slurm-cluster"
MUNGE_DIR_PREFIX = "suite-munge-"
PORT_ATTEMPTS = 3
UNIX_PATH_MAX = 107  # sun_path is 108 bytes with the final NUL
PR_SET_PDEATHSIG = 1
# Input variables of the Slurm clients. Inherited from an outer Slurm job (a CI runner inside
# salloc/sbatch), SLURM_JOB_ID makes srun attach to a job our cluster never had ("Invalid job id
# specified"), and the others change what sbatch asks for; client_env() drops them all.
CLIENT_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_", "SCANCEL_",
                       "SCONTROL_", "SACCT_")


def is_client_variable(name: str) -> bool:
    return name.startswith(CLIENT_ENV_PREFIXES)


class SlurmUnavailable(system.Unavailable):
    """The cluster cannot be provided here (not root, no apt-get, install or start failed)."""


@dataclass
class Daemon:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen | None = None


@dataclass
class StartTimings:
    install_s: float | None = None   # None: packages were already there
    munge_s: float = 0.0
    slurm_s: float = 0.0             # slurmctld + slurmd started until the node is idle
    total_s: float = 0.0


_prctl = ctypes.CDLL(None, use_errno=True).prctl   # resolved before fork, not in the child


def _die_with_parent() -> None:
    """preexec_fn: SIGTERM the daemon when the test process dies (a crashed/killed session)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _orphan_stepd_zombies() -> list[int]:
    """Zombie slurmstepd processes waiting for pid 1 to reap them."""
    zombies = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            comm, rest = stat.read_text().split(" (", 1)[1].rsplit(")", 1)
        except (OSError, ValueError):
            continue
        fields = rest.split()
        if comm == "slurmstepd" and fields[0] == "Z" and fields[1] == "1":
            zombies.append(int(stat.parent.name))
    return zombies


def _searchable_by_all(path: Path) -> bool:
    """Every folder from / down to path has the execute bit for others."""
    return all(p.stat().st_mode & 0o001 for p in (path, *path.parents))


def missing_packages() -> list[str]:
    return system.missing_packages(BINARIES)


def install_packages(packages: list[str], timeout_s: float = 600) -> float:
    return system.install_packages(packages, BINARIES, timeout_s, error=SlurmUnavailable)


def reap_stale_daemons(registry_dir: Path = REGISTRY_DIR) -> list[str]:
    """Kill daemons left by a SlurmCluster whose owning process is gone; returns what was killed.

    A pid is killed only if its command line still names a private folder recorded with it,
    so a recycled pid (or anyone else's Slurm) is never touched.
    """
    killed = []
    for entry in sorted(registry_dir.glob("*.json")):
        try:
            record = json.loads(entry.read_text())
            owner_pid, paths = int(record["owner_pid"]), [str(p) for p in record["paths"]]
            daemons = {str(name): int(pid) for name, pid in record["daemons"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            entry.unlink(missing_ok=True)   # not ours, or torn: nothing we may safely kill
            continue
        if _pid_alive(owner_pid):
            continue  # a live session (this one, or a concurrent one) owns these
        for name, pid in daemons.items():
            if _pid_alive(pid) and any(path in _cmdline(pid) for path in paths):
                _terminate(pid, grace_s=5.0)
                killed.append(f"{name} pid {pid}")
        for path in map(Path, paths):   # a munge folder outside the cluster's root holds a key
            if path.name.startswith(MUNGE_DIR_PREFIX) and str(path.parent) == tempfile.gettempdir():
                shutil.rmtree(path, ignore_errors=True)
        entry.unlink(missing_ok=True)
    return killed


@dataclass
class SlurmCluster:
    """One slurmctld + one slurmd + one munged, private to this object; see the module docstring."""
    base_dir: Path
    partition: str = "debug"
    install: bool = True
    start_timeout_s: float = 60.0
    min_job_age_s: int = 300   # Slurm's default: finished jobs stay in `scontrol show job` >= this
    kill_wait_s: int = 5       # SIGTERM -> SIGKILL grace for cancelled/timed-out jobs
    root: Path = field(init=False)
    conf_path: Path = field(init=False)
    munge_dir: Path = field(init=False)       # key, socket, pid/seed files of our munged
    socket: Path = field(init=False)          # munged's socket (AuthInfo=socket=...)
    env: dict[str, str] = field(init=False, default_factory=dict)
    timings: StartTimings = field(init=False, default_factory=StartTimings)
    reaped: list[str] = field(init=False, default_factory=list)
    _daemons: list[Daemon] = field(init=False, default_factory=list)
    _registry_entry: Path | None = field(init=False, default=None)

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> SlurmCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Install if needed, start munged, slurmctld, slurmd; wait for the node to be idle.

        Raises SlurmUnavailable with the reason (and the daemons' log tails) on failure, after
        stopping whatever it had started.
        """
        t0 = time.monotonic()
        if not self.install and missing_packages():
            raise SlurmUnavailable(f"Slurm packages missing: {missing_packages()}")
        if missing_packages():
            self.timings.install_s = install_packages(missing_packages())
        if os.geteuid() != 0:
            # SlurmUser=root and a private munged need root; a user-mode cluster is not supported
            raise SlurmUnavailable("a private Slurm cluster needs root (SlurmUser=root)")
        self.reaped = reap_stale_daemons()
        self._make_root()
        try:
            t1 = time.monotonic()
            self._start_munged()
            self.timings.munge_s = time.monotonic() - t1
            t2 = time.monotonic()
            for attempt in range(PORT_ATTEMPTS):
                try:
                    self._start_slurm_daemons()
                    break
                except SlurmUnavailable as e:
                    # the free ports we picked were taken before the daemons bound them
                    if "Address already in use" not in str(e) or attempt == PORT_ATTEMPTS - 1:
                        raise
                    self._stop_daemons({"slurmctld", "slurmd"})
            self.timings.slurm_s = time.monotonic() - t2
        except BaseException:
            self.stop()
            raise
        self.timings.total_s = time.monotonic() - t0

    def _start_slurm_daemons(self) -> None:
        self._write_conf()   # fresh free ports each time
        self.env = {"SLURM_CONF": str(self.conf_path)}
        self._spawn("slurmctld", [find_binary("slurmctld"), "-D", "-i", "-f",
                                  str(self.conf_path)])
        self._spawn("slurmd", [find_binary("slurmd"), "-D", "-f", str(self.conf_path)])
        self._wait_idle()

    def _stop_daemons(self, names: set[str]) -> None:
        for daemon in reversed(self._daemons):
            if daemon.name in names and daemon.proc is not None and daemon.proc.poll() is None:
                _terminate(daemon.proc.pid, grace_s=10.0)
                daemon.proc.wait()
        self._daemons = [d for d in self._daemons if d.name not in names]

    def stop(self) -> None:
        """Cancel remaining jobs, then stop (by pid) only the daemons this object started."""
        started_any = bool(self._daemons)
        if self._running("slurmctld"):
            self._cancel_all_jobs()
        stepds = self._stepd_pids()
        self._stop_daemons({d.name for d in self._daemons})   # slurmd, slurmctld, munged
        munge_dir = getattr(self, "munge_dir", None)
        if munge_dir is not None and munge_dir.name.startswith(MUNGE_DIR_PREFIX):
            shutil.rmtree(munge_dir, ignore_errors=True)   # outside root, holds the key
        # slurmstepd is double-forked (orphaned to pid 1); one that outlived scancel is ours
        for pid in stepds:
            _terminate(pid, grace_s=2.0)
        # a finished slurmstepd is a zombie of pid 1 until pid 1 reaps it (on this kind of VM,
        # about once a second); wait (never kill) so that the session ends with no
        # "[slurmstepd] <defunct>" left. A zombie has no environ, so we cannot tell ours apart.
        deadline = time.monotonic() + 5.0
        while started_any and time.monotonic() < deadline and \
                (any(_pid_alive(pid) for pid in stepds) or _orphan_stepd_zombies()):
            time.sleep(0.1)
        if self._registry_entry is not None:
            self._registry_entry.unlink(missing_ok=True)
            self._registry_entry = None

    def _stepd_pids(self) -> list[int]:
        """slurmstepd processes launched by our slurmd (they inherit its SLURM_CONF)."""
        if not self.env:
            return []
        marker = f"SLURM_CONF={self.conf_path}".encode()
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if (proc / "comm").read_text().strip() != "slurmstepd":
                    continue
                if marker in (proc / "environ").read_bytes().split(b"\0"):
                    pids.append(int(proc.name))
            except OSError:
                continue
        return pids

    # -- helpers for tests -------------------------------------------------------------------
    @property
    def daemon_pids(self) -> dict[str, int]:
        """name -> pid of the daemons this object started and that still run."""
        return {d.name: d.proc.pid for d in self._daemons
                if d.proc is not None and d.proc.poll() is None}

    def client_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """base (default os.environ) without Slurm client variables, plus SLURM_CONF."""
        base = os.environ if base is None else base
        return {**{k: v for k, v in base.items() if not is_client_variable(k)}, **self.env}

    def run(self, argv: list[str], timeout_s: float = 60, check: bool = True
            ) -> subprocess.CompletedProcess:
        """Run a Slurm client command against this cluster; argv[0] is looked up in sbin too."""
        argv = [find_binary(argv[0]) or argv[0], *argv[1:]]
        result = subprocess.run(argv, env=self.client_env(), capture_output=True,
                                text=True, timeout=timeout_s)
        if check and result.returncode != 0:
            raise RuntimeError(f"{argv} exited {result.returncode}: {result.stderr.strip()}")
        return result

    def job_fields(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o ID` as a dict (JobState, ExitCode, ...)."""
        out = self.run(["scontrol", "show", "job", "-o", job_id]).stdout
        return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)

    def wait_gone(self, job_id: str, timeout_s: float = 60, poll_s: float = 0.2) -> None:
        """Poll `squeue -h -j ID` until the job (all array tasks) has left the queue."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.run(["squeue", "-h", "-j", job_id], check=False)
            if result.returncode == 0 and not result.stdout.strip():
                return
            time.sleep(poll_s)
        raise TimeoutError(f"job {job_id} still in squeue after {timeout_s} s")

    def log_tails(self) -> str:
        names = [(f"{d.name} stdout/stderr", d.log) for d in self._daemons]
        names += [("slurmctld", self.root / "log" / "slurmctld.log"),
                  ("slurmd", self.root / "log" / "slurmd.log")]
        return "\n".join(f"--- {name} ({path}) ---\n{_tail(path)}" for name, path in names
                         if path.exists())

    # -- internals -------------------------------------------------------------------------
    def _make_root(self) -> None:
        base = Path(self.base_dir)
        base.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix="slurm-", dir=base))
        # slurmd's step sockets are <root>/spool/<node>_<job id>.<step id> (ids up to 10 digits)
        host = socket.gethostname().split(".")[0]
        longest_socket = f"{self.root}/spool/{host}_{'9' * 10}.{'9' * 10}"
        if len(longest_socket) > UNIX_PATH_MAX:
            shutil.rmtree(self.root)
            self.root = Path(tempfile.mkdtemp(prefix="slurm-"))
        self.root.chmod(0o755)
        for sub in ("state", "spool", "log", "run"):
            (self.root / sub).mkdir(mode=0o755)
        self.conf_path = self.root / "slurm.conf"
        # munged exits ("Socket is inaccessible: execute permissions for all required on ...")
        # unless every folder above its socket is searchable by others; pytest's tmp folders
        # are 0700, so then the munge folder goes to a fresh folder in the system tmp dir
        if _searchable_by_all(self.root):
            self.munge_dir = self.root / "munge"
            self.munge_dir.mkdir(mode=0o755)
        else:
            self.munge_dir = Path(tempfile.mkdtemp(prefix=MUNGE_DIR_PREFIX))
            self.munge_dir.chmod(0o755)
            (self.root / "munge").symlink_to(self.munge_dir)

    def _spawn(self, name: str, argv: list[str]) -> Daemon:
        log = self.root / "log" / f"{name}.out"
        daemon = Daemon(name, argv, log)
        with open(log, "wb") as out:
            daemon.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=self.client_env(), cwd=self.root,
                start_new_session=True, preexec_fn=_die_with_parent)
        self._daemons.append(daemon)
        self._register()
        return daemon

    def _register(self) -> None:
        REGISTRY_DIR.mkdir(mode=0o755, exist_ok=True)
        self._registry_entry = REGISTRY_DIR / f"{os.getpid()}-{self.root.name}.json"
        record = {"owner_pid": os.getpid(), "paths": [str(self.root), str(self.munge_dir)],
                  "daemons": {d.name: d.proc.pid for d in self._daemons}}
        tmp = self._registry_entry.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.rename(self._registry_entry)

    def _running(self, name: str) -> bool:
        return any(d.name == name and d.proc is not None and d.proc.poll() is None
                   for d in self._daemons)

    def _start_munged(self) -> None:
        munge = self.munge_dir
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.socket = munge / "munge.socket"
        self._spawn("munged", [find_binary("munged"), "-F", f"--key-file={key}",
                               f"--socket={self.socket}", f"--pid-file={munge / 'munged.pid'}",
                               f"--seed-file={munge / 'munged.seed'}",
                               f"--log-file={munge / 'munged.log'}"])
        self._wait(lambda: self.socket.is_socket(), 15, "the munged socket", ["munged"])

    def _write_conf(self) -> None:
        host = socket.gethostname().split(".")[0]
        cpus = len(os.sched_getaffinity(0))   # what `nproc` says
        mem_kib = next(int(line.split()[1]) for line in open("/proc/meminfo")
                       if line.startswith("MemTotal:"))
        real_memory_mb = int(mem_kib / 1024 * 0.8)
        r = self.root
        ctld_port, slurmd_port = _free_port(), _free_port()
        while slurmd_port == ctld_port:
            slurmd_port = _free_port()
        self.conf_path.write_text("\n".join([
            "ClusterName=suite",
            f"SlurmctldHost={host}",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "ReturnToService=2",
            f"MinJobAge={self.min_job_age_s}",
            f"KillWait={self.kill_wait_s}",
            "InactiveLimit=0",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'run' / 'slurmd.pid'}",
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={real_memory_mb} "
            "State=UNKNOWN",
            f"PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))

    def _node_state(self) -> str:
        try:
            result = self.run(["sinfo", "-h", "-o", "%T"], timeout_s=5, check=False)
        except subprocess.TimeoutExpired:
            return ""   # e.g. something else answers on SlurmctldPort and never replies
        return result.stdout.strip() if result.returncode == 0 else ""

    def _wait_idle(self) -> None:
        self._wait(lambda: self._node_state() == "idle", self.start_timeout_s,
                   "the node to be idle in sinfo", ["munged", "slurmctld", "slurmd"])

    def _wait(self, predicate, timeout_s: float, what: str, daemons: list[str]) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [d for d in self._daemons if d.name in daemons and d.proc.poll() is not None]
            if dead:
                raise SlurmUnavailable(
                    f"{dead[0].name} exited with {dead[0].proc.returncode} while waiting for "
                    f"{what}\n{self.log_tails()}")
            if predicate():
                return
            time.sleep(0.1)
        state = self._node_state() if self._running("slurmctld") else "n/a"
        raise SlurmUnavailable(f"timed out after {timeout_s} s waiting for {what} "
                               f"(sinfo state: {state!r})\n{self.log_tails()}")

    def _cancel_all_jobs(self) -> None:
        """scancel every job, then wait (bounded) until none is left running or completing."""
        result = self.run(["squeue", "-h", "-o", "%A"], check=False, timeout_s=15)
        job_ids = result.stdout.split()
        if not job_ids:
            return
        self.run(["scancel", *job_ids], check=False, timeout_s=15)
        deadline = time.monotonic() + self.kill_wait_s + 15
        while time.monotonic() < deadline:
            left = self.run(["squeue", "-h", "-o", "%A"], check=False, timeout_s=15)
            if left.returncode != 0 or not left.stdout.strip():
                return
            time.sleep(0.2)
