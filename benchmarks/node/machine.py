"""The machine a rank runs on, read from the system (never from the platform file): CPU, memory and
load; each GPU (nvidia-smi: name, UUID, memory, SM clocks, power limit, ECC); the node's GPU/NIC
topology; each network interface of this network namespace with its link speed, rate shaping and
effective rate (netlink, tc, ethtool, sysfs: benchmarks/node/network.py) and each InfiniBand port's rate
(sysfs). One builder for the fingerprint of every record (benchmarks/node/environment.py); no torch, so
the harness may call it too. Anything unreadable is None, never a guess.
"""
from __future__ import annotations

import os
import re
import resource
import time
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from benchmarks.node.network import SYS_NET, interfaces, read_stripped as _read, run_quiet

SMI_TIMEOUT_S = 20.0
GPU_QUERY = ("name", "uuid", "memory.total", "clocks.max.sm", "clocks.sm", "power.limit", "ecc.mode.current",
             "pci.bus_id")
"""nvidia-smi --query-gpu fields, in the order of GPU_KEYS."""
GPU_KEYS = ("name", "uuid", "memory_mib", "sm_clock_max_mhz", "sm_clock_mhz", "power_limit_w", "ecc", "pci_bus_id")
NUMERIC = {"memory_mib", "sm_clock_max_mhz", "sm_clock_mhz", "power_limit_w"}
SYS_IB = Path("/sys/class/infiniband")


def _run(cmd: list[str]) -> Optional[str]:
    return run_quiet(cmd, SMI_TIMEOUT_S)


def cpu_model(cpuinfo: Optional[str] = None) -> Optional[str]:
    """The CPU's model name from /proc/cpuinfo ('AMD EPYC 7763 64-Core Processor'), not the
    architecture that platform.processor() often returns ('x86_64')."""
    text = _read(Path("/proc/cpuinfo")) if cpuinfo is None else cpuinfo
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "cpu model") and value.strip():
            return value.strip()
    return None


CPU_ID_FIELDS = {"vendor_id": "vendor", "cpu family": "family", "model": "model", "stepping": "stepping",
                 "microcode": "microcode", "CPU implementer": "implementer", "CPU architecture": "architecture",
                 "CPU part": "part", "CPU variant": "variant", "CPU revision": "revision"}
"""/proc/cpuinfo's fields (x86's, then Arm's) that say which silicon and firmware the model name stands for:
a cloud VM's 'AMD EPYC' is one EPYC generation on one host and a Zen 5 (family 26) on another, 1.3-1.4x apart
in fp32 matmul per core with the same ISA class (measured: docs/measurement.md, "Which CPU")."""


def cpu_id(cpuinfo: Optional[str] = None) -> Optional[dict[str, Any]]:
    """The first processor's identity from /proc/cpuinfo: {vendor, family, model, stepping, microcode} on x86
    ('AuthenticAMD', 26, 2, 1, '0x1000065'; numbers as integers), the implementer, architecture, part,
    variant and revision on Arm; None where the file says none of them."""
    text = _read(Path("/proc/cpuinfo")) if cpuinfo is None else cpuinfo
    out: dict[str, Any] = {}
    for line in (text or "").split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        field, value = CPU_ID_FIELDS.get(key.strip()), value.strip()
        if field and value and field not in out:
            out[field] = int(value) if value.isdigit() else value
    return out or None


def cpu_kind(cpu_fields: Optional[dict[str, Any]]) -> Optional[str]:
    """The CPU's kind from a machine's cpu fields (cpu() above): 'family 26 model 2' (x86), 'implementer 0x41
    part 0xd4f' (Arm): what parts two machines of one model name; None where the record has no id (written
    before it was kept). The stepping and the microcode are not the kind: a "what changed" names them
    (harness/verdict/changes.py hardware)."""
    ident = (cpu_fields or {}).get("id") if isinstance(cpu_fields, dict) else None
    if not isinstance(ident, dict):
        return None
    if ident.get("family") is not None and ident.get("model") is not None:
        return f"family {ident['family']} model {ident['model']}"
    if ident.get("part") is not None:
        return f"implementer {ident.get('implementer')} part {ident['part']}"
    return None


def mem_total_gib(meminfo: Optional[str] = None) -> Optional[float]:
    text = _read(Path("/proc/meminfo")) if meminfo is None else meminfo
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", text or "", re.M)
    return round(int(m.group(1)) / 2**20, 2) if m else None


