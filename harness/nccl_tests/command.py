"""The argv of an nccl-tests binary run, and where its binary is: what the plan needs of nccl-tests
(records of its output are harness/nccl_tests/importer.py)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Optional

from contract.collectives import BINARIES, NCCL_TYPES, REDOPS

from ..errors import HarnessError
from .infer import op_of_binary


def command(binary: str, *, min_bytes: int, max_bytes: int, step_factor: float = 2.0,
            step_bytes: int = 0, gpus_per_proc: int = 1, iters: int = 20, warmup_iters: int = 5,
            check: bool = True, dtype: str = "float32", redop: str = "sum",
            json_out: Optional[str] = None) -> list[str]:
    """The argv of one nccl-tests binary (launcher and MPI flags are the caller's). Sizes step by
    step_factor (-f) when step_bytes is 0, else by step_bytes (-i), as harness.collectives.sizes.
    json_out must end in .json (nccl-tests infers the format from the suffix and otherwise writes
    nothing) and should not exist (nccl-tests then writes FILE.0, FILE.1 ... instead)."""
    def bad(name: str, value: Any, valid: str) -> HarnessError:
        return HarnessError(f"nccl-tests {name}={value!r} is invalid; {valid}")

    if op_of_binary(binary) is None:
        raise bad("binary", binary, f"valid: a path to one of {', '.join(BINARIES.values())}")
    if min_bytes < 1:
        raise bad("min_bytes", min_bytes, "must be >= 1 byte")
    if min_bytes > max_bytes:
        raise bad("min_bytes", min_bytes, f"must not exceed max_bytes={max_bytes}")
    if step_bytes < 0:
        raise bad("step_bytes", step_bytes, "must be >= 0 (0: use step_factor)")
    if step_bytes == 0 and (step_factor != int(step_factor) or step_factor < 2):
        raise bad("step_factor", step_factor, "nccl-tests -f takes an integer >= 2")
    for name, value, low in (("gpus_per_proc", gpus_per_proc, 1), ("iters", iters, 1),
                             ("warmup_iters", warmup_iters, 0)):
        if value < low:
            raise bad(name, value, f"must be >= {low}")
    if dtype not in NCCL_TYPES:
        raise bad("dtype", dtype, f"valid: {', '.join(NCCL_TYPES)}")
    if redop not in REDOPS:
        raise bad("redop", redop, f"valid: {', '.join(REDOPS)}")
    if json_out is not None and not json_out.lower().endswith(".json"):
        raise bad("json_out", json_out, "must end in .json (nccl-tests writes JSON only to *.json)")
    step = ["-i", str(step_bytes)] if step_bytes > 0 else ["-f", str(int(step_factor))]
    argv = [binary, "-b", str(min_bytes), "-e", str(max_bytes), *step, "-g", str(gpus_per_proc),
            "-n", str(iters), "-w", str(warmup_iters), "-c", "1" if check else "0",
            "-d", NCCL_TYPES[dtype], "-o", redop]
    return argv + (["-J", json_out] if json_out is not None else [])


def binary_for(op: str, search_dir: Optional[str] = None, suffix: str = "") -> Optional[str]:
    """The nccl-tests binary of op (+ the build's NAME_SUFFIX, e.g. "_mpi"): in search_dir when
    given (no fallback), else on PATH; None if absent."""
    if op not in BINARIES:
        raise HarnessError(f"op={op!r} has no nccl-tests binary; valid: {', '.join(BINARIES)}")
    if search_dir is None:
        return shutil.which(BINARIES[op] + suffix)
    path = Path(search_dir) / (BINARIES[op] + suffix)
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None
