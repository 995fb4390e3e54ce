"""`collect` without a cluster: what it refuses, and how it reads jobs from stand-in Slurm commands
(squeue, scontrol, sacct as small shell scripts on PATH). The real flow, against a real Slurm, is
tests/integration/test_slurm_collect.py."""
from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
import yaml

from harness.bench import bench
from harness.collect import EXIT_NOT_ALL_COLLECTED, LOCK_FILE, collect
from harness.errors import HarnessError
from harness.record import validate_record

SLURM_DRY_RUN = ["--dry-run", "platform.launcher=slurm", "platform.slurm.partition=debug", "suite=single"]
RUN = "00-llama-tiny"


def fake_slurm(tmp_path: Path, monkeypatch, squeue: str = "exit 0") -> None:
    """squeue answers with `squeue`; scontrol and sacct know no job (as after MinJobAge, no accounting)."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    scripts = {"squeue": squeue,
               "scontrol": 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1',
               "sacct": 'echo "sacct: error: Slurm accounting storage is disabled" >&2; exit 1'}
    for name, body in scripts.items():
        (folder / name).write_text("#!/bin/sh\n" + body + "\n")
        (folder / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")


@pytest.fixture
def dry(tmp_path) -> Path:
    out = tmp_path / "out"
    assert bench([f"out={out}", *SLURM_DRY_RUN]) == 0
    return out


def test_a_dry_run_of_slurm_jobs_names_its_scripts_and_overrides(dry):
    manifest = json.loads((dry / "slurm" / "dry-run.json").read_text())
    assert manifest["jobs"] == [{"script": f"runs/{RUN}/job.sbatch", "array": False, "runs": [RUN]}]
    assert manifest["overrides"] == [f"out={dry}", *SLURM_DRY_RUN[1:]] and manifest["multirun"] is False


@pytest.mark.parametrize("case,message", [
    ("missing", "is not a folder"),
    ("empty", "it is not the folder of a `bench platform.launcher=slurm --dry-run"),
    ("local", "its runs are local (launch.sh)"),
    ("launched", "launched its runs itself (suite.json)"),
])
def test_what_is_not_a_slurm_dry_run_is_refused(tmp_path, case, message):
    out = tmp_path / "out"
    if case == "empty":
        out.mkdir()
    elif case == "local":
        assert bench([f"out={out}", "--dry-run", "suite=single"]) == 0
    elif case == "launched":
        out.mkdir()
        (out / "suite.json").write_text("{}")
    with pytest.raises(HarnessError) as err:
        collect(out)
    assert message in str(err.value)


def test_a_changed_config_or_a_damaged_manifest_stops_collect_before_anything_is_written(dry, tmp_path, monkeypatch):
    fake_slurm(tmp_path, monkeypatch)
    config = dry / "runs" / RUN / "config.yaml"
    data = yaml.safe_load(config.read_text())
    data["measure"]["steps"] += 1  # as if conf/ had changed since the dry run
    config.write_text(yaml.safe_dump(data))
    with pytest.raises(HarnessError) as err:
        collect(dry)
    assert "measure.steps" in str(err.value) and "differs from the dry run's" in str(err.value)
    (dry / "slurm" / "dry-run.json").write_text('{"jobs": [')
    with pytest.raises(HarnessError, match="dry-run.json is unreadable"):
        collect(dry)
    assert not list(dry.glob("*.json")) and not (dry / "summary.md").exists()


def test_a_job_slurm_has_forgotten_is_recorded_from_its_folder_once(dry, tmp_path, monkeypatch, capsys):
    # the job ran and left its output, then left slurmctld's memory (no accounting): its ranks never wrote
    # their exit files, so the record says the job ended before any rank reported, naming its output
    fake_slurm(tmp_path, monkeypatch)
    (dry / "runs" / RUN / "slurm-77.out").write_text("srun: error: Unable to create step\n")
    assert collect(dry) == 3  # an error run, as bench would exit
    rec = json.loads((dry / f"{RUN}.json").read_text())
    assert validate_record(rec) == [] and rec["status"] == "error"
    assert rec["reason"].startswith("slurm job 77 ended UNKNOWN") and "Unable to create step" in rec["reason"]
    assert rec["environment"]["slurm"]["job_id"] == "77"
    suite = json.loads((dry / "suite.json").read_text())
    assert suite["statuses"] == {RUN: "error"} and suite["not_collected"] == {}
    kept = (dry / f"{RUN}.json").read_bytes()
    with pytest.raises(HarnessError, match="already collected"):
        collect(dry)
    assert (dry / f"{RUN}.json").read_bytes() == kept


def test_without_squeue_a_run_that_may_still_run_is_not_collected(dry, tmp_path, monkeypatch, capsys):
    fake_slurm(tmp_path, monkeypatch, squeue='echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1')
    (dry / "runs" / RUN / "slurm-78.out").write_text("")
    (dry / "runs" / RUN / "rank0.exit").write_text("0\n")  # rank 1 has not reported
    assert collect(dry) == EXIT_NOT_ALL_COLLECTED
    assert "not collected, state unknown: slurm job 78: the queue cannot be read" in capsys.readouterr().out
    assert not (dry / f"{RUN}.json").exists() and not (dry / "suite.json").exists()


def test_a_job_in_the_queue_is_found_by_its_script_and_left_alone(dry, tmp_path, monkeypatch, capsys):
    script = dry / "runs" / RUN / "job.sbatch"
    fake_slurm(tmp_path, monkeypatch, squeue=f'echo "79|PENDING|Priority||{script}"; echo "80|RUNNING|None|n1|/x.sbatch"')
    assert collect(dry) == EXIT_NOT_ALL_COLLECTED
    assert f"{RUN}: not collected yet: slurm job 79 PENDING (Priority)" in capsys.readouterr().out
    assert not (dry / f"{RUN}.json").exists()


def test_one_collect_at_a_time(dry, tmp_path, monkeypatch):
    fake_slurm(tmp_path, monkeypatch)
    with open(dry / LOCK_FILE, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(HarnessError, match="another `collect` is working on"):
            collect(dry)
