"""The computation efficiency of one platform from training records of ANOTHER platform that ran on
the same machine (`python -m harness model --compute-records`): e.g. the emulated cluster's nodes
share one box, so the single-node `cpu` platform's profile-mode compute on that box calibrates the
`cpu-cluster` platform's computation, while its own collective sweep gives the network.

What must match (else a record is left out, with the reason counted in the source):
- the machine (Machine): device kind, device model (environment.gpu_model on GPUs;
  environment.cpu_model, else machine.cpu.model, on CPU) and, on CPU, the usable cores, against
  the one machine the records of the predicted platform itself state (platform_machine);
- the number of ranks (they share the machine's cores or its GPUs), the workload, sequence length
  and precision; status ok; profile micro-steps (profile mode times every collective on its own, so
  a micro-step's compute_s is computation only, whatever the network was: throughput-only records
  would need the OTHER platform's communication subtracted, which this path does not model).
The efficiency is the FLOPs executed over the PREDICTED platform's declared peak, i.e. the achieved
FLOP/s carries over, not the other platform's declared peak. Per micro-batch size the median, of
the predicted stage's records where there are any (on CPU; calibration_inputs.efficiency_by_mb). Pure.
"""
from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any, Optional

from ..config.choices import Device
from ..config.schema import BenchConfig
from ..errors import HarnessError
from ..record import ResultRecord
from .calibration_inputs import (above_peak, efficiency_by_mb, num_ranks, profile_efficiency, same_place,
                                 stage_and_micro_batch, workload_matches)
from .calibration_types import BusbwCurve, Calibration
from .stack import stack_words


@dataclass(frozen=True)
class Machine:
    """What a record's computation ran on: the device kind, the device's model (on GPUs
    environment.gpu_model, on CPU environment.cpu_model or machine.cpu.model) and, on CPU, the
    cores its ranks shared (machine.cpu.usable_cpus: two ranks on two cores compute at half the
    speed of two ranks on four)."""
    device: str
    model: str
    usable_cpus: Optional[int] = None

    def same_as(self, other: "Machine") -> bool:
        """Same device kind and model, and the same cores where both records state them."""
        cores = None in (self.usable_cpus, other.usable_cpus) or self.usable_cpus == other.usable_cpus
        return self.device == other.device and self.model == other.model and cores

    def __str__(self) -> str:
        cores = f", {self.usable_cpus} usable cores" if self.usable_cpus else ""
        return f"{self.device}: {self.model}{cores}"


def _node_machine(device: str, machine: dict[str, Any], gpu_model: Optional[str]) -> Optional[Machine]:
    cpu = (machine or {}).get("cpu") or {}
    gpus = [g.get("name") for g in (machine or {}).get("gpus") or [] if isinstance(g, dict) and g.get("name")]
    model = (gpu_model or (gpus[0] if gpus else None)) if device == "cuda" else cpu.get("model")
    return Machine(device, str(model), cpu.get("usable_cpus") if device == "cpu" else None) if model else None


def record_machine(record: ResultRecord) -> Optional[Machine]:
    """The Machine a record states, None when it states no device model. A record with every
    node's machine (environment.nodes) states one machine only when all its nodes are alike (else
    the models joined with ' | ', which matches no single machine)."""
    env = record.environment
    device = (record.config.get("platform") or {}).get("device")
    device = device or ("cuda" if env.get("gpu_model") else "cpu")
    seen = {m for m in (_node_machine(device, n.get("machine") or {}, None) for n in env.get("nodes") or []
                        if isinstance(n, dict)) if m is not None}
    if len(seen) > 1:
        return Machine(device, " | ".join(sorted(m.model for m in seen)), None)
    if seen:
        return seen.pop()
    found = _node_machine(device, env.get("machine") or {}, env.get("gpu_model"))
    if found is None and env.get("cpu_model") and device == "cpu":
        return Machine(device, str(env["cpu_model"]), None)
    return found


