"""The slurm_cluster fixture itself: a real slurmctld + slurmd + munged on localhost."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..slurm_cluster import (REGISTRY_DIR, SlurmCluster, _pid_alive, find_binary,
                             reap_stale_daemons)
from .conftest import REPO, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def sbatch(cluster: SlurmCluster, workdir: Path, *args: str) -> str:
    out = cluster.run(["sbatch", "--parsable", f"--chdir={workdir}",
                       "--output", str(workdir / "slurm-%A_%a.out"), *args]).stdout
    return out.strip().split(";")[0]


def test_start_time_is_reported(slurm_cluster):
    t = slurm_cluster.timings
    install = "already installed" if t.install_s is None else f"{t.install_s:.1f} s"
    print(f"\n[slurm] install: {install}; munged {t.munge_s:.2f} s; slurmctld+slurmd to idle "
          f"{t.slurm_s:.2f} s; start() total {t.total_s:.1f} s; reaped: {slurm_cluster.reaped}")
    assert t.slurm_s < slurm_cluster.start_timeout_s


def test_session_environment_points_at_the_cluster(slurm_cluster):
    assert os.environ["SLURM_CONF"] == slurm_cluster.env["SLURM_CONF"]
    # as harness code runs it: plain argv, inherited environment
    sinfo = subprocess.run(["sinfo", "-h", "-p", slurm_cluster.partition, "-o", "%P %T %c"],
                           capture_output=True, text=True, timeout=30)
    assert sinfo.returncode == 0, sinfo.stderr
    num_cpus = len(os.sched_getaffinity(0))
    assert sinfo.stdout.split() == [f"{slurm_cluster.partition}*", "idle", str(num_cpus)]


def test_variables_of_an_outer_slurm_job_are_ignored(slurm_cluster, monkeypatch):
    """pytest run inside a job of another cluster: srun must not attach to that job's id."""
    monkeypatch.setenv("SLURM_JOB_ID", "999999")
    monkeypatch.setenv("SBATCH_PARTITION", "no-such-partition")
    env = slurm_cluster.client_env()
    assert "SLURM_JOB_ID" not in env and "SBATCH_PARTITION" not in env
    assert env["SLURM_CONF"] == slurm_cluster.env["SLURM_CONF"]
    assert slurm_cluster.run(["srun", "-n1", "hostname"]).stdout.strip()


def test_batch_job_completes_and_stays_visible(slurm_cluster, tmp_path):
    start = time.monotonic()
    job_id = sbatch(slurm_cluster, tmp_path, "--wrap", "echo hello > result.txt")
    slurm_cluster.wait_gone(job_id)
    print(f"\n[slurm] sbatch --wrap to gone from squeue: {time.monotonic() - start:.2f} s")
    assert (tmp_path / "result.txt").read_text() == "hello\n"
    job = slurm_cluster.job_fields(job_id)
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0")
    assert job["Partition"] == slurm_cluster.partition


def test_srun_runs_two_tasks(slurm_cluster):
    result = slurm_cluster.run(["srun", "-N1", "-n2", "hostname"], timeout_s=60)
    assert len(result.stdout.splitlines()) == 2, result.stdout


def test_job_array_runs_every_task(slurm_cluster, tmp_path):
    job_id = sbatch(slurm_cluster, tmp_path, "--array=0-2",
                    "--wrap", "echo $SLURM_ARRAY_TASK_ID > task_$SLURM_ARRAY_TASK_ID.txt")
    slurm_cluster.wait_gone(job_id)
    for task in range(3):
        assert (tmp_path / f"task_{task}.txt").read_text() == f"{task}\n"
    records = slurm_cluster.run(["scontrol", "show", "job", "-o", job_id]).stdout.splitlines()
    states = sorted(dict(tok.split("=", 1) for tok in line.split() if "=" in tok)["JobState"]
                    for line in records)
    assert states == ["COMPLETED"] * 3


def test_failing_job_reports_its_exit_code(slurm_cluster, tmp_path):
    job_id = sbatch(slurm_cluster, tmp_path, "--wrap", "exit 3")
    slurm_cluster.wait_gone(job_id)
    job = slurm_cluster.job_fields(job_id)
    assert (job["JobState"], job["ExitCode"]) == ("FAILED", "3:0")


