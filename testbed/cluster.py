"""An emulated Slurm cluster on one machine: the nodes of testbed.network plus a real Slurm in them
(munged and slurmctld on node1, one slurmd per node), following ../shared/MULTINODE_NOTES.md.

    cluster = EmulatedCluster("ci", num_nodes=2, link="1gbit")
    cluster.start()                     # or: with EmulatedCluster(...) as cluster:
    cluster.run(["sbatch", "--nodes=2", "--wrap", "srun hostname"])   # a client command on node1
    cluster.shape("250mbit")            # re-shape every link while it runs
    cluster.stop()                      # everything it made, gone

Everything lives under /tmp/suite-testbed/<name>/ (state.json, slurm.conf, munge key and socket,
spool, logs) and in the namespaces tb-<name>-*. Slurm's ports exist only inside the namespaces, so
a Slurm running in the root namespace (or another emulated cluster) is never disturbed.

Owned by a process (a test session), the daemons die with it (PR_SET_PDEATHSIG) and the next start
of any cluster removes what a dead owner left (namespaces, processes in them, files). Detached
(`python -m testbed up`, `make cluster-up`), the cluster stays up until `down`.
"""
from __future__ import annotations

import ctypes
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .network import Network, link_gbps, payload_gbps
from .system import Unavailable, cmdline, find_binary, install_packages, missing_packages, pid_alive, tail, terminate

BASE_DIR = Path(tempfile.gettempdir()) / "suite-testbed"
STATE_FILE = "state.json"
CLIENT = "client"
"""The cluster folder's Slurm client prefix for node1, a sh script (platform cpu-cluster's
slurm.client_prefix): a controller polls squeue every platform.slurm.poll_s, and through
`python3 -m testbed exec` each poll started Python, ~0.27 s of CPU a call against ~0.02 s for the
script. On the 2-core box that shares its cores with the nodes' ranks, polling every 0.5 s took 0.3
CPUs' worth from every run the cluster measured (its probes read 0.27-0.31 CPUs of other work)."""
BINARIES = {"slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client", "squeue": "slurm-client",
            "sinfo": "slurm-client", "scancel": "slurm-client", "scontrol": "slurm-client", "srun": "slurm-client",
            "munged": "munge", "ip": "iproute2", "tc": "iproute2", "nsenter": "util-linux",
            "unshare": "util-linux", "ethtool": "ethtool"}
"""binary -> Debian package that provides it."""
CTLD_PORT, SLURMD_PORT = 16817, 16818
PARTITION = "cluster"
CLIENT_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SINFO_", "SCANCEL_",
                       "SCONTROL_", "SACCT_")
"""Slurm client input variables of an outer job (a CI runner inside salloc) would make the clients
talk about jobs this cluster never had: dropped from every command's environment."""
PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent() -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def check_privileges() -> None:
    """Root is needed: network namespaces and tc (CAP_NET_ADMIN), mounts (CAP_SYS_ADMIN), and
    Slurm's daemons as SlurmUser=root."""
    if os.geteuid() != 0:
        raise Unavailable("an emulated cluster needs root (CAP_NET_ADMIN for network namespaces and tc, "
                          "CAP_SYS_ADMIN for the per-node /etc/hosts mounts, SlurmUser=root): run it as root, "
                          "e.g. `sudo make cluster-up`")


