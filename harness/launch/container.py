"""Running ranks inside the suite's image: the wrapper command, the image's digest, and checks
made before anything launches (ImageDigests, which planning asks).

The repository and the output folder are mounted at the same paths inside the container, so a
rank's `--run-dir` and PYTHONPATH mean the same thing on both sides. Apptainer passes the
launching environment through (the run's variables, and Slurm's); docker and podman get each
variable by name (`-e NAME`), its value taken from the launching process.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

from contract.fingerprint import DIGEST_VAR, IMAGE_VAR, RUNTIME_VAR

from ..atomic import write_bytes_atomic
from ..config.choices import ContainerRuntime
from ..config.schema import ContainerConfig
from ..errors import HarnessError
from .engine import engine_args, init_problem

ROUTES = ("def", "oci-archive")
"""How the suite built a .sif: from the definition written from the Dockerfile (containers/apptainer_def.py),
or converted from the docker-archive of the image docker or podman built (containers/sif.py)."""
ROUTE_LABEL = "llm-pretrain-bench.sif.route"
"""The label of a .sif built from the suite's definition (value: def)."""
RECORD_SUFFIX = ".json"
"""Beside each .sif the suite builds: <sif>.json, its sha256, route and source (containers/sif.py)."""
SLURM_VARS = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
              "SLURM_PROCID", "SLURM_NODEID")
"""Passed into docker/podman containers so that ranks under Slurm still see their job."""


def is_uri(image: str) -> bool:
    return "://" in image


def resolve_image(c: ContainerConfig, repo_root: Path) -> str:
    """An apptainer image path made absolute (relative paths are the repository's); URIs and
    docker references as given."""
    assert c.image is not None
    if c.runtime == ContainerRuntime.apptainer and not is_uri(c.image):
        path = Path(c.image).expanduser()
        return str(path if path.is_absolute() else repo_root / path)
    return c.image


def _mounts(c: ContainerConfig, repo_root: Path, out_dir: Path) -> list[str]:
    mounts = [str(repo_root)]
    if not Path(out_dir).resolve().is_relative_to(repo_root):
        mounts.append(str(out_dir))
    return mounts + list(c.binds)


def in_image(argv: list[str], c: ContainerConfig) -> list[str]:
    """A rank command as it runs inside the image: the host interpreter becomes the image's."""
    return [c.python if argv[0] == sys.executable else argv[0], *argv[1:]]


def prefix(c: ContainerConfig, *, image: str, repo_root: Path, out_dir: Path, env_names: list[str],
           cuda: bool, name: Optional[str] = None) -> list[str]:
    """The runtime's command up to and including the image; the command to run follows it."""
    mounts = _mounts(c, repo_root, out_dir)
    if c.runtime == ContainerRuntime.apptainer:
        cmd = ["apptainer", "exec"] + (["--nv"] if cuda else [])
        for m in mounts:
            cmd += ["--bind", m]
        return cmd + ["--pwd", str(repo_root), *c.options, image]
    quirks = engine_args(c.runtime.value)   # runc on hybrid cgroups, ulimits within the host's (engine.py)
    cmd = [c.runtime.value, *quirks.global_args, "run", "--rm", "--init", "--network=host", "--ipc=host",
           *quirks.limit_args] + (["--gpus", "all"] if cuda else [])
    if name:
        cmd += ["--name", name]
    for m in mounts:
        cmd += ["-v", m if ":" in m else f"{m}:{m}"]
    cmd += ["-w", str(repo_root)]
    for var in sorted(set(env_names) - {"PATH"}):
        cmd += ["-e", var]
    return cmd + [*c.options, image]


def container_env(c: ContainerConfig, image: str, digest: Optional[str]) -> dict[str, str]:
    """What the ranks are told about their image (the fingerprint records it)."""
    env = {IMAGE_VAR: image, RUNTIME_VAR: c.runtime.value}
    if digest:
        env[DIGEST_VAR] = digest
    return env


