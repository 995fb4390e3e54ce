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
    """One node of environment.nodes as a rank reads it (benchmarks/node/machine.py): a 2-core box whose
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


_NEUTRAL_ENV = {"python": "3.11.7", "torch": "2.13.0", "deepspeed": "0.19.8", "transformers": "5.23.0", "cuda": None,
                "nccl": None, "driver": None, "gpu_model": None, "gpu_count": 0, "container_image": None, "env": {},
                "hosts": ["box"], "suite_commit": "abc"}
_REQUIRED_METRICS = {"training": ("samples_per_s", "tokens_per_s", "step_time_s", "peak_mem_gib", "mfu_pct"),
                     "collective": ("avg_busbw_gbps",)}


def schema_valid(record: dict) -> dict:
    """A test's sketch of a record made a whole one (schemas/record.schema.json), as the suite writes
    them and its one loader reads them: what the sketch sets is kept; what the schema requires and the
    sketch leaves out is filled with neutral values (the registry's units, a plain cpu fingerprint)."""
    import copy

    from contract.metrics import METRICS
    from harness.record import validate_record

    out = copy.deepcopy(record)
    for key, value in (("schema_version", "1.0"), ("reason", None), ("overrides", []), ("microsteps", []),
                       ("config", {}), ("environment", {}), ("metrics", {})):
        out.setdefault(key, value)
    for key, value in _NEUTRAL_ENV.items():
        out["environment"].setdefault(key, value)
    if out.get("status") == "ok":
        for name in _REQUIRED_METRICS.get(out.get("kind"), ()):
            out["metrics"].setdefault(name, {"value": 1.0})
    for name, m in out["metrics"].items():
        m.setdefault("unit", METRICS[name].unit)
    if out.get("kind") == "collective" and out.get("status") == "ok" and "rows" not in out:
        busbw = out["metrics"]["avg_busbw_gbps"]["value"]          # one row carrying the record's average
        out["rows"] = [{"size_bytes": (out["config"].get("collective") or {}).get("min_bytes", 1024),
                        "out_of_place": {"busbw_gbps": busbw}, "in_place": None}]
    for row in out.get("rows") or []:
        for key, value in (("count", row["size_bytes"] // 4), ("dtype", "float"), ("redop", "sum"), ("root", -1)):
            row.setdefault(key, value)
        for place in ("out_of_place", "in_place"):
            if row.get(place):
                row[place].setdefault("time_us", 1.0)
                row[place].setdefault("algbw_gbps", row[place]["busbw_gbps"])
                row[place].setdefault("num_wrong", 0)
    problems = validate_record(out)
    assert not problems, problems
    return out


def as_record(sketch: dict):
    """A record sketch made whole (schema_valid) and read back as the loader reads it: the typed
    ResultRecord the calibration, the model check and the tuner take."""
    from harness.record import ResultRecord

    return ResultRecord.from_dict(schema_valid(sketch))


def typed(records: list) -> list:
    """Record sketches as the typed records compare, references and the history store take. Not
    validated (a test may sketch a record the schema would refuse, e.g. one lacking a metric): the
    fields a sketch leaves out take neutral values."""
    from dataclasses import fields

    from harness.record import ResultRecord

    names = {f.name for f in fields(ResultRecord)}
    neutral = {"schema_version": "1.0", "run_id": "run", "kind": "training", "benchmark": "", "platform": "",
               "status": "ok", "reason": None, "config": {}, "overrides": [], "environment": {},
               "metrics": {}, "microsteps": []}
    return [ResultRecord(**{**neutral, **{k: v for k, v in r.items() if k in names}}) if isinstance(r, dict) else r
            for r in records]
