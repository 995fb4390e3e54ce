"""The gpu image's wheelhouse is requirements-gpu.lock (issue 38: one closure, two consumers, the image
and the GPU venv of `make venv`): one `pip download --require-hashes --no-deps` of every pin, torch
and its nvidia-*/triton wheels among them, for CPython 3.12 on Linux x86-64, no torch index; the cpu
image's wheelhouse stays requirements.lock with torch from the host's torch source; the built image
is labelled with its own lock's sha256.

Offline: pip is a fake (`wheelhouse._pip` replaced) that records each argv and writes the files a
real pip would, with contents whose sha256 the synthetic locks carry; the container engine is a
fake executable on a PATH of its own.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import unit_helpers  # noqa: F401  (puts the repository root on sys.path)
from packaging.utils import canonicalize_name
from unit_helpers import REPO_ROOT

from containers import gpu_lock, lock, recipes, wheelhouse
from harness.launch import engine

GPU_LOCK = REPO_ROOT / "requirements-gpu.lock"
CPU_LOCK = REPO_ROOT / "requirements.lock"


class Stop(Exception):
    """Raised by a fake pip that only records its first call."""


def option_values(argv: list[str], option: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == option]


# --- the argv of the real locks ----------------------------------------------------------------

def first_download(monkeypatch, tmp_path, image: str, lock_path: Path, **kw) -> tuple[list[str], str]:
    """The first `pip download` the wheelhouse of `image` runs for the lock at `lock_path`, and the
    requirements file it is given (read while pip would run)."""
    seen = {}

    def fake_pip(python, args, env=None):
        seen["argv"], seen["requirements"] = list(args), Path(option_values(args, "-r")[0]).read_text()
        raise Stop

    monkeypatch.setattr(wheelhouse, "_pip", fake_pip)
    with pytest.raises(Stop):
        wheelhouse.make(image, lock_path.read_text(), tmp_path / image, python=sys.executable, **kw)
    return seen["argv"], seen["requirements"]


def test_gpu_wheelhouse_downloads_every_pin_of_the_gpu_lock_hashed_for_cp312_linux(monkeypatch, tmp_path):
    argv, requirements = first_download(monkeypatch, tmp_path, "gpu", GPU_LOCK)
    assert argv[0] == "download" and "--require-hashes" in argv and "--no-deps" in argv
    assert option_values(argv, "--platform") == list(gpu_lock.PLATFORM_TAGS), \
        "every tag pip accepts on glibc 2.28: the nvidia-* wheels are manylinux_2_27 and older"
    assert (option_values(argv, "--python-version"), option_values(argv, "--abi"),
            option_values(argv, "--implementation")) == (["3.12"], ["cp312"], ["cp"])
    assert not [a for a in argv if "index-url" in a or a.startswith("--find-links")], "PyPI's files only, by hash"
    assert "--only-binary=:all:" not in argv, "the lock's two sdists (deepspeed, antlr4) are fetched too"
    pinned = {canonicalize_name(e.name): (e.version, set(e.hashes)) for e in lock.parse_lock(requirements)}
    want = {canonicalize_name(e.name): (e.version, set(e.hashes)) for e in lock.parse_lock(GPU_LOCK.read_text())}
    assert pinned == want, "every pin of requirements-gpu.lock, with every one of its hashes"
    assert pinned["torch"][1] and "nvidia-cublas" in pinned and "triton" in pinned and "liger-kernel" in pinned


def test_gpu_wheelhouse_reads_the_gpu_lock_by_default(monkeypatch):
    seen = {}
    monkeypatch.setattr(wheelhouse, "make", lambda image, text, out, **kw: seen.update(image=image, text=text, **kw))
    assert wheelhouse.main(["--image", "gpu"]) == 0
    assert seen["text"] == GPU_LOCK.read_text() and seen["lock_name"] == "requirements-gpu.lock"
    assert wheelhouse.main(["--image", "cpu"]) == 0
    assert seen["text"] == CPU_LOCK.read_text() and seen["lock_name"] == "requirements.lock"


def test_cpu_wheelhouse_is_unchanged(monkeypatch, tmp_path):
    """requirements.lock for the host's Python: no platform options, every pin but torch (no hash
    in the CPU lock; it comes from the host's torch source afterwards)."""
    argv, requirements = first_download(monkeypatch, tmp_path, "cpu", CPU_LOCK)
    assert argv[0] == "download" and "--require-hashes" in argv and "--no-deps" in argv
    assert not option_values(argv, "--platform") and not option_values(argv, "--python-version")
    names = [e.name for e in lock.parse_lock(requirements)]
    assert names == [e.name for e in lock.parse_lock(CPU_LOCK.read_text()) if e.name != "torch"]


