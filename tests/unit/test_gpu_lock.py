"""requirements-gpu.lock (issue 38) and how `make venv` chooses it, offline: the committed lock parses
(as pip parses it too), hashes every pin, holds torch's CUDA closure, liger-kernel and torchao,
agrees with requirements.lock, and is a complete closure for Linux x86-64 / CPython 3.11 and 3.12
by the Requires-Dist `make lock` kept in it; then the lock's writer on fakes; then the choice."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import unit_helpers  # noqa: F401  (puts the repository root on sys.path)
from packaging.utils import canonicalize_name
from unit_helpers import REPO_ROOT

from containers import gpu_lock, lock, venv_choice

GPU_TEXT = (REPO_ROOT / "requirements-gpu.lock").read_text()
CPU_TEXT = (REPO_ROOT / "requirements.lock").read_text()
GPU = {canonicalize_name(e.name): e for e in lock.parse_lock(GPU_TEXT)}
CPU = {canonicalize_name(e.name): e for e in lock.parse_lock(CPU_TEXT)}
H = "a" * 64


# --- the committed lock ------------------------------------------------------------------------

def test_the_committed_gpu_lock_is_complete_and_consistent():
    """What `python -m containers.gpu_lock --check` says: every pin hashed, requirements.lock's pins
    at their versions and hashes, and each pin's Requires-Dist satisfied within the lock."""
    assert gpu_lock.check(GPU_TEXT, CPU_TEXT) == []


def test_every_pin_has_every_file_hash_and_pip_reads_them_so():
    assert len(GPU) > len(CPU)
    for e in GPU.values():
        assert e.hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in e.hashes), e.name
    assert len(GPU["torch"].hashes) > 10, "torch: every wheel PyPI has for 2.13.0 (all platforms, Pythons)"
    req_file = pytest.importorskip("pip._internal.req.req_file")
    session = pytest.importorskip("pip._internal.network.session")
    parsed = {}
    for r in req_file.parse_requirements(str(REPO_ROOT / "requirements-gpu.lock"), session=session.PipSession()):
        name, version = r.requirement.strip().split("==")
        parsed[canonicalize_name(name)] = (version, tuple(sorted(r.options["hashes"]["sha256"])))
    assert parsed == {k: (e.version, tuple(sorted(e.hashes))) for k, e in GPU.items()}


def test_it_holds_torch_cuda_closure_and_the_fused_kernels():
    torch = CPU["torch"].version
    assert GPU["torch"].version == torch
    for name in ("nvidia-cudnn-cu13", "nvidia-cublas", "nvidia-nccl-cu13", "nvidia-cuda-runtime", "triton",
                 "cuda-bindings", "cuda-pathfinder"):
        assert name in GPU, name
    assert (GPU["liger-kernel"].version, GPU["torchao"].version) == ("0.8.5", "0.18.0")
    torch_requires = gpu_lock.parse_requires(GPU_TEXT)["torch"]
    cudnn = next(r for r in torch_requires if r.startswith("nvidia-cudnn-cu13=="))
    assert cudnn.startswith(f"nvidia-cudnn-cu13=={GPU['nvidia-cudnn-cu13'].version};")


def test_beyond_the_cpu_lock_only_the_gpu_stack():
    """The non-CUDA pins are requirements.lock's, same versions and hashes; what the GPU lock adds is
    torch's CUDA libraries, triton and the issue's two packages, nothing else."""
    for key, e in CPU.items():
        assert GPU[key].version == e.version, key
        if e.hashes:
            assert GPU[key].hashes == e.hashes, key
    added = set(GPU) - set(CPU)
    assert {k for k in added if not re.match(r"(nvidia-|cuda-)", k)} == {"triton", "liger-kernel", "torchao"}


# --- the check and the writer, on fakes ---------------------------------------------------------

def _lock(pins: dict[str, str], requires: dict[str, list[str]], hashes=(H,)) -> str:
    ps = [lock.Pin(n, v) for n, v in pins.items()]
    return gpu_lock.render(ps, {p.key: list(hashes) for p in ps}, {canonicalize_name(k): v for k, v in requires.items()},
                           "2.13.0")


