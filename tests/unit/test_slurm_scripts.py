"""Slurm batch scripts and container wrapping, without a cluster: the golden scripts of roce-h100
at 2 nodes x 8 GPUs (`bench --dry-run`), the platform's Slurm and container fields, and how a
job's end becomes a run's status.

Set UPDATE_GOLDEN=1 to rewrite tests/data/golden/ after a deliberate change of the scripts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from unit_helpers import REPO_ROOT, VENV_PYTHON

from harness.config.compose import compose
from harness.errors import ConfigError
from harness.launch.local import LaunchResult

GOLDEN = REPO_ROOT / "tests" / "data" / "golden"


def dry_run(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([VENV_PYTHON, "-m", "harness", "bench", f"out={out}", "--dry-run", *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def normalised(text: str, out: Path) -> str:
    """Paths that differ between machines replaced by placeholders."""
    return (text.replace(str(out), "@OUT@").replace(VENV_PYTHON, "@PYTHON@")
            .replace(sys.executable, "@PYTHON@").replace(str(REPO_ROOT), "@REPO@"))


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"no golden file {path}; run with UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(encoding="utf-8"), (
        f"the batch script differs from {path.relative_to(REPO_ROOT)}; if the change is deliberate, "
        "rerun with UPDATE_GOLDEN=1 and review the diff")


@pytest.fixture(scope="module")
def roce_h100_dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dry") / "out"
    proc = dry_run(out, "platform=roce-h100")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc


def test_dry_run_writes_one_batch_script_per_run_and_submits_nothing(roce_h100_dry_run):
    out, proc = roce_h100_dry_run
    scripts = sorted(out.glob("runs/*/job.sbatch"))
    # the default suite of roce-h100: the collectives, the paper's Model 1 cells (ZeRO 1/2 x mb 32..512), then
    # mb 128 compiled under ZeRO 1/2 (paper-model1-stack.yaml)
    assert [p.parent.name for p in scripts] == ["00-collectives", "01-z1-mb32-ga32", "02-z1-mb64-ga16",
                                                 "03-z1-mb128-ga8", "04-z1-mb256-ga4", "05-z1-mb512-ga2",
                                                 "06-z2-mb32-ga32", "07-z2-mb64-ga16", "08-z2-mb128-ga8",
                                                 "09-z2-mb256-ga4", "10-z2-mb512-ga2", "11-z1-mb128-ga8-compile",
                                                 "12-z2-mb128-ga8-compile"]
    assert "nothing launched" in proc.stdout and "13 script(s) written" in proc.stdout
    assert f"`python -m harness collect {out}` writes their records" in proc.stdout  # what to do with them
    assert not list(out.glob("*.json")), "a dry run writes no records"
    for script in scripts:  # the rank programs' inputs are there, so the script can be sbatch'ed by hand
        assert (script.parent / "spec.json").is_file() and (script.parent / "config.yaml").is_file()
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0, f"{script} is not valid bash"


@pytest.mark.parametrize("run_id", ["00-collectives", "02-z1-mb64-ga16", "10-z2-mb512-ga2"])
def test_roce_h100_2x8_batch_scripts_match_golden(roce_h100_dry_run, run_id):
    out, _ = roce_h100_dry_run
    text = normalised((out / "runs" / run_id / "job.sbatch").read_text(), out)
    check_golden(f"roce-h100-2x8/{run_id}.sbatch", text)


def test_the_golden_script_asks_for_two_nodes_of_eight_gpus_in_the_image(roce_h100_dry_run):
    out, _ = roce_h100_dry_run
    text = (out / "runs" / "02-z1-mb64-ga16" / "job.sbatch").read_text()
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --exclusive", "#SBATCH --no-requeue", "export NCCL_IB_DISABLE=0"):
        assert line in text.splitlines(), line
    assert "apptainer exec --nv" in text and f"--bind {REPO_ROOT}" in text and f"--bind {out}" in text
    assert "--nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d" in text
    assert '--rdzv-endpoint="$head:$port"' in text and '--rdzv-id="$SLURM_JOB_ID"' in text
    assert sys.executable not in text, "inside the image the image's python runs, not the host venv's"


def test_a_sweep_is_one_job_array_and_platform_fields_reach_the_header(tmp_path):
    out = tmp_path / "out"
    proc = dry_run(out, "-m", "platform=roce-h100", "suite=single", "workload=llama-440m",
                   "workload.micro_batch_size=64", "zero=stage1,stage2,stage3",
                   "platform.slurm.partition=gpu", "platform.slurm.account=bench", "platform.slurm.qos=high",
                   "platform.slurm.time_limit=01:30:00", "platform.slurm.array_parallelism=2",
                   "platform.slurm.extra_args=['--reservation=perf']")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (script,) = out.glob("slurm/*.sbatch")
    text = script.read_text()
    for line in ("#SBATCH --array=0-2%2", "#SBATCH --partition=gpu", "#SBATCH --account=bench",
                 "#SBATCH --qos=high", "#SBATCH --time=01:30:00", "#SBATCH --reservation=perf"):
        assert line in text.splitlines(), line
    assert text.count("python -m benchmarks.training.train --run-dir") == 3
    for i in range(3):
        assert f"  {i})" in text.splitlines()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    check_golden("roce-h100-2x8/sweep-zero-stage.sbatch", normalised(text, out))


@pytest.mark.parametrize("override,field", [
    ("platform.slurm.partition='gpu normal'", "platform.slurm.partition"),
    ("platform.slurm.account='a;rm -rf /'", "platform.slurm.account"),
    ("platform.slurm.time_limit=soon", "platform.slurm.time_limit"),
    ("platform.slurm.extra_args=[reservation]", "platform.slurm.extra_args"),
    ("platform.slurm.array_parallelism=0", "platform.slurm.array_parallelism"),
    ("platform.container.runtime=apptainer", "platform.container.image"),
    ("platform.container.image=/x.sif", "platform.container.image"),
    ("platform.container.shm_size=lots", "platform.container.shm_size"),
])
def test_bad_slurm_and_container_values_are_refused_by_name(override, field):
    extra = ["platform.container.runtime=docker", "platform.container.image=img:1"] \
        if "shm_size" in override else []
    platform = "platform=cpu" if "container" in override else "platform=roce-h100"
    with pytest.raises(ConfigError) as err:
        compose([platform, override, *extra])
    assert field in str(err.value)


def test_a_job_gets_the_run_timeout_plus_the_startup_allowance_in_whole_minutes(composed):
    from harness.launch.slurm_script import time_limit

    cfg = composed(["platform=roce-h100"])
    run = type("R", (), {"timeout_s": 900.0})()
    assert time_limit(run, cfg.platform.slurm) == "0:20:00"  # 900 s + 300 s
    run.timeout_s = 7200.0
    assert time_limit(run, cfg.platform.slurm) == "2:05:00"
    cfg.platform.slurm.time_limit = "4:00:00"
    assert time_limit(run, cfg.platform.slurm) == "4:00:00"


def test_rank_exit_files_give_codes_signals_and_missing_ranks(tmp_path):
    from harness.launch.slurm import rank_exit_codes

    run = type("R", (), {"run_dir": tmp_path, "output": "events", "num_ranks": 4})()
    (tmp_path / "rank0.exit").write_text("0\n")
    (tmp_path / "rank1.exit").write_text("3\n")
    (tmp_path / "rank2.exit").write_text("137\n")  # a shell's 128 + SIGKILL
    assert rank_exit_codes(run) == {0: 0, 1: 3, 2: -9, 3: None}


def _status(launch: LaunchResult, failures=(), events=()):
    from harness.record import status_of

    run = type("R", (), {"timeout_s": 60.0})()
    return status_of(run, launch, list(events), list(failures))


def test_a_cancelled_or_preempted_job_is_recorded_with_the_scheduler_as_cause():
    launch = LaunchResult({0: None, 1: None}, False, 12.0, [0, 1],
                          cause="slurm job 42 was cancelled (CANCELLED)", job={"job_id": "42"})
    peer = {"status": "error", "reason": "rank 1: connection closed by peer"}
    status, reason = _status(launch, failures=[peer])
    assert status == "error"
    assert reason.startswith("slurm job 42 was cancelled") and "connection closed" in reason


def test_the_schedulers_memory_limit_is_an_oom_and_its_time_limit_a_timeout():
    oom = LaunchResult({0: None}, False, 3.0, [0], cause="slurm job 7 ran out of memory", cause_status="oom")
    assert _status(oom)[0] == "oom"
    late = LaunchResult({0: None}, True, 3.0, [0], cause="slurm job 8 reached its time limit (--time)")
    status, reason = _status(late)
    assert status == "timeout" and "time limit" in reason


def test_a_rank_oom_stays_the_cause_when_the_job_merely_failed():
    launch = LaunchResult({0: 3, 1: None}, False, 3.0, [], job={"job_id": "9", "state": "FAILED"})
    oom = {"status": "oom", "reason": "rank 0: OutOfMemoryError"}
    assert _status(launch, failures=[oom]) == ("oom", "rank 0: OutOfMemoryError")


def test_records_carry_the_slurm_job_and_the_image(composed, tmp_path):
    from harness.plan import plan_run
    from harness.record import environment

    cfg = composed(["platform=roce-h100"])
    run = plan_run(cfg, "x", 0, [], tmp_path, REPO_ROOT, tmp_path / "cache")
    run.env["SUITE_CONTAINER_DIGEST"] = "sha256:abc"
    job = {"launcher": "slurm", "job_id": "1234", "state": "COMPLETED", "nodelist": "gpu[01-02]"}
    env = environment(run, cfg, [], [], LaunchResult({0: 0}, False, 1.0, job=job))
    assert env["slurm"]["job_id"] == "1234" and env["slurm"]["nodelist"] == "gpu[01-02]"
    assert env["container_image"].endswith("build/containers/llm-pretrain-bench-gpu.sif")
    assert env["container_digest"] == "sha256:abc"
    assert env["container_runtime"] == "apptainer"


def test_docker_wraps_each_local_rank_with_gpus_ipc_shm_mounts_and_its_variables(composed, tmp_path):
    from harness.launch.container import Wrapper
    from harness.launch.local import LocalLauncher
    from harness.plan import plan_run

    cfg = composed(["platform=h100", "platform.container.runtime=docker",
                    "platform.container.image=nvcr.io/acme/bench:1"])
    run = plan_run(cfg, "x", 0, [], tmp_path / "out", REPO_ROOT, tmp_path / "cache")
    wrapper = Wrapper(cfg.platform.container, "nvcr.io/acme/bench:1", REPO_ROOT, tmp_path / "out", cuda=True)
    (argv, env), *_ = LocalLauncher(wrapper=wrapper).commands(run, 29500)
    assert argv[:2] == ["docker", "run"]
    for flag in ("--rm", "--ipc=host", "--network=host"):
        assert flag in argv
    assert argv[argv.index("--gpus") + 1] == "all"
    assert f"{REPO_ROOT}:{REPO_ROOT}" in argv and f"{tmp_path / 'out'}:{tmp_path / 'out'}" in argv
    passed = {argv[i + 1] for i, a in enumerate(argv) if a == "-e"}
    assert {"RANK", "WORLD_SIZE", "MASTER_PORT", "PYTHONPATH", "SUITE_CONTAINER_IMAGE"} <= passed
    assert "PATH" not in passed and "PATH" not in env, "the image keeps its own PATH"
    image_at = argv.index("nvcr.io/acme/bench:1")
    assert argv[image_at + 1:image_at + 3] == ["python", "-m"]


def test_an_apptainer_image_digest_is_the_sif_files_sha256_and_is_cached(tmp_path):
    import hashlib

    from harness.config.choices import ContainerRuntime
    from harness.config.schema import ContainerConfig
    from harness.launch.container import image_digest

    sif = tmp_path / "bench.sif"
    sif.write_bytes(b"not really an image" * 1000)
    c = ContainerConfig(runtime=ContainerRuntime.apptainer, image=str(sif))
    expected = "sha256:" + hashlib.sha256(sif.read_bytes()).hexdigest()
    assert image_digest(c, str(sif), tmp_path / "cache") == expected
    assert expected in json.loads((tmp_path / "cache" / "container-digests.json").read_text()).values()
    assert image_digest(c, "docker://nvcr.io/x:1", tmp_path / "cache") is None


def test_an_apptainer_digest_names_the_route_its_record_gives_for_these_bytes(tmp_path):
    """`make containers` leaves <sif>.json beside each .sif (containers/sif.py): its sha256 and the route
    that built it (def: from the definition; oci-archive: from podman/docker's image); the records say
    both. A record of other bytes (the .sif replaced since) names no route."""
    import hashlib

    from harness.config.choices import ContainerRuntime
    from harness.config.schema import ContainerConfig
    from harness.launch.container import image_digest, record_path

    sif = tmp_path / "bench.sif"
    sif.write_bytes(b"built by apptainer" * 100)
    hexdigest = hashlib.sha256(sif.read_bytes()).hexdigest()
    record_path(sif).write_text(json.dumps({"sha256": hexdigest, "route": "oci-archive"}))
    c = ContainerConfig(runtime=ContainerRuntime.apptainer, image=str(sif))
    assert image_digest(c, str(sif), tmp_path / "cache") == f"sha256:{hexdigest} (route: oci-archive)"
    sif.write_bytes(b"another image")
    assert image_digest(c, str(sif), tmp_path / "cache") == "sha256:" + hashlib.sha256(b"another image").hexdigest()


def test_the_fingerprint_names_packages_that_differ_from_the_lock(tmp_path):
    from benchmarks.node.environment import lock_mismatches

    lock = tmp_path / "requirements.lock"
    lock.write_text("# comment\npyyaml==0.0.1 \\\n    --hash=sha256:00\nnot-installed-pkg==1.0\n")
    found = lock_mismatches(lock)
    assert found["pyyaml"]["lock"] == "0.0.1" and found["pyyaml"]["seen"]
    assert found["not-installed-pkg"] == {"lock": "1.0", "seen": None}
    assert lock_mismatches(REPO_ROOT / "requirements.lock") == {}, "this venv is what the lock says"
    assert lock_mismatches(tmp_path / "missing.lock") is None


def _fake_bin(tmp_path: Path, **scripts: str) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for name, body in scripts.items():
        path = folder / name
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(0o755)
    return folder


def test_when_slurm_stops_answering_the_run_is_recorded_and_its_job_cancelled(composed, tmp_path, monkeypatch):
    import io

    from harness.launch import slurm
    from harness.plan import plan_run
    from harness.record import status_of

    cancelled = tmp_path / "scancel.args"
    folder = _fake_bin(tmp_path, sbatch="echo 77",
                       squeue='echo "slurm_load_jobs error: Unable to contact slurm controller" >&2; exit 1',
                       scancel=f'echo "$@" >> {cancelled}')
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    monkeypatch.setattr(slurm, "LOST_AFTER_S", 0.0)
    cfg = composed(["platform=cpu", "platform.launcher=slurm", "platform.slurm.poll_s=0.01"])
    run = plan_run(cfg, "x", 0, [], tmp_path / "out", REPO_ROOT, tmp_path / "cache")
    run.run_dir.mkdir(parents=True)
    launch = slurm.SlurmLauncher(cfg.platform, REPO_ROOT, tmp_path / "out", stream=io.StringIO()).run(run, REPO_ROOT)
    assert "lost contact with Slurm" in launch.cause and "Unable to contact slurm controller" in launch.cause
    assert cancelled.read_text().split() == ["77"]
    assert launch.killed_ranks == [0, 1]
    status, reason = status_of(run, launch, [], [])
    assert status == "error" and "lost contact with Slurm" in reason


def test_a_failed_sbatch_stops_with_slurms_message(composed, tmp_path, monkeypatch):
    from harness.errors import HarnessError
    from harness.launch import slurm
    from harness.plan import plan_run

    folder = _fake_bin(tmp_path, sbatch='echo "sbatch: error: invalid partition specified: nope" >&2; exit 1')
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    cfg = composed(["platform=cpu", "platform.launcher=slurm", "platform.slurm.partition=nope"])
    run = plan_run(cfg, "x", 0, [], tmp_path / "out", REPO_ROOT, tmp_path / "cache")
    run.run_dir.mkdir(parents=True)
    with pytest.raises(HarnessError, match="invalid partition specified: nope"):
        slurm.SlurmLauncher(cfg.platform, REPO_ROOT, tmp_path / "out").run(run, REPO_ROOT)


def test_the_cpu_cluster_reaches_its_slurm_through_the_clusters_client_script(monkeypatch):
    """The emulated cluster's client is the sh script in its folder (testbed/cluster.py CLIENT): a
    Python start at every poll took 0.3 of the box's 2 cores from the runs it measured. A cluster that
    is not up is said so, not 'not on PATH'."""
    from harness.errors import HarnessError
    from harness.launch import slurm
    from testbed.cluster import BASE_DIR, CLIENT

    monkeypatch.setenv("SUITE_CLUSTER", "nosuch")
    prefix = compose(["platform=cpu-cluster"]).platform.slurm.client_prefix   # not the cached one: SUITE_CLUSTER
    assert prefix == [str(BASE_DIR / "nosuch" / CLIENT)]
    monkeypatch.setattr(slurm, "CLIENT_PREFIX", list(prefix))
    with pytest.raises(HarnessError, match="client_prefix starts with `.*/nosuch/client`, which does not exist.*"
                                           "make cluster-up"):
        slurm.queue_states(["1"])


def test_a_local_dry_run_writes_each_runs_rank_commands(tmp_path):
    out = tmp_path / "out"
    proc = dry_run(out, "suite=smoke")
    assert proc.returncode == 0, proc.stderr[-3000:]
    scripts = sorted(out.glob("runs/*/launch.sh"))
    assert len(scripts) == 2
    text = scripts[0].read_text()
    assert text.count("-m benchmarks.training.train --run-dir") == 2 and "RANK=0" in text and "RANK=1" in text
    assert subprocess.run(["bash", "-n", str(scripts[0])]).returncode == 0
    assert not list(out.glob("*.json"))
