"""The container images' software stack, checked without an engine (containers/image_check.py),
and the build-time smoke test (benchmarks/node/smoke_image.py).

The defect these guard against (issue 14): the GPU image kept the NGC base image's torch
2.6.0a0+nv25.01 and installed the rest of the lock with --no-deps; transformers 5.23 requires
torch>=2.6 (which 2.6.0a0 is not) and treats such a torch as absent, so no model could be built,
while the image's build check (imports only) passed.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from unit_helpers import REPO_ROOT, VENV_PYTHON  # (importing it puts the repository root on sys.path)

from containers import image_check, image_requirements, image_stack, lock, recipes, wheelhouse
from containers.image_requirements import Dist
from containers.image_stack import ImageCheckError

LOCK_TEXT = (REPO_ROOT / "requirements.lock").read_text(encoding="utf-8")
GPU_LOCK_TEXT = (REPO_ROOT / "requirements-gpu.lock").read_text(encoding="utf-8")
LOCK_TORCH = next(e.version for e in lock.parse_lock(LOCK_TEXT) if e.name == "torch")
LOCKS = {"cpu": LOCK_TEXT, "gpu": GPU_LOCK_TEXT}
"""What each image installs (containers/wheelhouse.py's TARGETS)."""

OLD_NGC_GPU = """\
FROM nvcr.io/nvidia/pytorch:25.01-py3
COPY requirements.lock /tmp/requirements.lock
RUN grep -Ev '^torch==' /tmp/requirements.lock > /tmp/requirements.notorch.txt \\
 && PIP_CONSTRAINT= DS_BUILD_OPS=0 python -m pip install --no-cache-dir --require-hashes --no-deps \\
        -r /tmp/requirements.notorch.txt \\
 && python -c "import torch, deepspeed, transformers; print('torch', torch.__version__)" \\
 && rm /tmp/requirements.notorch.txt
ENV PYTHONUNBUFFERED=1
WORKDIR /workspace/suite
COPY harness /workspace/suite/harness
"""
"""containers/Dockerfile.gpu before the fix (its instructions; comments left out)."""


def write(tmp_path: Path, text: str, name: str = "Dockerfile") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m containers.image_check ARGS` as a user runs it, from the repository root."""
    return subprocess.run([VENV_PYTHON, "-m", "containers.image_check", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)


def venv_is_the_locks() -> None:
    from importlib import metadata

    try:
        for e in lock.parse_lock(LOCK_TEXT):
            metadata.version(e.name)
    except metadata.PackageNotFoundError as e:
        pytest.skip(f"{e} is not installed here: not the suite's venv")


# --- the shipped images -----------------------------------------------------------------------

@pytest.mark.parametrize("image,python,torch", [
    ("gpu", "3.12", LOCK_TORCH),   # PyPI's torch: the CUDA 13 build, no local tag
    ("cpu", "3.11", f"{LOCK_TORCH}+cpu"),
])
def test_shipped_dockerfile_resolves_with_no_problem(image, python, torch):
    venv_is_the_locks()
    stack = image_check.check(recipes.dockerfile_path(image))
    assert stack.problems == []
    assert stack.python.startswith(python)
    assert stack.get("torch").version == torch
    assert stack.get("torch").source == f"/tmp/wheelhouse/torch.txt (from {wheelhouse.TARGETS[image].lock.name})"
    entries = lock.parse_lock(LOCKS[image])
    for e in entries:  # the image's whole lock, at its versions, and nothing else
        have = stack.get(e.name)
        assert have is not None and have.version.split("+")[0] == e.version, e.name
    assert len(stack.packages) == len(entries)
    assert any("accelerate" in n and "not installed on purpose" in n for n in stack.notes)


def test_cli_prints_each_stack_and_exits_0():
    venv_is_the_locks()
    done = run_cli()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "containers/Dockerfile.gpu: nvidia/cuda:" in done.stdout
    assert f"torch {LOCK_TORCH}  [/tmp/wheelhouse/torch.txt (from requirements-gpu.lock)]" in done.stdout
    assert f"torch {LOCK_TORCH}+cpu  [/tmp/wheelhouse/torch.txt (from requirements.lock)]" in done.stdout
    assert done.stdout.count("ok: every requirement and Requires-Python holds") == 2


def test_gpu_dockerfile_runs_pip_check_and_the_smoke_test_after_copying_the_suite():
    text = recipes.dockerfile_path("gpu").read_text()
    assert "nvcr.io" not in recipes.base_arg(recipes.dockerfile_path("gpu"))
    assert "python -m pip check" in text
    smoke = text.index("python -m benchmarks.node.smoke_image")
    assert smoke > text.index("COPY benchmarks /workspace/suite/benchmarks")
    assert smoke > text.index("COPY conf /workspace/suite/conf")


# --- the old GPU image and other broken stacks ------------------------------------------------

def test_old_ngc_torch_image_is_reported(tmp_path):
    venv_is_the_locks()
    old = write(tmp_path, OLD_NGC_GPU, "Dockerfile.gpu")
    stack = image_check.check(old)
    assert stack.python == "3.12.3"
    assert stack.get("torch").version == "2.6.0a0+ecf3bae40a.nv25.01"
    assert ("transformers 5.23.0 requires torch>=2.6 (extra torch); the image has torch 2.6.0a0+ecf3bae40a.nv25.01"
            in stack.problems)
    assert any("torch 2.6.0a0" in n and "not checked" in n for n in stack.notes)
    done = run_cli("--dockerfile", str(old))
    assert done.returncode == 1
    assert "PROBLEM: transformers 5.23.0 requires torch>=2.6 (extra torch); the image has torch 2.6.0a0" in done.stdout


@pytest.mark.parametrize("base", ["nvidia/cuda:latest", "nvidia/cuda:13.0.1-devel-ubuntu26.04",
                                  "nvcr.io/nvidia/pytorch:25.02-py3", "python:3-slim"])
def test_unknown_base_is_an_error_not_a_guess(tmp_path, base):
    text = recipes.dockerfile_path("gpu").read_text().replace(
        "ARG BASE_IMAGE=nvidia/cuda:13.0.1-devel-ubuntu24.04", f"ARG BASE_IMAGE={base}")
    dockerfile = write(tmp_path, text)
    with pytest.raises(ImageCheckError, match="unknown base image"):
        image_stack.derive(dockerfile)
    done = run_cli("--dockerfile", str(dockerfile))
    assert done.returncode == 1 and f"unknown base image {base!r}" in done.stderr


def without(text: str, name: str) -> str:
    """A lock's text without the pin `name` (its hashes and `# requires:` lines)."""
    out = re.sub(rf"(?ms)^{re.escape(name)}==.*?(?=^\S|\Z)", "", text)
    assert out != text, name
    return out


def test_lock_missing_a_dependency_is_reported(tmp_path):
    venv_is_the_locks()
    short = {image: tmp_path / wheelhouse.TARGETS[image].lock.name for image in LOCKS}
    for image, text in LOCKS.items():
        short[image].write_text(without(text, "hjson"))   # deepspeed requires hjson
        stack = image_check.check(recipes.dockerfile_path(image), short[image])
        assert stack.problems == ["deepspeed 0.19.8 requires hjson; the image does not have hjson"], image
    done = run_cli("--lock", str(short["cpu"]), "--gpu-lock", str(short["gpu"]))
    assert done.returncode == 1 and done.stdout.count("PROBLEM: deepspeed 0.19.8 requires hjson") == 2


def test_gpu_image_is_checked_against_the_gpu_locks_cuda_closure(tmp_path):
    """The CUDA packages' requirements are read from requirements-gpu.lock (this CPU venv has none of
    them): a GPU lock without nvidia-cublas is an image that lacks it, for cuDNN and for the
    cuda-toolkit[cublas] that torch's CUDA build asks for."""
    venv_is_the_locks()
    short = tmp_path / "requirements-gpu.lock"
    short.write_text(without(GPU_LOCK_TEXT, "nvidia-cublas"))
    problems = image_check.check(recipes.dockerfile_path("gpu"), short).problems
    cudnn = next(e for e in lock.parse_lock(GPU_LOCK_TEXT) if e.name == "nvidia-cudnn-cu13")
    assert f"nvidia-cudnn-cu13 {cudnn.version} requires nvidia-cublas; the image does not have nvidia-cublas" in problems
    assert any(p.startswith("cuda-toolkit ") and p.endswith("(extra cublas); the image does not have nvidia-cublas")
               for p in problems)
    assert all("nvidia-cublas" in p for p in problems), problems


@pytest.mark.parametrize("step,problem", [
    ("RUN python -m pip install --no-index --find-links=/tmp/wheelhouse --no-deps accelerate==1.1.0",
     "accelerate 1.1.0 (pip install accelerate==1.1.0, --no-deps) is not pinned by requirements-gpu.lock"),
    ("RUN python -m pip install --no-index --find-links=/tmp/wheelhouse --no-deps triton==3.6.0",
     "requirements-gpu.lock pins triton==3.7.1; the image has 3.6.0 (pip install triton==3.6.0, --no-deps)"),
])
def test_gpu_image_installing_beyond_the_gpu_lock_fails_naming_the_package(tmp_path, step, problem):
    venv_is_the_locks()
    text = recipes.dockerfile_path("gpu").read_text()
    anchor = "ENV PYTHONUNBUFFERED=1"
    dockerfile = write(tmp_path, text.replace(anchor, step + "\n" + anchor), "Dockerfile.gpu")
    assert problem in image_check.check(dockerfile).problems
    done = run_cli("--dockerfile", str(dockerfile))
    assert done.returncode == 1 and f"PROBLEM: {problem}" in done.stdout


def test_venv_that_is_not_the_locks_is_said_so(tmp_path):
    venv_is_the_locks()

    def dist(name):
        d = image_requirements.installed_dist(name)
        return Dist("0.0.1", d.requires, d.requires_python) if name == "tokenizers" else d

    stack = image_check.check(recipes.dockerfile_path("cpu"), dist=dist)
    assert len(stack.problems) == 1
    assert stack.problems[0].startswith("this venv has tokenizers 0.0.1 but the image gets tokenizers 0.23.3")
    assert "run `make venv`" in stack.problems[0]


# --- synthetic stacks: markers, extras, Requires-Python, the Dockerfile's steps ---------------

SMALL_LOCK = "".join(f"{n}==1 \\\n    --hash=sha256:{c * 64}\n" for n, c in (("a", "a"), ("b", "b")))
INSTALL = ("COPY requirements.lock /tmp/requirements.lock\n"
           "RUN python -m pip install --require-hashes --no-deps -r /tmp/requirements.lock\n")


def small(tmp_path: Path, base: str, requires: dict[str, tuple[str, ...]], requires_python=None,
          body: str = INSTALL):
    (tmp_path / "requirements.lock").write_text(SMALL_LOCK)
    dockerfile = write(tmp_path, f"FROM {base}\n{body}")
    dists = {n: Dist("1", requires.get(n, ()), (requires_python or {}).get(n)) for n in ("a", "b")}
    return image_check.check(dockerfile, tmp_path / "requirements.lock", dist=dists.get)


@pytest.mark.parametrize("base,problems", [
    ("python:3.11-slim-bookworm", ["a 1 requires c>=2; the image does not have c",
                                   "b 1 requires Python >=3.12; the image has Python 3.11"]),
    ("python:3.12-slim-bookworm", ["a 1 requires c>=2; the image does not have c"]),
])
def test_requires_python_and_markers_are_evaluated_for_the_images_python(tmp_path, base, problems):
    stack = small(tmp_path, base, {"a": ('c>=2; python_version >= "3.11"', 'd; python_version < "3.11"',
                                         'e; sys_platform == "win32"', 'f; extra == "docs"')},
                  {"b": ">=3.12"})
    assert stack.problems == problems


def test_extras_asked_for_by_a_requirement_are_followed(tmp_path):
    stack = small(tmp_path, "python:3.11-slim-bookworm",
                  {"a": ("b[fast]>=1",), "b": ('c; extra == "fast"', 'd; extra == "slow"')})
    assert stack.problems == ["b 1 requires c (extra fast); the image does not have c"]


def test_suite_extras_and_deliberate_omissions_are_tables(monkeypatch, tmp_path):
    monkeypatch.setattr(image_requirements, "SUITE_EXTRAS", {"a": ("x",)})
    stack = small(tmp_path, "python:3.11-slim-bookworm", {"a": ('b>=2; extra == "x"', 'z; extra == "x"')})
    assert stack.problems == ["a 1 requires b>=2 (extra x); the image has b 1",
                              "a 1 requires z (extra x); the image does not have z"]
    monkeypatch.setattr(image_requirements, "NOT_INSTALLED", {("a", "z"): "not used here"})
    stack = small(tmp_path, "python:3.11-slim-bookworm", {"a": ('z; extra == "x"',)})
    assert stack.problems == [] and stack.notes == ["a 1 requires z (extra x): not installed on purpose: not used here"]


def test_distribution_python_needs_apt_python3_and_a_venv(tmp_path):
    base = "nvidia/cuda:13.0.1-devel-ubuntu24.04"
    stack = small(tmp_path, base, {})
    assert any("has no Python" in p for p in stack.problems)
    assert any("PEP 668" in p for p in stack.problems)
    apt = "RUN apt-get update && apt-get install -y python3 python3-venv && python3 -m venv /opt/venv\n"
    assert small(tmp_path, base, {}, body=apt + "ENV PATH=/opt/venv/bin:$PATH\n" + INSTALL).problems == []
    breaking = INSTALL.replace("--no-deps", "--no-deps --break-system-packages")
    assert small(tmp_path, base, {}, body=apt + breaking).problems == []


def test_torch_steps_are_followed(tmp_path):
    """torch from the lock with sed, the index's local tag, --no-deps on a CUDA build, a lock line
    without a hash that nothing satisfies, an unpinned install."""
    (tmp_path / "requirements.lock").write_text(SMALL_LOCK + "torch==2.13.0\n")
    dists = {n: Dist("2.13.0" if n == "torch" else "1", (), None) for n in ("a", "b", "torch")}

    def stack_of(body: str):
        dockerfile = write(tmp_path, "FROM python:3.12-slim-bookworm\nCOPY requirements.lock /tmp/requirements.lock\n"
                           + body)
        return image_check.check(dockerfile, tmp_path / "requirements.lock", dist=dists.get)

    read = "RUN V=\"$(sed -n 's/^torch==\\([^ ;]*\\).*/\\1/p' /tmp/requirements.lock)\" \\\n && "
    lock_step = " && python -m pip install --require-hashes --no-deps -r /tmp/requirements.lock\n"
    good = stack_of(read + 'pip install --index-url https://download.pytorch.org/whl/cu130 "torch==${V}"' + lock_step)
    assert good.problems == [] and good.get("torch").version == "2.13.0+cu130"
    no_deps = stack_of(read + 'pip install --no-deps -i https://download.pytorch.org/whl/cu130 "torch==$V"' + lock_step)
    assert any("CUDA build installed with --no-deps" in p for p in no_deps.problems)
    unverified = stack_of("RUN python -m pip install --require-hashes --no-deps -r /tmp/requirements.lock\n")
    assert any("torch==2.13.0 has no hash" in p and "unverified" in p for p in unverified.problems)
    unpinned = stack_of("RUN pip install torch" + lock_step)
    assert any("torch is not pinned" in p for p in unpinned.problems)


# --- the smoke test ----------------------------------------------------------------------------

def test_smoke_module_passes_in_the_venv():
    venv_is_the_locks()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([VENV_PYTHON, "-m", "benchmarks.node.smoke_image"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "image smoke test passed: llama-440m on the meta device: 439,927,808 parameters" in done.stdout
    assert "transformers 5.23.0" in done.stdout


def test_smoke_fails_clearly_on_a_wrong_parameter_count(monkeypatch, capsys):
    venv_is_the_locks()
    from benchmarks.node import smoke_image
    monkeypatch.setitem(smoke_image.EXPECTED_PARAMS, "llama-440m", 439_927_809)
    assert smoke_image.main([]) == 1
    err = capsys.readouterr().err
    assert "image smoke test FAILED: llama-440m built with 439,927,808 parameters, expected 439,927,809" in err
    assert "torch 2.13.0" in err and "deepspeed 0.19.8" in err and "transformers 5.23.0" in err


def test_smoke_fails_clearly_when_transformers_rejects_torch(monkeypatch, capsys):
    venv_is_the_locks()
    import transformers.utils

    from benchmarks.node import smoke_image
    monkeypatch.setattr(transformers.utils, "is_torch_available", lambda: False)
    assert smoke_image.main([]) == 1
    err = capsys.readouterr().err
    assert "transformers does not accept this torch" in err and "torch 2.13.0" in err


def test_the_smoke_reads_the_workload_as_the_harness_plans_it(composed):
    """benchmarks/ never imports harness/: the smoke reads the YAML itself; same ModelSpec."""
    from benchmarks.node.smoke_image import workload_spec
    from harness.plan import model_spec

    assert workload_spec("llama-440m") == model_spec(composed(["workload=llama-440m"]).workload)
