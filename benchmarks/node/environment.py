"""The environment fingerprint as seen by a rank (inside the container, if any)."""
from __future__ import annotations

import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

from contract import events as ev
from contract.fingerprint import DIGEST_VAR, IMAGE_VAR, RANK_FIELDS, RUNTIME_VAR, build, recorded_env, stack_versions

from benchmarks.node.machine import machine
from benchmarks.node.network import read_stripped
from benchmarks.node.probe import node_probe

LOCK_FILE = Path(__file__).resolve().parents[2] / "requirements.lock"

def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _driver_version() -> Optional[str]:
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            first = f.readline()
        for token in first.split():
            if token[:1].isdigit() and "." in token:
                return token
    except OSError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def lock_mismatches(lock: Path = LOCK_FILE) -> Optional[dict[str, dict[str, Optional[str]]]]:
    """Packages whose installed version differs from requirements.lock ({} when all match; None
    when there is no lock to read). Local tags (+cpu, +nv25.01) are ignored."""
    try:
        text = lock.read_text(encoding="utf-8")
    except OSError:
        return None
    out: dict[str, dict[str, Optional[str]]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip().rstrip("\\").strip()
        if "==" not in line or line.startswith("-"):
            continue
        name, pinned = (x.strip() for x in line.split(";")[0].split("==", 1))
        seen = _version(name)
        if seen is None or seen.split("+")[0] != pinned:
            out[name] = {"lock": pinned, "seen": seen}
    return out


def container_of() -> tuple[Optional[str], Optional[str], Optional[str]]:
    """(image, digest, runtime) as the harness declared them, else as the runtime says."""
    image = os.environ.get(IMAGE_VAR) or os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER")
    runtime = os.environ.get(RUNTIME_VAR) or ("apptainer" if os.environ.get("APPTAINER_CONTAINER") else None)
    return image, os.environ.get(DIGEST_VAR), runtime


def first_on_node() -> bool:
    """Whether this rank reports its node's machine (the NODE event): torchrun's first local rank,
    or every rank when nothing says which is first (the harness keeps one view per host)."""
    return os.environ.get("LOCAL_RANK") in (None, "0")


def first_on_kernel(rank: int) -> bool:
    """Whether this rank is the lowest of the ranks on its kernel (/proc's boot_id), by an all-gather every rank
    joins: the rank that reads the machine's pulses (benchmarks/node/probe.py pulse, pulse_triad), one per
    machine. On a cluster each node is its own kernel, so that is each node's first rank; the emulated
    cluster's nodes share one box, where two nodes' memory pulses at once read each other's traffic (a
    ZeRO-3 run's triad 0.57x its probe's, the other runs' 0.86-0.89x) and the pace of one is the box's.
    Where the boot_id cannot be read, first_on_node()."""
    return first_of(kernel_peers(rank))


def first_of(peers: Optional[tuple[int, int]]) -> bool:
    """first_on_kernel from kernel_peers' answer already gathered."""
    return first_on_node() if peers is None else peers[0] == 0


def kernel_peers(rank: int) -> Optional[tuple[int, int]]:
    """(this rank's place among the ranks on its kernel, how many they are), by /proc's boot_id and an all-gather
    every rank joins; None where this rank cannot read its boot_id."""
    import torch.distributed as dist

    boot = read_stripped(Path("/proc/sys/kernel/random/boot_id"))
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, boot)
    if boot is None:
        return None
    mine = [r for r, b in enumerate(everyone) if b == boot]
    return mine.index(rank), len(mine)


def cpu_share(allowed: set[int], place: int, count: int) -> Optional[list[int]]:
    """The CPUs of the place-th of `count` ranks that share the `allowed` CPUs: each an equal run of them in order
    (2 ranks on 2 CPUs: one each); None where there are fewer CPUs than ranks (no rank is given none)."""
    cpus = sorted(allowed)
    per = len(cpus) // count if count > 0 else 0
    if per == 0 or not 0 <= place < count:
        return None
    return cpus[place * per:(place + 1) * per]


def bind_rank(peers: Optional[tuple[int, int]]) -> Optional[list[int]]:
    """Bind every thread of this rank's process (its own and gloo's, made at init_process_group) to its share of the
    CPUs it may use (cpu_share, among the ranks on its kernel, `peers` as kernel_peers gives them: the emulated
    cluster's nodes split one box's). Returns the CPUs, or None where nothing was bound (fewer CPUs than ranks, no
    boot_id, a thread that refused: then every thread is given back the CPUs it had). A thread that ended meanwhile
    is passed over."""
    allowed = os.sched_getaffinity(0)
    share = cpu_share(allowed, *peers) if peers else None
    if share is None:
        return None
    threads = [int(tid) for tid in os.listdir("/proc/self/task")]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, share)
        except ProcessLookupError:
            continue
        except OSError:
            _set_affinity(threads, allowed)
            return None
    return share


def _set_affinity(threads: list[int], cpus: set[int]) -> None:
    """Every one of the threads that still runs on `cpus`."""
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass


def node_view(probe: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """This node's machine as this rank sees it: {host, machine} (benchmarks/node/machine.py), its
    capability probe (benchmarks/node/probe.py) as machine.probe."""
    return {"host": socket.gethostname(), "machine": {**machine(), "probe": probe}}


def announce(log: ev.EventLog, rank: int, world_size: int, run_dir: Path, device: str) -> None:
    """Before anything can fail, so that every record has the ranks' view: this node's probe
    (measured by its first rank once per bench, the others wait for it), then rank 0's fingerprint
    (ENVIRONMENT), or the NODE event of every other node's first rank."""
    probe = node_probe(run_dir.parent.parent, device, first_on_node())
    if rank == 0:
        log.emit(ev.ENVIRONMENT, fingerprint(world_size, probe))
    elif first_on_node():  # every other node's machine, in this rank's own event log
        log.emit(ev.NODE, node_view(probe))


def fingerprint(world_size: int, probe: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    box = {**machine(), "probe": probe}
    image, digest, runtime = container_of()
    nccl = None
    if cuda:
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return build(
        RANK_FIELDS,
        python=platform.python_version(),
        torch=torch.__version__,
        deepspeed=_version("deepspeed"),
        transformers=_version("transformers"),
        datasets=_version("datasets"),
        **stack_versions(),   # triton, liger_kernel, torchao: None when absent
        cuda=torch.version.cuda if cuda else None,
        nccl=nccl,
        driver=_driver_version() if cuda else None,
        gpu_model=torch.cuda.get_device_name(0) if cuda else None,
        gpu_count=torch.cuda.device_count() if cuda else 0,   # on this node, as detected
        cpu_model=box["cpu"]["model"],   # /proc/cpuinfo's model name; None, never the architecture, when absent
        machine=box,
        os=platform.platform(),
        container_image=image,
        container_digest=digest,
        container_runtime=runtime,
        lock_mismatches=lock_mismatches(),
        env=recorded_env(os.environ),
        host=socket.gethostname(),
        world_size=world_size,
    )