def client_env(conf: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    base = dict(os.environ) if base is None else base
    return {**{k: v for k, v in base.items() if not k.startswith(CLIENT_ENV_PREFIXES)}, "SLURM_CONF": str(conf)}


@dataclass
class EmulatedCluster:
    name: str = "default"
    num_nodes: int = 2
    link: str = "1gbit"
    detached: bool = False
    clock_skew_s: int = 0
    """Node K's monotonic clock (K - 1) x this ahead of node 1's (testbed/network.py): separate machines' clocks."""
    base_dir: Path = BASE_DIR
    start_timeout_s: float = 60.0
    root: Path = field(init=False)
    network: Network = field(init=False)
    daemons: dict[str, int] = field(init=False, default_factory=dict)
    start_s: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self.root = Path(self.base_dir) / self.name
        self.network = Network(self.name, self.num_nodes, self.link, self.root / "hosts", self.clock_skew_s)

    # -- paths and views -----------------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def client(self) -> Path:
        """The cluster's Slurm client prefix (CLIENT): `<client> squeue ...` runs on node1."""
        return self.root / CLIENT

    @property
    def hostnames(self) -> list[str]:
        return [self.network.hostname(k) for k in range(1, self.num_nodes + 1)]

    @property
    def link_gbps(self) -> float | None:
        return link_gbps(self.link)

    @property
    def payload_gbps(self) -> float | None:
        """The most a TCP transport can carry per direction on one node link (Gbit/s)."""
        return payload_gbps(self.link)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        return client_env(self.conf, base)

    def command(self, argv: list[str], node: int = 1) -> list[str]:
        """argv run on node K (1-based), its binary looked up in sbin too."""
        return [*self.network.prefix(node), find_binary(argv[0]) or argv[0], *argv[1:]]

    def run(self, argv: list[str], node: int = 1, timeout_s: float = 60, check: bool = True,
            **kwargs) -> subprocess.CompletedProcess:
        """A command on node K with SLURM_CONF pointing at this cluster (text, output captured)."""
        kwargs.setdefault("capture_output", True)
        result = subprocess.run(self.command(argv, node), env=self.env(kwargs.pop("env", None)), text=True,
                                timeout=timeout_s, **kwargs)
        if check and result.returncode != 0:
            raise RuntimeError(f"{argv} on node{node} exited {result.returncode}: {(result.stderr or '').strip()}")
        return result

    # -- life cycle ----------------------------------------------------------------------------
    def __enter__(self) -> EmulatedCluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Install missing packages, build the network, start munged, slurmctld and the slurmds,
        wait until every node is idle. Raises Unavailable (with the daemons' logs) after removing
        whatever it had made."""
        t0 = time.monotonic()
        check_privileges()
        missing = missing_packages(BINARIES)
        if missing:
            install_packages(missing, BINARIES)
        reap_stale(self.base_dir)
        if (self.root / STATE_FILE).exists():
            raise Unavailable(f"an emulated cluster named {self.name!r} is already up ({self.root}); "
                              f"`python -m testbed down --name {self.name}` (make cluster-down) first")
        shutil.rmtree(self.root, ignore_errors=True)
        for sub in ("state", "spool", "log", "run", "munge"):
            (self.root / sub).mkdir(parents=True, mode=0o755)
        for path in (Path(self.base_dir), self.root):   # munged refuses a socket others cannot reach
            path.chmod(0o755)
        self._save()   # before anything is made: a killed start is reaped like a killed session
        try:
            self.network.create()
            self._start_munged()
            self._write_conf()
            self._write_client()
            self._spawn("slurmctld", 1, [find_binary("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            for k in range(1, self.num_nodes + 1):
                (self.root / "spool" / self.network.hostname(k)).mkdir(mode=0o755, exist_ok=True)
                self._spawn(f"slurmd-node{k}", k, [find_binary("slurmd"), "-D", "-f", str(self.conf)])
            self._wait_idle()
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - t0
        self._save()

    def stop(self) -> None:
        """Cancel the jobs, stop the daemons, kill what is left in the namespaces, remove them and
        the cluster's folder. Idempotent."""
        if self.daemons.get("slurmctld") and pid_alive(self.daemons["slurmctld"]):
            self._cancel_all_jobs()
        teardown(self.root, self.network, self.daemons)
        self.daemons = {}

    def shape(self, link: str) -> None:
        self.network.shape(link)
        self.link = link
        self._save()

    # -- internals -----------------------------------------------------------------------------
    def _save(self) -> None:
        state = {"name": self.name, "num_nodes": self.num_nodes, "link": self.link, "clock_skew_s": self.clock_skew_s,
                 "owner_pid": None if self.detached else os.getpid(), "daemons": self.daemons,
                 "root": str(self.root), "namespaces": self.network.namespaces}
        tmp = self.root / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.rename(self.root / STATE_FILE)

    def _spawn(self, name: str, node: int, argv: list[str]) -> None:
        log = self.root / "log" / f"{name}.out"
        with open(log, "wb") as out:
            proc = subprocess.Popen(self.command(argv, node), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=self.env(), cwd=self.root, start_new_session=True,
                                    preexec_fn=None if self.detached else _die_with_parent)
        self.daemons[name] = proc.pid
        self._save()

    def _start_munged(self) -> None:
        munge = self.root / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn("munged", 1, [find_binary("munged"), "-F", f"--key-file={key}", f"--socket={munge / 'socket'}",
                                  f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'munged.seed'}",
                                  f"--log-file={munge / 'munged.log'}"])
        self._wait(lambda: (munge / "socket").is_socket(), 15, "the munged socket")

    def _write_conf(self) -> None:
        r, n = self.root, self.num_nodes
        cpus = len(os.sched_getaffinity(0))
        nodes = f"node[1-{n}]" if n > 1 else "node1"
        addrs = f"{self.network.address(1).rsplit('.', 1)[0]}.[1-{n}]" if n > 1 else self.network.address(1)
        self.conf.write_text("\n".join([
            f"ClusterName=tb{self.name}", f"SlurmctldHost=node1({self.network.address(1)})",
            f"SlurmctldPort={CTLD_PORT}", f"SlurmdPort={SLURMD_PORT}", "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={r / 'munge' / 'socket'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU", "MpiDefault=none", "MailProg=/bin/true", "ReturnToService=2",
            "MinJobAge=300", "KillWait=5", "InactiveLimit=0", "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none", "JobCompType=jobcomp/none",
            "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool' / '%n'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={r / 'log' / 'slurmd-%n.log'}",
            f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'run' / 'slurmd-%n.pid'}",
            f"NodeName={nodes} NodeAddr={addrs} CPUs={cpus} State=UNKNOWN",
            f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
            ""]))

    def _write_client(self) -> None:
        """The CLIENT script: what `python -m testbed exec --name NAME --` does for node1, in sh."""
        unset = "|".join(p.rstrip("_") for p in CLIENT_ENV_PREFIXES)
        script = "\n".join([
            "#!/bin/sh",
            f"# Slurm's client commands on node1 of the emulated cluster {self.name!r} (python -m testbed up wrote it).",
            f"for v in $(env | sed -n -E 's/^(({unset})_[A-Za-z0-9_]*)=.*/\\1/p'); do unset \"$v\"; done",
            f"SLURM_CONF={shlex.quote(str(self.conf))}; export SLURM_CONF",
            'PATH="$PATH:/usr/sbin:/sbin"; export PATH',
            "exec " + " ".join(shlex.quote(w) for w in self.network.prefix(1)) + ' "$@"',
            ""])
        tmp = self.client.with_suffix(".tmp")
        tmp.write_text(script)
        tmp.chmod(0o755)
        tmp.rename(self.client)

    def node_states(self) -> dict[str, str]:
        try:
            result = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout_s=5, check=False)
        except subprocess.TimeoutExpired:
            return {}
        return dict(line.split() for line in result.stdout.splitlines() if len(line.split()) == 2)

    def _wait_idle(self) -> None:
        self._wait(lambda: (s := self.node_states()) and all(s.get(h) == "idle" for h in self.hostnames),
                   self.start_timeout_s, f"nodes {self.hostnames} to be idle in sinfo")

    def _wait(self, predicate, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [name for name, pid in self.daemons.items() if not pid_alive(pid)]
            if dead:
                raise Unavailable(f"{dead[0]} exited while waiting for {what}\n{self.log_tails()}")
            if predicate():
                return
            time.sleep(0.1)
        raise Unavailable(f"timed out after {timeout_s:g} s waiting for {what} "
                          f"(sinfo: {self.node_states()})\n{self.log_tails()}")

    def log_tails(self) -> str:
        return "\n".join(f"--- {p} ---\n{tail(p)}" for p in sorted((self.root / "log").glob("*")))

    def _cancel_all_jobs(self) -> None:
        try:
            jobs = self.run(["squeue", "-h", "-o", "%A"], check=False, timeout_s=15).stdout.split()
            if jobs:
                self.run(["scancel", *jobs], check=False, timeout_s=15)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and \
                        self.run(["squeue", "-h", "-o", "%A"], check=False, timeout_s=15).stdout.strip():
                    time.sleep(0.2)
        except subprocess.TimeoutExpired:
            pass

    @classmethod
    def load(cls, name: str, base_dir: Path = BASE_DIR) -> EmulatedCluster:
        """The cluster named so that is up (from its state file)."""
        path = Path(base_dir) / name / STATE_FILE
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            raise Unavailable(f"no emulated cluster named {name!r} is up (no {path}): start one with "
                              "`make cluster-up NODES=2 LINK=1gbit` (python -m testbed up)") from None
        cluster = cls(state["name"], int(state["num_nodes"]), state["link"], detached=state["owner_pid"] is None,
                      base_dir=Path(base_dir), clock_skew_s=int(state.get("clock_skew_s", 0)))
        cluster.daemons = {k: int(v) for k, v in state["daemons"].items()}
        return cluster


def teardown(root: Path, network: Network, daemons: dict[str, int]) -> list[str]:
    """Stop the daemons (only pids whose command line still names the cluster's folder), every
    process in the namespaces, the namespaces, and the folder. What was stopped."""
    stopped = []
    for name, pid in reversed(list(daemons.items())):
        if pid_alive(pid) and str(root) in cmdline(pid):
            terminate(pid, grace_s=10.0)
            stopped.append(f"{name} pid {pid}")
    stopped += [f"pid {p}" for p in network.kill_all()]
    network.destroy()
    shutil.rmtree(root, ignore_errors=True)
    return stopped


def reap_stale(base_dir: Path = BASE_DIR) -> list[str]:
    """Remove clusters whose owning process is gone (a test session killed before its teardown);
    detached clusters and live owners' are left alone."""
    reaped = []
    for path in sorted(Path(base_dir).glob(f"*/{STATE_FILE}")):
        try:
            state = json.loads(path.read_text())
            owner = state["owner_pid"]
            network = Network(state["name"], int(state["num_nodes"]), state["link"], path.parent / "hosts")
            daemons = {str(k): int(v) for k, v in state["daemons"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            continue   # torn or not ours: leave it
        if owner is None or pid_alive(int(owner)):
            continue
        teardown(path.parent, network, daemons)
        reaped.append(state["name"])
    return reaped
