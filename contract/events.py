"""Structured events of a run: one JSON object per line, MLLOG-compatible.

Every event is written twice with the same payload: to ``events.jsonl`` (read by the harness)
and, through the mlperf-logging package, as ``:::MLLOG {...}`` lines to ``mllog.log`` so that
MLPerf's own tools can read the run. Standard MLLOG keys are used wherever one exists; this
module lists every key a benchmark may emit (``KEYS``); emitting any other key is a bug.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from mlperf_logging import mllog
from mlperf_logging.mllog import constants as C

# Standard MLLOG keys (mlperf_logging.mllog.constants).
RUN_START = C.RUN_START
RUN_STOP = C.RUN_STOP
SUBMISSION_BENCHMARK = C.SUBMISSION_BENCHMARK
SUBMISSION_PLATFORM = C.SUBMISSION_PLATFORM
SEED = C.SEED
GLOBAL_BATCH_SIZE = C.GLOBAL_BATCH_SIZE
MICRO_BATCH_SIZE = C.MICRO_BATCH_SIZE
GRADIENT_ACCUMULATION_STEPS = C.GRADIENT_ACCUMULATION_STEPS
MAX_SEQUENCE_LENGTH = C.MAX_SEQUENCE_LENGTH
OPT_NAME = C.OPT_NAME
OPT_BASE_LR = C.OPT_BASE_LR
OPT_ADAMW_BETA_1 = C.OPT_ADAMW_BETA_1
OPT_ADAMW_BETA_2 = C.OPT_ADAMW_BETA_2
OPT_ADAMW_EPSILON = C.OPT_ADAMW_EPSILON
OPT_ADAMW_WEIGHT_DECAY = C.OPT_ADAMW_WEIGHT_DECAY
OPT_GRADIENT_CLIP_NORM = C.OPT_GRADIENT_CLIP_NORM
# Suite keys (no MLLOG equivalent).
ENVIRONMENT = "environment"            # value: fingerprint dict seen on rank 0
NODE = "node"                          # value: {host, machine} from the first rank of each other node
NUM_PARAMS = "num_params"              # value: parameter count of the built model
TEACHER = "teacher"                    # value: {placement, dtype, num_params, bytes_per_rank, checkpoint, alpha, temperature}
STACK = "stack"                        # value: {kernels, liger?, fp8?, compile, mode?, backend?, path?, pass_steps?, attention, attention_used, attention_from?, compile_watch, warmup_steps_run, compile_s}
TRAIN_STEP = "train_step"              # value: {index, mode, warmup, step_time_s, loss, ce_loss?, kl_loss?, microsteps?}
ARRIVALS = "arrivals"                  # value: [{index, calls, ranks, clock_offset_s?, peer_wait_s} | {index, unmatched}] per profiled step, gathered after the last (benchmarks/training/arrivals.py)
LOAD = "load"                          # value: [LoadWindow.close() + {rank, host}] of every rank, over the measured part
RANK_SUMMARY = "rank_summary"          # value: [{rank, host, peak_mem_gib, mem_source}]
FAILURE = "failure"                    # value: {status, reason}; a rank that fails says why
COLLECTIVE_ROW = "collective_row"      # value: {op, size_bytes, count, dtype, redop, root, out_of_place, in_place, num_ranks}

KEYS = frozenset({
    RUN_START, RUN_STOP, SUBMISSION_BENCHMARK, SUBMISSION_PLATFORM, SEED, GLOBAL_BATCH_SIZE,
    MICRO_BATCH_SIZE, GRADIENT_ACCUMULATION_STEPS, MAX_SEQUENCE_LENGTH, OPT_NAME, OPT_BASE_LR,
    OPT_ADAMW_BETA_1, OPT_ADAMW_BETA_2, OPT_ADAMW_EPSILON, OPT_ADAMW_WEIGHT_DECAY,
    OPT_GRADIENT_CLIP_NORM, ENVIRONMENT, NODE, NUM_PARAMS, TEACHER, STACK, TRAIN_STEP, ARRIVALS, RANK_SUMMARY, LOAD,
    FAILURE,
    COLLECTIVE_ROW,
})
EVENTS_FILE = "events.jsonl"
MLLOG_FILE = "mllog.log"


class EventLog:
    """Writes events of one rank. Rank 0 writes the run's stream; other ranks only failures."""

    def __init__(self, run_dir: Path, rank: int):
        self.rank = rank
        name = EVENTS_FILE if rank == 0 else f"events.rank{rank}.jsonl"
        self._file = open(Path(run_dir) / name, "a", buffering=1, encoding="utf-8")
        self._mllog = None
        if rank == 0:
            # mllog keeps one process-wide logger; each EventLog brings its own named one.
            self._logger = logging.getLogger(f"suite.mllog.{os.getpid()}.{id(self)}")
            self._logger.propagate = False
            self._logger.setLevel(logging.INFO)
            self._handler = logging.FileHandler(Path(run_dir) / MLLOG_FILE, encoding="utf-8")
            self._logger.addHandler(self._handler)
            mllog.config(logger=self._logger, default_stack_offset=2)
            self._mllog = mllog.get_mllogger()

    def emit(self, key: str, value: Any = None, **metadata: Any) -> None:
        if key not in KEYS:
            raise ValueError(f"unknown event key {key!r}; add it to contract/events.py KEYS")
        time_ms = int(time.time() * 1000)
        line = {"time_ms": time_ms, "key": key, "value": value, "metadata": metadata}
        self._file.write(json.dumps(line, default=str) + "\n")
        self._file.flush()
        if self._mllog is not None:
            event = {RUN_START: self._mllog.start, RUN_STOP: self._mllog.end}.get(key, self._mllog.event)
            event(key=key, value=value, metadata=metadata, time_ms=time_ms)

    def close(self) -> None:
        self._file.close()
        if self._mllog is not None:
            self._logger.removeHandler(self._handler)
            self._handler.close()


def read_lines(text: str) -> list[dict]:
    """Parse event lines; a line cut short (a rank killed mid-write) is skipped."""
    events = []
    for raw in text.splitlines():
        try:
            events.append(json.loads(raw))
        except json.JSONDecodeError:
            continue
    return events


def read_events(path: Path) -> list[dict]:
    path = Path(path)
    return read_lines(path.read_text(encoding="utf-8")) if path.exists() else []