def test_the_gpu_image_refuses_a_lock_with_an_unhashed_torch(monkeypatch, tmp_path):
    monkeypatch.setattr(wheelhouse, "_pip", lambda *a, **k: pytest.fail("pip must not run"))
    with pytest.raises(wheelhouse.WheelhouseError, match=r"pins torch without a hash.*every file, torch's too"):
        wheelhouse.make("gpu", CPU_LOCK.read_text(), tmp_path / "gpu", lock_name="requirements.lock")


# --- a whole wheelhouse, on synthetic locks ----------------------------------------------------

def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


FILES = {  # name -> (version, file pip "downloads")
    "torch": ("2.13.0", "torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl"),
    "nvidia-cublas": ("13.1.0.3", "nvidia_cublas-13.1.0.3-py3-none-manylinux_2_27_x86_64.whl"),
    "triton": ("3.7.1", "triton-3.7.1-cp312-cp312-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl"),
    "deepspeed": ("0.19.8", "deepspeed-0.19.8.tar.gz"),
}


def synthetic_lock(files: dict[str, tuple[str, str]], unhashed: tuple[str, ...] = ()) -> str:
    return "# a lock\n" + "".join(
        f"{n}=={v}\n" if n in unhashed else f"{n}=={v} \\\n    --hash=sha256:{sha(f.encode())}\n    # requires: (none)\n"
        for n, (v, f) in files.items())


class FakePip:
    """`pip download` writes each requested pin's file (its content: the file name); `pip wheel`
    builds `built` from the sdist."""

    def __init__(self, files: dict[str, tuple[str, str]], built: str = "deepspeed-0.19.8-py3-none-any.whl",
                 torch_file: str = "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"):
        self.files, self.built, self.torch_file, self.calls = files, built, torch_file, []

    def __call__(self, python, args, env=None):
        self.calls.append(list(args))
        if args[0] == "download":
            dest = Path(option_values(args, "--dest")[0])
            dest.mkdir(parents=True, exist_ok=True)
            if "-r" in args:
                for e in lock.parse_lock(Path(option_values(args, "-r")[0]).read_text()):
                    name = self.files[e.name][1]
                    (dest / name).write_bytes(name.encode())
            else:   # torch==V from the host's torch source
                (dest / self.torch_file).write_bytes(b"a host torch")
        elif args[0] == "wheel":
            out = Path(option_values(args, "--wheel-dir")[0])
            out.mkdir(parents=True, exist_ok=True)
            (out / self.built).write_bytes(b"built here")


def test_a_gpu_wheelhouse_is_one_hashed_download_torch_first(monkeypatch, tmp_path, capsys):
    text = synthetic_lock(FILES)
    pip = FakePip(FILES)
    monkeypatch.setattr(wheelhouse, "_pip", pip)
    out = wheelhouse.make("gpu", text, tmp_path / "gpu", torch_index_url="https://download.pytorch.org/whl/cu130")
    downloads = [c for c in pip.calls if c[0] == "download"]
    assert len(downloads) == 1, "torch and its CUDA wheels come with every other pin: no second torch download"
    assert [c[0] for c in pip.calls] == ["download", "wheel"]
    assert not any("index-url" in a for c in pip.calls for a in c)
    assert "TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130 does not apply to the gpu image" \
        in capsys.readouterr().out
    torch_txt = (out / "torch.txt").read_text()
    assert torch_txt == f"torch==2.13.0 --hash=sha256:{sha(FILES['torch'][1].encode())}\n"
    rest = {e.name: e for e in lock.parse_lock((out / "requirements.txt").read_text())}
    assert set(rest) == {"nvidia-cublas", "triton", "deepspeed"}
    assert rest["deepspeed"].hashes == (sha(b"built here"),), "the wheel built here, by its own sha256"
    manifest = json.loads((out / wheelhouse.MANIFEST).read_text())
    assert (manifest["lock"], manifest["lock_sha256"], manifest["python"]) == (
        "requirements-gpu.lock", sha(text.encode()), "3.12")
    assert (out / "requirements-gpu.lock").read_text() == text
    ds = manifest["files"]["deepspeed-0.19.8-py3-none-any.whl"]["origin"]
    assert f"sha256 {sha(FILES['deepspeed'][1].encode())}" in ds
    assert wheelhouse.make("gpu", text, out) == out and len(pip.calls) == 2, "the same lock again: reused"


