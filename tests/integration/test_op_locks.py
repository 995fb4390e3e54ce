"""A killed run must not poison the next (issue 15): DeepSpeed's ops come prebuilt from the
installation (benchmarks/node/ops.py) and are loaded without torch's lock file; a lock file left in the
checkout's torch extension folder is judged before launch (harness/launch/preflight.py) and never waited on.

Real processes, real DeepSpeed, the venv's prebuilt op (`make venv` builds it; nothing is rebuilt
here)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.node.ops import OPS_DIR_VAR, PAUSE_VAR, build_command, ops_dir

from .conftest import REPO, harness_cmd, run_bench, wait_for

pytestmark = pytest.mark.integration

SHM = "deepspeed_shm_comm"
EXTENSIONS = REPO / ".cache" / "torch_extensions"  # the ranks' TORCH_EXTENSIONS_DIR (harness/plan.py)
QUICK = ("suite=single", "measure.warmup_steps=0", "measure.steps=1", "measure.profile_steps=0")
NEXT_RUN_S = 120  # a quick run takes ~10 s on 2 cores; a run waiting on a lock would take its timeout
SCRIPT = """
import json, os, sys
import torch, deepspeed
from benchmarks.node.ops import preload
states = preload()
deepspeed.init_distributed(dist_backend="gloo")
import deepspeed.comm.comm as c
out = {"shm": getattr(c.cdb.shm_comm_op, "__file__", None), "states": {s.op.name: s.problem for s in states}}
try:
    from deepspeed.ops.adam import FusedAdam
    FusedAdam([torch.nn.Parameter(torch.zeros(2))])
    out["fused_adam"] = "constructed"
except RuntimeError as exc:
    out["fused_adam"] = str(exc)
print("RESULT " + json.dumps(out))
"""


def prebuilt_shm() -> Path:
    library = ops_dir("cpu") / f"{SHM}.so"
    assert library.exists(), f"{library} is missing: run `make venv` ({build_command([SHM], 'cpu')})"
    return library


def rank_process(tmp_path: Path, **env: str) -> tuple[dict, str]:
    """SCRIPT as one gloo rank with the harness's rank environment, its own TORCH_EXTENSIONS_DIR."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    full = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "",
            "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), **env}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=full, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):]), proc.stdout


def test_a_rank_hands_deepspeed_the_prebuilt_op_and_builds_nothing(tmp_path):
    result, log = rank_process(tmp_path)
    assert result["shm"] == str(prebuilt_shm())
    assert f"deepspeed op {SHM}: loaded in" in log and "(prebuilt, no lock)" in log
    assert not (tmp_path / "ext").exists()  # no JIT build: torch's extension folder never made
    # an op that is not built is an error naming the command, never a JIT build under a lock
    if result["states"]["fused_adam"] is not None:
        assert f"{sys.executable} -m benchmarks.node.ops build fused_adam" in result["fused_adam"]
        assert "never JIT-builds ops at run time" in result["fused_adam"]


def test_without_prebuilt_ops_deepspeed_runs_without_shm_comm_and_builds_nothing(tmp_path):
    result, log = rank_process(tmp_path, **{OPS_DIR_VAR: str(tmp_path / "no-ops")})
    assert result["shm"] is None  # DeepSpeed's own path where the op is unsupported
    assert f"warning: deepspeed op {SHM} not built ({tmp_path / 'no-ops' / 'cpu' / SHM}.so missing)" in log
    assert f"{sys.executable} -m benchmarks.node.ops build {SHM}" in log
    assert result["fused_adam"].startswith("DeepSpeed op fused_adam: not built")
    assert not (tmp_path / "ext").exists()


def lock_files() -> set[Path]:
    return set(EXTENSIONS.glob("*/lock")) | set((ops_dir("cpu") / "build").glob("*/lock"))


