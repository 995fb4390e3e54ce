"""How a rank program runs: its entry point, and how it reports its own failure (one event with
status and reason, then a prompt exit)."""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path
from typing import Callable, NoReturn

from contract import events as ev

EXIT_OOM = 3
EXIT_ERROR = 1
OOM_MARKERS = ("OutOfMemoryError", "out of memory", "can't allocate memory",
               "CUBLAS_STATUS_ALLOC_FAILED", "MemoryError")


def classify_failure(exc: BaseException) -> str:
    """'oom' for out-of-memory on any device, otherwise 'error'."""
    text = f"{type(exc).__name__}: {exc}"
    return "oom" if any(m in text for m in OOM_MARKERS) else "error"


def exit_now(log: ev.EventLog, code: int) -> NoReturn:
    """Close the event log, flush the streams and leave without interpreter teardown: no atexit,
    no garbage collection of DeepSpeed's engines and the process groups they still hold."""
    log.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def fail(log: ev.EventLog, rank: int, exc: BaseException) -> NoReturn:
    """Record why this rank failed and exit at once: no NCCL/gloo teardown that could hang on
    peers that are gone."""
    status = classify_failure(exc)
    traceback.print_exc()
    log.emit(ev.FAILURE, {"status": status, "rank": rank,
                          "reason": f"rank {rank}: {type(exc).__name__}: {str(exc).strip()[:2000]}"})
    if rank == 0:
        log.emit(ev.RUN_STOP, status="aborted")
    exit_now(log, EXIT_OOM if status == "oom" else EXIT_ERROR)


def run_rank(argv: list[str] | None, description: str,
             body: Callable[[Path, ev.EventLog, int, int], None]) -> NoReturn:
    """`--run-dir DIR` from argv, rank and world size from the environment, the rank's event log;
    runs body(run_dir, log, rank, world_size) and turns any failure into a recorded event.

    A body that returns has said all it has to say (rank 0 has emitted RUN_STOP), so the rank
    exits at once too. Left to the interpreter's teardown, a ZeRO-3 rank sometimes aborted
    after a complete run ("terminate called without an active exception", SIGABRT; seen on
    rank 0 under load, in CI, always after RUN_STOP). destroy_process_group() drops only
    torch's own references; DeepSpeed's engine still holds its process groups, so their gloo
    worker threads are torn down by the finalizing interpreter, the known way to reach
    std::terminate (pytorch/pytorch#190489). That turned finished measurements into errors."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--run-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    log = ev.EventLog(args.run_dir, rank)
    try:
        body(args.run_dir, log, rank, int(os.environ.get("WORLD_SIZE", "1")))
    except BaseException as exc:  # every failure becomes an event the harness can record
        fail(log, rank, exc)
    exit_now(log, 0)
