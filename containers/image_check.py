"""Static check of the container images' software stack, without a container engine: from a
Dockerfile and requirements.lock, the Python and the packages the image ends up with, and whether
every package's declared requirements hold in that set.

What the image holds is derived from the Dockerfile, not guessed:
- the Python: the base image's, from BASES (a pinned python:3.X tag; a distribution's python3,
  which the Dockerfile must apt-get install; a known framework image). An unknown base is an
  error: add it to BASES with what it ships.
- torch: the torch the base ships (BASES: an NGC PyTorch image), replaced by a `pip install
  torch==V` the Dockerfile runs (V literal or read from the lock with sed, as the Dockerfiles
  do); the PyTorch index it comes from gives the local tag (+cpu, +cu130).
- the rest: each `pip install -r FILE` of the lock, or of a file the Dockerfile derives from it
  with `grep` (as the old GPU image dropped the torch line), in order. A lock line without a hash
  that the installed package does not satisfy is refused by --require-hashes.

Each package's requirements are its Requires-Dist as installed in this venv, whose versions must
be the lock's (the check says so where they are not: run `make venv`). They are evaluated for
the image's Python on Linux x86_64, with the extras the suite uses (SUITE_EXTRAS) and those other
requirements ask for; a requirement the suite leaves out on purpose is in NOT_INSTALLED with the
reason. Each package's Requires-Python must accept the image's Python. Not covered: what pip
resolves at build time for an install WITH dependencies (torch's nvidia-* libraries from the
PyTorch index): the build's `pip check` covers those.

Usage, from the repository root with the venv's python:
  python -m containers.image_check [--dockerfile PATH ...] [--lock PATH] [--packages]
prints each image's stack and each problem; exit 1 on a problem (0: every image resolves).
"""
from __future__ import annotations

import argparse
import re
import shlex
import sys
import textwrap
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable, Optional, Sequence

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from containers.lock import LOCK_PATH, LockError, parse_lock

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = tuple(REPO_ROOT / "containers" / f"Dockerfile.{image}" for image in ("gpu", "cpu"))


@dataclass(frozen=True)
class Base:
    what: str
    python: str
    """The Python the image runs: X.Y.Z where the base fixes it, else X.Y (evaluated as X.Y.0)."""
    apt_python: bool = False
    """A distribution image without Python: python3 comes from apt (the Dockerfile installs it)."""
    packages: tuple[tuple[str, str], ...] = ()
    """Python packages the base ships that the suite relies on (name, version)."""


BASES: dict[str, Base] = {
    "nvcr.io/nvidia/pytorch:25.01-py3": Base(
        "NGC PyTorch 25.01 (Ubuntu 24.04, CUDA 12.8)", "3.12.3",
        packages=(("torch", "2.6.0a0+ecf3bae40a.nv25.01"),)),
}
"""Bases known by their exact name."""
BASE_PATTERNS: tuple[tuple[str, Base], ...] = (
    (r"(?:docker\.io/)?(?:library/)?python:(?P<py>3\.\d+)(?:\.\d+)?-(?:slim-)?(?:bookworm|trixie)",
     Base("the official Python image", "{py}")),
    (r"(?:docker\.io/)?nvidia/cuda:\d+\.\d+\.\d+-(?:base|runtime|devel)(?:-cudnn\d*)?-ubuntu24\.04",
     Base("NVIDIA CUDA on Ubuntu 24.04", "3.12.3", apt_python=True)),
    (r"(?:docker\.io/)?nvidia/cuda:\d+\.\d+\.\d+-(?:base|runtime|devel)(?:-cudnn\d*)?-ubuntu22\.04",
     Base("NVIDIA CUDA on Ubuntu 22.04", "3.10.12", apt_python=True)),
    (r"(?:docker\.io/)?(?:library/)?ubuntu:24\.04", Base("Ubuntu 24.04", "3.12.3", apt_python=True)),
    (r"(?:docker\.io/)?(?:library/)?ubuntu:22\.04", Base("Ubuntu 22.04", "3.10.12", apt_python=True)),
)
"""Bases known by a pattern of pinned tags (the whole name must match); `{py}` is the tag's
Python. A distribution's python3 is the version its release ships."""