def test_scancel_stops_a_running_job_quickly(slurm_cluster, tmp_path):
    job_id = sbatch(slurm_cluster, tmp_path, "--wrap", "sleep 300 & echo $! > sleep.pid; wait")
    wait_for(lambda: (tmp_path / "sleep.pid").exists()
             and slurm_cluster.job_fields(job_id)["JobState"] == "RUNNING", 30, "job to run")
    sleep_pid = int(wait_for(lambda: (tmp_path / "sleep.pid").read_text().strip(), 5, "pid"))
    start = time.monotonic()
    slurm_cluster.run(["scancel", job_id])
    slurm_cluster.wait_gone(job_id, timeout_s=slurm_cluster.kill_wait_s + 10)
    print(f"\n[slurm] scancel to gone from squeue: {time.monotonic() - start:.2f} s")
    assert slurm_cluster.job_fields(job_id)["JobState"] == "CANCELLED"
    wait_for(lambda: not _pid_alive(sleep_pid), 10, "the job's sleep to be killed")


def test_sacct_without_accounting_fails_as_documented(slurm_cluster, tmp_path):
    job_id = sbatch(slurm_cluster, tmp_path, "--wrap", "true")
    slurm_cluster.wait_gone(job_id)
    sacct = slurm_cluster.run(["sacct", "-j", job_id], check=False)
    assert sacct.returncode != 0
    assert "accounting storage is disabled" in sacct.stderr


def test_second_cluster_coexists_and_stop_leaves_nothing(slurm_cluster, tmp_path):
    """A warm start (packages installed), next to the session's cluster, on other ports."""
    second = SlurmCluster(tmp_path)
    with second:
        print(f"\n[slurm] warm start: munged {second.timings.munge_s:.2f} s, to idle "
              f"{second.timings.slurm_s:.2f} s, total {second.timings.total_s:.2f} s")
        pids = second.daemon_pids
        assert second.conf_path != slurm_cluster.conf_path
        job_id = sbatch(second, tmp_path, "--wrap", "sleep 300")
        wait_for(lambda: second.job_fields(job_id)["JobState"] == "RUNNING", 30, "job to run")
    # stop() cancelled the running job and stopped exactly its own daemons
    assert pids.keys() == {"munged", "slurmctld", "slurmd"}
    assert not [name for name, pid in pids.items() if _pid_alive(pid)]
    assert not second.daemon_pids
    assert slurm_cluster.run(["sinfo", "-h", "-o", "%T"]).stdout.strip() == "idle"


CRASHING_SESSION = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from tests.slurm_cluster import SlurmCluster
cluster = SlurmCluster(sys.argv[2])
cluster.start()
print(json.dumps({"root": str(cluster.root), "munge_dir": str(cluster.munge_dir),
                  "pids": cluster.daemon_pids}), flush=True)
time.sleep(600)
"""


def test_daemons_of_a_killed_session_die_with_it(slurm_cluster, tmp_path):
    session = subprocess.Popen([sys.executable, "-c", CRASHING_SESSION, str(REPO), str(tmp_path)],
                               stdout=subprocess.PIPE, text=True)
    try:
        started = json.loads(session.stdout.readline())
    finally:
        session.kill()
        session.wait()
    wait_for(lambda: not any(_pid_alive(pid) for pid in started["pids"].values()), 20,
             f"daemons {started['pids']} to die with their session")
    entries = [p for p in REGISTRY_DIR.glob("*.json") if started["root"] in p.read_text()]
    assert entries, "a session that did not stop() leaves its registry entry"
    reap_stale_daemons()
    assert not any(p.exists() for p in entries)
    # the munge key is not left behind in the system tmp dir
    assert not Path(started["munge_dir"]).exists() or started["root"] in started["munge_dir"]


def test_reap_stale_daemons_kills_only_what_the_dead_session_started(tmp_path):
    """A registry entry of a dead session: its daemon is killed, a recycled pid is not."""
    root = tmp_path / "slurm-stale"
    stale = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", str(root)],
                             start_new_session=True)
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    dead_owner = subprocess.Popen(["true"])
    dead_owner.wait()
    try:
        (tmp_path / "1-slurm-stale.json").write_text(json.dumps(
            {"owner_pid": dead_owner.pid, "paths": [str(root)],
             "daemons": {"slurmctld": stale.pid, "slurmd": bystander.pid}}))
        killed = reap_stale_daemons(tmp_path)
        assert killed == [f"slurmctld pid {stale.pid}"]
        assert stale.wait(timeout=10) == -signal.SIGTERM
        assert bystander.poll() is None
        assert not list(tmp_path.glob("*.json"))
    finally:
        for proc in (stale, bystander):
            proc.kill()
            proc.wait()


def test_packages_are_found_in_sbin(slurm_cluster):
    # slurmctld/slurmd/munged live in /usr/sbin, which a non-login PATH may lack
    for name in ("slurmctld", "slurmd", "munged", "sbatch"):
        assert find_binary(name), name
