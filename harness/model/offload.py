"""ZeRO-3 offload to the host, as DeepSpeed 0.19.8 places it (runtime/zero/stage3.py, read there): which
of the optimizer's sub-groups stay on the GPU, and the host memory the offloaded states take. The
memory model (harness/model/memory.py) adds the GPU side to its estimate and this host side beside it.

What DeepSpeed does with `zero_optimization.offload_optimizer: {device: cpu, ratio: r}` under ZeRO-3:
- the rank's parameter partition is cut into sub-groups in parameter order, each closed once it
  reaches `sub_group_size` elements (default 1e9; `_create_fp16_sub_groups`);
- sub-group i of n goes to the host when i >= int((1 - r) n) (`_create_fp32_partitions`): its fp32
  master (4 B an element) and Adam's m and v (8 B, DeepSpeedCPUAdam's, made at the first step) in
  ordinary host memory, its fp32 gradient (4 B) pinned; the others keep the same 16 B on the GPU and
  are stepped by a torch AdamW there (the "backup" optimizer);
- the gradient partition the backward accumulates into (`grad_partitions_flat_buffer`, the
  accumulation dtype: 2 or 4 B an element) is one pinned host buffer, whatever r;
- `offload_param: {device: cpu}` keeps the bf16 parameter partitions in pinned host memory as well
  (one flat buffer per sub-group; each parameter's own partition was pinned first and its block
  stays in the host allocator's cache), and, the teacher's engine taking the student's ZeRO section
  (benchmarks/training/distill.py), the teacher's partitions too.
Pinned memory comes from PyTorch's CachingHostAllocator, which rounds every block up to a power of two
(ATen/core/CachingHostAllocator.h, `PowerOf2Ceil`, for any size by default): a 16.06 GB bf16 gradient
buffer holds 16 GiB = 17.18 GB, a 4.4 GB sub-group's gradient 8 GiB.
ZeRO-1/2's optimizer offload (stage_1_and_2.py) and NVMe are not modelled: the estimate says so.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

GIB = 2**30
DS_SUB_GROUP = 1_000_000_000
"""zero_optimization.sub_group_size's default (runtime/zero/config.py)."""
HOST_RUNTIME_GIB = 4.0
"""Host memory of one CUDA rank besides what it offloads: the interpreter with torch (its CUDA
libraries resident), DeepSpeed, transformers, the CPU Adam op. An ESTIMATE, to measure on a node."""
HOST_RESERVE_FRACTION = 0.10
"""Share of the host memory available at launch kept free: the kernel's growth, the page cache the
run's reads need, the controller process. A choice, not a fit: host memory that runs out is no
recorded OOM but the kernel's OOM killer (pinned pages cannot be swapped)."""
GPU_NODE_HOST_GIB = 125.87
"""MemTotal of the one-GPU H100/H200 nodes as their records' fingerprint read it (machine.cpu.mem_total_gib,
reference_results/sources/gpu-runs/2026-11-26-h200): the host the 8B suite is sized for."""


@dataclass(frozen=True)
class Offload:
    """ZeRO-3 offload as the DeepSpeed JSON sets it (zero_optimization.offload_optimizer / offload_param)."""
    optimizer: str = "none"
    """offload_optimizer.device: none, cpu or nvme."""
    param: str = "none"
    """offload_param.device: none, cpu or nvme."""
    ratio: float = 1.0
    """offload_optimizer.ratio: the share of the optimizer's sub-groups on the host (ZeRO-3 only)."""
    pin_memory: bool = True
    sub_group_size: int = DS_SUB_GROUP

    @property
    def active(self) -> bool:
        return self.optimizer != "none" or self.param != "none"


def offload_settings(ds: Optional[dict[str, Any]]) -> Offload:
    """The offload settings of a DeepSpeed JSON (the generated one merged with the user's)."""
    zero = (ds or {}).get("zero_optimization") or {}
    opt, par = zero.get("offload_optimizer") or {}, zero.get("offload_param") or {}
    return Offload(optimizer=str(opt.get("device") or "none"), param=str(par.get("device") or "none"),
                   ratio=float(opt.get("ratio", 1.0)),
                   pin_memory=bool(opt.get("pin_memory", par.get("pin_memory", True))),
                   sub_group_size=int(zero.get("sub_group_size") or DS_SUB_GROUP))


def read_offload(path: Optional[str]) -> Offload:
    """The offload settings of the user's DeepSpeed JSON (`deepspeed_config=`; checked to exist before
    this is called): the one input of the memory model that lives outside the config tree."""
    if not path:
        return Offload()
    try:
        return offload_settings(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, ValueError, AttributeError):
        return Offload()        # plan.load_user_deepspeed refuses such a file, naming it


def pow2(n: float) -> float:
    """Bytes a pinned block of n bytes takes: the next power of two (CachingHostAllocator)."""
    return float(2 ** math.ceil(math.log2(n))) if n > 0 else 0.0


def pinned(n: float, pin: bool) -> float:
    return pow2(n) if pin else n


def sub_groups(partitions: list[int], size: int) -> list[int]:
    """Elements of each optimizer sub-group: parameter partitions in order, a group closed once it
    reaches `size` (stage3.py _create_fp16_sub_groups)."""
    groups, current = [], 0
    for i, n in enumerate(partitions):
        current += n
        if current >= size or i == len(partitions) - 1:
            groups.append(current)
            current = 0
    return groups


