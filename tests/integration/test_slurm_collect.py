"""Slurm jobs the harness did not launch or wait for itself, on the real single-node Slurm of the
slurm_cluster fixture: a dry run's job array submitted by hand and turned into records by `collect`
(one task done, one held in the queue, then both), and jobs still pending past
platform.slurm.queue_limit_s, cancelled and recorded."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness.record import validate_record

from .conftest import REPO, harness_cmd, run_bench, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("no_slurm_job_left")]
SLURM = ["platform.launcher=slurm", "platform.slurm.partition=debug", "platform.slurm.poll_s=0.5"]
SHORT = ["measure.warmup_steps=1", "measure.steps=2", "measure.profile_steps=1"]
HOST = socket.gethostname().split(".")[0]


def collect(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "collect", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def slurm(*argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, check=True).stdout.strip()


def task_state(job_id: str) -> str:
    return slurm("squeue", "-h", "-r", "-t", "all", "-j", job_id.split("_")[0], "-o", "%i %T")


def records(out: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.name != "suite.json"}


def test_collect_turns_a_submitted_dry_run_into_the_records_bench_writes(slurm_cluster, tmp_path):
    out = tmp_path / "out"
    dry = subprocess.run(harness_cmd(out, "--dry-run", "-m", *SLURM, *SHORT, "suite=single", "zero=stage1,stage2,stage3"),
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, dry.stderr[-3000:]
    (script,) = out.glob("slurm/sweep-*.sbatch")
    runs = ["00-llama-tiny-zero-stage1", "01-llama-tiny-zero-stage2", "02-llama-tiny-zero-stage3"]

    before = collect(out)  # nothing submitted yet: each run says so, nothing is written
    assert before.returncode == 4, before.stdout + before.stderr
    assert before.stdout.count("never submitted") == 3 and f"sbatch {script}" in before.stdout
    assert records(out) == {} and not (out / "summary.md").exists()

    array = slurm("sbatch", "--parsable", "--hold", str(script)).split(";")[0]
    slurm("scontrol", "release", f"{array}_0")  # tasks 1 and 2 stay held: pending when collect looks
    wait_for(lambda: f"{array}_0 COMPLETED" in task_state(array), 180, "array task 0 to complete")
    first = collect(out)
    assert first.returncode == 4, first.stdout + first.stderr
    for task in (1, 2):
        assert f"{runs[task]}: not collected yet: slurm job {array}_{task} PENDING (JobHeldUser)" in first.stdout
    assert list(records(out)) == [runs[0]]
    kept = (out / f"{runs[0]}.json").read_bytes()
    suite = json.loads((out / "suite.json").read_text())
    assert suite["runs"] == runs[:1] and list(suite["not_collected"]) == runs[1:]

    slurm("scontrol", "release", f"{array}_1")
    wait_for(lambda: f"{array}_1 COMPLETED" in task_state(array), 180, "array task 1 to complete")
    slurm("scancel", array)  # task 2, still pending, is folded into the array's own record
    wait_for(lambda: "PENDING" not in task_state(array), 60, "task 2 to leave the queue")
    second = collect(out)
    assert second.returncode == 3, second.stdout + second.stderr  # a run ended in error, as bench says
    assert f"{runs[0]}: already collected" in second.stdout
    assert (out / f"{runs[0]}.json").read_bytes() == kept  # a stored record is never rewritten
    recs = records(out)
    assert list(recs) == runs
    for task, run_id in enumerate(runs[:2]):  # what bench writes when it launches the array itself
        rec = recs[run_id]
        assert rec["status"] == "ok", rec["reason"]
        assert validate_record(rec) == []
        assert rec["metrics"]["samples_per_s"]["value"] > 0 and rec["wall_s"] > 0
        job = rec["environment"]["slurm"]
        assert job["job_id"] == f"{array}_{task}" and job["array_job_id"] == array
        assert job["state"] == "COMPLETED" and job["nodelist"] == HOST and job["partition"] == "debug"
        assert f"zero=stage{task + 1}" in rec["overrides"]
        assert (out / "runs" / run_id / f"slurm-{array}_{task}.out").exists()  # the task's output, linked
    cancelled = recs[runs[2]]
    assert cancelled["status"] == "error" and validate_record(cancelled) == []
    assert cancelled["reason"].startswith(f"slurm job {array}_2 was cancelled"), cancelled["reason"]
    assert cancelled["environment"]["slurm"]["state"] == "CANCELLED"
    suite = json.loads((out / "suite.json").read_text())
    assert suite["runs"] == runs and suite["statuses"] == {**dict.fromkeys(runs[:2], "ok"), runs[2]: "error"}
    assert suite["not_collected"] == {}
    assert runs[1] in (out / "summary.md").read_text() and (out / "compare.md").exists()

    again = collect(out)
    assert again.returncode == 2 and "already collected" in again.stderr
    assert (out / f"{runs[0]}.json").read_bytes() == kept


@pytest.mark.parametrize("sweep", [False, True], ids=["one-job", "job-array"])
def test_a_job_pending_past_the_queue_limit_is_cancelled_and_recorded(slurm_cluster, tmp_path, sweep):
    # --begin an hour from now: the job cannot start while the harness waits
    run = run_bench(tmp_path / "out", *(["-m", "zero=stage1,stage2"] if sweep else []), *SLURM, *SHORT, "suite=single",
                    "platform.slurm.extra_args=['--begin=now+1hour']", "platform.slurm.queue_limit_s=3", timeout=300)
    assert run.returncode == 3, run.stdout[-3000:] + run.stderr[-3000:]  # an error run fails `bench`
    recs = run.records()
    assert len(recs) == (2 if sweep else 1)
    for rec in recs.values():
        assert rec["status"] == "error"
        assert "> platform.slurm.queue_limit_s=3 (reason: BeginTime); cancelled" in rec["reason"], rec["reason"]
        assert rec["reason"].startswith(f"slurm job {rec['environment']['slurm']['job_id']} pending ")
        assert rec["environment"]["slurm"]["state"] == "CANCELLED" and validate_record(rec) == []
        assert rec["wall_s"] < 60
    if sweep:
        assert len({r["environment"]["slurm"]["array_job_id"] for r in recs.values()}) == 1
    assert slurm("squeue", "-h", "-o", "%i") == ""  # nothing left in the queue