SUITE_EXTRAS: dict[str, tuple[str, ...]] = {
    "transformers": ("torch",),  # benchmarks/model.py builds LlamaForCausalLM: the PyTorch models
}
"""Extras of lock packages the suite uses (the lock installs with --no-deps, so nothing asks for
them; their requirements must hold all the same)."""
NOT_INSTALLED: dict[tuple[str, str], str] = {
    ("transformers", "accelerate"): (
        "the suite trains with DeepSpeed directly; transformers needs accelerate only for its Trainer and "
        "for device_map/low-memory loading of pretrained checkpoints, which the suite does not use "
        "(benchmarks/smoke_image.py builds the model without it)"),
}
"""(package, requirement) the suite deliberately does not install, with the reason."""

PYTORCH_INDEX = re.compile(r"https://download\.pytorch\.org/whl/(?P<tag>cpu|cu\d+|rocm[\d.]+)/?")
"""An index serving torch as <version>+<tag>."""
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageCheckError(Exception):
    """The Dockerfile cannot be resolved: an unknown base, a step the check cannot follow."""


@dataclass
class Installed:
    name: str
    version: str
    source: str


@dataclass
class Stack:
    dockerfile: Path
    base: str
    base_info: Base
    python: str
    packages: dict[str, Installed] = field(default_factory=dict)
    """By canonical name."""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Left out on purpose, or outside what the static check can see."""

    def get(self, name: str) -> Optional[Installed]:
        return self.packages.get(canonicalize_name(name))


@dataclass(frozen=True)
class Dist:
    """What the check reads of an installed distribution."""
    version: str
    requires: tuple[str, ...]
    requires_python: Optional[str]


def installed_dist(name: str) -> Optional[Dist]:
    """The distribution `name` in this interpreter's environment (the venv); None if absent."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    return Dist(dist.version, tuple(dist.requires or ()), dist.metadata.get("Requires-Python"))


# --- the Dockerfile ----------------------------------------------------------------------------

def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each instruction; comment lines dropped (also inside a continued
    instruction, as Docker does) and continuation lines joined."""
    out: list[tuple[str, str]] = []
    current = ""
    for raw in text.splitlines():
        if raw.lstrip().startswith("#") or (not raw.strip() and current):
            continue
        line = raw.rstrip()
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            keyword, _, args = current.strip().partition(" ")
            out.append((keyword.upper(), args.strip()))
        current = ""
    if current.strip():
        keyword, _, args = current.strip().partition(" ")
        out.append((keyword.upper(), args.strip()))
    return out


def base_image(name: str) -> Base:
    if name in BASES:
        return BASES[name]
    for pattern, base in BASE_PATTERNS:
        m = re.fullmatch(pattern, name)
        if m:
            return Base(base.what, base.python.format(**m.groupdict()), base.apt_python, base.packages)
    raise ImageCheckError(f"unknown base image {name!r}: its Python (and any torch it ships) is not known; add it "
                          "to BASES or BASE_PATTERNS in containers/image_check.py (pinned tags only)")


def _commands(script: str) -> list[list[str]]:
    """The simple commands of a RUN's shell script (split at &&, ||, ;, |), each a word list;
    a redirection stays in it as the words '>' FILE."""
    lex = shlex.shlex(script, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lex:
        if token in ("&&", "||", ";", "|", "&"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _expand(word: str, env: dict[str, Optional[str]]) -> Optional[str]:
    """`word` with $NAME/${NAME} replaced; None when a variable's value is not known."""
    unknown = False

    def sub(m: re.Match) -> str:
        nonlocal unknown
        value = env.get(m[1] or m[2])
        if value is None:
            unknown = True
            return ""
        return value

    out = _VAR.sub(sub, word)
    return None if unknown else out