def test_a_run_killed_while_loading_its_op_does_not_poison_the_next(tmp_path):
    prebuilt_shm()
    before = lock_files()
    out = tmp_path / "killed"
    proc = subprocess.Popen(harness_cmd(out, *QUICK), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", PAUSE_VAR: "300"})
    run_dir = out / "runs" / "00-llama-tiny"
    try:
        for rank in (0, 1):  # each rank is inside the op load (the test hook holds it there)
            wait_for(lambda: (run_dir / f"rank{rank}.log").exists() and
                     f"deepspeed op {SHM}: loading" in (run_dir / f"rank{rank}.log").read_text(), 120,
                     f"rank {rank} inside the load of {SHM}")
        for pid in json.loads((run_dir / "pids.json").read_text()).values():
            os.kill(pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 3, stderr[-2000:]
    (killed,) = (json.loads(p.read_text()) for p in out.glob("00-*.json"))
    assert killed["status"] == "error" and "killed by SIGKILL" in killed["reason"]
    assert lock_files() == before  # the killed load left no lock file behind

    started = time.monotonic()
    after = run_bench(tmp_path / "next", *QUICK, timeout=NEXT_RUN_S)
    assert after.returncode == 0, after.stdout[-2000:] + after.stderr[-2000:]
    (record,) = after.records().values()
    assert record["status"] == "ok", record["reason"]
    assert time.monotonic() - started < NEXT_RUN_S
    assert "(prebuilt, no lock)" in (after.out / "runs" / "00-llama-tiny" / "rank0.log").read_text()


def test_a_lock_file_left_in_the_extension_folder_is_never_waited_on(tmp_path):
    """The CI incident: <checkout>/.cache/torch_extensions/deepspeed_shm_comm/lock, 0 bytes, the
    library built beside it, left by a process killed inside torch's FileBaton. First while a live
    process still holds it (left alone, the run does not wait), then once that process is killed
    (stale: named and removed before launch)."""
    folder = EXTENSIONS / SHM
    made_folder = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / f"{SHM}.so"
    made_library = not library.exists()
    if made_library:
        shutil.copy2(prebuilt_shm(), library)
    lock = folder / "lock"
    assert not lock.exists(), f"{lock} exists before the test"
    # FileBaton.try_acquire: os.open(O_CREAT | O_EXCL), the descriptor held until release
    holder = subprocess.Popen([sys.executable, "-c", "import os, sys, time; os.open(sys.argv[1], os.O_CREAT | os.O_EXCL); "
                               "print('held', flush=True); time.sleep(600)", str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        held = run_bench(tmp_path / "held", *QUICK, timeout=NEXT_RUN_S)
        assert held.returncode == 0, held.stdout[-2000:] + held.stderr[-2000:]
        assert [r["status"] for r in held.records().values()] == ["ok"]
        assert f"lock file {lock} is held by pid {holder.pid}" in held.stdout and lock.exists()

        holder.kill()  # now it is what the killed rank left: a 0-byte file nobody holds
        holder.wait()
        assert lock.exists() and lock.stat().st_size == 0
        stale = run_bench(tmp_path / "stale", *QUICK, timeout=NEXT_RUN_S)
        assert stale.returncode == 0, stale.stdout[-2000:] + stale.stderr[-2000:]
        assert [r["status"] for r in stale.records().values()] == ["ok"]
        assert f"removed stale lock file {lock} (0 bytes" in stale.stdout
        assert "no process has it open" in stale.stdout and f"{SHM}.so beside it was built" in stale.stdout
        assert not lock.exists()
    finally:
        holder.kill()
        holder.wait()
        lock.unlink(missing_ok=True)
        if made_library:
            library.unlink(missing_ok=True)
        if made_folder and not any(folder.iterdir()):
            folder.rmdir()


def test_an_op_that_does_not_build_records_the_runs_needing_it_as_errors_and_the_others_run(tmp_path):
    """A run that needs fused_adam (workload.optimizer=deepspeed) beside one that needs no op, with no
    working C++ compiler: the build fails before anything launches, the first run is an error record
    with the build's own output, the second runs and is ok (as gpu-check's eager runs are not lost to
    DeepCompile's op on a node where it does not build); bench exits 3, as for any run in error."""
    ops = tmp_path / "ops" / "cpu"
    ops.mkdir(parents=True)
    for suffix in (".so", ".json"):       # the venv's shared-memory op; fused_adam is not built here
        shutil.copy(ops_dir("cpu") / f"{SHM}{suffix}", ops / f"{SHM}{suffix}")
    out = tmp_path / "out"
    proc = subprocess.run(harness_cmd(out, "-m", *QUICK, "workload.optimizer=deepspeed,torch"), cwd=REPO,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", OPS_DIR_VAR: str(tmp_path / "ops"),
                               "CXX": "/nonexistent/g++"})
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "the runs that need them are recorded as errors" in proc.stdout
    records = {r["config"]["workload"]["optimizer"]: r for r in
               (json.loads(p.read_text()) for p in out.glob("*.json") if p.name != "suite.json")}
    assert records["torch"]["status"] == "ok"
    failed = records["deepspeed"]
    assert failed["status"] == "error" and failed["reason"].startswith("DeepSpeed op(s) fused_adam did not build before launch")
    assert "/nonexistent/g++" in failed["reason"] and "after 0 optimizer steps" not in failed["reason"]
    assert build_command(["fused_adam"], "cpu") in failed["reason"]
