"""The Apptainer .sif of each image (`make containers`), built through spython's client
(containers/apptainer_client.py) by one of two routes, chosen by what works here:

- oci-archive (docker or podman, and apptainer): the engine built the OCI image; `ENGINE save
  --format docker-archive`, then `apptainer build X.sif docker-archive:...`: the .sif holds the
  OCI image's own files.
- def (apptainer, no engine: an Apptainer-only site): `apptainer build X.sif X.def` from the
  definition containers/apptainer_def.py writes from the same Dockerfile, with the same wheelhouse
  (`python -m containers.wheelhouse`, on the host, every hash checked).

Either way the .sif is then inspected (its labels must name the image's lock sha256), run once
(`python -c "import torch, deepspeed"`), moved into place, and recorded beside it in <sif>.json:
its sha256, the route and what it was built from (the run records name both: container_digest
`sha256:<hex> (route: def)`)."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional, Sequence

from containers import apptainer_def, wheelhouse
from containers.lock import REPO_ROOT, write_text_atomic
from containers.apptainer_client import ApptainerError, Runtime, build, execute, inspect
from harness.launch.container import ROUTE_LABEL, ROUTES, record_path

if TYPE_CHECKING:   # containers/recipes.py's, which imports this module
    from containers.recipes import Engine

SIF_DIR = REPO_ROOT / "build" / "containers"
IMAGE_NAME = "llm-pretrain-bench"
LOCK_LABEL = "llm-pretrain-bench.lock.sha256"
SMOKE = ["python", "-c", "import torch, deepspeed; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__)"]


class SifError(Exception):
    """A .sif cannot be made here; the message says why."""


@dataclass(frozen=True)
class RouteChoice:
    route: Optional[str]
    """def, oci-archive, or None: no .sif is made."""
    runtime: Optional[Runtime]
    engine: Optional[str]
    forced: bool = False

    def line(self) -> str:
        rt = self.runtime.describe() if self.runtime else None
        if self.route == "oci-archive":
            return (f"sif route: oci-archive: {self.engine} builds each image, {rt} converts its docker-archive "
                    "into the .sif" + (" (--route oci-archive)" if self.forced else ""))
        if self.route == "def":
            why = "--route def" if self.forced else "no container engine works here"
            return (f"sif route: def ({why}): {rt} builds each image from its definition "
                    f"({_rel(apptainer_def.def_path('<image>'))}, written from containers/Dockerfile.<image>)")
        if self.engine:
            return (f"sif route: none: neither apptainer nor singularity is on PATH, so {self.engine} builds the OCI "
                    "images and no .sif is made")
        return ("apptainer: neither apptainer nor singularity is on PATH, so the definitions cannot be built here "
                "either (an Apptainer-only site: docs/clusters.md, \"Apptainer-only sites\")")


def choose_route(engine: Optional[str], runtime: Optional[Runtime], forced: Optional[str] = None) -> RouteChoice:
    """oci-archive where an engine and a runtime work, def where only a runtime does, None otherwise;
    `forced` (--route) that cannot be taken here is an error."""
    if forced is not None:
        if forced not in ROUTES:
            raise SifError(f"--route {forced!r}: valid: {', '.join(ROUTES)}")
        if runtime is None:
            raise SifError(f"--route {forced}: neither apptainer nor singularity is on PATH")
        if forced == "oci-archive" and engine is None:
            raise SifError("--route oci-archive: no container engine works here to build the OCI image")
        return RouteChoice(forced, runtime, engine, forced=True)
    if runtime is None:
        return RouteChoice(None, None, engine)
    return RouteChoice("oci-archive" if engine else "def", runtime, engine)


def sif_path(name: str) -> Path:
    """build/containers/llm-pretrain-bench-<name>.sif (the path the platform configs use)."""
    return SIF_DIR / f"{IMAGE_NAME}-{name}.sif"


def _rel(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


@dataclass(frozen=True)
class SifBuilt:
    path: Path
    sha256: str
    route: str
    source: str
    labels_note: str

    def line(self) -> str:
        return (f"sif {_rel(self.path)}: sha256 {self.sha256[:12]}..., route {self.route} (from {self.source}); "
                f"{self.labels_note}")


@contextmanager
def _in_repository() -> Iterator[None]:
    """A definition's %files paths are relative to the directory apptainer runs in: the repository's."""
    old = os.getcwd()
    os.chdir(REPO_ROOT)
    try:
        yield
    finally:
        os.chdir(old)


def from_definition(rt: Runtime, image: str, moves: Sequence[wheelhouse.Move] = (), env: Sequence[str] = (),
                    cpu_base: str = "docker") -> SifBuilt:
    """The def route: the wheelhouse, the definition (written for this wheelhouse and its lock), the build."""
    if env:
        raise SifError(f"--env {env[0]}: adds ENV on top of an engine's image; the def route builds no OCI image "
                       "(add the variable to the Dockerfile, or pass it at run time)")
    house = wheelhouse.ensure(image, moves, wheelhouse.TARGETS[image].lock,
                              torch_index_url=os.environ.get("TORCH_INDEX_URL") or None)
    lock_sha = json.loads((house / wheelhouse.MANIFEST).read_text(encoding="utf-8"))["lock_sha256"]
    name = wheelhouse.folder_name(image, moves).replace("+", "-")
    try:
        defn = apptainer_def.generate(image, cpu_base=cpu_base, wheelhouse=house, lock_sha=lock_sha)
    except apptainer_def.DefinitionError as e:
        raise SifError(str(e)) from None
    path = apptainer_def.write(defn, apptainer_def.def_path(name))
    print(f"definition {_rel(path)}: {len(defn.adapted)} instructions adapted (its header lists them)", flush=True)
    final = sif_path(name)
    partial = _partial(final)
    try:
        with _in_repository():
            build(rt, _rel(path), partial)
    except ApptainerError as e:
        raise SifError(str(e)) from None
    return finish(rt, partial, final, "def", _rel(path), lock_sha, {"definition_sha256": _sha256(path)})


def from_archive(rt: Runtime, engine: "Engine", tag: str, image_id: str, lock_sha: Optional[str]) -> SifBuilt:
    """The oci-archive route: the engine's image saved as a docker-archive, converted by apptainer."""
    name = tag.split(":", 1)[1]
    archive = SIF_DIR / f"{IMAGE_NAME}-{name}.tar"
    SIF_DIR.mkdir(parents=True, exist_ok=True)
    if engine.run("save", "--format", "docker-archive", "-o", str(archive), tag, stream=True).returncode != 0:
        raise SifError(f"{engine.name} save of {tag} failed")
    final = sif_path(name)
    partial = _partial(final)
    try:
        build(rt, f"docker-archive:{archive}", partial)
    except ApptainerError as e:
        raise SifError(str(e)) from None
    finally:
        archive.unlink(missing_ok=True)
    return finish(rt, partial, final, "oci-archive", f"the docker-archive of {tag} ({image_id[:19]})", lock_sha,
                  {"image": tag, "image_id": image_id})