class _Image:
    """The image as the Dockerfile builds it, instruction by instruction."""

    def __init__(self, dockerfile: Path, lock_text: str, context: Path):
        self.dockerfile = dockerfile
        self.lock_text = lock_text
        self.context = context
        self.files: dict[str, str] = {}
        """Text of files in the image the check can follow (the lock and what is derived from it)."""
        self.env: dict[str, Optional[str]] = {"PATH": DEFAULT_PATH}
        self.venvs: list[str] = []
        self.apt: set[str] = set()
        self.stack: Optional[Stack] = None

    # instructions
    def from_(self, args: str) -> None:
        if self.stack is not None:
            raise ImageCheckError("more than one FROM: the check handles single-stage Dockerfiles only")
        name = next(w for w in args.split() if not w.startswith("--"))  # FROM [--platform=...] NAME [AS x]
        base = base_image(name)
        self.stack = Stack(self.dockerfile, name, base, base.python)
        for pkg, version in base.packages:
            self.stack.packages[canonicalize_name(pkg)] = Installed(pkg, version, f"base image {name}")

    def env_(self, args: str) -> None:
        words = shlex.split(args)
        if len(words) == 2 and "=" not in words[0]:  # legacy `ENV NAME value`
            words = [f"{words[0]}={words[1]}"]
        for word in words:
            name, _, value = word.partition("=")
            self.env[name] = _expand(value, self.env)

    def copy(self, args: str) -> None:
        words = [w for w in shlex.split(args) if not w.startswith("--")]
        sources, dest = words[:-1], words[-1]
        for src in sources:
            target = dest.rstrip("/") + "/" + Path(src).name if dest.endswith("/") or len(sources) > 1 else dest
            if src == "requirements.lock":
                self.files[target] = self.lock_text
            elif (self.context / src).is_file():
                self.files[target] = (self.context / src).read_text(encoding="utf-8", errors="replace")

    def run(self, script: str) -> None:
        shell = dict(self.env)
        for words in _commands(script):
            prefix: dict[str, Optional[str]] = {}
            while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                name, _, value = words.pop(0).partition("=")
                prefix[name] = self._value(value, shell)
            if not words:  # assignments alone set shell variables
                shell.update(prefix)
                continue
            redirect = None
            if ">" in words:
                i = words.index(">")
                redirect = _expand(words[i + 1], shell) if i + 1 < len(words) else None
                words = words[:i]
            argv = [_expand(w, {**shell, **prefix}) for w in words]
            self._command(argv, {**shell, **prefix}, redirect)

    # commands
    def _value(self, value: str, shell: dict[str, Optional[str]]) -> Optional[str]:
        m = re.fullmatch(r"\$\((.*)\)", value, flags=re.S)
        if m is None:
            return _expand(value, shell)
        argv = shlex.split(m[1])
        if len(argv) == 4 and argv[:2] == ["sed", "-n"]:
            sm = re.fullmatch(r"s/\^([A-Za-z0-9._-]+)==.*/\\1/p", argv[2])
            text = self.files.get(argv[3])
            if sm and text is not None:
                return self._pins(text, argv[3]).get(canonicalize_name(sm[1]), (None, ()))[0]
        return None

    def _pins(self, text: str, where: str) -> dict[str, tuple[str, tuple[str, ...]]]:
        try:
            return {canonicalize_name(e.name): (e.version, e.hashes) for e in parse_lock(text)}
        except LockError as e:
            raise ImageCheckError(f"{where}: {e}") from None

    def _command(self, argv: list[Optional[str]], env: dict[str, Optional[str]], redirect: Optional[str]) -> None:
        if any(a is None for a in argv):
            if any(a and re.search(r"\bpip$", a) for a in argv):
                self._problem(f"a pip command uses a variable whose value the check does not know: {argv}")
            return
        words = [a for a in argv if a is not None]
        exe = Path(words[0]).name
        if exe == "grep" and redirect:
            self._grep(words[1:], redirect)
        elif exe == "echo" and redirect:
            self.files[redirect] = " ".join(w for w in words[1:] if not w.startswith("-")) + "\n"
        elif exe in ("apt-get", "apt") and "install" in words:
            self.apt.update(w for w in words[words.index("install") + 1:] if not w.startswith("-"))
        elif re.fullmatch(r"python3(\.\d+)?", exe) and words[1:3] == ["-m", "venv"]:
            self.venvs += [w.rstrip("/") for w in words[3:] if not w.startswith("-")]
        elif (re.fullmatch(r"python(3(\.\d+)?)?", exe) and words[1:4] == ["-m", "pip", "install"]) \
                or (re.fullmatch(r"pip3?", exe) and words[1:2] == ["install"]):
            self._pip_install(words, words[4:] if words[1:2] == ["-m"] else words[2:], env)

    def _grep(self, args: list[str], target: str) -> None:
        flags = [a for a in args if a.startswith("-")]
        rest = [a for a in args if not a.startswith("-")]
        if len(rest) != 2 or rest[1] not in self.files:
            return
        pattern, source = rest
        invert = any("v" in f for f in flags)
        lines = [ln for ln in self.files[source].splitlines() if bool(re.search(pattern, ln)) != invert]
        self.files[target] = "\n".join(lines) + "\n"

    def _problem(self, text: str) -> None:
        assert self.stack is not None
        self.stack.problems.append(text)

    def _pip_install(self, words: list[str], args: list[str], env: dict[str, Optional[str]]) -> None:
        stack = self.stack
        assert stack is not None
        opts: dict[str, list[str]] = {"-r": [], "-c": [], "--index-url": [], "specs": []}
        flags: set[str] = set()
        aliases = {"--requirement": "-r", "--constraint": "-c", "-i": "--index-url"}
        i = 0
        while i < len(args):
            word = args[i]
            name, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
            name = aliases.get(name, name)
            if name in ("-r", "-c", "--index-url", "--extra-index-url"):
                if not eq:
                    i += 1
                    value = args[i] if i < len(args) else ""
                opts.setdefault(name, []).append(value)
            elif word.startswith("-"):
                flags.add(name)
            else:
                opts["specs"].append(word)
            i += 1
        where = " ".join(words)
        # PEP 668: a distribution's python3 refuses pip outside a venv
        if stack.base_info.apt_python:
            first = (env.get("PATH") or "").split(":")[0]
            in_venv = any(first == f"{v}/bin" or words[0].startswith(f"{v}/") for v in self.venvs)
            if not in_venv and "--break-system-packages" not in flags and not env.get("PIP_BREAK_SYSTEM_PACKAGES"):
                self._problem(f"`{where}` installs into {stack.base}'s system python3, which PEP 668 marks "
                              "externally managed: pip refuses; use a venv (python3 -m venv, on PATH) or "
                              "--break-system-packages")
        if opts.get("--extra-index-url"):
            self._problem(f"`{where}`: --extra-index-url lets another index shadow a pinned package")
        index = (opts["--index-url"] or [None])[-1]
        local = PYTORCH_INDEX.fullmatch(index) if index else None
        no_deps = "--no-deps" in flags
        hashes = "--require-hashes" in flags
        constraints: dict[str, str] = {}
        for path in opts["-c"] + ([env["PIP_CONSTRAINT"]] if env.get("PIP_CONSTRAINT") else []):
            if path not in self.files:
                self._problem(f"`{where}`: constraints file {path} is not one the check can follow")
                continue
            constraints.update((k, v) for k, (v, _) in self._pins(self.files[path], path).items())
        wanted: list[tuple[str, str, tuple[str, ...], str]] = []  # name, version, hashes, from
        for spec in opts["specs"]:
            try:
                req = Requirement(spec)
            except InvalidRequirement:
                self._problem(f"`{where}`: {spec!r} is not a requirement")
                continue
            pins = [s.version for s in req.specifier if s.operator in ("==", "===") and "*" not in s.version]
            if len(pins) != 1:
                self._problem(f"`{where}`: {spec} is not pinned to one version (==)")
                continue
            version = pins[0] + (f"+{local['tag']}" if local and "+" not in pins[0] else "")
            wanted.append((req.name, version, (), f"pip install {spec}" + (f" from {index}" if index else "")
                           + (", --no-deps" if no_deps else ", with its dependencies")))
        for path in opts["-r"]:
            if path not in self.files:
                self._problem(f"`{where}`: requirements file {path} is not one the check can follow")
                continue
            what = "requirements.lock" if self.files[path] == self.lock_text else f"{path} (from requirements.lock)"
            try:
                entries = parse_lock(self.files[path])
            except LockError as e:
                raise ImageCheckError(f"{path}: {e}") from None
            wanted += [(e.name, e.version, e.hashes, what) for e in entries]
        for name, version, hs, source in wanted:
            key = canonicalize_name(name)
            have = stack.packages.get(key)
            if have is not None and _same_public(have.version, version):
                kept = have  # "Requirement already satisfied": pip keeps the installed one
            else:
                if hashes and not hs:
                    self._problem(f"`{where}`: {name}=={version} has no hash (--require-hashes) and "
                                  + (f"the image's {have.name} {have.version} does not satisfy it"
                                     if have else "nothing installed before satisfies it")
                                  + ": pip refuses to download it unverified")
                    continue
                kept = stack.packages[key] = Installed(name, version, source)
                if key == "torch" and no_deps and re.search(r"\+cu\d+$", version):
                    self._problem(f"`{where}`: torch {version} is a CUDA build installed with --no-deps: its "
                                  "nvidia-* libraries are not in the lock; install torch with its dependencies")
            if key in constraints and not _same_public(kept.version, constraints[key]):
                self._problem(f"`{where}`: {name} {kept.version} conflicts with the constraint "
                              f"{name}=={constraints[key]}")
            if not no_deps and not hs and source.startswith("pip install"):
                stack.notes.append(f"{name} {kept.version}: what it needs beyond the lock (a CUDA torch's nvidia-* "
                                   f"libraries and triton) comes from {index or 'PyPI'} through pip's resolver; "
                                   "the build's `pip check` covers it")


