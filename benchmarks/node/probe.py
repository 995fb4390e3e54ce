"""The capability probe: what a node measurably is, measured in the ranks' own environment (inside
the container, under the launcher) once per node per bench, before the first run measures.

A machine is known by what it measures, not by its name: two hosts named "AMD EPYC" may differ by
60x in bf16 matmul (AVX-512 BF16 or not), a GPU at a lowered power cap or on a PCIe link trained
at x8 carries the same name as a healthy one. The probe records:
- dense matmul throughput (F.linear, as the model's layers run it) per dtype the suite runs (cpu:
  fp32, bf16, one thread, so per core;
  cuda: fp32 with TF32 off, bf16, fp16, on the rank's GPU), each at a size on its plateau (SIZE;
  the rate at half that size is kept beside it as the check), REPEATS timed repeats: best (the
  figure compared), median and spread ((max - min) / median);
- memory bandwidth: a STREAM-like triad a = b + s*c (3 arrays of TRIAD_BYTES; on cpu one thread,
  as a busy neighbour on another core moves an all-core triad 4x), best of REPEATS;
- the host's pace at issuing work (host_dispatch): torch ops on 8-element CPU tensors a second, one
  thread, on every device: what sets the pace of a step the GPU waits on (ZeRO-3's hooks, small
  micro-batches); two one-GPU nodes of one CPU name took ZeRO-1 mb 8's forward phase in 38.1 and
  23.5 ms (docs/performance-model.md, "The H200 runs"), and no other figure told their hosts apart;
- on cpu, the ISA that picks torch's kernels: torch's CPU capability (ATEN_CPU_CAPABILITY lowers
  it), the avx2 / avx512f / avx512_bf16 / amx flags of /proc/cpuinfo, and the frequency governor;
- on cuda, the node's GPUs as `nvidia-smi -q` describes them (benchmarks/node/gpu_state.py: clocks,
  power draw and limit, throttle reasons, ECC, PCIe link, persistence, MIG);
- other work on the machine during the probe (CPUs' worth), so a busier box is named as such, and on a
  virtual machine what its hypervisor took (steal_cpus); on cpu each figure during which the two took
  more than QUIET_CPUS is measured again (QUIET_WAIT_S in all), the quietest attempt kept with its own
  other_cpus, steal_cpus and attempts.

One process per node computes it (the first rank on the node) and writes PROBE_DIR/<host>.json in
the bench's output folder; the node's other ranks wait for that file (they would otherwise compete
for the cores), later runs of the same bench read it. Nodes that are one machine (the same boot id:
the emulated cluster's namespaces) probe one after the other, under a lock in that folder: two
one-core triads at once on a 2-core EPYC read 26 GB/s each against 49 GB/s alone, so whichever
node's triad happened to overlap the other's read half, and a night's machine "changed" by chance.
Versioned (PROBE_SCHEMA); a record without a probe (an older record) stays valid and is "machine
not measured" to a comparison.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Collection, Optional

from benchmarks.node.exchange import exchange
from benchmarks.node.gpu_state import query
from benchmarks.node.machine import busy_cpu_s, own_cpu_s, steal_cpu_s, usable_cpus
from benchmarks.node.network import read_stripped

PROBE_SCHEMA = "1"
PROBE_DIR = "probes"
REPEATS = 5
SIZE = {"cpu": 512, "cuda": 8192}
"""The product's side: at the plateau on the CPUs and GPUs measured (half_size_ratio shows it)."""
REPEAT_S = {"cpu": 0.12, "cuda": 0.05}
"""Each repeat runs products for at least this long."""
PULSE_REPEATS = 3
PULSE_S = {"cpu": 0.08, "cuda": 0.03}
"""A pulse's repeats: long enough for a figure at the plateau, short enough to cost ~0.3 s a run."""
TRIAD_BYTES = {"cpu": 32 * 2**20, "cuda": 1 * 2**30}
PULSE_TRIAD_BYTES = {"cpu": 32 * 2**20, "cuda": 256 * 2**20}
"""A memory pulse's arrays: the probe's on cpu (so that the two compare), a quarter of the probe's on a GPU
(3 x 256 MiB, far beyond its L2 cache, beside a loaded model)."""
DTYPES = {"cpu": ("fp32", "bf16"), "cuda": ("fp32", "bf16", "fp16")}
DISPATCH_OPS = 200
"""torch.add calls a timed call of host_dispatch makes (a few hundred microseconds on the 2-core EPYC)."""
DISPATCH_S = 0.05
"""Each repeat of host_dispatch runs for at least this long: REPEATS of them, about 0.25 s a probe."""
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
QUIET_CPUS = 0.25
"""A cpu figure measured while other work on the machine took more than this many CPUs' worth is
measured again. Another process's torch threads share the probe's core: on the 2-core EPYC, one thread's
fp32 matmul read 73-84 GFLOP/s alone and 33-78 (bf16 4.4-8.7 against 9.1-9.3) while a neighbour ran
torch; on the emulated cluster, whose nodes share that box, a node probed while the other node's rank
was still importing and building read 5.33 GFLOP/s bf16 against 9.17 the bench before, and the next
night's runs were all 'not comparable' (other work 0.35 CPUs over the whole probe)."""
QUIET_WAIT_S = {"cpu": 6.0, "cuda": 0.0}
"""How long a probe measures again for quiet figures, all its figures together (a rank's imports and
model build on this box: a few seconds; measured, the emulated cluster's second node waited 5 s); past
it each figure is measured once, so a probe stays within its 10 s budget. A GPU's figures do not
move with other CPU work: measured once."""
WAIT_S = 300.0
"""How long a node's other ranks wait for its probe before going on without one."""


