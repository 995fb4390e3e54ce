"""`python -m harness tune` under the real single-node Slurm of the slurm_cluster fixture: each
step's trials go to the queue together as one job array (one queue wait per step), and so do the
confirmation's interleaved pairs; the tune judges them as it judges local trials."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.record import validate_record

from .conftest import REPO

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("no_slurm_job_left")]
ARGS = ["platform.launcher=slurm", "platform.slurm.partition=debug", "platform.slurm.poll_s=0.5",
        "tune.strategy=grid", "tune.budget=3", "tune.steps=[2,3]", "tune.stages=[1,2]", "tune.micro_batch_sizes=[2,4]",
        "tune.bucket_sizes=[300000]", "tune.install_preset=false",
        "measure.steps=2", "measure.warmup_steps=1", "measure.profile_steps=1", "tune.confirm_repeats=2"]


def test_each_tune_step_runs_its_trials_as_one_job_array(slurm_cluster, tmp_path):
    out = tmp_path / "tune"
    proc = subprocess.run([sys.executable, "-m", "harness", "tune", f"out={out}", *ARGS], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    state = json.loads((out / "tune.json").read_text())
    s2, s3 = state["steps"]

    def jobs(trials):
        out_ = []
        for t in trials:
            assert t["status"] == "ok", t
            rec = json.loads((out / t["records"][0]).read_text())
            assert validate_record(rec) == [] and rec["environment"]["slurm"]["state"] == "COMPLETED"
            out_.append(rec["environment"]["slurm"])
        return out_

    baseline = jobs([state["baseline"]])[0]
    assert "array_job_id" not in baseline  # the default configuration: one job, before any step
    searched2 = jobs([t for t in s2["trials"] if t["role"] == "search"])
    searched3 = jobs(s3["trials"])
    assert len(searched2) == 2 and len(searched3) == 3  # budget 3; step 2's default point is the baseline
    for step_jobs in (searched2, searched3):  # one array per step, one task per trial
        assert len({j["array_job_id"] for j in step_jobs}) == 1, step_jobs
        assert sorted(j["array_task_id"] for j in step_jobs) == [str(i) for i in range(len(step_jobs))]
    assert searched2[0]["array_job_id"] != searched3[0]["array_job_id"]
    c = state["confirmation"]
    confirming = c["folder"] is not None  # none when the default itself won
    if confirming:  # the pairs: one array too, tasks in the interleaved order
        pairs = jobs(c["trials"])
        assert len({j["array_job_id"] for j in pairs}) == 1 and len(pairs) == 4, pairs
        assert sorted(j["array_task_id"] for j in pairs) == ["0", "1", "2", "3"] and c["order"] == ["default", "winner"] * 2
        assert len(list((out / c["folder"] / "slurm").glob("sweep-*.sbatch"))) == 1
    arrays = 2 + confirming
    assert proc.stdout.count("slurm job array") == arrays and proc.stdout.count("submitted") == arrays + 1  # queue waits
    for step in ("step2", "step3"):
        assert len(list((out / step / "slurm").glob("sweep-*.sbatch"))) == 1
    assert all(t["parity"]["ok"] for t in s3["trials"])  # judged as local trials are
    assert (out / "report.md").exists()
