"""How a rank program runs: its entry point, and how it reports its own failure (one event with
status and reason, then a prompt exit)."""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import Callable, NoReturn

from . import events as ev

EXIT_OOM = 3
EXIT_ERROR = 1
OOM_MARKERS = ("OutOfMemoryError", "out of memory", "can't allocate memory",
               "CUBLAS_STATUS_ALLOC_FAILED", "MemoryError")


def classify_failure(exc: BaseException) -> str:
    """'oom' for out-of-memory on any device, otherwise 'error'."""
    text = f"{type(exc).__name__}: {exc}"
    return "oom" if any(m in text for m in OOM_MARKERS) else "error"


def fail(log: ev.EventLog, rank: int, exc: BaseException) -> NoReturn:
    """Record why this rank failed and exit at once: no atexit, no NCCL/gloo teardown that could
    hang on peers that are gone."""
    status = classify_failure(exc)
    traceback.print_exc()
    log.emit(ev.FAILURE, {"status": status, "rank": rank,
                          "reason": f"rank {rank}: {type(exc).__name__}: {str(exc).strip()[:2000]}"})
    if rank == 0:
        log.emit(ev.RUN_STOP, status="aborted")
    log.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_OOM if status == "oom" else EXIT_ERROR)


def run_rank(argv: list[str] | None, description: str,
             body: Callable[[Path, ev.EventLog, int, int], None]) -> int:
    """`--run-dir DIR` from argv, rank and world size from the environment, the rank's event log;
    runs body(run_dir, log, rank, world_size) and turns any failure into a recorded event."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--run-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    log = ev.EventLog(args.run_dir, rank)
    try:
        body(args.run_dir, log, rank, int(os.environ.get("WORLD_SIZE", "1")))
    except BaseException as exc:  # every failure becomes an event the harness can record
        fail(log, rank, exc)
    log.close()
    return 0