def _timed(fn: Callable[[], None], sync: Callable[[], None], min_s: float) -> tuple[int, float]:
    """(calls, seconds) of fn repeated for at least min_s (at least once), synchronised at both ends."""
    sync()
    t0, n = time.perf_counter(), 0
    while True:
        fn()
        n += 1
        if n % 4 == 0 or n == 1:
            sync()
            dt = time.perf_counter() - t0
            if dt >= min_s:
                return n, dt


def _figure(rates: list[float], unit: str, **more: Any) -> dict[str, Any]:
    med = statistics.median(rates)
    return {"best": round(max(rates), 3), "median": round(med, 3), "unit": unit,
            "spread_pct": round(100.0 * (max(rates) - min(rates)) / med, 2) if med else None,
            "repeats": len(rates), **more}


def _start() -> tuple[float, Optional[float], Optional[float], float]:
    return time.monotonic(), busy_cpu_s(), steal_cpu_s(), own_cpu_s()


def _taken(start: tuple[float, Optional[float], Optional[float], float]) -> tuple[Optional[float], Optional[float]]:
    """(other work on the machine: every process but this one, on this kernel; the CPUs' worth a
    hypervisor took, steal) since _start(), in CPUs' worth; None where /proc/stat cannot be read."""
    t0, busy0, steal0, own0 = start
    wall, busy1, steal1 = time.monotonic() - t0, busy_cpu_s(), steal_cpu_s()
    if wall <= 0:
        return None, None
    other = None if busy0 is None or busy1 is None else round(max(0.0, (busy1 - busy0) - (own_cpu_s() - own0)) / wall, 3)
    steal = None if steal0 is None or steal1 is None else round(max(0.0, steal1 - steal0) / wall, 3)
    return other, steal


def quiet(measure_figure: Callable[[], dict[str, Any]], deadline: float) -> dict[str, Any]:
    """measure_figure()'s figure, measured again while other work and the hypervisor's steal together
    took more than QUIET_CPUS during it and the monotonic clock is before deadline: the quietest
    attempt, with its other_cpus, steal_cpus and the number of attempts made."""
    kept: Optional[tuple[dict[str, Any], Optional[float], Optional[float]]] = None
    attempts = 0
    while True:
        start = _start()
        figure = measure_figure()
        attempts += 1
        other, steal = _taken(start)
        taken = None if other is None else other + (steal or 0.0)
        if kept is None or (taken is not None and (kept[1] is None or taken < kept[1] + (kept[2] or 0.0))):
            kept = (figure, other, steal)
        if taken is None or taken <= QUIET_CPUS or time.monotonic() >= deadline:
            return {**kept[0], "other_cpus": kept[1], "steal_cpus": kept[2], "attempts": attempts}