def test_a_sdist_that_builds_for_this_host_only_is_refused_for_the_gpu_image(monkeypatch, tmp_path):
    monkeypatch.setattr(wheelhouse, "_pip", FakePip(FILES, built="deepspeed-0.19.8-cp311-cp311-linux_x86_64.whl"))
    with pytest.raises(wheelhouse.WheelhouseError, match=r"deepspeed-0\.19\.8-cp311.*does not fit the gpu image's "
                                                         r"CPython 3\.12"):
        wheelhouse.make("gpu", synthetic_lock(FILES), tmp_path / "gpu")


def test_the_cpu_wheelhouse_takes_torch_from_the_host_and_checks_its_build(monkeypatch, tmp_path):
    files = {k: v for k, v in FILES.items() if k in ("torch", "deepspeed")}
    text = synthetic_lock(files, unhashed=("torch",))
    pip = FakePip(files)
    monkeypatch.setattr(wheelhouse, "_pip", pip)
    out = wheelhouse.make("cpu", text, tmp_path / "cpu", python=sys.executable, torch_index_url="file:///torch")
    downloads = [c for c in pip.calls if c[0] == "download"]
    assert len(downloads) == 2 and downloads[1][-1] == "torch==2.13.0"
    assert option_values(downloads[1], "--index-url") == ["file:///torch"] and "--no-deps" in downloads[1]
    assert (out / "torch.txt").read_text() == f"torch==2.13.0 --hash=sha256:{sha(b'a host torch')}\n"
    assert json.loads((out / wheelhouse.MANIFEST).read_text())["lock"] == "requirements.lock"
    monkeypatch.setattr(wheelhouse, "_pip", FakePip(files, torch_file="torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"))
    with pytest.raises(wheelhouse.WheelhouseError, match=r"needs torch 2\.13\.0\+cpu.*a CUDA build from PyPI"):
        wheelhouse.make("cpu", text, tmp_path / "cpu2", python=sys.executable)


# --- the built image's label --------------------------------------------------------------------

def up_to_date_wheelhouse(folder: Path, lock_path: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "x-1.0-py3-none-any.whl").write_bytes(b"abc")
    (folder / wheelhouse.MANIFEST).write_text(json.dumps({
        "lock_sha256": sha(lock_path.read_bytes()), "files": {"x-1.0-py3-none-any.whl": {"size": 3}}}))


@pytest.mark.parametrize("image,lock_path", [("gpu", GPU_LOCK), ("cpu", CPU_LOCK)])
def test_the_image_is_labelled_with_its_own_locks_sha256(monkeypatch, tmp_path, image, lock_path):
    """build_image passes LOCK_SHA256 of the lock its wheelhouse holds: requirements-gpu.lock's for
    the gpu image. The wheelhouse here is up to date for that lock only (any other: pip would run)."""
    monkeypatch.setattr(wheelhouse, "WHEELHOUSE_DIR", tmp_path / "wheelhouse")
    monkeypatch.setattr(wheelhouse, "_pip", lambda *a, **k: pytest.fail("the wheelhouse of another lock"))
    up_to_date_wheelhouse(tmp_path / "wheelhouse" / image, lock_path)
    log = tmp_path / "calls"
    podman = tmp_path / "bin" / "podman"
    podman.parent.mkdir()
    podman.write_text(f'#!/bin/sh\necho "$*" >> {log}\n[ "$1" = image ] && echo 123\nexit 0\n')
    podman.chmod(0o755)
    eng = recipes.Engine(recipes.EngineProbe("podman", str(podman), True, "answers"), engine.EngineArgs("podman"))
    built = recipes.build_image(eng, image)
    build = next(line for line in log.read_text().splitlines() if line.startswith("build "))
    lock_sha = sha(lock_path.read_bytes())
    assert f"--build-arg LOCK_SHA256={lock_sha} " in build
    assert f"--build-arg WHEELHOUSE={tmp_path / 'wheelhouse' / image} " in build
    assert f"-f containers/Dockerfile.{image}" in build and f"-t llm-pretrain-bench:{image}-lock{lock_sha[:12]}" in build
    assert built.tag == f"llm-pretrain-bench:{image}"
    label = 'llm-pretrain-bench.lock.sha256="${LOCK_SHA256}"'
    assert label in recipes.dockerfile_path(image).read_text()
