"""An image's Python and packages, derived from its Dockerfile's steps, not guessed (for
containers/image_check.py; containers/image_requirements.py then checks them):
- the Python: the base image's, from BASES (a pinned python:3.X tag; a distribution's python3,
  which the Dockerfile must apt-get install; a known framework image). An unknown base is an
  error: add it to BASES with what it ships.
- torch: the torch the base ships (BASES: an NGC PyTorch image), replaced by a `pip install
  torch==V` the Dockerfile runs (V literal or read from the lock with sed); the PyTorch index it
  comes from gives the local tag (+cpu, +cu130).
- the rest: each `pip install -r FILE` of the image's lock (wheelhouse.TARGETS: requirements.lock
  for the cpu image, requirements-gpu.lock for the gpu image), of its wheelhouse's torch.txt and
  requirements.txt, or of a file the Dockerfile derives from the lock with `grep`, in order. A
  lock line without a hash that the installed package does not satisfy is refused by
  --require-hashes.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from containers.lock import REPO_ROOT, LockEntry, LockError, parse_lock
from containers.wheelhouse import TARGETS


@dataclass(frozen=True)
class Base:
    what: str
    python: str
    """The Python the image runs: X.Y.Z where the base fixes it, else X.Y (evaluated as X.Y.0)."""
    apt_python: bool = False
    """A distribution image without Python: python3 comes from apt (the Dockerfile installs it)."""
    packages: tuple[tuple[str, str], ...] = ()
    """Python packages the base ships that the suite relies on (name, version)."""
    ships_python3: bool = False
    """A distribution base that already holds its python3 (the local base of `make base-image`)."""


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
    (r"localhost/llm-pretrain-bench-base:bookworm",
     Base("the local Debian bookworm base of `make base-image`", "3.11.2", apt_python=True, ships_python3=True)),
)
"""Bases known by a pattern of pinned tags (the whole name must match); `{py}` is the tag's
Python. A distribution's python3 is the version its release ships."""

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
            out.append(_instruction(current))
        current = ""
    if current.strip():
        out.append(_instruction(current))
    return out


def _instruction(line: str) -> tuple[str, str]:
    keyword, _, args = line.strip().partition(" ")
    return keyword.upper(), args.strip()


def base_image(name: str) -> Base:
    """A known base by its pinned name; a digest (`NAME@sha256:...`) pins a known tag further."""
    name = re.sub(r"@sha256:[0-9a-f]{64}$", "", name)
    if name in BASES:
        return BASES[name]
    for pattern, base in BASE_PATTERNS:
        m = re.fullmatch(pattern, name)
        if m:
            return Base(base.what, base.python.format(**m.groupdict()), base.apt_python, base.packages,
                        base.ships_python3)
    raise ImageCheckError(f"unknown base image {name!r}: its Python (and any torch it ships) is not known; add it "
                          "to BASES or BASE_PATTERNS in containers/image_stack.py (pinned tags only)")


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

    def __init__(self, dockerfile: Path, lock_text: str, lock_name: str, context: Path):
        self.dockerfile = dockerfile
        self.lock_text, self.lock_name = lock_text, lock_name
        """The image's lock: its text (what the check was given), the name the Dockerfile copies."""
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
        words = [_expand(w, self.env) or w for w in shlex.split(args) if not w.startswith("--")]
        sources, dest = words[:-1], words[-1]
        for src in sources:
            if src.startswith("build/wheelhouse"):   # containers/wheelhouse.py: the lock's pins, by file hash
                self.files.update(wheelhouse_files(self.lock_text, dest.rstrip("/"), Path(src).name.split("+")[0]))
                continue
            target = dest.rstrip("/") + "/" + Path(src).name if dest.endswith("/") or len(sources) > 1 else dest
            if src == self.lock_name:
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
        return {canonicalize_name(e.name): (e.version, e.hashes) for e in _lock_entries(text, where)}

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
            what = self.lock_name if self.files[path] == self.lock_text else f"{path} (from {self.lock_name})"
            wanted += [(e.name, e.version, e.hashes, what) for e in _lock_entries(self.files[path], path)]
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


def wheelhouse_files(lock_text: str, dest: str, image: str = "cpu") -> dict[str, str]:
    """What a wheelhouse (containers/wheelhouse.py) of `image` COPY'd to `dest` holds for the check:
    torch.txt, the image's lock's torch pin (as the host's torch build where the lock pins it
    without a hash: +cpu), and requirements.txt, every other pin; each pinned by the sha256 of its
    file in the wheelhouse (here a stand-in where the lock has none: the wheelhouse is made, and
    checked, on the host)."""
    entries = _lock_entries(lock_text, "the image's lock")
    stand_in = "--hash=sha256:" + "0" * 64
    tag = TARGETS[image].torch_tag if image in TARGETS else None
    line = {e.name: f"{e.name}=={e.version}" + (f"+{tag}" if tag and canonicalize_name(e.name) == "torch" else "")
            + " " + (" ".join(f"--hash=sha256:{h}" for h in e.hashes) or stand_in) + "\n" for e in entries}
    torch = [n for n in line if canonicalize_name(n) == "torch"]
    return {f"{dest}/torch.txt": "".join(line[n] for n in torch),
            f"{dest}/requirements.txt": "".join(v for n, v in line.items() if n not in torch)}


def _lock_entries(text: str, where: str) -> list[LockEntry]:
    """The entries of a lock-format file in the image; ImageCheckError if it does not parse."""
    try:
        return parse_lock(text)
    except LockError as e:
        raise ImageCheckError(f"{where}: {e}") from None


def _same_public(a: str, b: str) -> bool:
    """Versions equal up to a local tag (2.13.0+cu130 satisfies ==2.13.0)."""
    try:
        va, vb = Version(a), Version(b)
    except InvalidVersion:
        return a == b
    if vb.local is not None and va.local is not None:
        return va == vb
    return va.public == vb.public


def image_of(dockerfile: Path) -> str:
    """The image a Dockerfile builds, by its name: Dockerfile.gpu the gpu image; another name, cpu."""
    name = Path(dockerfile).name.partition("Dockerfile.")[2]
    return name if name in TARGETS else "cpu"


def derive(dockerfile: Path, lock_path: Optional[Path] = None, context: Path = REPO_ROOT) -> Stack:
    """The Python and packages of the image `dockerfile` builds (with problems found on the way),
    `lock_path` standing for the image's lock (default: that lock); ImageCheckError when it cannot
    be derived."""
    dockerfile = Path(dockerfile)
    lock = TARGETS[image_of(dockerfile)].lock
    image = _Image(dockerfile, Path(lock_path or lock).read_text(encoding="utf-8"), lock.name, Path(context))
    for keyword, args in instructions(dockerfile.read_text(encoding="utf-8")):
        if keyword == "FROM":
            expanded = _expand(args, image.env)
            if expanded is None:
                raise ImageCheckError(f"FROM {args}: a build argument without a default")
            image.from_(expanded)
            continue
        if image.stack is None:
            if keyword == "ARG":   # a build argument FROM may use (its default is what the check follows)
                image.env_(args) if "=" in args else None
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
    if stack.base_info.apt_python and not stack.base_info.ships_python3 and "python3" not in image.apt:
        stack.problems.append(f"{stack.base} has no Python and the Dockerfile does not apt-get install python3")
    return stack
