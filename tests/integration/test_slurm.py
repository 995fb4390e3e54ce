"""The suite through a real Slurm (the single-node cluster of the slurm_cluster fixture): the cpu
suite end to end as Slurm jobs (srun + torchrun, two gloo ranks), a sweep as one job array run
inside an image, and a job that is cancelled, one past its timeout and one whose ranks run out of
memory, each turned into a recorded result."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from harness.record import validate_record

from .conftest import REPO, BenchRun, harness_cmd, run_bench, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("no_slurm_job_left")]
SLURM = ["platform.launcher=slurm", "platform.slurm.partition=debug", "platform.slurm.poll_s=0.5"]
SHORT = ["measure.warmup_steps=1", "measure.steps=2", "measure.profile_steps=1"]
FAKE_APPTAINER = REPO / "tests" / "data" / "fake_apptainer"


def assert_slurm_record(rec: dict, state: str = "COMPLETED") -> dict:
    job = rec["environment"]["slurm"]
    assert job["launcher"] == "slurm" and job["job_id"]
    assert job["state"].startswith(state), job
    assert job["nodelist"] == socket.gethostname().split(".")[0], job
    assert job["partition"] == "debug"
    assert validate_record(rec) == []
    return job


def no_ranks_left(out: Path) -> None:
    procs = subprocess.run(["pgrep", "-af", str(out)], capture_output=True, text=True).stdout
    assert not procs.strip(), f"processes of this suite left behind:\n{procs}"


ONE_OF_EACH = "only=[collectives,z1-mb2-ga4,z3-mb4-ga2,kd-z3-mb4-ga2]"
"""The default suite's runs of each kind (the collective sweep, ZeRO-1, ZeRO-3, the distillation):
what the launcher does differs by kind, not by micro-batch; the whole suite runs locally in
test_default_suite (each run here is a Slurm job of ~17 s on the 2-core box)."""


def test_the_cpu_suite_runs_end_to_end_as_slurm_jobs(slurm_cluster, tmp_path):
    run = run_bench(tmp_path / "out", *SLURM, *SHORT, ONE_OF_EACH)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    records = run.records()
    suite = json.loads((run.out / "suite.json").read_text())
    assert len(suite["runs"]) == len(records) >= 4  # collectives (one record per op) + 3 training runs
    jobs = set()
    for rec in records.values():
        assert rec["status"] == "ok", (rec["run_id"], rec["reason"])
        jobs.add(assert_slurm_record(rec)["job_id"])
    training = [r for r in records.values() if "samples_per_s" in r["metrics"]]
    assert len(training) == 3 and all(r["metrics"]["samples_per_s"]["value"] > 0 for r in training)
    assert {r["benchmark"] for r in training} == {"llama-tiny", "llama-tiny-kd"}
    assert len(jobs) == 4, "one Slurm job per run (the collective sweep is one run)"
    for run_dir in (run.out / "runs").iterdir():
        assert (run_dir / "job.sbatch").is_file()
        assert sorted(p.name for p in run_dir.glob("rank*.exit")) == ["rank0.exit", "rank1.exit"]
        assert list(run_dir.glob("slurm-*.out"))
    assert "slurm job" in run.stdout and "RUNNING" in run.stdout  # progress while it waits
    assert "step 2/4" in run.stdout  # per-step progress lines, as with local ranks
    no_ranks_left(run.out)


def test_a_sweep_is_one_job_array_inside_the_image(slurm_cluster, tmp_path):
    image = tmp_path / "bench.sif"
    image.write_bytes(b"a stand-in image" * 64)
    log = tmp_path / "apptainer.jsonl"
    env = {**os.environ, "PATH": f"{FAKE_APPTAINER}:{os.environ['PATH']}", "FAKE_APPTAINER_LOG": str(log)}
    out = tmp_path / "out"
    proc = subprocess.run(
        harness_cmd(out, "-m", *SLURM, *SHORT, "suite=single", "zero=stage1,stage2",
                    "workload.micro_batch_size=4", "platform.container.runtime=apptainer",
                    f"platform.container.image={image}", f"platform.container.python={os.sys.executable}"),
        cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    run = BenchRun(proc.returncode, proc.stdout, proc.stderr, out)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    records = sorted(run.records().values(), key=lambda r: r["run_id"])
    assert [r["status"] for r in records] == ["ok", "ok"], [r["reason"] for r in records]
    jobs = [assert_slurm_record(r) for r in records]
    assert jobs[0]["array_job_id"] == jobs[1]["array_job_id"]
    assert [j["array_task_id"] for j in jobs] == ["0", "1"]
    assert "job array" in run.stdout
    for rec in records:  # the ranks ran in the image and said so
        env_ = rec["environment"]
        assert env_["container_image"] == str(image) and env_["container_runtime"] == "apptainer"
        assert env_["container_digest"].startswith("sha256:")
        assert env_["lock_mismatches"] == {}
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) == 2  # one srun task per node, in each array task
    assert all(c["image"] == str(image) and str(REPO) in c["binds"] and str(out) in c["binds"] for c in calls)
    assert all(c["cmd"][1:3] == ["-m", "torch.distributed.run"] and not c["nv"] for c in calls)


def _default_sigint() -> None:
    # A shell starting a background job (nohup, `&`, some CI runners) ignores SIGINT in it, and
    # Python then never raises KeyboardInterrupt: give the harness the terminal's behaviour back.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_long_run(out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(harness_cmd(out, *SLURM, "suite=single", "measure.warmup_steps=0",
                                        "measure.steps=100000", "measure.profile_steps=0", *extra),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
                            preexec_fn=_default_sigint)


def _finish(proc: subprocess.Popen, timeout: float = 180) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise


def test_a_cancelled_job_becomes_a_recorded_result(slurm_cluster, tmp_path):
    out = tmp_path / "out"
    proc = _start_long_run(out)
    events = out / "runs" / "00-llama-tiny" / "events.jsonl"
    wait_for(lambda: events.exists() and '"train_step"' in events.read_text(), 120, "the first step")
    job_id = subprocess.run(["squeue", "-h", "-o", "%i", "-n", "bench-00-llama-tiny"],
                            capture_output=True, text=True, check=True).stdout.split()[0]
    subprocess.run(["scancel", job_id], check=True)
    stdout, stderr = _finish(proc)
    assert proc.returncode == 3, stdout[-2000:] + stderr[-2000:]  # an error run fails `bench`, and says so
    (rec,) = BenchRun(proc.returncode, stdout, stderr, out).records().values()
    assert rec["status"] == "error"
    assert rec["reason"].startswith(f"slurm job {job_id} was cancelled"), rec["reason"]
    assert assert_slurm_record(rec, "CANCELLED")["job_id"] == job_id
    no_ranks_left(out)


def test_a_job_past_its_timeout_is_cancelled_and_recorded_as_timeout(slurm_cluster, tmp_path):
    out = tmp_path / "out"
    proc = _start_long_run(out, "measure.timeout_s=25")
    stdout, stderr = _finish(proc)
    assert proc.returncode == 3, stdout[-2000:] + stderr[-2000:]
    (rec,) = BenchRun(proc.returncode, stdout, stderr, out).records().values()
    assert rec["status"] == "timeout", rec["reason"]
    assert "exceeded measure.timeout_s=25 s" in rec["reason"]
    assert_slurm_record(rec, "CANCELLED")
    no_ranks_left(out)


def test_ranks_out_of_memory_in_a_job_are_an_oom_result(slurm_cluster, tmp_path):
    # logits alone: 256 x 2048 x 4096 fp32 = 8 GiB per rank, over the cpu platform's 4 GiB per rank
    run = run_bench(tmp_path / "out", *SLURM, "suite=single", "workload.seq_len=2048",
                    "workload.samples_per_step=512", "workload.micro_batch_size=256",
                    "measure.warmup_steps=0", "measure.steps=1", "measure.profile_steps=0")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    (rec,) = run.records().values()
    assert rec["status"] == "oom", rec["reason"]
    assert "can't allocate memory" in rec["reason"]
    assert_slurm_record(rec, "FAILED")
    no_ranks_left(run.out)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_stopping_the_harness_cancels_its_job(slurm_cluster, tmp_path, sig):
    out = tmp_path / "out"
    proc = _start_long_run(out)
    events = out / "runs" / "00-llama-tiny" / "events.jsonl"
    wait_for(lambda: events.exists() and '"train_step"' in events.read_text(), 120, "the first step")
    os.killpg(proc.pid, sig)
    _finish(proc, timeout=60)
    assert proc.returncode != 0

    def gone() -> bool:
        q = subprocess.run(["squeue", "-h", "-n", "bench-00-llama-tiny", "-o", "%i %T"],
                           capture_output=True, text=True).stdout
        return not q.strip()
    wait_for(gone, 60, "the job to leave the queue")
    time.sleep(1)
    no_ranks_left(out)