CPU_SMALL = "numpy==2.4.6 \\\n    --hash=sha256:" + H + "\ntorch==2.13.0\n"
GOOD = {"numpy": "2.4.6", "torch": "2.13.0", "nvidia-cudnn-cu13": "9.20.0.48", "nvidia-cublas": "13.1.1.3",
        "liger-kernel": "0.8.5", "torchao": "0.18.0", "triton": "3.7.1"}
GOOD_REQUIRES = {"torch": ['nvidia-cudnn-cu13==9.20.0.48; platform_system == "Linux"', "triton==3.7.1"],
                 "nvidia-cudnn-cu13": ["nvidia-cublas"], "liger-kernel": ["torch>=2.1.2", "triton>=2.3.1"]}


@pytest.mark.parametrize("pins,requires,hashes,problem", [
    (GOOD, GOOD_REQUIRES, (H,), None),
    ({k: v for k, v in GOOD.items() if k != "nvidia-cublas"}, GOOD_REQUIRES, (H,),
     "nvidia-cudnn-cu13==9.20.0.48 requires nvidia-cublas (Python 3.11, 3.12), which is not in the lock"),
    ({**GOOD, "triton": "3.6.0"}, GOOD_REQUIRES, (H,), "torch==2.13.0 requires triton==3.7.1 (Python 3.11, 3.12), "
     "but the lock pins triton==3.6.0"),
    ({**GOOD, "numpy": "2.4.5"}, GOOD_REQUIRES, (H,), "requirements.lock pins numpy==2.4.6, the GPU lock 2.4.5"),
    ({k: v for k, v in GOOD.items() if k != "torchao"}, GOOD_REQUIRES, (H,), "the GPU lock must pin torchao==0.18.0"),
    (GOOD, GOOD_REQUIRES, ("b" * 64,), "numpy==2.4.6: the GPU lock's hashes are not requirements.lock's"),
])
def test_the_check_names_what_is_wrong(pins, requires, hashes, problem):
    problems = gpu_lock.check(_lock(pins, requires, hashes), CPU_SMALL)
    assert problems == ([] if problem is None else [problem])


def test_a_pin_without_recorded_requirements_or_hash_is_refused():
    text = _lock(GOOD, GOOD_REQUIRES).replace("    # requires: (none)\n", "", 1)
    assert any("no '# requires:' line" in p for p in gpu_lock.check(text, CPU_SMALL))
    text = re.sub(r"(triton==3\.7\.1) \\\n    --hash=sha256:a+\n", r"\1\n", _lock(GOOD, GOOD_REQUIRES))
    assert "triton==3.7.1: no --hash=sha256 (or one that is not 64 hex digits)" in gpu_lock.check(text, CPU_SMALL)


def test_only_requirements_that_apply_on_linux_x86_64_are_kept():
    pins = [lock.Pin("a", "1"), lock.Pin("b", "1"), lock.Pin("c", "1")]
    requires = {"a": ['b[x]; platform_system == "Linux"', 'w; sys_platform == "win32"', 'o; python_version < "3.10"',
                      'd; extra == "dev"'],
                "b": ['c; extra == "x"', 'e; extra == "y"'], "c": []}
    kept = gpu_lock.applicable_requires(pins, lambda n: requires[n])
    assert kept == {"a": ['b[x]; platform_system == "Linux"'], "b": ['c; extra == "x"'], "c": []}


def test_wheels_are_matched_to_cpython_3_11_and_3_12_on_manylinux_x86_64():
    pin = lock.Pin("x", "1")
    assert gpu_lock.wheel_gaps(pin, ["x-1-py3-none-manylinux_2_27_x86_64.whl"]) == []
    assert gpu_lock.wheel_gaps(pin, ["x-1-cp310-abi3-manylinux_2_28_x86_64.whl"]) == []
    assert gpu_lock.wheel_gaps(pin, ["x-1-cp311-cp311-manylinux_2_17_x86_64.whl", "x-1.tar.gz"]) == ["3.12"]
    assert gpu_lock.wheel_gaps(pin, ["x-1-cp312-cp312-manylinux_2_34_x86_64.whl",
                                     "x-1-cp312-cp312-musllinux_1_2_x86_64.whl"]) == ["3.11", "3.12"]


