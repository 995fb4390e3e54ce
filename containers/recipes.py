"""Apptainer definitions generated from the Dockerfiles, and the images built with whichever
container engine works on this host (`make containers`).

The Dockerfiles (containers/Dockerfile.<image>) are the one source. spython converts each into
containers/Apptainer.<image>.def, and `convert` corrects what that conversion loses:

- ENV in %post: spython writes each Docker ENV as a bare `NAME=value` line in %post (a shell
  variable, not exported: the commands of later RUN steps, pip among them, never see it). Here
  it is `export NAME=value`, at the place where the Dockerfile sets it, as Docker does.
- ENV in %environment: Apptainer passes the caller's environment into the container and then
  sources %environment over it, so a plain `export` there would override a value the caller
  set (the harness sets TORCH_EXTENSIONS_DIR to a writable cache of the bind-mounted checkout;
  the image's /workspace/suite/.cache is read-only in a .sif). A literal value becomes a
  default, `export NAME="${NAME:-value}"`: the caller's value wins, as `docker run -e NAME`
  wins over ENV. A value with quotes or `$` stays a plain export.
- %runscript: the Dockerfiles have no CMD/ENTRYPOINT, for which spython writes `exec /bin/bash`.
  Here `apptainer run IMAGE.sif ARGS` is `python -m harness ARGS`, run from the WORKDIR (the
  suite's copy needs the cd: `python -m harness` imports from the current directory).
- %startscript: spython repeats the runscript there; the images are no services, so it is
  dropped (an instance would run the harness with no arguments).
- a header saying the file is generated, from which Dockerfile, and not to be edited.

Apptainer's %files ignores .dockerignore, so the Dockerfiles COPY an explicit list of paths (a
`COPY . ...` would become `%files . /workspace/suite` and copy .venv, .git and results).

Usage, from the repository root with the venv's python (spython is in requirements.lock):
  python -m containers.recipes              regenerate the .def files, then build the images
  python -m containers.recipes --check      exit 1, naming each .def that differs from what its
                                            Dockerfile generates now
  python -m containers.recipes --no-build   regenerate only
The engine: the first that works of apptainer, singularity, docker, podman; `--engine NAME`
(or CONTAINER_ENGINE=NAME) forces one and fails when it does not work. Extra arguments for the
build command: CONTAINER_BUILD_ARGS (e.g. "--fakeroot" for an unprivileged apptainer).
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from spython.main.parse.parsers import DockerParser
from spython.main.parse.writers import SingularityWriter
from spython.version import __version__ as spython_version

from containers.lock import write_text_atomic

REPO_ROOT = Path(__file__).resolve().parents[1]
CONTAINERS_DIR = REPO_ROOT / "containers"
IMAGES = ("cpu", "gpu")
IMAGE_NAME = "llm-pretrain-bench"
SIF_DIR = REPO_ROOT / "build" / "containers"
"""apptainer/singularity builds: build/containers/llm-pretrain-bench-<image>.sif (the path the
platform configs use)."""
RUNSCRIPT = "python -m harness"
NOT_IN_IMAGE = frozenset({".ci", ".dockerignore", ".gitignore", "Makefile", "containers"})
"""Top-level entries of the repository the Dockerfiles deliberately leave out of the images;
every other tracked entry must be COPY'd (tests/unit/test_containers.py checks)."""

SIF_ENGINES = ("apptainer", "singularity")
DAEMON_ENGINES = ("docker", "podman")
ENGINES = SIF_ENGINES + DAEMON_ENGINES
"""In order of preference: the clusters run .sif images."""
PROBE_TIMEOUT_S = 20.0
KNOWN_SECTIONS = frozenset({"help", "setup", "files", "labels", "environment", "pre", "post", "runscript",
                            "test", "startscript", "arguments"})
_LITERAL_ENV = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=([A-Za-z0-9_./:,+@%=-]*)$")


class RecipeError(Exception):
    """A Dockerfile the generator cannot convert faithfully, or a conversion that is not valid."""


