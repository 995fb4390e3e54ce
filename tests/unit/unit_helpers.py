"""Paths and small helpers shared by the unit tests (imported by name: tests/unit is on sys.path)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
_VENV = REPO_ROOT / ".venv" / "bin" / "python"
VENV_PYTHON = str(_VENV) if _VENV.exists() else sys.executable

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO_ROOT / ".cache" / "torch_extensions"))


def options(group: str) -> list[str]:
    """The options of a config group as a user sees them: the YAML files in conf/<group>/."""
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def node(host: str, rate_gbps: float = 1.0, *, load: float = 0.5, cpu_model: str = "AMD EPYC 7763 64-Core Processor",
         logical_cpus: int = 2, mem_total_gib: float = 7.75, gpus: list | None = None) -> dict:
    """One node of environment.nodes as a rank reads it (benchmarks/machine.py): a 2-core box whose
    eth0 is a veth shaped to `rate_gbps`, beside a container's bridge port and an unshaped bridge."""
    nic = {"kind": "veth", "state": "up", "mtu": 1500, "master": None, "speed_gbps": 10.0, "qdisc": "tbf"}
    return {"host": host, "machine": {
        "cpu": {"model": cpu_model, "logical_cpus": logical_cpus, "usable_cpus": logical_cpus,
                "mem_total_gib": mem_total_gib, "load_avg_1_5_15": [load, load, load]},
        "gpus": gpus, "gpu_topology": None,
        "nics": [{**nic, "name": "eth0", "shaping_gbps": rate_gbps, "rate_gbps": rate_gbps},
                 {**nic, "name": "vethc0ffee", "master": "docker0", "qdisc": "noqueue", "shaping_gbps": None,
                  "rate_gbps": 10.0},
                 {**nic, "name": "docker0", "kind": "bridge", "speed_gbps": None, "qdisc": "noqueue",
                  "shaping_gbps": None, "rate_gbps": None}]}}
