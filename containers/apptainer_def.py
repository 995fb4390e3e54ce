"""Apptainer definition files written from the Dockerfiles (one source of truth), for sites that
have Apptainer and no docker or podman: `make containers` writes them, or

    python -m containers.apptainer_def [--image cpu|gpu] [--cpu-base docker|debootstrap] [--check]

writes build/containers/llm-pretrain-bench-<image>.def (generated, git-ignored: a fresh one is
always the Dockerfile's conversion; --check says whether the written ones are). Build one from the
repository root (its %files paths are relative to it):

    apptainer build build/containers/llm-pretrain-bench-cpu.sif build/containers/llm-pretrain-bench-cpu.def

spython's Docker parser and Singularity writer do the conversion; _Parser below overrides what they
get wrong for these Dockerfiles, and the definition's header lists every instruction adapted, and
why. What the conversion cannot carry is added: the Dockerfile's ARGs substituted (a definition has
none: the base pinned by digest, the image's lock sha256, the wheelhouse folder), the offline
wheelhouse as %files, labels naming the lock's sha256 and the route (llm-pretrain-bench.sif.route
def). The base: the Dockerfile's own `ARG BASE_IMAGE` default, as `Bootstrap: docker` (the cpu
image's python:3.11-slim-bookworm by digest; the gpu image's nvidia/cuda tag, not pinned by
digest: none could be read where the suite is developed). `--cpu-base debootstrap` writes the cpu
image on `Bootstrap: debootstrap` instead, the same Debian bookworm minbase and packages as `make
base-image` (containers/base_image.py), for a site that reaches a Debian mirror but no registry;
not the default: it needs root (or a fakeroot mode that works with debootstrap) and debootstrap on
the host, and it takes whatever the mirror serves that day, where a digest pins every byte."""
from __future__ import annotations

import argparse
import hashlib
import re
import shlex
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence

from spython.logger import bot
from spython.main.parse.parsers import DockerParser
from spython.main.parse.writers import SingularityWriter

from containers import base_image
from containers.image_stack import base_image as known_base
from containers.lock import REPO_ROOT, write_text_atomic
from containers.wheelhouse import TARGETS, WHEELHOUSE_DIR
from harness.launch.container import ROUTE_LABEL

IMAGES = ("cpu", "gpu")
DEF_DIR = REPO_ROOT / "build" / "containers"
IMAGE_NAME = "llm-pretrain-bench"
WHEELHOUSE_DEST = "/opt/wheelhouse"
"""Where %files puts the wheelhouse (the Dockerfiles COPY it to /tmp/wheelhouse; see _Parser._copy)."""
DOCKER_WHEELHOUSE = "/tmp/wheelhouse"
SOURCE_LABEL = "llm-pretrain-bench.definition.source"
CPU_BASES = ("docker", "debootstrap")


class DefinitionError(Exception):
    """A Dockerfile holds something the conversion cannot carry; the message names it."""


@dataclass(frozen=True)
class Adapted:
    """One Dockerfile instruction the definition does differently, and why."""
    instruction: str
    how: str
    why: str

    def lines(self) -> list[str]:
        return [f"#   {self.instruction}", f"#       -> {self.how}", f"#       because {self.why}"]


@dataclass(frozen=True)
class Base:
    header: tuple[str, ...]
    """The definition's header lines (Bootstrap: ... and its keywords)."""
    name: str
    """What the labels call the base (the Dockerfile's BASE_IMAGE)."""
    base_id: str
    """The base's digest where pinned, else why there is none."""
    note: str


@dataclass
class Definition:
    image: str
    dockerfile: Path
    text: str
    base: Base
    values: dict[str, str]
    """The Dockerfile's ARGs as substituted."""
    adapted: list[Adapted] = field(default_factory=list)


def def_path(name: str) -> Path:
    """build/containers/llm-pretrain-bench-<name>.def (name: the image, or its tag suffix)."""
    return DEF_DIR / f"{IMAGE_NAME}-{name}.def"