def platform_machine(records: list[ResultRecord], cfg: BenchConfig) -> Machine:
    """The one machine the records of cfg's platform and world size (any kind) ran on."""
    machines = {m for m in (record_machine(r) for r in records if same_place(r, cfg)) if m is not None}
    where = f"platform {cfg.platform.name} with {cfg.platform.world_size} ranks"
    if not machines:
        raise HarnessError(f"--compute-records: no record of {where} states its machine (environment.cpu_model / "
                           "gpu_model), so nothing shows that the compute records ran on the same one: give --records "
                           f"with {cfg.platform.name}'s own records (e.g. its collective sweep)")
    if len(machines) > 1:
        raise HarnessError(f"--compute-records: the records of {where} ran on different machines "
                           f"({'; '.join(sorted(map(str, machines)))}): give the records of one")
    return machines.pop()


def _not_comparable(rec: ResultRecord, cfg: BenchConfig, machine: Machine) -> Optional[str]:
    """Why a compute record cannot calibrate cfg's computation (None: it can)."""
    found = record_machine(rec)
    if rec.benchmark != cfg.workload.name or not workload_matches(rec.config, cfg):
        return f"not {cfg.workload.name} at seq {cfg.workload.seq_len} {cfg.workload.precision.value} ({stack_words(cfg.workload)})"
    if num_ranks(rec) != cfg.platform.world_size:
        return f"not {cfg.platform.world_size} ranks"
    if found is None or not found.same_as(machine):
        return f"another machine ({found or 'not stated'})"
    return None


def calibrate_on_machine(compute_records: list[ResultRecord], records: list[ResultRecord], cfg: BenchConfig,
                         curves: dict[str, BusbwCurve]) -> Calibration:
    """The efficiency from the profile-mode compute of training records of any platform that ran on
    the machine of cfg's platform (platform_machine of `records`), same world size and workload; the
    busbw curves given (cfg's own platform's). Ok training records that do not qualify are counted
    in the source with the reason; none qualifying is an error."""
    machine = platform_machine(records, cfg)
    found: list[tuple[int, int, float]] = []
    used: list[ResultRecord] = []
    left_out: Counter[str] = Counter()
    for rec in compute_records:
        if rec.kind != "training" or rec.status != "ok":
            continue
        why, eff = _not_comparable(rec, cfg, machine), None
        if why is None:
            try:
                eff = profile_efficiency(rec, cfg)
                key = stage_and_micro_batch(rec)
            except (KeyError, TypeError, ValueError):  # a record without the fields a training record has
                eff = None
            why = None if eff is not None else "no profile-mode compute"
        if why is not None:
            left_out[why] += 1
            continue
        found.append((*key, eff))
        used.append(rec)
    skipped = "; ".join(f"{n} {why}" for why, n in sorted(left_out.items()))
    if not found:
        raise HarnessError(f"--compute-records: no ok {cfg.workload.name} training record with profile micro-steps, "
                           f"{cfg.platform.world_size} ranks, on {machine} (the machine of {cfg.platform.name}'s "
                           f"records)" + (f"; left out: {skipped}" if skipped else ": none given"))
    prefer_stage = cfg.platform.device != Device.cuda
    by_mb, where = efficiency_by_mb(found, cfg.zero.stage, prefer_stage)
    if prefer_stage and any(stage == cfg.zero.stage for stage, _, _ in found):   # what by_mb took
        used = [r for r, (stage, _, _) in zip(used, found) if stage == cfg.zero.stage]
    platforms = ", ".join(sorted({r.platform for r in used}))
    names = sorted({r.run_id for r in used})
    ids = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    source = (f"measured on platform {platforms}, the machine of {cfg.platform.name} ({machine}): {where} training "
              f"runs, profile-mode compute, FLOPs over {cfg.platform.name}'s declared peak ({ids})"
              + (f"; left out: {skipped}" if skipped else ""))
    return Calibration(by_mb, statistics.median(by_mb.values()), source, curves, above_peak(by_mb, "compute records"))
