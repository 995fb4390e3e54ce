"""The wheels a GPU node without network access lacks, into .whl/ (what tests/gpu/*_node.sh install
into the node's own Python with `pip install --no-index --no-deps`).

Such a node (one H100 or H200, 16 cores, no network) has its own CPython 3.12 with torch, CUDA,
triton, transformers, numpy, scipy, pandas, psutil, py-cpuinfo and the rest of a training image; it
lacks DeepSpeed and the suite's own dependencies (CARRY). They are taken from requirements-gpu.lock,
the GPU venv's and the gpu image's lock, for CPython 3.12 on Linux x86-64 (the gpu image's pip
arguments), every file checked against the lock's hashes; deepspeed and antlr4-python3-runtime,
which PyPI has as sdists only, are built into wheels here (DS_BUILD_OPS=0: pure Python; the node
builds an op when a run needs it). Beside them, under .whl/torchao016/, torchao 0.16 (hashed from
PyPI's JSON API): stack_node.sh installs it where the lock's torchao does not import with the node's
torch. MANIFEST.json lists every file with its sha256, size and origin.

    python -m containers.node_wheels [--dest .whl] [--lock requirements-gpu.lock]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

from packaging.utils import canonicalize_name

from containers.gpu_lock import GPU_LOCK_PATH
from containers.lock import REPO_ROOT, LockEntry, LockError, Pin, file_hashes, parse_lock, write_text_atomic
from containers.wheelhouse import MANIFEST, TARGETS, WheelhouseError, fetch

DEST = REPO_ROOT / ".whl"
CARRY = ("deepspeed", "hjson", "hydra-core", "omegaconf", "antlr4-python3-runtime", "mlperf-logging",
         "jsonschema", "jsonschema-specifications", "referencing", "rpds-py", "pydantic", "pydantic-core",
         "annotated-types", "typing-inspection", "typing-extensions", "sqlalchemy", "alembic", "mako",
         "optuna", "colorlog", "psycopg", "liger-kernel", "torchao")
"""What such a node's image lacks (read there, docs/gpu-check.md "A GPU node without network
access"), by the lock's names; liger-kernel and torchao for workload.kernels=liger and precision=fp8."""
FALLBACK = {"torchao016": Pin("torchao", "0.16.0")}
"""Sub-folder -> an older release a node script installs when the lock's does not import there."""


def carried(entries: Sequence[LockEntry], names: Sequence[str] = CARRY) -> list[LockEntry]:
    """The lock's entries of `names`, each hashed; a name the lock does not pin (or pins without a
    hash) stops with the names."""
    by_name = {canonicalize_name(e.name): e for e in entries}
    missing = [n for n in names if canonicalize_name(n) not in by_name]
    unhashed = [n for n in names if canonicalize_name(n) in by_name and not by_name[canonicalize_name(n)].hashes]
    problems = ([f"pins no {', '.join(missing)}"] if missing else []) + \
        ([f"pins {', '.join(unhashed)} without a hash"] if unhashed else [])
    if problems:
        raise WheelhouseError(f"the lock {'; '.join(problems)}: run `make lock`, or name the lock that has them (--lock)")
    return [by_name[canonicalize_name(n)] for n in names]


def make(lock_path: Path = GPU_LOCK_PATH, dest: Path = DEST, python: str = sys.executable,
         hashes_of: Callable[[Pin], list[str]] = file_hashes) -> Path:
    """Fill `dest` (atomically: a .partial folder renamed at the end; the old one stays until then)."""
    text = lock_path.read_text(encoding="utf-8")
    entries = carried(parse_lock(text))
    part = dest.with_name(dest.name + ".partial")
    shutil.rmtree(part, ignore_errors=True)
    files = {name: {**meta, "folder": "."} for name, meta in fetch(python, "gpu", entries, part, lock_path.name).items()}
    for folder, pin in FALLBACK.items():
        try:
            old = LockEntry(pin.name, pin.version, tuple(hashes_of(pin)))
        except LockError as e:
            raise WheelhouseError(f"{pin.name}=={pin.version} ({folder}): {e}") from None
        sub = part / folder
        for name, meta in fetch(python, "gpu", [old], sub, "PyPI's JSON API").items():
            files[f"{folder}/{name}"] = {**meta, "folder": folder}
    manifest = {"for": "a GPU node's own CPython 3.12 on Linux x86-64, pip install --no-index --no-deps",
                "lock": lock_path.name, "lock_sha256": hashlib.sha256(text.encode()).hexdigest(),
                "pins": {e.name: e.version for e in entries}, "files": files}
    write_text_atomic(part / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    part.rename(dest)
    total = sum(m["size"] for m in files.values()) / 2**20
    print(f"{dest}: {len(files)} wheels, {total:.1f} MiB, from {lock_path.name} for CPython "
          f"{TARGETS['gpu'].python} on Linux x86-64 (what a GPU node without network lacks)")
    return dest


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m containers.node_wheels", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", type=Path, default=DEST, help="where the wheels go (default: .whl/, git-ignored)")
    ap.add_argument("--lock", type=Path, default=GPU_LOCK_PATH, help="the lock (default: requirements-gpu.lock)")
    ns = ap.parse_args(argv)
    try:
        make(ns.lock, ns.dest)
    except (WheelhouseError, LockError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