def dockerfile_path(image: str) -> Path:
    return CONTAINERS_DIR / f"Dockerfile.{image}"


def definition_path(image: str) -> Path:
    return CONTAINERS_DIR / f"Apptainer.{image}.def"


def sif_path(image: str) -> Path:
    return SIF_DIR / f"{IMAGE_NAME}-{image}.sif"


def docker_tag(image: str) -> str:
    return f"{IMAGE_NAME}:{image}"


def _rel(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


# --- conversion --------------------------------------------------------------------------------

def _export_env_in_post(layer) -> None:
    """spython appends each ENV entry to both `install` (%post) and `environ`, in order: turn
    the %post copies into exports, in place."""
    pending = list(layer.environ)
    for i, line in enumerate(layer.install):
        if pending and line == pending[0]:
            layer.install[i] = f"export {line}"
            pending.pop(0)
    if pending:
        raise RecipeError(f"ENV {pending[0]!r} is not in spython's %post; the spython version "
                          "changed how it converts ENV: update containers/recipes.py")


def _default_env(entry: str) -> str:
    m = _LITERAL_ENV.match(entry)
    return f'{m[1]}="${{{m[1]}:-{m[2]}}}"' if m else entry


def _is_section(line: str) -> bool:
    """Apptainer opens a section at a line whose first word starts with %."""
    words = line.split()
    return bool(words) and words[0].startswith("%")


def _drop_section(text: str, name: str) -> str:
    out, skipping = [], False
    for line in text.splitlines():
        if _is_section(line):
            skipping = line.split()[0] == f"%{name}"
        if not skipping:
            out.append(line)
    return "\n".join(out)


def _space_sections(text: str) -> str:
    """A blank line before each section (spython writes none), for the reader."""
    out: list[str] = []
    for line in text.splitlines():
        if _is_section(line) and out and out[-1].strip():
            out.append("")
        out.append(line)
    return "\n".join(out)


def _header(image: str) -> str:
    return (f"# GENERATED by `make containers` (containers/recipes.py, spython {spython_version}) from\n"
            f"# {_rel(dockerfile_path(image))}.  DO NOT EDIT: edit the Dockerfile, then run `make containers`;\n"
            "# the unit tests fail while this file differs from what the Dockerfile generates.\n"
            "# Build from the repository root (%files paths are relative to it), e.g.\n"
            f"#   apptainer build {_rel(sif_path(image))} {_rel(definition_path(image))}\n"
            "# Corrections to spython's conversion (see containers/recipes.py): ENV exported in\n"
            "# %post where the Dockerfile sets it; %environment keeps a value the caller set;\n"
            f"# %runscript runs `{RUNSCRIPT}` from the WORKDIR; no %startscript.\n")


def sections(text: str) -> dict[str, list[str]]:
    """{"header": [...], "post": [...], ...}: the lines of each section of a definition, as
    Apptainer splits them (a line whose first word starts with % opens a section)."""
    out: dict[str, list[str]] = {"header": []}
    current = "header"
    for line in text.splitlines():
        if _is_section(line):
            current = line.split()[0][1:]
            if current not in KNOWN_SECTIONS:
                raise RecipeError(f"line {line.strip()!r} opens an unknown section %{current} (a line of a "
                                  "section whose first word starts with % opens a new one)")
            if current in out:
                raise RecipeError(f"section %{current} appears twice")
            out[current] = []
        else:
            out[current].append(line)
    return out


def validate(text: str) -> None:
    """What Apptainer would reject or misread: a missing header, %files from `.`, shell sections
    that `sh -n` and `bash -n` do not parse."""
    parts = sections(text)
    header = [ln for ln in parts["header"] if ln.strip() and not ln.lstrip().startswith("#")]
    if not header or not header[0].startswith("Bootstrap:"):
        raise RecipeError("the definition does not start with a Bootstrap: header")
    for line in parts.get("files", []):
        if line.strip() and line.split()[0] in (".", "./"):
            raise RecipeError(f"%files copies the whole build context ({line.strip()!r}); COPY an explicit "
                              "list of paths in the Dockerfile (Apptainer ignores .dockerignore)")
    for name in ("post", "environment", "runscript"):
        body = "\n".join(parts.get(name, [])) + "\n"
        for shell in ("sh", "bash"):
            exe = shutil.which(shell)
            if exe is None:
                continue
            done = subprocess.run([exe, "-n"], input=body, capture_output=True, text=True)
            if done.returncode != 0:
                raise RecipeError(f"%{name} is not valid {shell}: {done.stderr.strip()}")


def convert(dockerfile: Path, image: str) -> str:
    """The corrected Apptainer definition of `image` that `dockerfile` generates."""
    dockerfile = Path(dockerfile)
    num_stages = len(re.findall(r"^\s*FROM\s", dockerfile.read_text(encoding="utf-8"), flags=re.I | re.M))
    if num_stages != 1:  # spython merges a second FROM without AS into the first stage
        raise RecipeError(f"{_rel(dockerfile)}: {num_stages} FROM instructions; the generator "
                          "handles single-stage Dockerfiles only")
    parser = DockerParser(str(dockerfile))
    layer = next(iter(parser.recipe.values()))
    _export_env_in_post(layer)
    layer.environ = [_default_env(e) for e in layer.environ]
    text = SingularityWriter(parser.recipe).convert(runscript=RUNSCRIPT)
    text = _space_sections(_drop_section(text, "startscript"))
    text = _header(image) + text.rstrip("\n") + "\n"
    try:
        validate(text)
    except RecipeError as e:
        raise RecipeError(f"{_rel(dockerfile)}: {e}") from None
    return text


def generate(image: str, dockerfile: Optional[Path] = None) -> str:
    """The definition of `image` from its Dockerfile (or from `dockerfile`, a copy of it)."""
    return convert(dockerfile_path(image) if dockerfile is None else Path(dockerfile), image)


def drift(images: Sequence[str] = IMAGES) -> list[str]:
    """A message per committed .def that differs from what its Dockerfile generates now."""
    problems = []
    for image in images:
        want, path = generate(image), definition_path(image)
        have = path.read_text(encoding="utf-8") if path.is_file() else None
        if have is None:
            problems.append(f"{_rel(path)} is missing; run `make containers`")
        elif have != want:
            diff = "".join(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                                f"{_rel(path)} (committed)", f"{_rel(path)} (generated)", n=1))
            problems.append(f"{_rel(path)} differs from what {_rel(dockerfile_path(image))} generates; "
                            f"run `make containers`\n{diff}")
    return problems


