"""Structured events (contract.events): events.jsonl for the harness, the same payloads as
MLLOG lines for MLPerf's tools, and reading a stream cut short."""
from __future__ import annotations

import json
import logging
import os

import pytest
from mlperf_logging import mllog
from mlperf_logging.mllog import constants as mllog_constants

from contract import events as ev

MLLOG_PREFIX = ":::MLLOG "
PARKED = "tests.unit.mllog-parked"


def reset_mllog() -> None:
    """Undo what a rank-0 EventLog did to this process: detach its mllog file handler (else one
    test's events reach another test's mllog.log) and point mllog's shared logger elsewhere
    (mllog.config refuses to be given the logger it already has)."""
    logger = logging.getLogger(f"suite.mllog.{os.getpid()}")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    if mllog.get_mllogger().logger.name != PARKED:
        mllog.config(logger=logging.getLogger(PARKED))


@pytest.fixture(autouse=True)
def fresh_mllog():
    yield
    reset_mllog()


def emit_a_run(log: ev.EventLog) -> None:
    log.emit(ev.SUBMISSION_BENCHMARK, "llama-tiny")
    log.emit(ev.SEED, 1234)
    log.emit(ev.GLOBAL_BATCH_SIZE, 16)
    log.emit(ev.RUN_START)
    log.emit(ev.TRAIN_STEP, {"index": 0, "mode": "throughput", "warmup": True, "step_time_s": 0.5,
                             "loss": 8.3})
    log.emit(ev.RANK_SUMMARY, [{"rank": 0, "host": "h", "peak_mem_gib": 1.0, "mem_source": "rss"}])
    log.emit(ev.RUN_STOP, status="success")
    log.close()


def test_rank0_writes_events_jsonl_and_matching_mllog_lines(tmp_path):
    emit_a_run(ev.EventLog(tmp_path, 0))
    assert sorted(p.name for p in tmp_path.iterdir()) == [ev.EVENTS_FILE, ev.MLLOG_FILE]

    events = ev.read_events(tmp_path / ev.EVENTS_FILE)
    assert [e["key"] for e in events] == ["submission_benchmark", "seed", "global_batch_size",
                                          "run_start", "train_step", "rank_summary", "run_stop"]
    assert events[-1]["metadata"] == {"status": "success"}

    lines = (tmp_path / ev.MLLOG_FILE).read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(events)
    for line, event in zip(lines, events):
        assert line.startswith(MLLOG_PREFIX), line
        m = json.loads(line[len(MLLOG_PREFIX):])
        assert m["key"] == event["key"]
        assert m["value"] == event["value"]
        assert m["time_ms"] == event["time_ms"]
        # mllog adds the emitting file and line; everything the suite passed is there too
        assert event["metadata"].items() <= m["metadata"].items()
    by_key = {json.loads(line[len(MLLOG_PREFIX):])["key"]: json.loads(line[len(MLLOG_PREFIX):])
              for line in lines}
    assert by_key["run_start"]["event_type"] == "INTERVAL_START"
    assert by_key["run_stop"]["event_type"] == "INTERVAL_END"
    assert by_key["seed"]["event_type"] == "POINT_IN_TIME"


def test_run_start_and_stop_use_mllogs_standard_keys():
    assert ev.RUN_START == mllog_constants.RUN_START == "run_start"
    assert ev.RUN_STOP == mllog_constants.RUN_STOP == "run_stop"
    assert ev.SEED == mllog_constants.SEED


def test_an_unknown_key_is_refused_and_nothing_is_written(tmp_path):
    log = ev.EventLog(tmp_path, 0)
    log.emit(ev.RUN_START)
    with pytest.raises(ValueError, match="throughput_per_sec"):
        log.emit("throughput_per_sec", 3.0)
    log.close()
    assert [e["key"] for e in ev.read_events(tmp_path / ev.EVENTS_FILE)] == ["run_start"]
    assert len((tmp_path / ev.MLLOG_FILE).read_text(encoding="utf-8").splitlines()) == 1


def test_read_events_skips_a_truncated_last_line(tmp_path):
    path = tmp_path / ev.EVENTS_FILE
    full = [{"time_ms": 1, "key": "run_start", "value": None, "metadata": {}},
            {"time_ms": 2, "key": "train_step", "value": {"index": 0, "loss": 1.5}, "metadata": {}}]
    cut = json.dumps({"time_ms": 3, "key": "train_step", "value": {"index": 1}})[:25]
    path.write_text("".join(json.dumps(e) + "\n" for e in full) + cut, encoding="utf-8")
    assert ev.read_events(path) == full


def test_read_events_of_a_missing_file_is_empty(tmp_path):
    assert ev.read_events(tmp_path / "nothing.jsonl") == []


def test_other_ranks_write_their_own_file_and_no_mllog(tmp_path):
    log = ev.EventLog(tmp_path, 1)
    log.emit(ev.FAILURE, {"status": "oom", "reason": "rank 1: OutOfMemoryError", "rank": 1})
    log.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.rank1.jsonl"]
    (event,) = ev.read_events(tmp_path / "events.rank1.jsonl")
    assert event["key"] == "failure"
    assert event["value"]["status"] == "oom"


def test_two_runs_in_one_process_each_get_their_own_mllog(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    log = ev.EventLog(first, 0)
    log.emit(ev.RUN_START)
    log.close()
    log = ev.EventLog(second, 0)
    log.emit(ev.RUN_START)
    log.emit(ev.RUN_STOP, status="success")
    log.close()
    assert len((first / ev.MLLOG_FILE).read_text(encoding="utf-8").splitlines()) == 1
    assert len((second / ev.MLLOG_FILE).read_text(encoding="utf-8").splitlines()) == 2
