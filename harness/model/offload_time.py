"""The time ZeRO-3's optimizer offload adds to a GPU's optimizer step, mechanism by mechanism, as
DeepSpeed 0.19.8 does it (runtime/zero/stage3.py, read there; offload.py places the states):

- gradients, during backward, on DeepSpeed's reduce stream (partition_grads): each parameter's
  gradient partition goes into the pinned host accumulation buffer (`grad_partitions_flat_buffer` on
  the offload device; accumulation dtype, a B an element). At the first micro-step it is copied down,
  then brought back up as the GPU copy the boundary works on; at every later one the buffer comes up,
  takes the new partition and goes back down: 2 a Psi a micro-step. At the boundary (the engine's
  managed accumulation, as the suite steps it) the host sub-groups' fp32 gradients go down once more
  (4 B an element). These copies overlap the backward computation: only what outlasts it is exposed.
- the step, after backward, sub-group by sub-group, nothing overlapped: DeepSpeedCPUAdam over the
  host sub-groups (reads parameter, gradient, m, v, writes parameter, m, v: 28 B an element), then
  each updated fp32 sub-group is written into its bf16 GPU partition: torch casts it on the host
  into a fresh tensor (read 4 B, write 2 B, the fresh pages zeroed: 8 B an element) and copies that
  from pageable memory.
- the GPU sub-groups' torch AdamW is GPU work like any non-offloaded step: not counted here.
Host work runs at the rank's threads (benchmarks/training/train.py rank_threads: the rank's share of
the node's cores), each at a measured per-thread rate, capped by the host memory bandwidth a rank
gets. The rates and bandwidths are params.py's `offload_*` (tests/gpu/offload_rates.py measures them).
offload_param (parameters fetched from the host every forward and backward) is not timed: a note says so.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..config.choices import Device
from ..config.schema import BenchConfig
from .memory import accum_bytes, offload_split
from .offload import read_offload
from .params import PARAMS, ModelParams

ADAM_BYTES = 28
"""Host bytes DeepSpeedCPUAdam moves per element: reads fp32 parameter, gradient, m, v; writes parameter, m, v."""
CAST_BYTES = 8
"""Host bytes of the fp32 -> bf16 cast into a fresh tensor per element: read 4, write 2, the new page's zeroing 2."""


@dataclass
class OffloadTime:
    """Seconds per optimizer step of one rank (module docstring)."""
    step_s: float
    """After backward, not overlapped: host Adam + the cast + the parameters' copy to the GPU."""
    grads_s: float
    """The gradients' copies over PCIe during the step's backward passes (before overlap)."""
    exposed_grads_s: float
    """Of grads_s, what outlasts the backward computation of the step."""
    items: dict[str, float] = field(default_factory=dict)
    formulas: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def added_s(self) -> float:
        return self.step_s + self.exposed_grads_s


def host_rate(per_thread: float, threads: int, gbps: float, bytes_per_element: int) -> float:
    """Elements per second of host work: threads x per-thread rate, capped by the bandwidth a rank gets."""
    return min(threads * per_thread, gbps * 1e9 / bytes_per_element)


def offload_time(cfg: BenchConfig, backward_s: float, params: ModelParams = PARAMS) -> Optional[OffloadTime]:
    """What the optimizer's offload to the host adds to cfg's step on a GPU; None where nothing is
    offloaded (or on the cpu platform, whose device is the host: a measured efficiency holds it there).
    `backward_s`: the GPU's backward computation per optimizer step (all micro-steps)."""
    if cfg.platform.device != Device.cuda or cfg.zero.stage != 3 or not cfg.deepspeed_config:
        return None
    o = read_offload(cfg.deepspeed_config)
    if o.optimizer != "cpu":
        return None
    sp = offload_split(cfg, o)
    ga, a, psi, host = cfg.workload.grad_acc_steps, accum_bytes(cfg), sp.elements, sp.host_elements
    t, bw = cfg.platform.host_threads or params.offload_host_threads, params.offload_host_gbps
    adam = host / host_rate(params.offload_adam_elements_per_s, t, bw, ADAM_BYTES) if host else 0.0
    cast = host / host_rate(params.offload_cast_elements_per_s, t, bw, CAST_BYTES) if host else 0.0
    up = 2.0 * host / (params.pcie_pageable_gbps * 1e9)
    grads = (2.0 * a * psi * ga + 4.0 * host) / (params.pcie_pinned_gbps * 1e9)
    items = {"host Adam": adam, "cast to bf16": cast, "parameters to the GPU": up, "gradients over PCIe": grads}
    formulas = {
        "host Adam": (f"{host:.4g} host elements / min({t} threads x {params.offload_adam_elements_per_s:.3g}/s, "
                      f"{bw:g} GB/s / {ADAM_BYTES} B)"),
        "cast to bf16": (f"{host:.4g} / min({t} threads x {params.offload_cast_elements_per_s:.3g}/s, "
                         f"{bw:g} GB/s / {CAST_BYTES} B)"),
        "parameters to the GPU": f"2 B x {host:.4g} / {params.pcie_pageable_gbps:g} GB/s (pageable)",
        "gradients over PCIe": (f"(2 x {a} B x {psi:.4g} x ga {ga} + 4 B x {host:.4g}) / "
                                f"{params.pcie_pinned_gbps:g} GB/s (pinned), overlapping backward ({backward_s:.4g} s)")}
    notes = [f"optimizer offload: {sp.num_host_groups} of {sp.num_groups} sub-groups ({host:.4g} of {psi:.4g} elements) "
             f"stepped on the host at {t} threads"]
    if o.param != "none":
        notes.append("offload_param's fetches from the host at every forward and backward are not timed (not modelled)")
    return OffloadTime(step_s=adam + cast + up, grads_s=grads, exposed_grads_s=max(0.0, grads - backward_s),
                       items=items, formulas=formulas, notes=notes)