def matmul(dtype_name: str, device: str) -> dict[str, Any]:
    """GFLOP/s of an n x n product in this dtype (per core on cpu: one thread), as the model's layers
    compute it: F.linear, x @ W^T (on a CPU without AVX-512 BF16, bf16 torch.mm takes a path 7x
    slower than bf16 F.linear, which oneDNN serves: measured 0.9 vs 6.5 GFLOP/s). n is fixed per device
    (SIZE) so that two machines are measured alike; the rate at n/2 is measured too, and its ratio
    to the rate at n (half_size_ratio) shows the plateau was reached (near 1 or above)."""
    n = SIZE[device]
    half = max(_linear_rates(dtype_name, device, n // 2, 3, REPEAT_S[device] / 4))
    full = _linear_rates(dtype_name, device, n, REPEATS, REPEAT_S[device])
    return _figure(full, "GFLOP/s", n=n, half_size_ratio=round(half / max(full), 3))


def _linear_rates(dtype_name: str, device: str, n: int, repeats: int, min_s: float) -> list[float]:
    """GFLOP/s of F.linear on n x n operands in this dtype, one figure per timed repeat (after a warm-up call)."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype_name]
    dev = torch.device("cuda" if device == "cuda" else "cpu")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    a, b = (torch.randn(n, n, device=dev).to(dtype) for _ in range(2))
    linear = torch.nn.functional.linear
    linear(a, b)                                     # warm-up: kernel choice, caches
    out = []
    for _ in range(repeats):
        calls, dt = _timed(lambda: linear(a, b), sync, min_s)
        out.append(2.0 * n**3 * calls / dt / 1e9)
    return out


def pulse(device: str) -> Optional[float]:
    """The machine's pace now, in about 0.3 s: fp32 F.linear GFLOP/s at the probe's size (one thread
    on cpu: per core, as the probe's fp32 figure), best of PULSE_REPEATS short repeats. The first rank
    on each node reads it right before and right after a run measures (benchmarks/training/train.py), so a
    run judged against a reference knows whether the machine itself ran slower than the reference's
    (harness/pace.py pace). None when it fails: a pulse never fails a run."""
    return _one_thread(device, lambda: max(_linear_rates("fp32", device, SIZE[device], PULSE_REPEATS, PULSE_S[device])))


def pulse_triad(device: str) -> Optional[float]:
    """The machine's memory pace now, in about 0.3 s: the triad's GB/s over PULSE_TRIAD_BYTES (one thread on
    cpu, as the probe's triad), best of PULSE_REPEATS short repeats; read beside pulse(), so that a run whose
    machine lost memory bandwidth and not matmul rate (a neighbour streaming memory, another tenant of a VM's
    host) is known as such (harness/pace.py pace). None when it fails."""
    return _one_thread(device, lambda: max(_triad_rates(device, PULSE_TRIAD_BYTES[device] // 4, PULSE_REPEATS,
                                                        PULSE_S[device])))


def pulse_exchange(device: str, cpus: Optional[Collection[int]] = None) -> Optional[float]:
    """The host's exchange latency now, on cpu, in about 0.15 s: the lower quartile (us) of a TCP ping-pong's round
    trips between this process and a child on another CPU (benchmarks/node/exchange.py), what a small gloo call
    waits on without gloo; it reads the host's slow spells (tests/perf/exchange_spells.py). None on a GPU (NCCL's
    small calls wait on other paths) and when it fails: a pulse never fails a run."""
    if device != "cpu":
        return None
    try:
        return round(exchange(allowed=cpus)["p25_us"], 2)
    except Exception:   # noqa: BLE001  (a pulse never fails a run)
        return None


class Pulses:
    """The pulses right before a run measures and right after: start() before, window() after, the latter in
    the LOAD window's form ({before, after, unit, triad: {...}, exchange: {...}}: harness/nodes.py pulse_of). The
    first rank on each machine reads them (benchmarks/node/environment.py first_on_kernel) while the others
    wait at a barrier, for the training runs and for the collective sweeps on one cpu host."""

    def __init__(self, device: str, cpus: Optional[Collection[int]] = None):
        self.device = device
        self.cpus = cpus
        """The CPUs the exchange pulse may use: a rank bound to one CPU passes those it had before."""
        self.before: tuple[Optional[float], Optional[float], Optional[float]] = (None, None, None)
        self.own_before: Optional[float] = None

    def start(self) -> None:
        self.before = (pulse(self.device), pulse_triad(self.device), pulse_exchange(self.device, self.cpus))

    def own_start(self) -> None:
        """Every rank, all at once (between barriers): the fp32 pulse of its own device, as training loads them
        all (a GPU of eight that runs slower, a vCPU its host runs slower only while the others are busy).
        own_window() after; harness/nodes.py keeps the slowest and the fastest as load.pulse_devices."""
        self.own_before = pulse(self.device)

    def own_window(self) -> dict[str, Any]:
        return {"before": self.own_before, "after": pulse(self.device), "unit": "GFLOP/s"}

    def window(self) -> dict[str, Any]:
        return {"before": self.before[0], "after": pulse(self.device), "unit": "GFLOP/s",
                "triad": {"before": self.before[1], "after": pulse_triad(self.device), "unit": "GB/s"},
                **({"exchange": {"before": self.before[2], "after": pulse_exchange(self.device, self.cpus),
                                 "unit": "us"}} if self.device == "cpu" else {})}


def _one_thread(device: str, rate: Callable[[], float]) -> Optional[float]:
    """rate() rounded, on one thread on cpu (per core); None when it fails: a pulse never fails a run."""
    try:
        import torch

        threads = torch.get_num_threads()
        if device == "cpu":
            torch.set_num_threads(1)
        try:
            return round(rate(), 3)
        finally:
            torch.set_num_threads(threads)
    except Exception:  # noqa: BLE001 - unmeasured, never a failed run
        return None


def host_dispatch() -> dict[str, Any]:
    """Million torch ops a second the host issues on one thread (torch.add of two 8-element CPU tensors:
    the Python call and ATen's dispatch, no arithmetic to speak of), best of REPEATS: on a GPU node the
    host's share of every kernel launch and of ZeRO-3's per-module hooks. The 2-core EPYC VM read
    0.86-0.87 (1.15-1.16 us an op) over five rounds."""
    import torch

    a, b = torch.ones(8), torch.ones(8)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        def batch() -> None:
            for _ in range(DISPATCH_OPS):
                torch.add(a, b)
        batch()
        rates = []
        for _ in range(REPEATS):
            calls, dt = _timed(batch, lambda: None, DISPATCH_S)
            rates.append(DISPATCH_OPS * calls / dt / 1e6)
    finally:
        torch.set_num_threads(threads)
    return _figure(rates, "Mop/s", op="torch.add, 8-element CPU tensors, 1 thread")


def triad(device: str) -> dict[str, Any]:
    """GB/s of a = b + s*c over three float32 arrays (STREAM's triad: 3 x bytes moved per pass)."""
    rates = _triad_rates(device, TRIAD_BYTES[device] // 4, REPEATS, REPEAT_S[device])
    return _figure(rates, "GB/s", array_mib=TRIAD_BYTES[device] // 2**20)


def _triad_rates(device: str, count: int, repeats: int, min_s: float) -> list[float]:
    """GB/s of the triad over three float32 arrays of `count` elements, one figure per timed repeat."""
    import torch

    dev = torch.device("cuda" if device == "cuda" else "cpu")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    a, b, c = (torch.full((count,), 1.0 + i, device=dev) for i in range(3))   # filled, not drawn: 0.1 s less
    torch.add(b, c, alpha=3.0, out=a)
    rates = []
    for _ in range(repeats):
        calls, dt = _timed(lambda: torch.add(b, c, alpha=3.0, out=a), sync, min_s)
        rates.append(3.0 * 4 * count * calls / dt / 1e9)
    return rates


def cpu_flags(cpuinfo: Optional[str] = None) -> set[str]:
    text = read_stripped(Path("/proc/cpuinfo")) if cpuinfo is None else cpuinfo
    m = re.search(r"^(flags|Features)\s*:\s*(.*)$", text or "", re.M)
    return set(m.group(2).split()) if m else set()


def isa_class(capability: Optional[str], flags: dict[str, bool]) -> str:
    """What picks the CPU kernels, as one comparable string: torch's capability and the bf16/AMX
    units ('AVX2', 'AVX512 +avx512_bf16 +amx_bf16', 'DEFAULT')."""
    extras = [f"+{f}" for f in ("avx512_bf16", "amx_bf16") if flags.get(f)]
    return " ".join([capability or "unknown", *extras])


def isa() -> dict[str, Any]:
    import torch

    flags = cpu_flags()
    has = {f: f in flags for f in ISA_FLAGS}
    capability = torch.backends.cpu.get_cpu_capability()
    return {"torch_cpu_capability": capability, "flags": has, "class": isa_class(capability, has),
            "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY"),
            "governor": read_stripped(Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"))}


def measure(device: str) -> dict[str, Any]:
    """The whole probe of this node (seconds): see the module's docstring."""
    import torch

    start = _start()
    t0 = start[0]
    deadline = t0 + QUIET_WAIT_S.get(device, 0.0)
    out: dict[str, Any] = {"schema_version": PROBE_SCHEMA, "host": socket.gethostname(),
                           "boot_id": read_stripped(Path("/proc/sys/kernel/random/boot_id")), "device": device}
    threads = torch.get_num_threads()
    if device == "cuda":
        out["gpu_name"] = torch.cuda.get_device_name(0)
        torch.backends.cuda.matmul.allow_tf32 = False
        out["matmul"] = {d: matmul(d, device) for d in DTYPES[device]}
        out["gpus"] = query()
    else:
        out["isa"] = isa()
        torch.set_num_threads(1)
        try:
            out["matmul"] = {d: quiet(lambda d=d: matmul(d, device), deadline) for d in DTYPES[device]}
        finally:
            torch.set_num_threads(threads)
        out["matmul_threads"] = 1
    out["usable_cpus"] = usable_cpus() or os.cpu_count()
    if device == "cpu":   # one core's bandwidth: a neighbour on another core leaves it be (all cores: it does not)
        torch.set_num_threads(1)
    try:
        out["triad"] = quiet(lambda: triad(device), deadline) if device == "cpu" else triad(device)
    finally:
        torch.set_num_threads(threads)
    out["triad_threads"] = 1 if device == "cpu" else None
    out["host_dispatch"] = quiet(host_dispatch, deadline) if device == "cpu" else host_dispatch()
    out["other_cpus"], out["steal_cpus"] = _taken(start)
    out["took_s"] = round(time.monotonic() - t0, 2)
    return out


def probe_path(out_dir: Path, host: Optional[str] = None) -> Path:
    return out_dir / PROBE_DIR / f"{host or socket.gethostname()}.json"


def _read(path: Path) -> Optional[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("schema_version") else None


def _alone_on_machine(out_dir: Path, boot: Optional[str], wait_s: float) -> tuple[Optional[int], float]:
    """(fd holding the lock, seconds waited): the lock of this machine (its boot id) in the bench's
    probe folder, so that only one node of a machine probes at a time; (None, waited) when it cannot
    be had within wait_s or the file system refuses locks (the probe is then measured regardless)."""
    t0 = time.monotonic()
    if not boot:   # no boot id to tell machines apart: never make a cluster's nodes wait on each other
        return None, 0.0
    try:
        path = out_dir / PROBE_DIR / f".machine-{boot}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return None, 0.0
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd, time.monotonic() - t0
        except BlockingIOError:
            if time.monotonic() - t0 >= wait_s:
                break
            time.sleep(0.05)
        except OSError:
            break
    os.close(fd)
    return None, time.monotonic() - t0


def node_probe(out_dir: Path, device: str, first_on_node: bool, wait_s: float = WAIT_S) -> Optional[dict[str, Any]]:
    """This node's probe for the bench whose output folder is out_dir: measured by the first rank
    on the node if no run of this bench measured it yet (same host, same boot), else read; the
    other ranks wait for it. A probe that fails is {"error": ...}: the run goes on, unmeasured."""
    path = probe_path(out_dir)
    boot = read_stripped(Path("/proc/sys/kernel/random/boot_id"))
    found = _read(path)
    if found and found.get("boot_id") == boot:
        return found
    if not first_on_node:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            time.sleep(0.1)
            found = _read(path)
            if found and found.get("boot_id") == boot:
                return found
        return None
    fd, waited = _alone_on_machine(out_dir, boot, wait_s / 2)   # the node's other ranks wait wait_s in all
    try:
        result = measure(device)
    except Exception as exc:  # noqa: BLE001 - a probe that fails is recorded, never a failed run
        result = {"schema_version": PROBE_SCHEMA, "host": socket.gethostname(), "boot_id": boot,
                  "device": device, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        if fd is not None:
            os.close(fd)   # releases the lock: the machine's next node probes
    result["waited_for_machine_s"] = round(waited, 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result, indent=1), encoding="utf-8")
    os.replace(tmp, path)
    return result


if __name__ == "__main__":   # python -m benchmarks.node.probe [cpu|cuda]: this node's probe, printed
    import sys

    print(json.dumps(measure(sys.argv[1] if len(sys.argv) > 1 else "cpu"), indent=1))