def test_the_resolution_is_pip_on_pypi_alone_for_the_gpu_hosts():
    argv = gpu_lock.resolve_argv("py", "3.12", Path("r.json"), Path("t"), Path("c.txt"), ["torch==2.13.0"])
    text = " ".join(argv)
    for part in ("install --isolated --dry-run", "--ignore-installed", "--report r.json", "--only-binary=:all:",
                 "--platform manylinux_2_28_x86_64", "--platform manylinux_2_27_x86_64", "--python-version 3.12",
                 "--implementation cp --abi cp312", "-c c.txt", f"--index-url {gpu_lock.PYPI_SIMPLE_URL}"):
        assert part in text, part
    assert argv[-1] == "torch==2.13.0"


def test_a_release_is_found_by_version_equality():
    """cuda-toolkit's wheel says 13.0.3.0 in its metadata; PyPI files it under 13.0.3."""
    doc = {"info": {"version": "13.5.0"}, "releases": {"13.0.3": [{"filename": "f.whl", "digests": {"sha256": H}}]}}
    fetch = lambda url: doc if url.endswith("/cuda-toolkit/json") else None  # noqa: E731  (no version endpoint)
    assert lock.file_hashes(lock.Pin("cuda-toolkit", "13.0.3.0"), fetch) == [H]
    with pytest.raises(lock.LockError, match="PyPI has no release 13.0.4 of cuda-toolkit"):
        lock.file_hashes(lock.Pin("cuda-toolkit", "13.0.4"), fetch)


def _fake_resolver(versions: dict[str, dict[str, str]]):
    def resolve(python_version, wanted, constraints, python=None):
        assert wanted[0] == "torch==2.13.0" and {p.name for p in constraints} == {"numpy", "torch"}
        return {canonicalize_name(n): gpu_lock.Resolved(n, v, tuple(GOOD_REQUIRES.get(n, ())))
                for n, v in versions[python_version].items()}
    return resolve


def _fake_pypi(url: str):
    name = url.removeprefix(lock.PYPI_JSON_URL + "/").split("/")[0]
    files = [{"filename": f"{name.replace('-', '_')}-1-py3-none-any.whl", "digests": {"sha256": H}}]
    return {"urls": files}


def test_make_lock_writes_what_the_check_accepts_and_refuses_a_split_resolution():
    resolved = {k: v for k, v in GOOD.items() if k != "numpy"}
    text, notes = gpu_lock.build(CPU_SMALL, fetch=_fake_pypi, resolver=_fake_resolver({"3.11": resolved, "3.12": resolved}),
                                 requires_of=lambda name: [], installed_version=lambda name: "2.4.6")
    assert gpu_lock.check(text, CPU_SMALL) == []
    assert notes[-1].startswith("5 pins beyond requirements.lock: liger-kernel, nvidia-cublas")
    split = _fake_resolver({"3.11": resolved, "3.12": {**resolved, "triton": "3.6.0"}})
    with pytest.raises(lock.LockError, match="differently for Python 3.11 and 3.12"):
        gpu_lock.build(CPU_SMALL, fetch=_fake_pypi, resolver=split, requires_of=lambda name: [],
                       installed_version=lambda name: "2.4.6")


# --- the choice ------------------------------------------------------------------------------

def _no_probe():
    raise AssertionError("the GPU probe must not run when VENV_KIND or the platform decides")


