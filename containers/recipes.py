"""`make containers`: the suite's images built for real, with docker or podman, from a wheelhouse
(no network in the build), on a base pinned by digest or made here; then an Apptainer .sif
converted from each built image where apptainer exists.

For each image (cpu, gpu; containers/Dockerfile.<image>):
1. the engine: docker or podman, the first whose `info` answers (`--engine`/CONTAINER_ENGINE
   forces one), with what it needs on this host (harness/launch/engine.py: runc on hybrid
   cgroups, explicit ulimits). None that works: one message per engine, exit 2.
2. the base: the Dockerfile's pinned BASE_IMAGE when the engine has it or can pull it; else, for
   the cpu image, the local debootstrap base (containers/base_image.py, made when missing); the
   gpu image's CUDA base has no local stand-in, so it is not built and the reason is printed (an
   error, exit 1, when the image was asked for with --image).
3. the wheelhouse (containers/wheelhouse.py): every file of the image's lock, the one the venv of
   its kind installs too (cpu: requirements.lock, gpu: requirements-gpu.lock), hash-checked on the host.
4. `ENGINE build --build-arg BASE_IMAGE=... --build-arg LOCK_SHA256=... --build-arg WHEELHOUSE=...
   -t llm-pretrain-bench:<image>`, labelled and also tagged with that lock's sha256 (from the
   wheelhouse's MANIFEST: `<image>-lock<12 hex>`); the engine's layer cache makes a second build of
   the same lock on one machine reuse the installed stack (seconds).
5. a smoke run of the built image (`python -c "import torch, deepspeed"`): an engine that builds
   but cannot run stops here with its message.
6. apptainer/singularity on PATH (containers/sif.py, through spython's client): `ENGINE save
   --format docker-archive`, then `apptainer build IMAGE.sif docker-archive:...` (route oci-archive),
   so the .sif holds the same files; not on PATH: said, and nothing else.

No engine that works but apptainer (an Apptainer-only site): route def, each image's .sif built
by apptainer from the definition containers/apptainer_def.py writes from its Dockerfile, with the
same wheelhouse (steps 3, then 6). The route chosen is printed first; --route forces one.

--move NAME==VERSION builds the same recipe with that pin moved (a second image of a real library
change: tag <image>-name-version); --env NAME=VALUE adds `ENV NAME=VALUE` on top of the built image
(tag <image>-env-name-value): what an admin's edit of the image's environment would be."""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from containers import apptainer_client as apptainer
from containers import apptainer_def, base_image, sif, wheelhouse
from containers.lock import REPO_ROOT
from harness.launch.container import ROUTES
from harness.launch.engine import ENGINES, EngineArgs, engine_args

CONTAINERS_DIR = REPO_ROOT / "containers"
IMAGES = ("cpu", "gpu")
IMAGE_NAME = "llm-pretrain-bench"
SIF_DIR = sif.SIF_DIR
"""Built .sif files and docker archives: build/containers/llm-pretrain-bench-<tag>.sif (the path the
platform configs use)."""
NOT_IN_IMAGE = frozenset({".ci", ".dockerignore", ".gitignore", "Makefile", "containers", "docs"})
"""Top-level entries of the repository the Dockerfiles deliberately leave out of the images;
every other tracked entry must be COPY'd (tests/unit/test_containers.py checks)."""
NOT_IN = {"cpu": frozenset({"requirements-gpu.lock"}), "gpu": frozenset()}
"""Left out of one image: the cpu image installs requirements.lock, not the GPU lock (the gpu image
copies both: its own, and requirements.lock for the harness's lock comparison)."""
PROBE_TIMEOUT_S = 20.0
PULL_TIMEOUT_S = 120.0


class RecipeError(Exception):
    """An image cannot be built here; the message says why."""


class BaseUnavailable(RecipeError):
    """The image's base cannot be had here and has no local stand-in (the gpu image without a registry):
    skipped unless the image was asked for by name."""


def dockerfile_path(image: str) -> Path:
    return CONTAINERS_DIR / f"Dockerfile.{image}"


def docker_tag(image: str) -> str:
    return f"{IMAGE_NAME}:{image}"


def sif_path(tag: str) -> Path:
    return sif.sif_path(tag)


