"""Saved nccl-tests outputs as references: what `submit` asks of a record `import-nccl-tests` made.

A team's acceptance log (the vendor's nccl-tests run on the day the cluster was handed over) is the
figure its nightly should be held to. Such an output names no Python, suite commit or driver, and no
capability probe; it names the library (`NCCL version 2.18.5+cuda12.2`) and every rank's GPU and host
(`#  Rank  0 Group  0 Pid 1187 on h100-node-01 device 0 [0x18] NVIDIA H100 80GB HBM3`). So an imported
record is submitted on what it can say: the NCCL version, one GPU model that the platform declares, a
machine from complete Rank lines (harness/nccl_tests/importer.py machine_of_output), every row (not cut
short). Its references pair with a later sweep of the same op, ranks, type and source by size
(harness/verdict/by_size.py), whatever its -b/-e.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Optional

from contract.fingerprint import IMPORTED_REQUIRED

from ..config.choices import Device
from ..config.compose import compose
from ..config.schema import PlatformConfig
from ..errors import HarnessError
from ..hardware import hardware_mismatches
from .cross_machine import machine_of

SOURCE = "imported nccl-tests output"


def is_imported(rec: Any) -> bool:
    """A collective record made from a saved output: its config is what the output says, no sweep's groups."""
    config = rec.get("config") if isinstance(rec, dict) else None
    return (rec.get("kind") == "collective" and isinstance(config, dict)
            and "collective" not in config and "platform" not in config) if isinstance(rec, dict) else False


@functools.lru_cache(maxsize=None)
def _platform(name: str) -> Optional[PlatformConfig]:
    """The platform as the suite composes it (one composition a submission), None where it does not compose
    (an unknown one is named by submit.check_record already)."""
    try:
        return compose([f"platform={name}"]).platform
    except HarnessError:
        return None


def problems(name: str, rec: dict[str, Any]) -> list[str]:
    """Every reason this imported record cannot become a reference (the fingerprint it can have)."""
    env = rec.get("environment") if isinstance(rec.get("environment"), dict) else {}
    out = [f"{name}: environment.{key} is {env.get(key)!r}: the output does not say it ("
           + ("no 'NCCL version' line" if key == "nccl" else "no Rank lines naming the GPUs") + ")"
           for key in IMPORTED_REQUIRED if not (isinstance(env.get(key), str) and env[key].strip())]
    if machine_of(env) is None:
        out.append(f"{name}: the output does not name one GPU model on every rank (a pasted tail, mixed GPUs): a "
                   "reference is per machine, so it must name the one it was measured on")
    if rec.get("complete") is False:
        out.append(f"{name}: the output was cut short (only its complete rows were kept): a reference needs "
                   "the whole sweep")
    platform = _platform(str(rec.get("platform")))
    if platform is not None and platform.device != Device.cuda:
        out.append(f"{name}: platform {platform.name!r} declares no GPU: an nccl-tests output is a GPU platform's")
    elif platform is not None:   # the GPU's name against the declared one, as the suite's own runs are checked
        out += [f"{name}: hardware: {m}; a record of other hardware than its platform declares cannot become that "
                "platform's reference" for m in hardware_mismatches(platform, {"gpu_model": env.get("gpu_model")}) or []]
    return out


def system_of(records: list[tuple[str, dict[str, Any]]]) -> str:
    """'8 x NVIDIA H100 80GB HBM3 on h100-node-01, NCCL 2.18.5: nccl-tests outputs all_reduce_perf.txt, ...'."""
    envs = [r.get("environment") if isinstance(r.get("environment"), dict) else {} for _, r in records]
    hosts = sorted({str(h) for env in envs for h in (env.get("hosts") or [])})
    files = sorted({Path(str(r["config"].get("source_file"))).name for _, r in records})
    first = envs[0]
    where = f" on {', '.join(hosts)}" if len(hosts) <= 4 else f" on {len(hosts)} hosts"
    return (f"{machine_of(first)}{where}, NCCL {first.get('nccl')}: nccl-tests output"
            f"{'s' if len(files) > 1 else ''} {', '.join(files)}")