@pytest.mark.parametrize("kind,platform,given,gpu,line", [
    ("", "cpu", False, lambda: None, "venv: cpu lock (requirements.lock): no NVIDIA GPU detected, platform cpu"),
    ("", "h100", True, _no_probe, "venv: gpu lock (requirements-gpu.lock): platform h100"),
    ("", "roce-h100", True, _no_probe, "venv: gpu lock (requirements-gpu.lock): platform roce-h100"),
    ("", "cpu-cluster", True, lambda: None,
     "venv: cpu lock (requirements.lock): no NVIDIA GPU detected, platform cpu-cluster"),
    ("", "cpu", False, lambda: "nvidia-smi -L lists 8 (GPU 0: NVIDIA H100 80GB HBM3, ...)",
     "venv: gpu lock (requirements-gpu.lock): NVIDIA GPU detected: nvidia-smi -L lists 8 "
     "(GPU 0: NVIDIA H100 80GB HBM3, ...); platform cpu"),
    ("cpu", "h100", True, _no_probe, "venv: cpu lock (requirements.lock): VENV_KIND=cpu"),
    ("GPU", "cpu", False, _no_probe, "venv: gpu lock (requirements-gpu.lock): VENV_KIND=gpu"),
])
def test_the_choice_variable_then_platform_then_this_host(kind, platform, given, gpu, line):
    assert venv_choice.choose(kind, platform, given, gpu).line() == line


def test_a_bad_venv_kind_is_refused():
    with pytest.raises(ValueError, match="VENV_KIND=rocm: expected gpu or cpu"):
        venv_choice.choose("rocm", "cpu", False, _no_probe)


def test_a_gpu_is_seen_by_nvidia_smi_or_the_driver(tmp_path):
    listed = subprocess.CompletedProcess([], 0, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n"
                                                "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)\n", "")
    seen = venv_choice.detect_gpu(tmp_path / "none", run=lambda *a, **k: listed, which=lambda _: "/usr/bin/nvidia-smi")
    assert seen == "nvidia-smi -L lists 2 (GPU 0: NVIDIA H100 80GB HBM3, ...)"
    failing = subprocess.CompletedProcess([], 9, "", "NVIDIA-SMI has failed")
    (tmp_path / "nvidia").mkdir()
    assert venv_choice.detect_gpu(tmp_path / "nvidia", run=lambda *a, **k: failing,
                                  which=lambda _: "/usr/bin/nvidia-smi") == f"{tmp_path / 'nvidia'} exists"
    assert venv_choice.detect_gpu(tmp_path / "none", which=lambda _: None) is None


def test_the_record_keeps_a_cpu_venv_and_a_switch_makes_it_again(tmp_path):
    venv = tmp_path / "v"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / ".installed").write_text("")
    os.utime(venv / ".installed", (1_000_000, 1_000_000))
    record = venv / ".venv-lock"
    cpu, gpu = venv_choice.Choice("cpu", "x"), venv_choice.Choice("gpu", "y")
    assert venv_choice.record(cpu, record) == []          # a venv from before the record: the CPU lock's
    assert record.read_text() == "requirements.lock\n" and record.stat().st_mtime == 1_000_000
    assert venv_choice.record(cpu, record) == [] and record.stat().st_mtime == 1_000_000
    assert venv_choice.record(gpu, record) == [f"venv: {venv} held requirements.lock: removed, to be made again "
                                               "from requirements-gpu.lock"]
    assert sorted(p.name for p in venv.iterdir()) == [".venv-lock"] and record.read_text() == "requirements-gpu.lock\n"


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
@pytest.mark.parametrize("args,gpu", [([], False), (["PLATFORM=h100"], True), (["VENV_KIND=gpu"], True),
                                      (["PLATFORM=h100", "VENV_KIND=cpu"], False), (["PLATFORM=cpu-cluster"], False)])
def test_make_venv_installs_the_chosen_lock(tmp_path, args, gpu):
    if not gpu and venv_choice.detect_gpu() and "VENV_KIND=cpu" not in args:
        pytest.skip("an NVIDIA GPU here: make venv takes the GPU lock")
    done = subprocess.run(["make", "-n", "venv", f"VENV={tmp_path / 'v'}", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, check=True)
    assert "--record" in done.stdout and not (tmp_path / "v").exists(), "make -n records nothing"
    installs = [ln for ln in done.stdout.splitlines() if "pip install" in ln]
    if gpu:
        assert len(installs) == 1 and "--require-hashes --no-deps -r requirements-gpu.lock" in installs[0]
    else:
        assert '--no-deps  "torch==' in installs[0] and installs[1].endswith("--require-hashes --no-deps -r requirements.lock")
    assert f"echo {'requirements-gpu.lock' if gpu else 'requirements.lock'} > {tmp_path / 'v'}/.installed" in done.stdout