def on_host(num_groups: int, ratio: float) -> list[bool]:
    """Which sub-groups DeepSpeed puts on the host: i >= int((1 - ratio) n)."""
    first = int((1 - ratio) * num_groups)
    return [i >= first for i in range(num_groups)]


@dataclass
class OffloadSplit:
    """Bytes per rank of ZeRO-3's model states when something is offloaded: on the GPU (replacing the
    estimate's terms) and on the host."""
    gpu_params: float
    gpu_grads: float
    gpu_optimizer: float
    gpu_step: float
    host: dict[str, float] = field(default_factory=dict)
    """What the host holds for the rank, by item (runtime included)."""
    formulas: dict[str, str] = field(default_factory=dict)
    num_groups: int = 0
    num_host_groups: int = 0
    elements: int = 0
    """The rank's partition of the parameters (Psi/N)."""
    host_elements: int = 0
    """Of those, the elements of the sub-groups the host steps (DeepSpeedCPUAdam)."""

    @property
    def host_bytes(self) -> float:
        return sum(self.host.values())


def zero3_split(partitions: list[int], persistent: int, accum_bytes: int, param_bytes: int, o: Offload,
                teacher_partitions: Optional[list[tuple[int, int]]] = None) -> OffloadSplit:
    """ZeRO-3 with offload (module docstring). `partitions`: the rank's elements of each parameter in
    order; `persistent`: elements of parameters kept whole (below the persistence threshold);
    `teacher_partitions`: (elements, bytes per element) of each teacher parameter on the rank, when
    the teacher is a ZeRO-3 engine (it follows offload_param)."""
    psi = sum(partitions)
    groups = sub_groups(partitions, o.sub_group_size)
    host_side = on_host(len(groups), o.ratio) if o.optimizer == "cpu" else [False] * len(groups)
    gpu_groups = [g for g, h in zip(groups, host_side) if not h]
    host_groups = [g for g, h in zip(groups, host_side) if h]
    host: dict[str, float] = {"runtime": HOST_RUNTIME_GIB * GIB}
    f: dict[str, str] = {"runtime": f"{HOST_RUNTIME_GIB:g} GiB (interpreter, torch with CUDA, DeepSpeed; estimate)"}
    pin = " (pinned: each block rounded up to a power of two)" if o.pin_memory else ""
    groups_f = (f"{len(host_groups)} of {len(groups)} sub-groups of >= {o.sub_group_size:.3g} elements on the host "
                f"(ratio {o.ratio:g}: i >= int((1 - ratio) n))")
    if o.optimizer == "cpu":
        gpu_grads, gpu_optimizer = 4.0 * sum(gpu_groups), 12.0 * sum(gpu_groups)
        gpu_step = 4.0 * max(gpu_groups, default=0)
        host["gradient accumulation buffer"] = pinned(accum_bytes * psi, o.pin_memory)
        host["fp32 gradients of host sub-groups"] = sum(pinned(4.0 * g, o.pin_memory) for g in host_groups)
        if gpu_groups and o.pin_memory:   # each GPU sub-group's gradient is pinned first, then moved: one block stays cached
            host["fp32 gradients of host sub-groups"] += pow2(4.0 * max(gpu_groups))
        host["fp32 master + Adam m, v of host sub-groups"] = 12.0 * sum(host_groups)
        f.update({"gradient accumulation buffer": f"{accum_bytes} Psi/N{pin}",
                  "fp32 gradients of host sub-groups": f"4 B x each host sub-group{pin}",
                  "fp32 master + Adam m, v of host sub-groups": f"12 B x host sub-groups; {groups_f}",
                  "gpu": (f"GPU: 16 B x GPU sub-groups (fp32 master, Adam m, v, fp32 gradient: {len(gpu_groups)} "
                          f"of {len(groups)}), step: 4 B x the largest GPU sub-group (torch AdamW's foreach temporary, sqrt(v))")})
    else:
        gpu_grads, gpu_optimizer, gpu_step = float(accum_bytes * psi), 12.0 * psi, 4.0 * psi
    gpu_params = float(param_bytes * (psi + persistent))
    if o.param == "cpu":
        gpu_params = float(param_bytes * persistent)
        host["bf16 parameter partitions"] = (sum(pinned(param_bytes * g, o.pin_memory) for g in groups)
                                             + (sum(pinned(param_bytes * n, True) for n in partitions) if o.pin_memory else 0))
        f["bf16 parameter partitions"] = ("2 B x each sub-group's flat buffer" + pin + (
            " + each parameter's first pinned partition, left in the allocator's cache (an upper bound)" if o.pin_memory else ""))
        if teacher_partitions:
            host["teacher parameter partitions"] = sum(pinned(b * n, o.pin_memory) for n, b in teacher_partitions)
            f["teacher parameter partitions"] = "the teacher's ZeRO-3 engine takes the student's offload_param" + pin
    return OffloadSplit(gpu_params, gpu_grads, gpu_optimizer, gpu_step, host, f, len(groups), len(host_groups),
                        psi, sum(host_groups))


def host_capacity_gib(available_gib: float) -> float:
    """Host memory a node's ranks may take: what is available at launch less HOST_RESERVE_FRACTION."""
    return available_gib * (1 - HOST_RESERVE_FRACTION)


def read_meminfo(path: Path = Path("/proc/meminfo")) -> Optional[dict[str, float]]:
    """MemTotal and MemAvailable of this host in GiB (None where /proc/meminfo cannot be read)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    out = {}
    for line in lines:
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable") and rest.split():
            out[key] = int(rest.split()[0]) * 1024 / GIB
    return out if "MemTotal" in out else None