def regenerate(images: Sequence[str] = IMAGES) -> list[str]:
    """Write each .def whose content changed; one line per file saying what happened."""
    done = []
    for image in images:
        text, path = generate(image), definition_path(image)
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            done.append(f"{_rel(path)}: up to date with {_rel(dockerfile_path(image))}")
        else:
            write_text_atomic(path, text)
            done.append(f"{_rel(path)}: regenerated from {_rel(dockerfile_path(image))}")
    return done


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
    """Whether engine `name` answers: apptainer/singularity `--version`; docker/podman `info`
    (the CLI alone is not enough: a docker without a daemon cannot build). `search_path`
    replaces PATH (tests use a folder of fake executables)."""
    exe = shutil.which(name, path=search_path)
    if exe is None:
        return EngineProbe(name, None, False, "not found on PATH")
    argv = [exe, "--version"] if name in SIF_ENGINES else [exe, "info"]
    shown = f"`{name} {argv[1]}`"
    env = None if search_path is None else {**os.environ, "PATH": search_path}
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return EngineProbe(name, exe, False, f"CLI found at {exe} but {shown} did not answer "
                                             f"within {PROBE_TIMEOUT_S:.0f} s")
    except OSError as e:
        return EngineProbe(name, exe, False, f"CLI found at {exe} but it cannot be run ({e})")
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        why = f"{shown} failed, exit {done.returncode}" + (f": {said[-1].strip()}" if said else "")
        if name == "docker":
            return EngineProbe(name, exe, False, f"CLI found at {exe} but no daemon answers ({why})")
        return EngineProbe(name, exe, False, f"CLI found at {exe} but {why}")
    version = (done.stdout.strip().splitlines() or ["answers"])[0] if name in SIF_ENGINES else "daemon answers"
    return EngineProbe(name, exe, True, f"{exe}: {version}")


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
        return "\n".join(["no usable container engine; looked for " + ", ".join(ENGINES) + ":"]
                         + [f"  {ln}" for ln in lines]
                         + ["only the Apptainer definitions were regenerated; no image was built"])