def _rel(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def base_arg(dockerfile: Path) -> str:
    """The default of the Dockerfile's `ARG BASE_IMAGE=` (its pinned base)."""
    m = re.search(r"^ARG BASE_IMAGE=(\S+)", dockerfile.read_text(encoding="utf-8"), flags=re.M)
    if m is None:
        raise RecipeError(f"{_rel(dockerfile)}: no `ARG BASE_IMAGE=<pinned base>` before its FROM")
    return m[1]


# --- engines -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class EngineProbe:
    name: str
    path: Optional[str]
    """Where the CLI is; None when it is not on PATH."""
    usable: bool
    detail: str
    """The version line when usable, else why not."""

    def describe(self) -> str:
        return f"{self.name}: {self.detail}"


def probe(name: str, search_path: Optional[str] = None) -> EngineProbe:
    """Whether engine `name` answers `info` (a docker CLI without a daemon cannot build).
    `search_path` replaces PATH (tests use a folder of fake executables)."""
    exe = shutil.which(name, path=search_path)
    if exe is None:
        return EngineProbe(name, None, False, "not found on PATH")
    env = None if search_path is None else {**os.environ, "PATH": search_path}
    try:
        done = subprocess.run([exe, "info"], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return EngineProbe(name, exe, False, f"CLI found at {exe} but `{name} info` did not answer "
                                             f"within {PROBE_TIMEOUT_S:.0f} s")
    except OSError as e:
        return EngineProbe(name, exe, False, f"CLI found at {exe} but it cannot be run ({e})")
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        why = f"`{name} info` failed, exit {done.returncode}" + (f": {said[-1].strip()}" if said else "")
        if name == "docker":
            return EngineProbe(name, exe, False, f"CLI found at {exe} but no daemon answers ({why})")
        return EngineProbe(name, exe, False, f"CLI found at {exe} but {why}")
    return EngineProbe(name, exe, True, f"{exe}: answers")


@dataclass(frozen=True)
class EngineChoice:
    engine: Optional[EngineProbe]
    """The engine to build with; None when none works."""
    probes: tuple[EngineProbe, ...]
    forced: bool

    def report(self) -> str:
        lines = [p.describe() for p in self.probes]
        if self.engine is not None:
            return "\n".join(lines + [f"building with {self.engine.name}"])
        if self.forced:
            return "\n".join(lines + [f"error: CONTAINER_ENGINE={self.probes[0].name} does not work here; "
                                      "no image was built"])
        return "\n".join(["error: no usable container engine; looked for " + ", ".join(ENGINES) + ":"]
                         + [f"  {ln}" for ln in lines]
                         + ["no image was built (Debian/Ubuntu: apt-get install podman runc catatonit)"])


def choose_engine(forced: Optional[str] = None, search_path: Optional[str] = None) -> EngineChoice:
    """The first engine that works (in ENGINES order), or exactly `forced`."""
    if forced:
        if forced not in ENGINES:
            raise RecipeError(f"CONTAINER_ENGINE={forced!r}: not an engine that builds images; valid: {', '.join(ENGINES)}")
        p = probe(forced, search_path)
        return EngineChoice(p if p.usable else None, (p,), True)
    probes = tuple(probe(name, search_path) for name in ENGINES)
    return EngineChoice(next((p for p in probes if p.usable), None), probes, False)


class Engine:
    """One engine's commands, with the arguments this host needs (harness/launch/engine.py)."""

    def __init__(self, probe_: EngineProbe, args: Optional[EngineArgs] = None):
        assert probe_.path is not None
        self.name, self.args = probe_.name, args or engine_args(probe_.name)
        if self.args.problem:
            raise RecipeError(f"{self.name}: {self.args.problem}")
        self.cmd = [probe_.path, *self.args.global_args]

    def run(self, *args: str, timeout: Optional[float] = None, stream: bool = False, **kw) -> subprocess.CompletedProcess:
        argv = [*self.cmd, *args]
        if stream:
            print("+ " + shlex.join(argv), flush=True)
            return subprocess.run(argv, cwd=REPO_ROOT, timeout=timeout, **kw)
        return subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, **kw)

    def inspect(self, ref: str, fmt: str = "{{.Id}}") -> Optional[str]:
        done = self.run("image", "inspect", "--format", fmt, ref, timeout=60)
        return done.stdout.strip() or None if done.returncode == 0 else None

    def available(self, ref: str) -> tuple[bool, str]:
        """Whether `ref` is here or can be pulled now (and why not)."""
        if self.inspect(ref):
            return True, "present"
        try:
            done = self.run("pull", ref, timeout=PULL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return False, f"`{self.name} pull` did not finish within {PULL_TIMEOUT_S:.0f} s"
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return done.returncode == 0, "pulled" if done.returncode == 0 else (said[-1].strip() if said else f"exit {done.returncode}")


# --- building ----------------------------------------------------------------------------------

@dataclass
class Built:
    tag: str
    image_id: str
    base: str
    seconds: float
    size_mb: float
    sif: Optional[str] = None
    lock_sha256: Optional[str] = None

    def line(self) -> str:
        return (f"built {self.tag}: id {self.image_id[:19]}, {self.size_mb:.0f} MB, base {self.base}, "
                f"{self.seconds:.0f} s" + (f"; {self.sif}" if self.sif else ""))


def _base_for(engine: Engine, image: str, dockerfile: Path) -> str:
    pinned = base_arg(dockerfile)
    ok, why = engine.available(pinned)
    if ok:
        return pinned
    if image != "cpu":
        raise BaseUnavailable(f"the {image} image's base {pinned} cannot be pulled here ({why}); it has no local "
                          f"stand-in, so the {image} image is not built (its wheelhouse would be made by "
                          f"`python -m containers.wheelhouse --image {image}` on a host that can build it)")
    print(f"base {pinned}: cannot be pulled here ({why}); using the local debootstrap base {base_image.BASE_NAME}",
          flush=True)
    try:
        base_image.make(engine.name)
    except base_image.BaseImageError as e:
        raise RecipeError(f"no base for the cpu image: {pinned} cannot be pulled ({why}) and the local base "
                          f"cannot be made: {e}") from None
    return base_image.BASE_NAME


def build_image(engine: Engine, image: str, moves: Sequence[wheelhouse.Move] = (),
                env: Sequence[str] = (), extra: Sequence[str] = ()) -> Built:
    t0 = time.monotonic()
    dockerfile = dockerfile_path(image)
    base = _base_for(engine, image, dockerfile)
    house = wheelhouse.ensure(image, moves, wheelhouse.TARGETS[image].lock,
                              torch_index_url=os.environ.get("TORCH_INDEX_URL") or None)
    lock_sha = json.loads((house / wheelhouse.MANIFEST).read_text(encoding="utf-8"))["lock_sha256"]   # the label
    tag = docker_tag(wheelhouse.folder_name(image, moves).replace("+", "-"))   # a tag allows [A-Za-z0-9_.-]
    argv = ["build", *engine.args.limit_args, *extra,
            "--build-arg", f"BASE_IMAGE={base}", "--build-arg", f"BASE_ID={engine.inspect(base) or 'unknown'}",
            "--build-arg", f"LOCK_SHA256={lock_sha}", "--build-arg", f"WHEELHOUSE={_rel(house)}",
            "-f", _rel(dockerfile), "-t", tag, "-t", f"{tag}-lock{lock_sha[:12]}", "."]
    if engine.run(*argv, stream=True).returncode != 0:
        raise RecipeError(f"building the {image} image with {engine.name} failed (its output is above)")
    for assignment in env:
        tag = _with_env(engine, tag, assignment)
    smoke = engine.run("run", "--rm", *engine.args.limit_args, tag, "python", "-c",
                       "import torch, deepspeed; print(torch.__version__, deepspeed.__version__)", timeout=300)
    if smoke.returncode != 0:
        said = (smoke.stderr.strip() or smoke.stdout.strip()).splitlines()
        raise RecipeError(f"{engine.name} built {tag} but cannot run it: {said[-1] if said else smoke.returncode}")
    size = engine.inspect(tag, "{{.Size}}") or "0"
    return Built(tag, engine.inspect(tag) or "?", base, time.monotonic() - t0, int(size) / 1e6, lock_sha256=lock_sha)


def _with_env(engine: Engine, tag: str, assignment: str) -> str:
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)=([A-Za-z0-9_./:,+@%=-]*)", assignment)
    if m is None:
        raise RecipeError(f"--env {assignment!r}: expected NAME=VALUE (letters, digits, ./:,+@%=- in the value)")
    new = re.sub(r"[^A-Za-z0-9_.:-]", "-", f"{tag}-env-{m[1].lower()}-{m[2]}").replace("_", "-")
    recipe = f"FROM {tag}\nENV {m[1]}={m[2]}\nLABEL llm-pretrain-bench.env.{m[1]}=\"{m[2]}\"\n"
    done = engine.run("build", *engine.args.limit_args, "-t", new, "-f", "-", ".", input=recipe.encode(), stream=True)
    if done.returncode != 0:
        raise RecipeError(f"adding ENV {assignment} to {tag} failed")
    return new


def to_sif(engine: Engine, built: Built, route: sif.RouteChoice) -> str:
    """The .sif converted from the built image where the route is oci-archive, else why none is made."""
    name = built.tag.split(":", 1)[1]
    if route.route != "oci-archive" or route.runtime is None:
        return (f"apptainer: not installed here, no .sif made; where it is, `make containers` converts "
                f"`{engine.name} save --format docker-archive` of {built.tag} into {_rel(sif_path(name))} "
                "(route oci-archive), through spython")
    made = sif.from_archive(route.runtime, engine, built.tag, built.image_id, built.lock_sha256)
    built.sif = _rel(made.path)
    return made.line()


# --- command line ------------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m containers.recipes", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--image", action="append", choices=IMAGES,
                    help="image to build (repeatable). Default: every image; one whose base cannot be had here "
                         "is skipped with the reason (named with --image, it fails)")
    ap.add_argument("--engine", default=os.environ.get("CONTAINER_ENGINE") or None,
                    help=f"force an engine ({', '.join(ENGINES)}); default: $CONTAINER_ENGINE, else the first that works")
    ap.add_argument("--route", choices=ROUTES, default=os.environ.get("SIF_ROUTE") or None,
                    help="how the .sif is built: def (apptainer from the definition) or oci-archive (converted "
                         "from the engine's image); default: $SIF_ROUTE, else oci-archive where an engine works, "
                         "def where only apptainer does")
    ap.add_argument("--cpu-base", choices=apptainer_def.CPU_BASES, default="docker",
                    help="route def: the cpu image's base (the Dockerfile's by digest, or debootstrap's bookworm)")
    ap.add_argument("--move", action="append", default=[], metavar="NAME==VERSION",
                    help="build with this pin of the lock moved to another release (tag <image>-name-version)")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="add ENV NAME=VALUE on top of the built image (tag ...-env-name-value)")
    ns = ap.parse_args(argv)
    try:
        moves = [wheelhouse.Move.parse(m) for m in ns.move]
        choice = choose_engine(ns.engine)
        if choice.forced and choice.engine is None:   # this engine, or fail
            print(choice.report(), file=sys.stderr)
            return 2
        route = sif.choose_route(choice.engine.name if choice.engine else None, apptainer.runtime(), ns.route)
    except (RecipeError, wheelhouse.WheelhouseError, sif.SifError, apptainer.ApptainerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if route.route == "def":
        print("\n".join(p.describe() for p in choice.probes))
        print(route.line(), flush=True)
        return _by_definition(route, ns.image or IMAGES, moves, ns.env, ns.cpu_base)
    print(choice.report(), file=sys.stderr if choice.engine is None else sys.stdout)
    print(route.line(), file=sys.stderr if choice.engine is None else sys.stdout, flush=True)
    if choice.engine is None:
        return 2
    try:
        engine = Engine(choice.engine)
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for note in engine.args.notes:
        print(f"{engine.name}: {note}")
    extra = shlex.split(os.environ.get("CONTAINER_BUILD_ARGS", ""))
    failed = 0
    for image in ns.image or IMAGES:
        try:
            built = build_image(engine, image, moves, ns.env, extra)
            said = to_sif(engine, built, route)
            print(built.line())
            print(said)
        except BaseUnavailable as e:   # skipped, unless asked for by name
            print(f"{'error' if ns.image else 'not built'}: {e}", file=sys.stderr)
            failed += 1 if ns.image else 0
        except (RecipeError, wheelhouse.WheelhouseError, sif.SifError) as e:   # a build or an engine that fails
            print(f"error: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


def _by_definition(route: sif.RouteChoice, images: Sequence[str], moves: Sequence[wheelhouse.Move],
                   env: Sequence[str], cpu_base: str) -> int:
    """Route def: each image's .sif built by apptainer from its definition (no engine)."""
    assert route.runtime is not None
    failed = 0
    for image in images:
        try:
            print(sif.from_definition(route.runtime, image, moves, env, cpu_base).line(), flush=True)
        except (sif.SifError, wheelhouse.WheelhouseError) as e:
            print(f"error: {image} image: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
