"""Failures are results: a killed rank, a hang past the timeout, an OOM. The suite goes on."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from harness.record import validate_record

from .conftest import REPO, assert_no_rank_left, harness_cmd, run_bench, wait_for

pytestmark = pytest.mark.integration


def test_a_killed_rank_is_recorded_and_the_next_run_goes_on(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen(harness_cmd(out, "suite=smoke"), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    first = out / "runs" / "00-z1-mb4-ga2"
    try:
        wait_for(lambda: (first / "events.jsonl").exists()
                 and '"train_step"' in (first / "events.jsonl").read_text(), 300, "the first step")
        pids = json.loads((first / "pids.json").read_text())
        os.kill(pids["1"], signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 3, stderr[-2000:]  # a run ended in error
    records = {p.stem: json.loads(p.read_text()) for p in out.glob("0*.json")}
    killed, after = records["00-z1-mb4-ga2"], records["01-z2-mb4-ga2"]
    assert killed["status"] == "error"
    assert "rank 1 killed by SIGKILL" in killed["reason"]
    assert validate_record(killed) == []
    assert after["status"] == "ok", after["reason"]
    assert_no_rank_left(first)
    assert "error: rank 1 killed by SIGKILL" in stdout


def test_a_run_past_its_timeout_is_recorded_as_timeout(tmp_path):
    started = time.monotonic()
    run = run_bench(tmp_path / "out", "suite=single", "measure.timeout_s=4", "measure.steps=100")
    elapsed = time.monotonic() - started
    assert run.returncode == 3
    (rec,) = run.records().values()
    assert rec["status"] == "timeout"
    assert "measure.timeout_s=4" in rec["reason"]
    assert validate_record(rec) == []
    assert rec["wall_s"] < 4 + 10  # killed at the deadline (plus the kill's grace)
    assert elapsed < 120
    assert_no_rank_left(run.out / "runs" / rec["run_id"])


def test_running_out_of_memory_is_a_result_not_a_crash(tmp_path):
    # logits alone: 256 x 2048 x 4096 fp32 = 8 GiB per rank, over the cpu platform's 4 GiB per rank
    run = run_bench(tmp_path / "out", "suite=single", "workload.seq_len=2048",
                    "workload.samples_per_step=512", "workload.micro_batch_size=256",
                    "measure.warmup_steps=0", "measure.steps=1", "measure.profile_steps=0")
    assert run.returncode == 0, run.stderr[-2000:]  # an OOM is a result, like the paper's OOM cells
    (rec,) = run.records().values()
    assert rec["status"] == "oom", rec["reason"]
    assert "can't allocate memory" in rec["reason"]
    assert rec["metrics"] == {}
    assert validate_record(rec) == []
    assert_no_rank_left(run.out / "runs" / rec["run_id"])


def test_a_bad_value_stops_before_anything_launches(tmp_path):
    run = run_bench(tmp_path / "out", "workload.micro_batch_size=3")
    assert run.returncode == 2
    assert "workload.micro_batch_size=3 is invalid" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "out").exists()


def test_results_already_in_out_are_never_overwritten(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    stored = out / "00-llama-tiny.json"
    stored.write_text('{"kept": true}\n')
    run = run_bench(out, "suite=single")
    assert run.returncode == 2
    assert "already holds results" in run.stderr and "choose a new out=" in run.stderr
    assert stored.read_text() == '{"kept": true}\n'
    assert not (out / "runs").exists()