def check_image(c: ContainerConfig, image: str, local_runtime: bool) -> None:
    """Before launch: a local .sif must exist; with the local launcher the runtime must be on PATH
    (under Slurm it is looked for on the compute nodes)."""
    if c.runtime == ContainerRuntime.apptainer and not is_uri(image) and not Path(image).is_file():
        raise HarnessError(f"platform.container.image={c.image!r}: no image at {image}; build it with "
                           "`make containers` (or pull it: apptainer pull IMAGE.sif docker://...)")
    if local_runtime and shutil.which(c.runtime.value) is None:
        raise HarnessError(f"platform.container.runtime={c.runtime.value!r} but `{c.runtime.value}` is not "
                           "on PATH; install it or set platform.container.runtime=none")
    problem = init_problem(c.runtime.value) if local_runtime else None
    if problem:
        raise HarnessError(f"platform.container.runtime={c.runtime.value!r}: {problem}")


def image_digest(c: ContainerConfig, image: str, cache_dir: Path) -> Optional[str]:
    """sha256 of a .sif file (cached by path, size and mtime), or the image id docker/podman report;
    None when it cannot be known here (a URI not pulled yet, no engine). A .sif whose record beside it
    (built_route) names these bytes is named with its route: `sha256:<hex> (route: def)` or
    `(route: oci-archive)`."""
    if c.runtime == ContainerRuntime.apptainer:
        path = Path(image)
        if is_uri(image) or not path.is_file():
            return None
        st = path.stat()
        key = f"{path}|{st.st_size}|{st.st_mtime_ns}"
        cache = cache_dir / "container-digests.json"
        try:
            known = json.loads(cache.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            known = {}
        if key not in known:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):
                    h.update(block)
            known[key] = f"sha256:{h.hexdigest()}"
            cache_dir.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(cache, json.dumps(known, indent=1).encode())
        route = built_route(path, known[key].removeprefix("sha256:"))
        return f"{known[key]} (route: {route})" if route else known[key]
    try:
        out = subprocess.run([c.runtime.value, "image", "inspect", "--format", "{{.Id}}", image],
                             capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def record_path(sif: Path) -> Path:
    return Path(str(sif) + RECORD_SUFFIX)


def built_route(sif: Path, sha256_hex: str) -> Optional[str]:
    """The route of the .sif whose sha256 is `sha256_hex`, as its record says (`make containers` writes
    it, containers/sif.py); None without a record, or when the record is of other bytes (the .sif was
    replaced, or the record copied beside another)."""
    try:
        rec = json.loads(record_path(sif).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(rec, dict) and rec.get("sha256") == sha256_hex and rec.get("route") in ROUTES
    return rec["route"] if ok else None


class ImageDigests:
    """The container images of what is being planned: each checked once (check_image) the first
    time a run asks for it, and its digest (image_digest) handed to planning, which tells the ranks.
    `dry_run`: a failed check is printed as a note instead of stopping."""

    def __init__(self, cache_dir: Path, dry_run: bool = False):
        self.cache_dir, self.dry_run = cache_dir, dry_run
        self.known: dict[str, Optional[str]] = {}

    def digest(self, c: ContainerConfig, image: str, local_runtime: bool) -> Optional[str]:
        """The image's digest, None when it cannot be known here; checked before its first answer."""
        if image not in self.known:
            try:
                check_image(c, image, local_runtime=local_runtime)
            except HarnessError as exc:
                if not self.dry_run:
                    raise
                print(f"note (dry run): {exc}")
            self.known[image] = image_digest(c, image, self.cache_dir)
        return self.known[image]


def stop_containers(c: ContainerConfig, names: list[str]) -> None:
    """Remove docker/podman containers left by killed clients (killing the client does not stop
    its container)."""
    if c.runtime in (ContainerRuntime.docker, ContainerRuntime.podman) and names:
        subprocess.run([c.runtime.value, "rm", "-f", *names], capture_output=True, timeout=60)


class Wrapper:
    """Wraps rank commands for one platform's image (what the launchers call)."""

    def __init__(self, c: ContainerConfig, image: str, repo_root: Path, out_dir: Path, cuda: bool):
        self.c, self.image, self.repo_root, self.out_dir, self.cuda = c, image, repo_root, out_dir, cuda

    def __call__(self, argv: list[str], env_names: list[str], name: Optional[str] = None) -> list[str]:
        """`argv` run inside the image."""
        return prefix(self.c, image=self.image, repo_root=self.repo_root, out_dir=self.out_dir,
                      env_names=env_names, cuda=self.cuda, name=name) + in_image(argv, self.c)

    def cleanup(self, names: list[str]) -> None:
        stop_containers(self.c, names)