def _same_public(a: str, b: str) -> bool:
    """Versions equal up to a local tag (2.13.0+cu130 satisfies ==2.13.0)."""
    try:
        va, vb = Version(a), Version(b)
    except InvalidVersion:
        return a == b
    if vb.local is not None and va.local is not None:
        return va == vb
    return va.public == vb.public


def derive(dockerfile: Path, lock_path: Path = LOCK_PATH, context: Path = REPO_ROOT) -> Stack:
    """The Python and packages of the image `dockerfile` builds (with problems found on the way);
    ImageCheckError when it cannot be derived."""
    dockerfile = Path(dockerfile)
    image = _Image(dockerfile, Path(lock_path).read_text(encoding="utf-8"), Path(context))
    for keyword, args in instructions(dockerfile.read_text(encoding="utf-8")):
        if keyword == "FROM":
            image.from_(args)
            continue
        if image.stack is None:
            if keyword == "ARG":
                continue
            raise ImageCheckError(f"{keyword} before FROM")
        if keyword == "ENV":
            image.env_(args)
        elif keyword == "ARG":
            image.env_(args) if "=" in args else image.env.setdefault(args.strip(), None)
        elif keyword in ("COPY", "ADD"):
            image.copy(args)
        elif keyword == "RUN":
            if args.lstrip().startswith("["):
                raise ImageCheckError(f"RUN in exec form is not supported: {args}")
            image.run(args)
    if image.stack is None:
        raise ImageCheckError("no FROM instruction")
    stack = image.stack
    if stack.base_info.apt_python and "python3" not in image.apt:
        stack.problems.append(f"{stack.base} has no Python and the Dockerfile does not apt-get install python3")
    return stack