def choose_engine(forced: Optional[str] = None, search_path: Optional[str] = None) -> EngineChoice:
    """The first engine that works (in ENGINES order), or exactly `forced`."""
    if forced:
        if forced not in ENGINES:
            raise RecipeError(f"CONTAINER_ENGINE={forced!r}: not an engine; valid: {', '.join(ENGINES)}")
        p = probe(forced, search_path)
        return EngineChoice(p if p.usable else None, (p,), True)
    probes = tuple(probe(name, search_path) for name in ENGINES)
    return EngineChoice(next((p for p in probes if p.usable), None), probes, False)


def build_commands(engine: EngineProbe, image: str, extra: Sequence[str] = ()) -> list[list[str]]:
    """argv lists, run from the repository root (the build context / %files base)."""
    assert engine.path is not None
    if engine.name in SIF_ENGINES:
        return [[engine.path, "build", "--force", *extra, _rel(sif_path(image)), _rel(definition_path(image))]]
    return [[engine.path, "build", *extra, "-f", _rel(dockerfile_path(image)), "-t", docker_tag(image), "."]]


def build(engine: EngineProbe, images: Sequence[str], extra: Sequence[str] = ()) -> int:
    """Build each image in turn (output streamed); the first failure's exit status."""
    for image in images:
        if engine.name in SIF_ENGINES:
            SIF_DIR.mkdir(parents=True, exist_ok=True)
        for argv in build_commands(engine, image, extra):
            print("+ " + shlex.join(argv), flush=True)
            rc = subprocess.run(argv, cwd=REPO_ROOT).returncode
            if rc != 0:
                print(f"error: building the {image} image with {engine.name} failed (exit {rc})", file=sys.stderr)
                return rc
        built = _rel(sif_path(image)) if engine.name in SIF_ENGINES else docker_tag(image)
        print(f"built {built}", flush=True)
    return 0


# --- command line ------------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m containers.recipes", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true",
                    help="compare the committed .def files with what the Dockerfiles generate; exit 1 on a difference")
    ap.add_argument("--no-build", action="store_true", help="regenerate the .def files only")
    ap.add_argument("--image", action="append", choices=IMAGES,
                    help="image to build (repeatable; default: all). The .def files are always all regenerated")
    ap.add_argument("--engine", default=os.environ.get("CONTAINER_ENGINE") or None,
                    help=f"force an engine ({', '.join(ENGINES)}); default: $CONTAINER_ENGINE, else the first that works")
    ns = ap.parse_args(argv)
    if ns.engine and ns.engine not in ENGINES:
        print(f"error: CONTAINER_ENGINE={ns.engine!r}: not an engine; valid: {', '.join(ENGINES)}", file=sys.stderr)
        return 2
    try:
        if ns.check:
            problems = drift()
            for p in problems:
                print(f"error: {p}", file=sys.stderr)
            if not problems:
                print("containers: the .def files match the Dockerfiles")
            return 1 if problems else 0
        for line in regenerate():
            print(line)
        if ns.no_build:
            return 0
        choice = choose_engine(ns.engine)
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(choice.report(), file=sys.stderr if choice.forced and choice.engine is None else sys.stdout)
    if choice.engine is None:
        return 2 if choice.forced else 0
    extra = shlex.split(os.environ.get("CONTAINER_BUILD_ARGS", ""))
    return build(choice.engine, ns.image or IMAGES, extra)


if __name__ == "__main__":
    sys.exit(main())
