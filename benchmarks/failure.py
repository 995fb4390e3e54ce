"""How a rank reports its own failure: one event with status and reason, then a prompt exit."""
from __future__ import annotations

import os
import sys
import traceback
from typing import NoReturn

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
