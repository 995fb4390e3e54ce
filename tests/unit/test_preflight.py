"""Before launch (harness/launch/preflight.py): torch's lock files, judged by whether a live process holds
them, and the DeepSpeed ops the planned runs need (benchmarks/node/ops.py: which, and whether built)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from unit_helpers import REPO_ROOT

from benchmarks.node import ops
from harness.config.choices import OptimizerImpl
from harness.errors import ConfigError
from harness.launch.preflight import check, check_ops, clear_stale_locks, find_locks, holders, inspect
from harness.plan import deepspeed_config, plan_run


def stale_lock(ext: Path, op: str = "deepspeed_shm_comm", library: bool = True) -> Path:
    """What a process killed inside torch's FileBaton leaves: <ext>/<op>/lock, 0 bytes, with the
    op's library beside it when the build had finished."""
    (ext / op).mkdir(parents=True, exist_ok=True)
    if library:
        (ext / op / f"{op}.so").write_bytes(b"\x7fELF")
    lock = ext / op / "lock"
    lock.touch()
    return lock


@pytest.fixture
def holder(tmp_path):
    """holder(path): a live process that has `path` open (as FileBaton's holder has), killed after."""
    procs = []

    def start(path: Path) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
                                 "print('open', flush=True); time.sleep(300)", str(path)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "open"
        procs.append(proc)
        return proc
    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


# --- lock files -----------------------------------------------------------------------------------

def test_a_lock_left_by_a_killed_load_is_named_removed_and_said_why(tmp_path):
    lock = stale_lock(tmp_path / "ext")
    (messages,) = clear_stale_locks(tmp_path / "ext", recheck_s=0.01)
    assert not lock.exists()
    assert f"removed stale lock file {lock} (0 bytes" in messages
    assert "no process has it open" in messages
    assert "deepspeed_shm_comm.so beside it was built" in messages and "killed while loading" in messages
    assert "waited on it forever" in messages


def test_a_lock_without_a_library_is_a_killed_build(tmp_path):
    lock = stale_lock(tmp_path / "ext", op="cpu_adam", library=False)
    (messages,) = clear_stale_locks(tmp_path / "ext", recheck_s=0.01)
    assert not lock.exists() and "a build was killed" in messages


def test_a_lock_a_live_process_holds_is_left_alone_naming_the_process(tmp_path, holder):
    lock = stale_lock(tmp_path / "ext")
    proc = holder(lock)
    assert holders(lock) == [proc.pid]
    (messages,) = clear_stale_locks(tmp_path / "ext", recheck_s=0.01)
    assert lock.exists()
    assert f"lock file {lock} is held by pid {proc.pid} (" in messages and "left alone" in messages


def test_the_holder_killed_makes_the_lock_stale(tmp_path, holder):
    lock = stale_lock(tmp_path / "ext")
    proc = holder(lock)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert holders(lock) == []
    assert inspect(lock, recheck_s=0.01).stale
    clear_stale_locks(tmp_path / "ext", recheck_s=0.01)
    assert not lock.exists()


def test_when_holders_cannot_be_told_the_lock_stays_and_the_fix_is_printed(tmp_path):
    lock = stale_lock(tmp_path / "ext")
    no_proc = tmp_path / "no-proc"  # no /proc: nothing can be told
    assert holders(lock, proc=no_proc) is None
    (messages,) = clear_stale_locks(tmp_path / "ext", proc=no_proc, recheck_s=0.01)
    assert lock.exists()
    assert "cannot tell whether a live process holds it" in messages
    assert f"rm -f {lock}" in messages and f"fuser {lock}" in messages


def test_a_lock_released_while_looked_at_is_no_stale_lock(tmp_path):
    # FileBaton.release closes its descriptor, then removes the file: between the two the file
    # has no holder, and must not be taken for stale
    lock = stale_lock(tmp_path / "ext")
    timer = threading.Timer(0.05, lock.unlink)
    timer.start()
    try:
        assert inspect(lock, recheck_s=0.5) is None
    finally:
        timer.join()
    assert clear_stale_locks(tmp_path / "ext", recheck_s=0.01) == []


def test_only_torchs_lock_files_are_looked_at(tmp_path):
    ext = tmp_path / "ext"
    stale_lock(ext)
    (ext / "deepspeed_shm_comm" / "lockfile").touch()
    (ext / ".build.lock").touch()  # benchmarks/node/ops.py's flock file
    assert find_locks(ext) == [ext / "deepspeed_shm_comm" / "lock"]
    assert find_locks(tmp_path / "missing") == []


# --- which ops a run loads --------------------------------------------------------------------------

