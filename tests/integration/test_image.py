"""The cpu image built for real and the smoke suite run with its ranks inside it.

`make containers` builds the image with podman from the wheelhouse (the local debootstrap base
where the pinned base cannot be pulled, as here); a second build of the same lock reuses the
installed stack from the engine's layer cache. Then `python -m harness bench` runs the smoke
suite with platform.container.runtime=podman: each rank in the image, the records on the host,
each naming the image and its id. Packages missing (podman, runc, debootstrap) are installed as
root, as the Slurm tests install Slurm; without a working engine the tests skip with the reason
(fail under CI=true).
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Optional

import pytest

from containers import recipes
from testbed import system

from . import background
from .conftest import require_or_skip

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = str(REPO_ROOT / ".venv" / "bin" / "python")
BINARIES = {"podman": "podman", "runc": "runc", "debootstrap": "debootstrap", "catatonit": "catatonit"}
"""catatonit: podman's --init, which the ranks run under; Debian only recommends it, and the install leaves
recommends out."""
TAG = "llm-pretrain-bench:cpu"
BUILD_JOB = "image"


def prepare() -> tuple[Optional[str], Optional[str]]:
    """podman usable here, its packages installed as root when missing: (its path, None), or (None, why not)."""
    missing = system.missing_packages(BINARIES)
    if missing:
        try:
            system.install_packages(missing, BINARIES)
        except system.Unavailable as e:
            return None, f"no container engine: {e}"
    found = recipes.probe("podman")
    if not found.usable:
        return None, f"podman does not work here: {found.detail}"
    return found.path, None


def make_containers() -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    done = subprocess.run(["make", "containers", "CONTAINER_IMAGES=cpu", "CONTAINER_ENGINE=podman"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=1800)
    return done, time.monotonic() - t0


def first_build() -> tuple[Optional[str], Optional[str], Optional[tuple[subprocess.CompletedProcess, float]]]:
    """podman prepared, then the first `make containers`: (podman, why not, the build and its seconds).
    conftest.py starts it in the background with the first module that measures nothing, after every
    module that measures (tests/integration/background.py): it waits on apt, debootstrap and the disk
    more than on the CPU, so it runs beside the tests that measure nothing."""
    path, why = prepare()
    return path, why, (make_containers() if path else None)


@pytest.fixture(scope="module")
def first() -> tuple:
    return background.result(BUILD_JOB, first_build)


@pytest.fixture(scope="module")
def podman(first) -> str:
    path, why, _ = first
    if path is None:
        require_or_skip(why)
    return path


@pytest.fixture(scope="module")
def built(podman, first):
    first_done, first_s = first[2]
    assert first_done.returncode == 0, first_done.stdout[-3000:] + first_done.stderr[-3000:]
    second, second_s = make_containers()
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    print(f"make containers: {first_s:.0f} s (in the background), again {second_s:.0f} s")
    return first_done, second

def inspect(podman: str, fmt: str) -> str:
    return subprocess.run([podman, "image", "inspect", "--format", fmt, TAG], capture_output=True, text=True,
                          check=True).stdout.strip()

def test_the_image_is_built_offline_from_the_wheelhouse_and_says_its_base(built, podman):
    first, second = built
    assert f"built {TAG}" in first.stdout
    lock_sha = json.loads((REPO_ROOT / "build/wheelhouse/cpu/MANIFEST.json").read_text())["lock_sha256"]
    assert inspect(podman, '{{index .Labels "llm-pretrain-bench.lock.sha256"}}') == lock_sha
    base = inspect(podman, '{{index .Labels "org.opencontainers.image.base.name"}}')
    assert base in (recipes.base_arg(recipes.dockerfile_path("cpu")), "localhost/llm-pretrain-bench-base:bookworm")
    # the same lock again: the wheelhouse is reused and the installed stack comes from the layer cache
    assert "wheelhouse" in second.stdout and "up to date" in second.stdout
    install = second.stdout.index("--find-links=/tmp/wheelhouse")
    assert "Using cache" in second.stdout[install:install + 2000], "the pip install step was run again"

def test_the_smoke_suite_runs_with_its_ranks_in_the_image(built, podman, tmp_path):
    out = tmp_path / "smoke"
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    done = subprocess.run([VENV_PYTHON, "-m", "harness", "bench", "confirm_regressions=0", "platform=cpu", "suite=smoke",
                           "platform.container.runtime=podman", f"platform.container.image={TAG}", f"out={out}"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode in (0, 3), done.stdout[-3000:] + done.stderr[-3000:]   # 3: a verdict, not a failure
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.name != "suite.json"]
    assert len(records) == 2
    image_id = inspect(podman, "{{.Id}}")
    image_python = subprocess.run([podman, *recipes.Engine(recipes.probe("podman")).args.global_args, "run", "--rm",
                                   *recipes.Engine(recipes.probe("podman")).args.limit_args, TAG, "python", "-c",
                                   "import platform; print(platform.python_version())"],
                                  capture_output=True, text=True, check=True).stdout.strip()
    for r in records:
        assert r["status"] == "ok", r.get("error")
        env_ = r["environment"]
        assert env_["container_image"] == TAG and env_["container_runtime"] == "podman"
        assert env_["container_digest"].removeprefix("sha256:") == image_id.removeprefix("sha256:")
        assert env_["python"] == image_python, "the ranks ran the image's Python, not the host's"
        assert env_["lock_mismatches"] == {}, "the image holds exactly the lock"
        if r["kind"] == "training":   # the ranks' run-queue wait read inside the container (its /proc's schedstat)
            assert isinstance(r["environment"]["load"]["wait_cpus"], (int, float)), r["environment"]["load"]