def usable_cpus() -> Optional[int]:
    """The CPUs this process may run on (its affinity mask: a Slurm task's, a container's), None where
    the platform has no affinity call."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def cpu() -> dict[str, Any]:
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {"model": cpu_model(), "id": cpu_id(), "logical_cpus": os.cpu_count(),
            "usable_cpus": usable_cpus(),
            "mem_total_gib": mem_total_gib(), "load_avg_1_5_15": load}


def _stat_ticks(stat: Optional[str]) -> Optional[list[int]]:
    text = _read(Path("/proc/stat")) if stat is None else stat
    fields = (text or "").split("\n", 1)[0].split()
    if len(fields) < 5 or fields[0] != "cpu":
        return None
    return [int(x) for x in fields[1:]]


def busy_cpu_s(stat: Optional[str] = None) -> Optional[float]:
    """CPU seconds the whole machine (this kernel: every network namespace shares it) has spent
    busy since boot, from /proc/stat's first line: everything but idle, iowait and steal (steal_cpu_s:
    not this machine's work)."""
    ticks = _stat_ticks(stat)
    if ticks is None:
        return None
    guest = sum(ticks[8:10])   # guest time is counted in user already
    steal = ticks[7] if len(ticks) > 7 else 0
    return (sum(ticks) - ticks[3] - ticks[4] - steal - guest) / os.sysconf("SC_CLK_TCK")