ADAMW = {"type": "AdamW", "params": {"lr": 1e-3}}


@pytest.mark.parametrize("accelerator, ds, want", [
    ("cpu", None, []),  # no DeepSpeed engine (a collective sweep)
    ("cpu", {}, ["deepspeed_shm_comm"]),
    ("cpu", {"optimizer": ADAMW}, ["deepspeed_shm_comm", "fused_adam"]),
    ("cpu", {"optimizer": {"type": "adam"}}, ["deepspeed_shm_comm", "fused_adam"]),
    ("cpu", {"optimizer": ADAMW, "zero_optimization": {"offload_optimizer": {"device": "cpu"}}},
     ["deepspeed_shm_comm", "cpu_adam"]),
    ("cpu", {"optimizer": ADAMW, "zero_optimization": {"offload_optimizer": {"device": "nvme"}}},
     ["deepspeed_shm_comm", "cpu_adam"]),
    ("cpu", {"optimizer": ADAMW, "zero_optimization": {"offload_optimizer": {"device": "none"}}},
     ["deepspeed_shm_comm", "fused_adam"]),
    ("cpu", {"optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}, ["deepspeed_shm_comm"]),
    ("cuda", {}, []),
    ("cuda", {"optimizer": ADAMW}, ["fused_adam"]),
])
def test_needed_ops_follow_deepspeeds_choice(accelerator, ds, want):
    assert [op.name for op in ops.needed_ops(accelerator, ds)] == want


def test_the_suites_deepspeed_optimizer_needs_fused_adam(tiny_cfg):
    assert [op.name for op in ops.needed_ops("cpu", deepspeed_config(tiny_cfg))] == ["deepspeed_shm_comm"]
    tiny_cfg.workload.optimizer = OptimizerImpl.deepspeed
    assert [op.name for op in ops.needed_ops("cpu", deepspeed_config(tiny_cfg))] == ["deepspeed_shm_comm", "fused_adam"]


# --- whether an op is built for this installation -------------------------------------------------

def built(folder: Path, name: str, **versions) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.so").write_bytes(b"\x7fELF")
    (folder / f"{name}.json").write_text(json.dumps({"versions": {**ops.installed_versions(), **versions}}))


def test_op_state_says_what_is_missing_or_mismatched(tmp_path, monkeypatch):
    monkeypatch.setenv(ops.OPS_DIR_VAR, str(tmp_path))
    op, folder = ops.BY_NAME["fused_adam"], tmp_path / "cpu"
    assert ops.ops_dir("cpu") == folder
    assert ops.state(op, "cpu").problem == f"not built ({folder / 'fused_adam.so'} missing)"
    folder.mkdir()
    (folder / "fused_adam.so").write_bytes(b"half")  # a build killed before its manifest
    assert "the build did not finish" in ops.state(op, "cpu").problem
    built(folder, "fused_adam", deepspeed="0.0.1")
    assert ops.state(op, "cpu").problem == f"built for deepspeed 0.0.1 (installed: {ops.installed_versions()['deepspeed']})"
    built(folder, "fused_adam")
    assert ops.state(op, "cpu").problem is None


def test_the_default_location_is_the_installations_own(monkeypatch):
    monkeypatch.delenv(ops.OPS_DIR_VAR, raising=False)
    assert ops.ops_dir("cpu") == Path(sys.prefix) / "deepspeed-ops" / "cpu"
    assert ops.build_command(["fused_adam"], "cpu") == f"{sys.executable} -m benchmarks.node.ops build fused_adam"
    assert ops.build_command(["fused_adam"], "cuda").endswith("build fused_adam --accelerator cuda")


def test_deepspeeds_own_builders_lose_only_their_g():
    """DeepSpeed's -g is dropped from what its builder passes (the same machine code, about a third less
    g++ time); every other flag stays, in order. The real builders' flags, as jit_load() reads them."""
    from deepspeed.ops.op_builder.cpu import CPUAdamBuilder, FusedAdamBuilder

    for cls in (CPUAdamBuilder, FusedAdamBuilder):
        builder = cls()
        before = builder.cxx_args()
        assert "-g" in before
        assert ops._without_debug_info(builder) == ["-g"]
        assert builder.cxx_args() == [a for a in before if a != "-g"] and "-O3" in builder.cxx_args()


def test_a_build_compiles_with_the_flags_less_g_and_its_manifest_names_what_was_dropped(tmp_path, monkeypatch):
    import types

    monkeypatch.setenv(ops.OPS_DIR_VAR, str(tmp_path))
    built = tmp_path / "fake_op.so"
    built.write_bytes(b"ELF")
    seen = []

    class Builder:
        name = "cpu_adam"

        def is_compatible(self, verbose=False):
            return True

        def cxx_args(self):
            return ["-O3", "-g", "-march=native"]

        def jit_load(self, verbose=False):
            seen.append(self.cxx_args())
            return types.SimpleNamespace(__file__=str(built))

    accel = types.SimpleNamespace(_name="cpu", create_op_builder=lambda name: Builder())
    folder = tmp_path / "cpu"
    folder.mkdir()
    assert ops._build_one(ops.BY_NAME["cpu_adam"], accel, folder, folder / "build")
    assert seen == [["-O3", "-march=native"]]
    manifest = json.loads((folder / "cpu_adam.json").read_text())
    assert manifest["cxx_args_dropped"] == ["-g"] and (folder / f"cpu_adam{ops.LIB_SUFFIX}").read_bytes() == b"ELF"


def test_the_build_lock_is_never_stale(tmp_path):
    """flock(2): a builder killed while it holds it does not keep the next one waiting."""
    code = ("import sys, time; from benchmarks.node.ops import build_lock; from pathlib import Path\n"
            "with build_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(300)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert f"pid {proc.pid}" in (tmp_path / ops.BUILD_LOCK).read_text()
        proc.kill()
        proc.wait()
        started = time.monotonic()
        with ops.build_lock(tmp_path):
            assert time.monotonic() - started < 1
            assert (tmp_path / ops.BUILD_LOCK).read_text() == f"pid {os.getpid()}\n"
    finally:
        proc.kill()
        proc.wait()


# --- before launch --------------------------------------------------------------------------------

@dataclass
class Planned:
    cfg: object
    run: object


def planned(cfg, tmp_path: Path, index: int = 0) -> Planned:
    return Planned(cfg, plan_run(cfg, "run", index, [], tmp_path / "out", REPO_ROOT, tmp_path / "cache"))


def test_a_slurm_run_needing_an_op_that_is_not_built_is_refused_with_the_command(tiny_cfg, tmp_path, monkeypatch):
    """Its ranks run on Slurm's nodes, and a cpu op is compiled for the CPU that builds it: refused
    before launch, with the command to run on a compute node."""
    from harness.config.choices import LauncherKind

    monkeypatch.setenv(ops.OPS_DIR_VAR, str(tmp_path / "ops"))
    tiny_cfg.workload.optimizer = OptimizerImpl.deepspeed
    run = planned(tiny_cfg, tmp_path)
    tiny_cfg.platform.launcher = LauncherKind.slurm
    with pytest.raises(ConfigError) as refused:
        check_ops([run])
    message = str(refused.value)
    assert "run 00-run needs DeepSpeed op fused_adam (workload.optimizer=deepspeed" in message
    assert f"not built ({tmp_path / 'ops' / 'cpu' / 'fused_adam.so'} missing)" in message
    assert "build them once on a compute node" in message
    assert message.endswith(f"{sys.executable} -m benchmarks.node.ops build fused_adam")
    built(tmp_path / "ops" / "cpu", "fused_adam")
    built(tmp_path / "ops" / "cpu", "deepspeed_shm_comm")
    assert check_ops([run]) == []


def _fake_build(tmp_path, calls, rc=0, build=True):
    def run(argv, **kwargs):
        calls.append(argv)
        if build:
            built(tmp_path / "ops" / "cpu", "fused_adam")
        return subprocess.CompletedProcess(argv, rc, stdout="deepspeed op fused_adam: built in 41 s\n")
    return run


def test_a_local_run_needing_an_op_gets_it_built_by_the_controller_once(tiny_cfg, tmp_path, monkeypatch, capsys):
    """Built before anything launches, in a process of its own (python -m benchmarks.node.ops build),
    once for every run that needs it; a second check finds it built and builds nothing."""
    import harness.launch.preflight as preflight

    monkeypatch.setenv(ops.OPS_DIR_VAR, str(tmp_path / "ops"))
    monkeypatch.setattr(preflight, "_noted", {"deepspeed_shm_comm"})
    calls: list = []
    monkeypatch.setattr(preflight.subprocess, "run", _fake_build(tmp_path, calls))
    tiny_cfg.workload.optimizer = OptimizerImpl.deepspeed
    runs = [planned(tiny_cfg, tmp_path, 0), planned(tiny_cfg, tmp_path, 1)]
    assert check_ops(runs) == []
    assert calls == [[sys.executable, "-m", "benchmarks.node.ops", "build", "fused_adam", "--accelerator", "cpu"]]
    out = capsys.readouterr().out
    assert "run 00-run needs DeepSpeed op fused_adam" in out and "building it now, once" in out
    assert "DeepSpeed op(s) fused_adam ready" in out
    assert check_ops(runs) == [] and len(calls) == 1


@pytest.mark.parametrize("rc,build", [(1, False), (0, False)])
def test_a_build_that_fails_launches_nothing_and_says_why(tiny_cfg, tmp_path, monkeypatch, rc, build):
    import harness.launch.preflight as preflight

    monkeypatch.setenv(ops.OPS_DIR_VAR, str(tmp_path / "ops"))
    monkeypatch.setattr(preflight.subprocess, "run", _fake_build(tmp_path, [], rc=rc, build=build))
    tiny_cfg.workload.optimizer = OptimizerImpl.deepspeed
    with pytest.raises(ConfigError) as refused:
        check_ops([planned(tiny_cfg, tmp_path)])
    message = str(refused.value)
    assert message.startswith(f"building DeepSpeed op(s) fused_adam failed (exit {rc}")
    assert "nothing was launched" in message and "built in 41 s" in message
    assert message.endswith(f"{sys.executable} -m benchmarks.node.ops build fused_adam")


def test_for_bench_a_build_that_fails_marks_each_run_needing_the_op_and_no_other(tiny_cfg, tmp_path, monkeypatch, capsys):
    """bench records those runs as errors with the build's output and launches the rest (gpu-check's
    eager runs are not lost to DeepCompile's op)."""
    import copy
    import harness.launch.preflight as preflight

    monkeypatch.setenv(ops.OPS_DIR_VAR, str(tmp_path / "ops"))
    monkeypatch.setattr(preflight, "_noted", {"deepspeed_shm_comm"})
    monkeypatch.setattr(preflight.subprocess, "run", _fake_build(tmp_path, [], rc=1, build=False))
    plain = planned(copy.deepcopy(tiny_cfg), tmp_path, 0)
    tiny_cfg.workload.optimizer = OptimizerImpl.deepspeed
    needing = [planned(tiny_cfg, tmp_path, 1), planned(tiny_cfg, tmp_path, 2)]
    failed: dict = {}
    assert check_ops([plain, *needing], failed) == []
    assert sorted(failed) == sorted(r.run.run_id for r in needing)
    why = failed[needing[0].run.run_id]
    assert why.startswith("DeepSpeed op(s) fused_adam did not build before launch (exit 1): ") and "built in 41 s" in why
    assert why.endswith(f"build them by hand to see why: {sys.executable} -m benchmarks.node.ops build fused_adam")
    assert "nothing was launched" not in why and "recorded as errors; the others go on" in capsys.readouterr().out


def test_a_missing_optional_op_is_a_note_said_once(tiny_cfg, tmp_path, monkeypatch):
    import harness.launch.preflight as preflight

    monkeypatch.setenv(ops.OPS_DIR_VAR, str(tmp_path / "ops"))
    monkeypatch.setattr(preflight, "_noted", set())
    runs = [planned(tiny_cfg, tmp_path, 0), planned(tiny_cfg, tmp_path, 1)]
    (note,) = check_ops(runs)
    assert note.startswith("note: DeepSpeed op deepspeed_shm_comm not built")
    assert "runs go on without it" in note and "benchmarks.node.ops build deepspeed_shm_comm" in note
    assert check_ops(runs) == []


def test_runs_in_a_container_are_not_checked_against_this_installation(tiny_cfg, tmp_path, monkeypatch):
    from harness.config.choices import ContainerRuntime

    monkeypatch.setenv(ops.OPS_DIR_VAR, str(tmp_path / "ops"))
    tiny_cfg.workload.optimizer = OptimizerImpl.deepspeed
    run = planned(tiny_cfg, tmp_path)
    tiny_cfg.platform.container.runtime = ContainerRuntime.docker
    assert check_ops([run]) == []


def test_check_clears_the_runs_extension_folder_and_prints_it(tiny_cfg, tmp_path, monkeypatch, capsys):
    import harness.launch.preflight as preflight

    monkeypatch.setenv(ops.OPS_DIR_VAR, str(tmp_path / "ops"))
    monkeypatch.setattr(preflight, "_noted", {"deepspeed_shm_comm"})
    run = planned(tiny_cfg, tmp_path)
    ext = Path(run.run.env["TORCH_EXTENSIONS_DIR"])
    assert ext == tmp_path / "cache" / "torch_extensions"
    lock = stale_lock(ext)
    check([run])
    assert not lock.exists()
    assert f"removed stale lock file {lock}" in capsys.readouterr().out