def dockerfile_of(image: str) -> Path:
    return REPO_ROOT / "containers" / f"Dockerfile.{image}"


def lock_sha256(image: str) -> str:
    """The sha256 the image's label names: of its lock's text, as containers/wheelhouse.py computes it."""
    return hashlib.sha256(TARGETS[image].lock.read_text(encoding="utf-8").encode()).hexdigest()


def base_for(image: str, pinned: str, cpu_base: str = "docker") -> Base:
    """The header for the Dockerfile's pinned BASE_IMAGE (`pinned`), or for the debootstrap base."""
    if cpu_base == "debootstrap":
        if image != "cpu":
            raise DefinitionError(f"--cpu-base debootstrap: the {image} image's base ({pinned}) has no debootstrap "
                                  "equivalent; only the cpu image has one")
        include = ",".join(base_image.PACKAGES)
        return Base((f"Bootstrap: debootstrap", f"OSVersion: {base_image.SUITE}", f"MirrorURL: {base_image.MIRROR}",
                     f"Include: {' '.join(base_image.PACKAGES)}"),
                    f"debootstrap:{base_image.SUITE}", f"debootstrap {base_image.SUITE} minbase +{include}",
                    f"Debian {base_image.SUITE} minbase by debootstrap, as `make base-image` makes it (Python "
                    f"{base_image.PYTHON_MINOR}); not pinned: the mirror's packages of the day")
    what = known_base(pinned)   # image_stack's table: an unknown base is an error there too
    digest = re.search(r"@(sha256:[0-9a-f]{64})$", pinned)
    note = (f"{what.what}, Python {what.python}, pinned by digest" if digest else
            f"{what.what}, Python {what.python}; NOT pinned by digest: no registry is reachable where the suite is "
            "developed, so no digest could be read; pin it (`@sha256:...` in the Dockerfile's ARG BASE_IMAGE) on the "
            "first host that pulls it")
    return Base(("Bootstrap: docker", f"From: {pinned}"), pinned,
                digest[1] if digest else "unknown (not pinned by digest)", note)