# --- resolution --------------------------------------------------------------------------------

def marker_env(python: str, extra: str = "") -> dict[str, str]:
    """PEP 508 marker variables of CPython `python` on Linux x86_64."""
    parts = python.split(".")
    full = ".".join((parts + ["0"])[:3])
    return {"python_version": ".".join(parts[:2]), "python_full_version": full,
            "implementation_name": "cpython", "implementation_version": full,
            "platform_python_implementation": "CPython", "os_name": "posix", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": "x86_64", "platform_release": "",
            "platform_version": "", "extra": extra}


def resolve(stack: Stack, dist: Callable[[str], Optional[Dist]] = installed_dist) -> Stack:
    """Check every package's requirements and Requires-Python against the image's set; problems
    and notes are appended to `stack`, which is returned."""
    python = marker_env(stack.python)["python_full_version"]
    todo = [(pkg, "") for pkg in stack.packages.values()]
    todo += [(stack.packages[canonicalize_name(n)], e) for n, extras in SUITE_EXTRAS.items()
             if canonicalize_name(n) in stack.packages for e in extras]
    seen: set[tuple[str, str]] = set()
    problems: list[str] = []
    notes: list[str] = []
    while todo:
        pkg, extra = todo.pop(0)
        key = canonicalize_name(pkg.name)
        if (key, extra) in seen:
            continue
        seen.add((key, extra))
        d = dist(pkg.name)
        who = f"{pkg.name} {pkg.version}"
        if d is None:
            problems.append(f"{who} is not installed in this venv: its requirements cannot be read (run `make venv`)")
            continue
        if Version(d.version).public != Version(pkg.version).public:
            if pkg.source.startswith("base image"):
                if not extra:
                    notes.append(f"{who} ({pkg.source}): its own requirements are not checked (this venv has "
                                 f"{pkg.name} {d.version})")
            elif not extra:
                problems.append(f"this venv has {pkg.name} {d.version} but the image gets {who} from {pkg.source}: "
                                "its requirements were not checked (the venv is not the lock's; run `make venv`)")
            continue
        if not extra and d.requires_python:
            try:
                ok = SpecifierSet(d.requires_python).contains(python, prereleases=True)
            except InvalidSpecifier:
                ok = True
            if not ok:
                problems.append(f"{who} requires Python {d.requires_python}; the image has Python {stack.python}")
        for line in d.requires:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(marker_env(stack.python, extra)):
                continue
            if req.marker is not None and extra and req.marker.evaluate(marker_env(stack.python, "")):
                continue  # not specific to the extra: checked with the package itself
            shown = req.name + (f"[{','.join(sorted(req.extras))}]" if req.extras else "") + str(req.specifier)
            on = f" (extra {extra})" if extra else ""
            dep_key = canonicalize_name(req.name)
            reason = NOT_INSTALLED.get((key, dep_key))
            if reason is not None:
                notes.append(f"{who} requires {shown}{on}: not installed on purpose: {reason}")
                continue
            dep = stack.packages.get(dep_key)
            if dep is None:
                problems.append(f"{who} requires {shown}{on}; the image does not have {req.name}")
                continue
            if not req.specifier.contains(dep.version, prereleases=True):
                problems.append(f"{who} requires {shown}{on}; the image has {dep.name} {dep.version}")
            todo += [(dep, e) for e in sorted(req.extras)]
    stack.problems += sorted(set(problems))
    stack.notes += sorted(set(notes))
    return stack


