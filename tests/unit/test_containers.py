"""The images (containers/recipes.py: engine detection, the base, the build; wheelhouse.py;
harness/launch/engine.py: what an engine needs on this host) and the hashed lock
(containers/lock.py).

No network and no container engine: engines are probed through a PATH holding fake executables;
PyPI is a fake fetch function. Building and running the image for real is
tests/integration/test_image.py.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import unit_helpers  # noqa: F401  (puts the repository root on sys.path)
from unit_helpers import REPO_ROOT, VENV_PYTHON

from containers import image_stack, lock, recipes, wheelhouse
from harness.launch import engine

LOCK_TEXT = (REPO_ROOT / "requirements.lock").read_text(encoding="utf-8")


def fake_exe(folder: Path, name: str, script: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + script + "\n")
    path.chmod(0o755)
    return path


def run_recipes(*args: str, path: str | None = None) -> subprocess.CompletedProcess:
    """`python -m containers.recipes ARGS` as a user runs it."""
    env = {k: v for k, v in os.environ.items() if k != "CONTAINER_ENGINE"}
    if path is not None:
        env["PATH"] = path
    return subprocess.run([VENV_PYTHON, "-m", "containers.recipes", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def copied(image: str) -> list[tuple[str, str]]:
    """(source, destination) of each COPY of the suite in the Dockerfile."""
    out = []
    for keyword, args in image_stack.instructions(recipes.dockerfile_path(image).read_text()):
        if keyword == "COPY":
            words = args.split()
            out += [(src, words[-1]) for src in words[:-1]]
    return out


@pytest.mark.parametrize("image", recipes.IMAGES)
def test_copies_an_explicit_list_of_the_suite(image):
    pairs = [(s, d) for s, d in copied(image) if d.startswith("/workspace/suite")]
    sources = [s for s, _ in pairs]
    for needed in ("harness", "benchmarks", "contract", "conf", "schemas", "reference_results", "requirements.lock",
                   "pyproject.toml"):
        assert needed in sources, f"{needed} (read by `python -m harness bench`) is not copied into the image"
    for src, dst in pairs:
        assert src not in (".", "./", ".venv", ".git", "results", "build"), f"COPY {src}"
        assert (REPO_ROOT / src).exists(), f"COPY {src}, which is not in the repository"
        if (REPO_ROOT / src).is_dir():  # copied to its own name
            assert dst == f"/workspace/suite/{src}", (src, dst)


def test_every_tracked_top_level_entry_is_copied_or_left_out_on_purpose():
    git = shutil.which("git")
    done = subprocess.run([git or "git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True) if git else None
    if done is None or done.returncode != 0 or not done.stdout:
        pytest.skip("not a git checkout")
    tracked = {line.split("/", 1)[0] for line in done.stdout.splitlines()}
    for image in recipes.IMAGES:
        undecided = tracked - {s for s, _ in copied(image)} - recipes.NOT_IN_IMAGE - recipes.NOT_IN[image]
        assert not undecided, (f"{sorted(undecided)}: COPY into containers/Dockerfile.{image} or add to "
                               "NOT_IN_IMAGE (or NOT_IN) in containers/recipes.py")


@pytest.mark.parametrize("image", recipes.IMAGES)
def test_each_image_carries_its_own_lock(image):
    """The lock an image installs is in it, beside requirements.lock (the harness compares the
    installed packages with that one): the gpu image holds requirements-gpu.lock, the cpu image not."""
    sources = {s for s, d in copied(image) if d.startswith("/workspace/suite")}
    assert wheelhouse.TARGETS[image].lock.name in sources and "requirements.lock" in sources
    assert ("requirements-gpu.lock" in sources) == (image == "gpu")


@pytest.mark.parametrize("image", recipes.IMAGES)
def test_the_base_is_a_build_argument_with_a_pinned_default(image):
    base = recipes.base_arg(recipes.dockerfile_path(image))
    if image == "cpu":   # pullable somewhere: pinned by digest
        assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", base), base
    else:
        assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-devel-ubuntu24\.04", base), base
    text = recipes.dockerfile_path(image).read_text()
    assert "FROM ${BASE_IMAGE}" in text and 'org.opencontainers.image.base.name="${BASE_IMAGE}"' in text


# --- engines ----------------------------------------------------------------------------------

def test_no_engine_on_path_is_reported_engine_by_engine_and_fails(tmp_path):
    (tmp_path / "bin").mkdir()
    choice = recipes.choose_engine(search_path=str(tmp_path / "bin"))
    assert choice.engine is None
    assert [p.describe() for p in choice.probes] == [f"{n}: not found on PATH" for n in recipes.ENGINES]
    assert "no usable container engine; looked for docker, podman" in choice.report()
    done = run_recipes("--image", "cpu", path=str(tmp_path / "bin"))
    assert done.returncode == 2
    assert "error: no usable container engine" in done.stderr and "no image was built" in done.stderr


DOCKER_WITHOUT_DAEMON = """if [ "$1" = info ]; then
  echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?" >&2
  exit 1