def _substitute(text: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        text = re.sub(r"\$\{" + name + r"\}|\$" + name + r"\b", lambda _m: value, text)
    return text


def _dockerignored() -> list[str]:
    """.dockerignore's patterns that apply inside copied folders (`**/NAME`): the names to remove."""
    path = REPO_ROOT / ".dockerignore"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return [ln.strip()[3:] for ln in lines if ln.strip().startswith("**/")]


_RUN_OPEN, _RUN_CLOSE = "(", ") || exit $?"


class _Parser(DockerParser):
    """spython's DockerParser with what it gets wrong for these Dockerfiles overridden; each override
    notes the instruction it adapted (self.adapted)."""

    def __init__(self, dockerfile: Path):
        self.adapted: list[Adapted] = []
        self.seen_from = False
        self.label_pairs: list[tuple[str, str]] = []
        super().__init__(str(dockerfile), load=True)

    def _note(self, instruction: str, how: str, why: str) -> None:
        if not any(a.instruction == instruction for a in self.adapted):
            self.adapted.append(Adapted(instruction, how, why))

    def _layer(self):
        return self.recipe[self.active_layer]

    def _from(self, line):
        if self.seen_from:
            raise DefinitionError("more than one FROM: the conversion handles single-stage Dockerfiles only")
        self.seen_from = True
        super()._from(line)

    def _comment(self, line):
        if self.seen_from:   # the file's own header (before FROM) says how to build with docker: left out
            super()._comment(line)

    def _arg(self, line):
        install = self._layer().install
        n = len(install)
        super()._arg(line)   # spython turns ARG NAME=VALUE into a shell assignment in %post: dropped,
        del install[n:]      # its value is substituted where it is used (values in Definition)

    def _env(self, line):
        install = self._layer().install
        n = len(install)
        super()._env(line)
        install[n:] = [f"export {e}" for e in install[n:]]
        self._note("ENV NAME=VALUE ...", "`export NAME=VALUE` in %post at its place, and in %environment",
                   "spython writes a plain shell assignment into %post, which pip and python do not see; a Docker "
                   "ENV holds for every later RUN and at run time (%environment: `$PATH` there is expanded when the "
                   "container starts, after the base's PATH is set)")

    def _run(self, line):
        install = self._layer().install
        if re.match(r"\s*RUN\s", line, flags=re.I):
            if line.split(None, 1)[1].lstrip().startswith("["):
                raise DefinitionError(f"RUN in exec form ({line.strip()}) is not converted")
            install.append(_RUN_OPEN)
        elif line.strip().startswith("#"):
            raise DefinitionError(f"a comment inside a continued RUN ({line.strip()}): spython would put it into the "
                                  "shell command; move it above the RUN")
        super()._run(line)
        if not line.rstrip().endswith("\\"):
            install.append(_RUN_CLOSE)
        self._note("RUN script", f"`{_RUN_OPEN}` script `{_RUN_CLOSE}` in %post",
                   "%post is one `sh -e` script, and sh -e does not stop at a failure inside an && chain (a failed pip "
                   "install would be built into the image); a subshell gives each RUN its own shell, as Docker's "
                   "`sh -c` does, and its exit status stops the build")

    def _copy(self, lines):
        super()._copy(lines)
        self._note("COPY SRC... DEST", "%files SRC DEST (copied before any %post step)",
                   "a definition has no COPY; %files runs before %post, where Docker copies at the COPY's place "
                   "(nothing here reads a copied file before its COPY)")

    def _workdir(self, line):
        super()._workdir(line)
        self._note(line.strip(), "`mkdir -p DIR` and `cd DIR` in %post; `cd DIR` in %runscript",
                   "a definition has no WORKDIR; `apptainer exec` starts in the caller's directory (the suite's "
                   "launcher passes --pwd)")

    def _label(self, line):
        words = self._setup("LABEL", line)
        text = " ".join(words).rstrip("\\").strip()
        for item in shlex.split(text):
            key, eq, value = item.partition("=")
            if not eq:
                raise DefinitionError(f"LABEL {item}: only the KEY=VALUE form is converted")
            self.label_pairs.append((key, value))
        self._note("LABEL KEY=\"VALUE\" ...", "%labels KEY VALUE (one a line, quotes removed, ARGs substituted)",
                   "spython copies `KEY=\"VALUE\"` as it is, which Apptainer reads as a key with the whole text")

    def _add(self, lines):
        raise DefinitionError(f"ADD {lines}: use COPY (ADD's URL and archive forms are not converted)")


@contextmanager
def _quiet_spython() -> Iterator[None]:
    """spython's warnings (ARG is not supported, ${WHEELHOUSE} does not exist) are what this module handles."""
    level = bot.level
    bot.level = -3   # spython.logger: ERROR
    try:
        yield
    finally:
        bot.level = level


def _copied_with_its_folder(src: str, dest: str, files: list[list[str]]) -> bool:
    """Whether another %files entry copies a folder of the repository that holds src to where this one
    puts it (dest the file's own path, or its folder's with a trailing /)."""
    for folder, to in files:
        if folder == src or not (REPO_ROOT / folder).is_dir() or not Path(src).is_relative_to(folder):
            continue
        inside = Path(to) / Path(src).relative_to(folder)
        if Path(dest) == inside or (dest.endswith("/") and Path(dest) / Path(src).name == inside):
            return True
    return False


def generate(image: str, *, cpu_base: str = "docker", wheelhouse: Optional[Path] = None,
             lock_sha: Optional[str] = None, dockerfile: Optional[Path] = None) -> Definition:
    """The definition of `image` from its Dockerfile. `wheelhouse` (default build/wheelhouse/<image>) and
    `lock_sha` (default: the image's lock's) are what the Dockerfile's WHEELHOUSE and LOCK_SHA256 get."""
    if image not in IMAGES:
        raise DefinitionError(f"image {image!r}: valid: {', '.join(IMAGES)}")
    if cpu_base not in CPU_BASES:
        raise DefinitionError(f"--cpu-base {cpu_base!r}: valid: {', '.join(CPU_BASES)}")
    dockerfile = Path(dockerfile or dockerfile_of(image))
    with _quiet_spython():
        parser = _Parser(dockerfile)
    if len(parser.recipe) != 1:
        raise DefinitionError(f"{dockerfile.name}: {len(parser.recipe)} stages; the conversion handles one")
    layer = next(iter(parser.recipe.values()))
    if "BASE_IMAGE" not in parser.args:
        raise DefinitionError(f"{dockerfile.name}: no `ARG BASE_IMAGE=<pinned base>` before its FROM")
    base = base_for(image, parser.args["BASE_IMAGE"], cpu_base)
    house = Path(wheelhouse or WHEELHOUSE_DIR / image).resolve()
    values = {"BASE_IMAGE": base.name, "BASE_ID": base.base_id, "LOCK_SHA256": lock_sha or lock_sha256(image),
              "WHEELHOUSE": str(house.relative_to(REPO_ROOT)) if house.is_relative_to(REPO_ROOT) else str(house)}
    unknown = sorted(set(parser.args) - set(values))
    if unknown:
        raise DefinitionError(f"{dockerfile.name}: ARG {', '.join(unknown)}: no value to substitute; add it to "
                              "containers/apptainer_def.py")
    defn = Definition(image, dockerfile, "", base, values, parser.adapted)
    defn.adapted.insert(0, Adapted(
        "FROM ${BASE_IMAGE}", "\n#          ".join(base.header), f"a definition names its base in its header: {base.note}"))
    defn.adapted.insert(1, Adapted(
        "ARG " + " ".join(sorted(parser.args)), "substituted: " + ", ".join(f"{k}={v}" for k, v in values.items()),
        "a definition has no ARG (Apptainer's own build arguments would leave the values out of the file)"))

    files = []
    for src, dest in layer.files:
        src, dest = _substitute(src, values), _substitute(dest, values)
        if dest.rstrip("/") == DOCKER_WHEELHOUSE:
            dest = WHEELHOUSE_DEST
            defn.adapted.append(Adapted(
                f"COPY ${{WHEELHOUSE}} {DOCKER_WHEELHOUSE}", f"%files {src} {WHEELHOUSE_DEST}, read and removed "
                f"there by %post", f"Apptainer binds the host's /tmp over the container's during %post: the copy "
                f"would be hidden, and `rm -rf {DOCKER_WHEELHOUSE}` would delete the host's. The .sif does not keep "
                "it (no layer holds it, unlike the OCI image)"))
        if [src, dest] not in files:
            files.append([src, dest])
    covered = [[s, d] for s, d in files if _copied_with_its_folder(s, d, files)]
    if covered:
        defn.adapted.append(Adapted(
            "COPY of files a later COPY of their folder copies too", "left out of %files: "
            + ", ".join(s for s, _ in covered), "Docker copies them first for a layer of their own (one that "
            "need not be rebuilt after every edit of the folder); %files copies everything before %post anyway, and "
            "a copy of the folder into the one their copy made would nest it (benchmarks/benchmarks)"))
    layer.files = [pair for pair in files if pair not in covered]
    layer.labels = [[k, _substitute(v, values)] for k, v in parser.label_pairs]
    layer.labels += [[ROUTE_LABEL, "def"], [SOURCE_LABEL, f"containers/{dockerfile.name}"]]
    layer.environ = [_substitute(e, values) for e in layer.environ]
    names = _dockerignored()
    folders = [d for s, d in files if (REPO_ROOT / s).is_dir() and d != WHEELHOUSE_DEST]
    cleanup = []
    if names and folders:
        matches = " -o ".join(f"-name {shlex.quote(n)}" for n in names)
        cleanup = [f"find {' '.join(folders)} \\( {matches} \\) -prune -exec rm -rf {{}} +"]
        defn.adapted.append(Adapted(
            "COPY of a folder (.dockerignore)", f"%post removes {', '.join(names)} from the copied folders first",
            "%files reads no .dockerignore: it would copy the checkout's caches the OCI build leaves out"))
    install = [ln.replace(DOCKER_WHEELHOUSE, WHEELHOUSE_DEST) for ln in layer.install]
    layer.install = cleanup + [_substitute(ln, values) for ln in install]
    workdir = layer.workdir or "/"
    layer.workdir = None   # %runscript below
    layer.cmd = layer.entrypoint = None
    with _quiet_spython():
        converted = SingularityWriter(parser.recipe).convert()
    body = converted[converted.index("\n%"):].strip("\n")
    body = body[:body.index("%runscript")].rstrip("\n")   # spython's runscript: `exec /bin/bash "$@"`
    runscript = ["%runscript", f"cd {workdir}", '[ $# -gt 0 ] || set -- /bin/bash', 'exec "$@"']
    defn.adapted.append(Adapted("(no CMD or ENTRYPOINT)", '%runscript: `cd WORKDIR; exec "$@"` (a shell without arguments)',
                                'spython\'s runscript is `exec /bin/bash "$@"`, which runs `apptainer run IMAGE python ...` '
                                "as a bash script named python"))
    defn.text = "\n".join(_header(defn) + list(base.header) + ["", body, "\n".join(runscript), ""])
    if "{{" in defn.text:
        raise DefinitionError(f"{dockerfile.name}: `{{{{` in the converted text: Apptainer would read it as a build "
                              "argument")
    return defn


def _header(defn: Definition) -> list[str]:
    name = defn.dockerfile.name
    lines = [f"# Generated from containers/{name} by containers/apptainer_def.py (spython's Docker-to-Singularity",
             "# conversion, then the adaptations below); do not edit: change the Dockerfile and regenerate",
             "# (make containers, or python -m containers.apptainer_def). Build from the repository root:",
             f"#   apptainer build build/containers/{IMAGE_NAME}-{defn.image}.sif "
             f"build/containers/{IMAGE_NAME}-{defn.image}.def",
             f"# Base: {defn.base.name} ({defn.base.note}).",
             f"# Lock: {TARGETS[defn.image].lock.name} sha256 {defn.values['LOCK_SHA256']}; wheelhouse "
             f"{defn.values['WHEELHOUSE']} (python -m containers.wheelhouse --image {defn.image}).",
             f"# Adapted instructions ({len(defn.adapted)}):"]
    for a in defn.adapted:
        lines += a.lines()
    return lines + [""]


def write(defn: Definition, path: Optional[Path] = None) -> Path:
    path = Path(path or def_path(defn.image))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, defn.text)
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m containers.apptainer_def", description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", action="append", choices=IMAGES, help="default: every image")
    ap.add_argument("--cpu-base", choices=CPU_BASES, default="docker",
                    help="the cpu image's base: the Dockerfile's, by digest (default), or debootstrap's bookworm")
    ap.add_argument("--out", type=Path, default=DEF_DIR, help=f"folder (default {DEF_DIR.relative_to(REPO_ROOT)})")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a written definition is stale")
    ns = ap.parse_args(argv)
    stale = 0
    for image in ns.image or IMAGES:
        try:
            defn = generate(image, cpu_base=ns.cpu_base)
        except DefinitionError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        path = ns.out / def_path(image).name
        shown = path.relative_to(REPO_ROOT) if path.resolve().is_relative_to(REPO_ROOT) else path
        if ns.check:
            same = path.is_file() and path.read_text(encoding="utf-8") == defn.text
            stale += not same
            print(f"{shown}: {'up to date' if same else 'stale or missing'}")
            continue
        write(defn, path)
        print(f"definition {shown}: from containers/{defn.dockerfile.name}, base {defn.base.name}, "
              f"{len(defn.adapted)} instructions adapted (listed in its header)")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