def check(dockerfile: Path, lock_path: Path = LOCK_PATH, dist: Callable[[str], Optional[Dist]] = installed_dist,
          context: Path = REPO_ROOT) -> Stack:
    """derive + resolve."""
    return resolve(derive(dockerfile, lock_path, context), dist)


# --- command line ------------------------------------------------------------------------------

def _rel(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def report(stack: Stack, all_packages: bool = False) -> str:
    lines = [f"{_rel(stack.dockerfile)}: {stack.base} ({stack.base_info.what}), Python {stack.python}"
             + (" (apt python3)" if stack.base_info.apt_python else "")]
    key = [p for p in (stack.get(n) for n in ("torch", "deepspeed", "transformers")) if p is not None]
    lines += [f"  {p.name} {p.version}  [{p.source}]" for p in key]
    if all_packages:
        listing = ", ".join(f"{p.name}=={p.version}" for p in sorted(stack.packages.values(), key=lambda p: p.name.lower()))
        lines += textwrap.wrap(listing, 100, initial_indent="  ", subsequent_indent="  ")
    else:
        lines.append(f"  {len(stack.packages)} packages (--packages lists them)")
    extras = [f"{n}[{','.join(e)}]" for n, e in SUITE_EXTRAS.items() if stack.get(n)]
    if extras:
        lines.append("  extras the suite uses: " + ", ".join(extras))
    lines += [f"  note: {n}" for n in stack.notes]
    lines += [f"  PROBLEM: {p}" for p in stack.problems]
    if not stack.problems:
        lines.append("  ok: every requirement and Requires-Python holds")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m containers.image_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dockerfile", action="append", type=Path,
                    help="a Dockerfile to check (repeatable; default: containers/Dockerfile.gpu and .cpu)")
    ap.add_argument("--lock", type=Path, default=LOCK_PATH, help="the lock the Dockerfile's requirements.lock is")
    ap.add_argument("--packages", action="store_true", help="list every package of each image")
    ns = ap.parse_args(argv)
    failed = False
    for dockerfile in ns.dockerfile or DOCKERFILES:
        try:
            stack = check(dockerfile, ns.lock)
        except (ImageCheckError, OSError) as e:
            print(f"{_rel(dockerfile)}: error: {e}", file=sys.stderr)
            failed = True
            continue
        print(report(stack, ns.packages))
        failed |= bool(stack.problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