fi
echo "Docker version 27.0.0"
"""


def test_docker_cli_without_daemon_is_not_usable(tmp_path):
    docker = fake_exe(tmp_path / "bin", "docker", DOCKER_WITHOUT_DAEMON)
    choice = recipes.choose_engine(search_path=str(tmp_path / "bin"))
    assert choice.engine is None
    probe = {p.name: p for p in choice.probes}["docker"]
    assert not probe.usable and probe.path == str(docker)
    assert probe.describe() == (f"docker: CLI found at {docker} but no daemon answers (`docker info` failed, exit 1: "
                                "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
                                "Is the docker daemon running?)")


def test_first_working_engine_is_chosen(tmp_path):
    fake_exe(tmp_path / "bin", "docker", DOCKER_WITHOUT_DAEMON)
    fake_exe(tmp_path / "bin", "podman", 'echo "host: ok"')
    choice = recipes.choose_engine(search_path=str(tmp_path / "bin"))
    assert choice.engine is not None and choice.engine.name == "podman"


def test_forced_engine_that_does_not_work_fails_loudly(tmp_path):
    fake_exe(tmp_path / "bin", "docker", DOCKER_WITHOUT_DAEMON)
    done = run_recipes("--engine", "docker", path=str(tmp_path / "bin"))
    assert done.returncode == 2
    assert "no daemon answers" in done.stderr and "CONTAINER_ENGINE=docker does not work here" in done.stderr
    done = run_recipes("--engine", "apptainer", path=str(tmp_path / "bin"))
    assert done.returncode == 2 and "valid: docker, podman" in done.stderr


def test_podman_on_hybrid_cgroups_runs_with_runc_and_says_so():
    args = engine.engine_args("podman", hybrid=True, which=lambda name: f"/usr/sbin/{name}")
    assert args.global_args == ["--runtime", "runc"] and args.problem is None
    assert any("hybrid" in n for n in args.notes)
    assert engine.engine_args("podman", hybrid=False).global_args == []
    assert engine.engine_args("docker", hybrid=True).global_args == []   # dockerd picks its own runtime
    missing = engine.engine_args("podman", hybrid=True, which=lambda name: None)
    assert missing.problem and "apt-get install runc" in missing.problem


def test_ulimits_are_this_process_own_and_nproc_within_pid_max():
    args = engine.engine_args("podman", hybrid=False)
    limits = dict(v.split("=", 1) for v in args.limit_args[1::2])
    soft, hard = (int(x) for x in limits["nofile"].split(":"))
    have = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft <= hard and (have[1] == resource.RLIM_INFINITY or hard <= have[1])
    psoft, phard = (int(x) for x in limits["nproc"].split(":"))
    assert psoft <= phard <= engine.pid_max()


def test_the_ranks_podman_command_carries_the_same_quirks():
    from harness.config.choices import ContainerRuntime
    from harness.config.schema import ContainerConfig
    from harness.launch.container import prefix
    c = ContainerConfig(runtime=ContainerRuntime.podman, image="llm-pretrain-bench:cpu")
    cmd = prefix(c, image=c.image, repo_root=REPO_ROOT, out_dir=REPO_ROOT / "results", env_names=["OMP_NUM_THREADS"],
                 cuda=False)
    want = engine.engine_args("podman")
    assert cmd[:1 + len(want.global_args)] == ["podman", *want.global_args]
    joined = " ".join(cmd)
    assert " ".join(want.limit_args) in joined and "--ipc=host" in joined and "--shm-size" not in joined
    assert cmd[-1] == "llm-pretrain-bench:cpu"


# --- the wheelhouse ---------------------------------------------------------------------------

def fake_pypi(versions: dict[str, list[str]]):
    def fetch(url: str):
        name, version = url.removeprefix(lock.PYPI_JSON_URL + "/").split("/")[:2]
        hashes = versions.get(f"{name}=={version}")
        return None if hashes is None else {"urls": [{"digests": {"sha256": h}} for h in hashes]}
    return fetch


def test_a_moved_pin_takes_the_other_release_and_its_hashes():
    text = lock.parse_lock(LOCK_TEXT)
    ds = next(e for e in text if e.name == "deepspeed")
    moved = wheelhouse.moved_lock(LOCK_TEXT, [wheelhouse.Move("deepspeed", "0.19.7")],
                                  fake_pypi({"deepspeed==0.19.7": ["a" * 64]}))
    entries = {e.name: e for e in lock.parse_lock(moved)}
    assert entries["deepspeed"].version == "0.19.7" and entries["deepspeed"].hashes == ("a" * 64,)
    assert ds.version != "0.19.7"
    others = {e.name: e for e in lock.parse_lock(LOCK_TEXT) if e.name != "deepspeed"}
    assert all(entries[n] == e for n, e in others.items()), "only the moved pin changes"


@pytest.mark.parametrize("move,why", [
    ("deepspeed", "expected NAME==VERSION"),
    ("nosuchpackage==1.0", "not pinned in the lock"),
    ("torch==2.12.0", "host-specific"),
    ("deepspeed==0.0.1", "no release 0.0.1|HTTP 404|PyPI"),
])
def test_a_bad_move_is_refused_by_name(move, why):
    with pytest.raises((wheelhouse.WheelhouseError, lock.LockError), match=why):
        wheelhouse.moved_lock(LOCK_TEXT, [wheelhouse.Move.parse(move)], fake_pypi({}))


def test_wheelhouse_names_and_reuse(tmp_path):
    assert wheelhouse.folder_name("cpu", []) == "cpu"
    assert wheelhouse.folder_name("cpu", [wheelhouse.Move("DeepSpeed", "0.19.7")]) == "cpu+deepspeed-0.19.7"
    folder = tmp_path / "cpu"
    folder.mkdir()
    (folder / "x-1.0-py3-none-any.whl").write_bytes(b"abc")
    manifest = {"lock_sha256": "f" * 64, "files": {"x-1.0-py3-none-any.whl": {"size": 3}}}
    (folder / wheelhouse.MANIFEST).write_text(json.dumps(manifest))
    assert wheelhouse.up_to_date(folder, "f" * 64)
    assert not wheelhouse.up_to_date(folder, "e" * 64), "another lock: made again"
    (folder / "x-1.0-py3-none-any.whl").write_bytes(b"abcd")
    assert not wheelhouse.up_to_date(folder, "f" * 64), "a file changed: made again"


@pytest.mark.parametrize("image", recipes.IMAGES)
def test_the_image_check_follows_the_wheelhouse_copy(image):
    """The wheelhouse holds the image's lock's pins: the static check reads torch.txt and
    requirements.txt as the lock's torch line (the cpu image's as the host's +cpu build, the gpu
    image's as the GPU lock pins and hashes it: PyPI's CUDA build) and every other pin."""
    text = wheelhouse.TARGETS[image].lock.read_text(encoding="utf-8")
    files = image_stack.wheelhouse_files(text, "/tmp/wheelhouse", image)
    torch = lock.parse_lock(files["/tmp/wheelhouse/torch.txt"])
    rest = lock.parse_lock(files["/tmp/wheelhouse/requirements.txt"])
    want = next(e for e in lock.parse_lock(text) if e.name == "torch")
    assert [e.name for e in torch] == ["torch"] and torch[0].hashes
    assert torch[0].version == want.version + ("+cpu" if image == "cpu" else "")
    if image == "gpu":
        assert torch[0].hashes == want.hashes, "the GPU lock's own torch hashes"
    assert {e.name for e in rest} == {e.name for e in lock.parse_lock(text)} - {"torch"}


# --- the hashed lock --------------------------------------------------------------------------

def test_committed_lock_hashes_every_pin_but_torch():
    entries = lock.parse_lock(LOCK_TEXT)
    assert len(entries) > 50
    for e in entries:
        if e.name == "torch":
            assert e.hashes == ()
        else:
            assert e.hashes, f"{e.name}=={e.version} has no --hash in requirements.lock; run `make lock`"
            assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in e.hashes), e.name
    lines = LOCK_TEXT.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("torch=="))
    assert not lines[i].endswith("\\") and not lines[i - 1].endswith("\\"), "the torch line must stand alone"


def test_lock_agrees_with_pyproject_pins():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    pinned = {lock.Pin(*d.split("==")).key: d.split("==")[1]
              for d in project["dependencies"] + project["optional-dependencies"]["test"]}
    locked = {lock.Pin(e.name, e.version).key: e.version for e in lock.parse_lock(LOCK_TEXT)}
    assert {k: locked.get(k) for k in pinned} == pinned


@pytest.mark.parametrize("image", recipes.IMAGES)
def test_image_installs_torch_then_the_lock_from_the_wheelhouse_alone(image):
    """Both Dockerfiles install from the wheelhouse only (--no-index: the build needs no network),
    torch first (torch.txt), then every other pin (requirements.txt), each by its file's sha256;
    the wheelhouse is the image's lock, which pins every file by hash but the cpu image's torch."""
    text = recipes.dockerfile_path(image).read_text()
    assert f"ARG WHEELHOUSE=build/wheelhouse/{image}" in text and "COPY ${WHEELHOUSE} /tmp/wheelhouse" in text
    flags = "python -m pip install --no-index --find-links=/tmp/wheelhouse --require-hashes --no-deps -r "
    torch_step = text.index(flags + "/tmp/wheelhouse/torch.txt")
    lock_step = text.index(flags + "/tmp/wheelhouse/requirements.txt")
    assert torch_step < lock_step
    assert "--index-url" not in text and "download.pytorch.org/whl" not in text.split("FROM", 1)[1].split("\n# ", 1)[0]
    unhashed = [e.name for e in lock.parse_lock(wheelhouse.TARGETS[image].lock.read_text()) if not e.hashes]
    assert unhashed == (["torch"] if image == "cpu" else []), \
        "only the cpu image's torch (pinned in the wheelhouse by its file's hash) may lack one in its lock"


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_makefile_installs_torch_from_the_lock_then_the_lock_with_hashes(tmp_path):
    done = subprocess.run(["make", "-n", "venv", f"VENV={tmp_path / 'v'}"], cwd=REPO_ROOT,
                          capture_output=True, text=True, check=True)
    version = next(e.version for e in lock.parse_lock(LOCK_TEXT) if e.name == "torch")
    torch_step = next(ln for ln in done.stdout.splitlines() if "pip install --no-deps" in ln)
    lock_step = next(ln for ln in done.stdout.splitlines() if "-r requirements.lock" in ln)
    assert f'"torch=={version}"' in torch_step
    assert "--require-hashes --no-deps" in lock_step and "DS_BUILD_OPS=0" in lock_step
    assert done.stdout.index(torch_step) < done.stdout.index(lock_step)


def pypi(releases: dict[str, dict[str, list[str]]], version_endpoint: bool = True):
    """A fake fetch: releases = {name: {version: [sha256, ...]}}; None (404) for the unknown."""
    def fetch(url: str):
        parts = url.removeprefix(lock.PYPI_JSON_URL + "/").split("/")
        files = releases.get(parts[0])
        if files is None:
            return None
        if len(parts) == 3:  # name/version/json
            if not version_endpoint or parts[1] not in files:
                return None
            return {"urls": [{"digests": {"sha256": h}} for h in files[parts[1]]]}
        return {"info": {"version": max(files)},
                "releases": {v: [{"digests": {"sha256": h}} for h in hs] for v, hs in files.items()}}
    return fetch


@pytest.mark.parametrize("version_endpoint", [True, False])
def test_lock_lists_every_file_hash_and_none_for_torch(version_endpoint):
    fetch = pypi({"numpy": {"2.4.6": ["b" * 64, "a" * 64, "b" * 64]}, "idna": {"3.20": ["c" * 64]}},
                 version_endpoint)
    pins = lock.parse_freeze("numpy==2.4.6\ntorch==2.13.0+cpu\npip==23.2.1\nidna==3.20\nwheel==0.41\n")
    assert pins == [lock.Pin("idna", "3.20"), lock.Pin("numpy", "2.4.6"), lock.Pin("torch", "2.13.0")]
    text = lock.render(pins, lock.all_hashes(pins, fetch))
    assert text.startswith(lock.HEADER)
    assert f"numpy==2.4.6 \\\n    --hash=sha256:{'a' * 64} \\\n    --hash=sha256:{'b' * 64}\ntorch==2.13.0\n" in text
    assert lock.parse_lock(text) == [lock.LockEntry("idna", "3.20", ("c" * 64,)),
                                     lock.LockEntry("numpy", "2.4.6", ("a" * 64, "b" * 64)),
                                     lock.LockEntry("torch", "2.13.0", ())]


def test_lock_fails_clearly_for_a_package_or_version_not_on_pypi():
    fetch = pypi({"numpy": {"2.4.6": ["a" * 64]}})
    pins = [lock.Pin("numpy", "9.9.9"), lock.Pin("inhouse-tool", "1.0"), lock.Pin("torch", "2.13.0")]
    with pytest.raises(lock.LockError) as e:
        lock.all_hashes(pins, fetch)
    assert "inhouse-tool==1.0: inhouse-tool is not on PyPI" in str(e.value)
    assert "numpy==9.9.9: PyPI has no release 9.9.9 of numpy (latest: 2.4.6)" in str(e.value)


@pytest.mark.parametrize("requires,pins,problems", [
    ({"a": ["b>=1"], "b": []}, {"a": "1", "b": "2"}, []),
    ({"a": ["b>=1"]}, {"a": "1"}, ["a==1 requires b>=1 (Python 3.11, 3.12), which is not in the lock"]),
    ({"a": ["b>=3"], "b": []}, {"a": "1", "b": "2"}, ["a==1 requires b>=3 (Python 3.11, 3.12), but the lock pins b==2"]),
    ({"a": ['b; python_version >= "3.12"']}, {"a": "1"},
     ['a==1 requires b; python_version >= "3.12" (Python 3.12), which is not in the lock']),
    ({"a": ['b; python_version < "3.11"', 'c; extra == "docs"']}, {"a": "1"}, []),
    ({"a": ["b[fast]"], "b": ['c; extra == "fast"']}, {"a": "1", "b": "1"},
     ['b==1[fast] requires c; extra == "fast" (Python 3.11, 3.12), which is not in the lock']),
])
def test_closure_check_for_no_deps_installs(requires, pins, problems):
    pinned = [lock.Pin(n, v) for n, v in pins.items()]
    assert lock.missing_requirements(pinned, lambda name: requires.get(name, [])) == problems


def test_this_venv_is_a_complete_closure_of_the_lock():
    from importlib import metadata

    pins = [lock.Pin(e.name, e.version) for e in lock.parse_lock(LOCK_TEXT)]
    try:
        for p in pins:
            metadata.version(p.name)
    except metadata.PackageNotFoundError as e:
        pytest.skip(f"{e} is not installed here: not the suite's venv")
    assert lock.missing_requirements(pins, lock.installed_requires) == []


# --- Apptainer: the .sif through spython's client (tests/data/fake_apptainer stands in) -----------

FAKE_APPTAINER = REPO_ROOT / "tests" / "data" / "fake_apptainer"


def docker_archive(path: Path, labels: dict[str, str]) -> Path:
    """A docker-archive as `podman save --format docker-archive` writes one (manifest and config only)."""
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, data in (("config.json", {"config": {"Labels": labels}}),
                           ("manifest.json", [{"Config": "config.json", "RepoTags": ["x"], "Layers": []}])):
            raw = json.dumps(data).encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return path


@pytest.fixture
def sif_dirs(tmp_path, monkeypatch):
    """build/containers in tmp_path; PATH: the stand-in apptainer and this venv's python (the stand-in's
    exec runs the smoke command on the host), no docker or podman."""
    from containers import apptainer_def, sif

    monkeypatch.setattr(sif, "SIF_DIR", tmp_path / "sif")
    monkeypatch.setattr(apptainer_def, "DEF_DIR", tmp_path / "defs")
    monkeypatch.setattr(sif, "SMOKE", ["python", "-c", "print('torch 2.13.0+cpu deepspeed 0.19.8')"])
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_APPTAINER_CALLS", str(calls))
    monkeypatch.setenv("PATH", f"{FAKE_APPTAINER}:{Path(VENV_PYTHON).parent}")
    monkeypatch.delenv("CONTAINER_ENGINE", raising=False)
    monkeypatch.delenv("SIF_ROUTE", raising=False)
    return tmp_path, calls


def test_sif_is_converted_from_the_built_image_through_spython(sif_dirs, monkeypatch):
    """Route oci-archive: `podman save --format docker-archive`, then spython's Client.build of
    docker-archive:...: the .sif holds the image's own files, its labels (the lock's sha256) checked,
    its record beside it. Without apptainer: said, nothing saved."""
    from containers import sif
    from containers import apptainer_client as apptainer

    tmp_path, calls = sif_dirs
    lock_sha = "c" * 64
    made = docker_archive(tmp_path / "made.tar", {sif.LOCK_LABEL: lock_sha})
    log = tmp_path / "podman.log"
    podman = fake_exe(tmp_path / "bin", "podman", f'echo "podman $*" >> {log}; '
                      f'while [ $# -gt 0 ]; do [ "$1" = -o ] && /bin/cp {made} "$2"; shift; done')
    eng = recipes.Engine(recipes.EngineProbe("podman", str(podman), True, "answers"), engine.EngineArgs("podman"))
    built = recipes.Built("llm-pretrain-bench:cpu", "sha256:" + "1" * 64, "base", 1.0, 1.0, lock_sha256=lock_sha)
    none = sif.choose_route("podman", apptainer.runtime(search_path=str(tmp_path / "bin")))
    assert none.route is None and "no .sif is made" in none.line()
    said = recipes.to_sif(eng, built, none)
    assert said.startswith("apptainer: not installed here, no .sif made") and built.sif is None
    assert not log.exists(), "nothing is saved when no apptainer can convert it"

    route = sif.choose_route("podman", apptainer.runtime())
    assert route.route == "oci-archive" and route.runtime.version == "apptainer version 1.3.4-fake"
    assert route.line().startswith("sif route: oci-archive: podman builds each image, apptainer: ")
    said = recipes.to_sif(eng, built, route)
    archive = tmp_path / "sif" / "llm-pretrain-bench-cpu.tar"
    final = tmp_path / "sif" / "llm-pretrain-bench-cpu.sif"
    assert log.read_text().splitlines() == [f"podman save --format docker-archive -o {archive} llm-pretrain-bench:cpu"]
    done = [json.loads(line) for line in calls.read_text().splitlines()]
    builds = [c["args"] for c in done if c["action"] == "build"]
    assert builds == [["--force", f"{final}.partial", f"docker-archive:{archive}"]]
    assert [c["action"] for c in done].count("inspect") == 1
    assert final.is_file() and not archive.exists() and not Path(f"{final}.partial").exists()
    record = json.loads((tmp_path / "sif" / "llm-pretrain-bench-cpu.sif.json").read_text())
    assert record["sha256"] == hashlib.sha256(final.read_bytes()).hexdigest()
    assert record["route"] == "oci-archive" and record["image_id"] == built.image_id
    assert record["smoke"] == ["torch 2.13.0+cpu deepspeed 0.19.8"]
    assert f"route oci-archive (from the docker-archive of llm-pretrain-bench:cpu (sha256:111111111111))" in said
    assert "labels: lock sha256 cccccccccccc... (the lock's)" in said and built.sif

    docker_archive(made, {sif.LOCK_LABEL: "d" * 64})   # an image of another lock
    with pytest.raises(sif.SifError, match="but the image's lock has sha256 c"):
        recipes.to_sif(eng, built, route)


def test_an_apptainer_only_site_builds_from_the_definition(sif_dirs, monkeypatch):
    """No docker or podman, apptainer: `make containers` says route def and builds each .sif from the
    definition written from the Dockerfile (spython's Client.build, from the repository root, where
    its %files paths are), then inspects and runs it; the run records name its sha256 and the route."""
    from containers import sif
    from harness.config.choices import ContainerRuntime
    from harness.config.schema import ContainerConfig
    from containers.apptainer_client import Runtime
    from harness.launch.container import image_digest

    tmp_path, calls = sif_dirs
    house = tmp_path / "wheelhouse" / "cpu"
    house.mkdir(parents=True)
    lock_sha = hashlib.sha256(LOCK_TEXT.encode()).hexdigest()
    (house / wheelhouse.MANIFEST).write_text(json.dumps({"lock_sha256": lock_sha}))
    monkeypatch.setattr(wheelhouse, "ensure", lambda image, moves, lock, torch_index_url=None: house)
    assert recipes.choose_engine().engine is None, "an engine on this PATH: the test would build with it"
    out = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: out.append(" ".join(map(str, a))))
    assert recipes.main(["--image", "cpu"]) == 0, "\n".join(out)
    said = "\n".join(out)
    assert "docker: not found on PATH" in said and "podman: not found on PATH" in said
    assert "sif route: def (no container engine works here): apptainer: " in said
    final = tmp_path / "sif" / "llm-pretrain-bench-cpu.sif"
    definition = tmp_path / "defs" / "llm-pretrain-bench-cpu.def"
    build = next(json.loads(c) for c in calls.read_text().splitlines() if '"build"' in c)
    assert build["args"] == ["--force", f"{final}.partial", str(definition)] and build["cwd"] == str(REPO_ROOT)
    assert f"{house} /opt/wheelhouse" in definition.read_text()
    record = json.loads(Path(f"{final}.json").read_text())
    digest = hashlib.sha256(final.read_bytes()).hexdigest()
    assert record["route"] == "def" and record["sha256"] == digest and record["lock_sha256"] == lock_sha
    assert record["labels"]["llm-pretrain-bench.sif.route"] == "def"
    assert f"route def (from {definition})" in said and "(the lock's)" in said

    c = ContainerConfig(runtime=ContainerRuntime.apptainer, image=str(final))
    assert image_digest(c, str(final), tmp_path / "cache") == f"sha256:{digest} (route: def)"
    monkeypatch.setenv("FAKE_APPTAINER_FAIL", "build")
    out.clear()
    assert recipes.main(["--image", "cpu"]) == 1
    assert final.read_bytes() and not Path(f"{final}.partial").exists(), "a failed build leaves the old .sif"
    with pytest.raises(sif.SifError, match="--env MALLOC_ARENA_MAX=2: adds ENV on top of an engine's image"):
        sif.from_definition(Runtime("apptainer", str(FAKE_APPTAINER / "apptainer"), "1.3.4"), "cpu",
                            env=["MALLOC_ARENA_MAX=2"])


def test_neither_engine_nor_apptainer_says_what_is_missing(tmp_path):
    (tmp_path / "bin").mkdir()
    done = run_recipes("--image", "cpu", path=str(tmp_path / "bin"))
    assert done.returncode == 2
    assert "error: no usable container engine" in done.stderr
    assert "neither apptainer nor singularity is on PATH, so the definitions cannot be built here" in done.stderr
    done = run_recipes("--route", "def", path=str(tmp_path / "bin"))
    assert done.returncode == 2 and "--route def: neither apptainer nor singularity is on PATH" in done.stderr


def test_an_engine_that_builds_but_cannot_run_fails_and_a_missing_gpu_base_is_a_skip(tmp_path, monkeypatch):
    """Without --image, a gpu image whose base cannot be had is skipped (exit 0, the reason said); a
    failure of the engine itself is an error whatever was asked."""
    podman = fake_exe(tmp_path / "bin", "podman", 'case "$1" in info) echo ok;; *) echo "Error: runc create failed" >&2; exit 125;; esac')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    calls = []

    def fake_build(engine_, image, moves, env, extra):
        calls.append(image)
        if image == "gpu":
            raise recipes.BaseUnavailable("the gpu image's base nvidia/cuda:... cannot be pulled here")
        raise recipes.RecipeError(f"{engine_.name} built llm-pretrain-bench:cpu but cannot run it: runc create failed")

    monkeypatch.setattr(recipes, "build_image", fake_build)
    monkeypatch.setattr(recipes, "engine_args", lambda name: engine.EngineArgs(name))
    assert recipes.main(["--engine", "podman"]) == 1 and calls == ["cpu", "gpu"]
    built = recipes.Built("llm-pretrain-bench:cpu", "sha256:" + "2" * 64, "base", 1.0, 1.0)
    monkeypatch.setattr(recipes, "build_image", lambda *a: fake_build(*a) if a[1] == "gpu" else built)
    monkeypatch.setattr(recipes, "to_sif", lambda *a, **k: "apptainer: not installed here")
    monkeypatch.setattr(recipes.apptainer, "runtime", lambda: None)
    assert recipes.main(["--engine", "podman"]) == 0, "the gpu image's missing base is a skip"
    assert recipes.main(["--engine", "podman", "--image", "gpu"]) == 1, "asked for by name: an error"
    assert podman.exists()


def test_podman_without_its_init_binary_is_said_before_any_rank_runs(tmp_path):
    """apt-get install --no-install-recommends podman leaves catatonit out; every rank then exited 125
    ("container-init binary not found on the host"). The init path is podman's default unless a
    containers.conf sets engine.init_path, the later file winning; docker needs nothing."""
    system = tmp_path / "containers.conf"
    system.write_text('[engine]\ninit_path = "/nowhere/catatonit"\n')
    assert engine.podman_init_path([tmp_path / "absent.conf"]) == engine.PODMAN_INIT
    assert engine.podman_init_path([system]) == "/nowhere/catatonit"
    found = tmp_path / "catatonit"
    found.write_text("")
    user = tmp_path / "user.conf"
    user.write_text(f'[engine]\ninit_path = "{found}"\n')
    assert engine.init_problem("podman", [system, user]) is None
    problem = engine.init_problem("podman", [user, system])
    assert problem and "/nowhere/catatonit" in problem and "apt-get install catatonit" in problem
    assert engine.init_problem("docker", [system]) is None


def test_the_bench_stops_naming_the_missing_init_before_launching(monkeypatch):
    from harness.config.choices import ContainerRuntime
    from harness.config.schema import ContainerConfig
    from harness.errors import HarnessError
    from harness.launch import container

    monkeypatch.setattr(container.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(container, "init_problem", lambda name: "its init binary /x is not on this host")
    c = ContainerConfig(runtime=ContainerRuntime.podman, image="llm-pretrain-bench:cpu")
    with pytest.raises(HarnessError, match="runtime='podman': its init binary /x is not on this host"):
        container.check_image(c, c.image, local_runtime=True)
    container.check_image(c, c.image, local_runtime=False)   # under Slurm the compute nodes are not this host


@pytest.mark.parametrize("image", ["cpu", "gpu"])
def test_the_ops_are_built_before_the_suite_is_copied_from_only_what_builds_them(image):
    """DeepSpeed's ops layer comes before the suite's COPY lines, so that an edit of the suite does not
    rebuild them (about 40 s of g++ on 2 cores): it may copy only benchmarks/node/ops.py and its
    packages, and that module may import nothing of the suite (only the standard library and deepspeed)."""
    import ast
    import sys

    steps = image_stack.instructions(recipes.dockerfile_path(image).read_text(encoding="utf-8"))
    build = next(i for i, (k, a) in enumerate(steps) if k == "RUN" and "benchmarks.node.ops build" in a)
    suite = next(i for i, (k, a) in enumerate(steps) if k == "COPY" and a.startswith("harness "))
    assert build < suite
    early = [w for k, a in steps[:build] if k == "COPY" and not a.startswith("${WHEELHOUSE}") for w in a.split()[:-1]]
    assert sorted(early) == ["benchmarks/__init__.py", "benchmarks/node/__init__.py", "benchmarks/node/ops.py"]
    tree = ast.parse((REPO_ROOT / "benchmarks/node/ops.py").read_text(encoding="utf-8"))
    imported = {(n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
                for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and not getattr(n, "level", 0)
                for a in (n.names if isinstance(n, ast.Import) else [n])}
    assert imported - set(sys.stdlib_module_names) - {"__future__"} == {"deepspeed"}, imported