def _partial(final: Path) -> Path:
    """Where apptainer writes: a build that fails leaves no .sif under the name the platforms use."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return final.with_name(final.name + ".partial")


def finish(rt: Runtime, partial: Path, final: Path, route: str, source: str, lock_sha: Optional[str],
           extra: dict) -> SifBuilt:
    """Inspect (the lock label), a smoke run, then the .sif moved into place and its record written."""
    if not partial.is_file():
        raise SifError(f"{rt.name} build reported success but wrote no {_rel(partial)}")
    try:
        labels = inspect(rt, partial).get("labels") or {}
        status, output = execute(rt, partial, SMOKE)
    except ApptainerError as e:
        raise SifError(str(e)) from None
    said = labels.get(LOCK_LABEL)
    if lock_sha and said and said != lock_sha:
        raise SifError(f"{_rel(partial)}: label {LOCK_LABEL}={said}, but the image's lock has sha256 {lock_sha}")
    note = (f"labels: lock sha256 {said[:12]}... (the lock's)" if said and said == lock_sha else
            f"labels: no {LOCK_LABEL} (the image it came from has none)" if not said else
            f"labels: lock sha256 {said[:12]}...")
    if route == "def" and labels.get(ROUTE_LABEL) != "def":
        note += f"; no {ROUTE_LABEL} label (the record says the route)"
    if status != 0:
        lines = [ln for ln in output.splitlines() if ln.strip()]
        raise SifError(f"{rt.name} built {_rel(partial)} but cannot run it: {lines[-1] if lines else f'exit {status}'}")
    os.replace(partial, final)
    digest = _sha256(final)
    record = {"sif": _rel(final), "sha256": digest, "route": route, "source": source, "lock_sha256": lock_sha,
              "runtime": rt.version, "labels": labels, "smoke": output.strip().splitlines()[-1:] or None,
              "built": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), **extra}
    write_text_atomic(record_path(final), json.dumps(record, indent=1, sort_keys=True) + "\n")
    return SifBuilt(final, digest, route, source, note)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
