"""A record with what varies from run to run masked: the golden form of a bench run's records.

Two runs of the same configuration on the same code give the same golden form, field for field
(timings, memory peaks, load, hosts and times are masked to their type; every key must still be
there). A refactor that changes what a record holds changes its golden form:
tests/integration/test_golden_records.py compares the default suite's records with the form kept
in tests/data/golden/default_suite/ (rewrite it with `python -m tests.golden_records OUT_DIR`
only for a change of a record that is meant).
"""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parent / "data" / "golden" / "default_suite"

# a key that names a time, a rate, a bandwidth, a share of time or a memory peak: its floats vary
VARYING_KEY = re.compile(r"(_s|_us|_gbps|_pct|_gib|_per_s|_per_device)$")
VARYING_TOP = {"created_utc", "wall_s"}
# counts that vary from run to run: how many of a profiled step's calls a rank came last to (its `arrivals`)
VARYING_COUNT = {"last_calls"}
# fields named like timings that a configuration fixes (the platform's peak TFLOP/s)
FIXED_TOP = {"flops"}
# what the environment holds that is the same for one configuration on any machine
ENV_KEPT = {"settings", "world_size", "num_nodes", "num_ranks", "deepspeed_json"}
ENV_VARS_KEPT = {"CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"}
# optional packages (contract/fingerprint.py STACK_PACKAGES): a version in one venv, None in another
ENV_OPTIONAL = {"triton", "liger_kernel", "torchao"}
# floats that are not masked (losses) agree to this: the ranks compute in fp32, and another CPU (another
# vector width: torch picks its kernels by it) sums a softmax in another order. A distillation's KL, a
# small difference of O(1) terms, then moves by ~1e-7 absolute: 0.0255530 against 0.0255531 (3e-6
# relative) on a 2-core AVX2-only EPYC against the golden form written on another box, same code.
FLOAT_TOLERANCE = {"rel_tol": 1e-6, "abs_tol": 1e-6}
# overrides that say where a run wrote (or what its bench did after it), not what it ran
PLACE_OVERRIDES = ("out=", "history=", "confirm_regressions=")   # the tests' bench runs none again (conftest.py)
PLACE_CONFIG = {"out", "history"}


def _mask(value: Any) -> str:
    return f"<{type(value).__name__}>"


def _walk(value: Any, varying: bool = False) -> Any:
    if isinstance(value, dict):
        return {k: _mask(v) if k in VARYING_COUNT else _walk(v, varying or bool(VARYING_KEY.search(k)))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v, varying) for v in value]
    if varying and isinstance(value, float):
        return _mask(value)
    return value


def _environment(env: dict) -> dict:
    out = {}
    for key, value in env.items():
        if key in ENV_KEPT:
            out[key] = value
        elif key == "env":
            out[key] = {k: (v if k in ENV_VARS_KEPT else _mask(v)) for k, v in sorted(value.items())
                        if k in ENV_VARS_KEPT}
        elif key in ENV_OPTIONAL:
            out[key] = "<version or None>"
        elif isinstance(value, dict):
            out[key] = {k: _mask(v) for k, v in value.items()}
        else:
            out[key] = _mask(value)
    return out


def golden(record: dict) -> dict:
    """The golden form of one record."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        if key in VARYING_TOP:
            out[key] = _mask(value)
        elif key == "config":
            out[key] = {k: (_mask(v) if k in PLACE_CONFIG else v) for k, v in value.items()}
        elif key == "overrides":
            out[key] = [o for o in value if not o.startswith(PLACE_OVERRIDES)]
        elif key == "environment":
            out[key] = _environment(value)
        elif key in FIXED_TOP:
            out[key] = value
        else:
            out[key] = _walk(value)
    return out


def differences(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Where two golden forms differ: keys missing or added, values unequal (floats to FLOAT_TOLERANCE)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = []
        for k in sorted(set(expected) | set(actual), key=str):
            if k not in actual:
                out.append(f"{path}.{k}: missing")
            elif k not in expected:
                out.append(f"{path}.{k}: not in the golden record")
            else:
                out += differences(expected[k], actual[k], f"{path}.{k}")
        return out
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return [f"{path}: {len(actual)} items, the golden record has {len(expected)}"]
        return [d for i, (e, a) in enumerate(zip(expected, actual)) for d in differences(e, a, f"{path}[{i}]")]
    if isinstance(expected, float) and isinstance(actual, (int, float)) and not isinstance(actual, bool):
        return [] if math.isclose(expected, actual, **FLOAT_TOLERANCE) else [f"{path}: {actual!r} != {expected!r}"]
    return [] if expected == actual and type(expected) is type(actual) else [f"{path}: {actual!r} != {expected!r}"]


def records(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.name != "suite.json"}


def write(out: Path) -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for old in GOLDEN.glob("*.json"):
        old.unlink()
    for name, record in records(out).items():
        (GOLDEN / f"{name}.json").write_text(json.dumps(golden(record), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    write(Path(sys.argv[1]))