def steal_cpu_s(stat: Optional[str] = None) -> Optional[float]:
    """CPU seconds since boot that a virtual machine's CPUs wanted to run while its hypervisor ran
    something else (/proc/stat's steal: the host's other guests); 0 on bare metal."""
    ticks = _stat_ticks(stat)
    if ticks is None:
        return None
    return (ticks[7] if len(ticks) > 7 else 0) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds this process (every thread) and its waited-for children have used."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run_delay_s() -> Optional[float]:
    """Seconds this process's threads have spent runnable but waiting for a CPU (the second of the three
    figures in /proc/self/task/<tid>/schedstat: on-CPU ns, run-queue wait ns, timeslices), summed over
    its live threads (a thread that ended takes its wait along); None where the kernel keeps no
    schedstat. A rank that sleeps on a socket or a lock does not wait on a run queue: only other
    runnable work on its CPUs makes it wait."""
    total, seen = 0, False
    try:
        tasks = list(Path("/proc/self/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        fields = (_read(task / "schedstat") or "").split()
        if len(fields) >= 2 and fields[1].isdigit():
            total, seen = total + int(fields[1]), True
    return total / 1e9 if seen else None


class LoadWindow:
    """How busy the machine was while a rank measured: opened when the measured part starts,
    closed after it. Per rank: the whole machine's busy CPUs and this rank's own, in CPUs' worth
    over the window; the harness subtracts every rank on the same kernel (boot_id) from the
    machine's busy CPUs to get the other work (harness/nodes.py load_during). On a virtual machine,
    the CPUs' worth its hypervisor took (steal) beside them: no process here did that work, and it
    slows the ranks as a busy neighbour does. And the CPUs' worth of time this rank's threads were
    ready to run while another task held the CPU (wait_cpus, run_delay_s): what other work took from
    it, which a rank waiting on the network or its peer never counts. And the same figures of each step
    marked with step_start/step_end (a training run's timed steps, outside their timing): `steps`, lists
    in step order, from which the harness reads the load during the steps at the run's median."""

    def __init__(self) -> None:
        self.start = self._read()
        self.steps: list[tuple] = []
        self._step: Optional[tuple] = None

    @staticmethod
    def _read() -> tuple:
        return time.monotonic(), busy_cpu_s(), steal_cpu_s(), own_cpu_s(), run_delay_s()

    def step_start(self) -> None:
        """Before a measured step (outside its timing): the step's own figures, so that the harness can read the
        load during the steps that set the run's median (harness/nodes.py at_median), not only the window's."""
        self._step = self._read()

    def step_end(self) -> None:
        if self._step is not None:
            self.steps.append((self._step, self._read()))
            self._step = None

    @staticmethod
    def _rates(t0: tuple, t1: tuple) -> dict[str, Any]:
        wall = t1[0] - t0[0]
        rate = (lambda x: round(x / wall, 3)) if wall > 0 else (lambda x: None)
        diff = (lambda i: None if t0[i] is None or t1[i] is None else rate(max(t1[i] - t0[i], 0.0)))
        return {"wall_s": round(wall, 4), "busy_cpus": diff(1), "steal_cpus": diff(2), "own_cpus": diff(3),
                "wait_cpus": diff(4)}

    def close(self) -> dict[str, Any]:
        rates = self._rates(self.start, self._read())
        try:
            load = [round(x, 2) for x in os.getloadavg()]
        except OSError:
            load = None
        out = {"boot_id": _read(Path("/proc/sys/kernel/random/boot_id")), "wall_s": round(rates["wall_s"], 3),
               "busy_cpus": rates["busy_cpus"], "steal_cpus": rates["steal_cpus"], "own_cpus": rates["own_cpus"],
               "load_avg_1_5_15": load, "wait_cpus": rates["wait_cpus"]}
        if self.steps:
            each = [self._rates(a, b) for a, b in self.steps]
            out["steps"] = {k: [e[k] for e in each] for k in each[0]}
        return out


def parse_gpu_query(csv: str) -> list[dict[str, Any]]:
    """Rows of `nvidia-smi --query-gpu=<GPU_QUERY> --format=csv,noheader,nounits`."""
    gpus = []
    for line in csv.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(GPU_KEYS):
            continue
        gpu: dict[str, Any] = {}
        for key, cell in zip(GPU_KEYS, cells):
            if cell in ("", "[N/A]", "N/A", "[Not Supported]"):
                gpu[key] = None
            elif key in NUMERIC:
                try:
                    gpu[key] = float(cell)
                except ValueError:
                    gpu[key] = None
            else:
                gpu[key] = cell
        gpus.append(gpu)
    return gpus


def gpus() -> Optional[list[dict[str, Any]]]:
    """Every GPU nvidia-smi sees on this node (None: no nvidia-smi, or it failed)."""
    out = _run(["nvidia-smi", f"--query-gpu={','.join(GPU_QUERY)}", "--format=csv,noheader,nounits"])
    return None if out is None else parse_gpu_query(out)


def parse_topology(text: str) -> Optional[dict[str, Any]]:
    """A summary of `nvidia-smi topo -m`: how GPU pairs and GPU-NIC pairs connect (counts of each
    link kind: NV<n>, PIX, PXB, PHB, NODE, SYS), and the matrix itself."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return None
    header = lines[0].split()
    gpu_cols = [i for i, h in enumerate(header) if re.fullmatch(r"GPU\d+", h)]
    nic_cols = [i for i, h in enumerate(header) if re.fullmatch(r"NIC\d+|mlx5_\d+", h)]
    gpu_gpu: Counter[str] = Counter()
    gpu_nic: Counter[str] = Counter()
    for line in lines[1:]:
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        values = cells[1:]
        for i in gpu_cols:
            if i < len(values) and values[i] != "X":
                gpu_gpu[values[i]] += 1
        for i in nic_cols:
            if i < len(values):
                gpu_nic[values[i]] += 1
    return {"gpu_gpu": dict(gpu_gpu), "gpu_nic": dict(gpu_nic), "matrix": lines[:64]}


def topology() -> Optional[dict[str, Any]]:
    out = _run(["nvidia-smi", "topo", "-m"])
    return None if out is None else parse_topology(out)


def _rate_gbps(text: Optional[str]) -> Optional[float]:
    """'200 Gb/sec (4X HDR)' -> 200.0."""
    m = re.match(r"\s*([\d.]+)\s*Gb/sec", text or "")
    return float(m.group(1)) if m else None


def ib_ports(sys_ib: Path = SYS_IB) -> list[dict[str, Any]]:
    """Each InfiniBand/RoCE port with its rate as the HCA reports it (sysfs)."""
    out = []
    for hca in sorted(sys_ib.iterdir()) if sys_ib.is_dir() else []:
        for port in sorted((hca / "ports").iterdir()) if (hca / "ports").is_dir() else []:
            out.append({"name": f"{hca.name}/{port.name}", "kind": "ib",
                        "link_layer": _read(port / "link_layer"), "rate_gbps": _rate_gbps(_read(port / "rate")),
                        "state": _read(port / "state")})
    return out


def nics(sys_net: Path = SYS_NET, sys_ib: Path = SYS_IB) -> list[dict[str, Any]]:
    """Each network interface of this process's network namespace but loopback (physical, veth,
    bridge, ...: benchmarks/node/network.py) with its link speed, rate shaping and effective rate, then
    each InfiniBand/RoCE port."""
    return interfaces(sys_net) + ib_ports(sys_ib)


def machine() -> dict[str, Any]:
    """The whole machine as this process sees it."""
    return {"cpu": cpu(), "gpus": gpus(), "gpu_topology": topology(), "nics": nics()}
