"""requirements.lock (`make lock`): the venv's exact pins, each with the sha256 of every file PyPI
has for that version, so that `pip install --require-hashes` verifies every download.

Every file of a version (all wheels, for every platform and Python, and the sdist), not only
the one this host would pick: the same lock then verifies on CPython 3.11 (the venv, the CPU
image) and 3.12 (the GPU image).

torch is the exception: it comes from a host-specific source (a local CPU wheel, the PyTorch
CPU index, the GPU base image), so its line carries no hash. It is installed first, on its own;
pip in hash-checking mode accepts a requirement without a hash when an installed distribution
already satisfies it ("Requirement already satisfied"), and refuses to download one without a
hash. So `pip install --require-hashes --no-deps -r requirements.lock` after torch verifies
everything else and never fetches an unverified torch. With --no-deps the lock must be the
complete closure: `missing_requirements` checks it (for Python 3.11 and 3.12) before writing.

Run with the venv's python, from the repository root:
  python -m containers.lock [--out requirements.lock]
PYPI_JSON_URL replaces https://pypi.org/pypi (a mirror with the same JSON API).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCK_PATH = REPO_ROOT / "requirements.lock"
PYPI_JSON_URL = os.environ.get("PYPI_JSON_URL", "https://pypi.org/pypi").rstrip("/")
UNHASHED = frozenset({"torch"})
"""Installed first from a host-specific source; no hash in the lock."""
LEFT_OUT = frozenset({"pip", "wheel", "distribute"})
"""The venv's own tooling, not part of the lock (setuptools stays: torch needs >=77)."""
PYTHON_VERSIONS = ("3.11", "3.12")
"""The closure is checked for both: the venv and CPU image (3.11), the GPU image (3.12)."""
FETCH_TIMEOUT_S = 60.0
NUM_FETCH_THREADS = 8

HEADER = """\
# requirements.lock -- the CPU lock of this suite: the venv that 'make bench' /
# 'make venv' creates on a host without an NVIDIA GPU, and the cpu image
# (containers/Dockerfile.cpu).  requirements-gpu.lock holds every pin of it at
# the same version for the GPU venv and the gpu image (containers/gpu_lock.py).
#
# Regenerate with 'make lock' (containers/lock.py): pip freeze of the venv,
# local version tags such as +cpu stripped, pip/wheel left out, then the sha256
# of EVERY file PyPI has for each pinned version (all wheels for all platforms
# and Pythons, and the sdist), so the same lock verifies on CPython 3.11 (venv,
# CPU image) and 3.12 (GPU image).  Do not edit by hand: install or upgrade
# in the venv, update pyproject.toml, then 'make lock'.
#
# Install torch FIRST and pinned (torch==<version below>), on its own, then
#   DS_BUILD_OPS=0 pip install --require-hashes --no-deps -r requirements.lock
# (see the Makefile).  --no-deps: this file is the complete closure.
#
# torch carries NO hash: it comes from a host-specific source (a local CPU
# wheel via find-links, the PyTorch CPU index, or its CUDA index), whose
# files differ from PyPI's.  pip accepts its hash-less line only because the
# torch installed first already satisfies it; without that torch pip refuses
# to download it unverified.  The GPU image installs the same torch version
# as its CUDA build (+cu130).  Every other line has hashes.
"""


@dataclass(frozen=True)
class Pin:
    name: str
    """As pip prints it (e.g. huggingface_hub, Jinja2)."""
    version: str

    @property
    def key(self) -> str:
        return canonicalize_name(self.name)


class LockError(Exception):
    """The lock cannot be written: a pin not on PyPI, an incomplete closure, a failed freeze."""


def parse_freeze(text: str) -> list[Pin]:
    """`name==version` lines of `pip list --format=freeze` -> pins, without pip/wheel, local
    version tags (+cpu, +cu128) stripped, sorted by canonical name."""
    pins = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s+;]+)(\+\S+)?", line)
        if m is None:
            raise LockError(f"pip freeze line {line!r} is not name==version")
        if canonicalize_name(m[1]) not in LEFT_OUT:
            pins.append(Pin(m[1], m[2]))
    return sorted(pins, key=lambda p: p.key)


def freeze(python: str = sys.executable) -> list[Pin]:
    argv = [python, "-m", "pip", "list", "--format=freeze", "--exclude-editable", "--disable-pip-version-check"]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise LockError(f"{' '.join(argv)} failed (exit {done.returncode}): {done.stderr.strip()}")
    return parse_freeze(done.stdout)


# --- hashes ------------------------------------------------------------------------------------

def fetch_json(url: str) -> Optional[dict]:
    """The JSON at `url`; None on HTTP 404."""
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as r:
            return json.load(r)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise LockError(f"{url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise LockError(f"{url}: {e}") from None


def release_files(pin: Pin, fetch: Callable[[str], Optional[dict]] = fetch_json) -> list[dict]:
    """PyPI's file entries of `pin` (the version endpoint; the project endpoint's `releases`
    where a mirror has no version endpoint)."""
    doc = fetch(f"{PYPI_JSON_URL}/{pin.name}/{pin.version}/json")
    if doc is not None:
        return list(doc.get("urls") or [])
    doc = fetch(f"{PYPI_JSON_URL}/{pin.name}/json")
    if doc is None:
        raise LockError(f"{pin.name}=={pin.version}: {pin.name} is not on PyPI ({PYPI_JSON_URL}/{pin.name}/json: "
                        "HTTP 404); the lock only takes packages from PyPI")
    releases = doc.get("releases") or {}
    # PyPI's key is the version as uploaded: 13.0.3 for a wheel whose metadata says 13.0.3.0
    same = [v for v in releases if _same_version(v, pin.version)]
    if pin.version not in releases and same:
        return list(releases[same[0]])
    if pin.version not in releases:
        latest = (doc.get("info") or {}).get("version")
        raise LockError(f"{pin.name}=={pin.version}: PyPI has no release {pin.version} of {pin.name}"
                        + (f" (latest: {latest})" if latest else ""))
    return list(releases[pin.version])


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except ValueError:
        return False


def file_hashes(pin: Pin, fetch: Callable[[str], Optional[dict]] = fetch_json) -> list[str]:
    """Sorted sha256 digests of every file of `pin` on PyPI."""
    files = release_files(pin, fetch)
    hashes = sorted({f["digests"]["sha256"] for f in files if (f.get("digests") or {}).get("sha256")})
    if not hashes:
        raise LockError(f"{pin.name}=={pin.version}: PyPI lists no files with a sha256 for this version")
    return hashes


def all_hashes(pins: Sequence[Pin], fetch: Callable[[str], Optional[dict]] = fetch_json) -> dict[str, list[str]]:
    """{canonical name: hashes} of every pin not in UNHASHED; every failure reported at once."""
    wanted = [p for p in pins if p.key not in UNHASHED]
    errors: list[str] = []

    def one(pin: Pin) -> Optional[list[str]]:
        try:
            return file_hashes(pin, fetch)
        except LockError as e:
            errors.append(str(e))
            return None

    with ThreadPoolExecutor(NUM_FETCH_THREADS) as pool:
        results = list(pool.map(one, wanted))
    if errors:
        raise LockError("\n".join(sorted(errors)))
    return {p.key: h for p, h in zip(wanted, results) if h is not None}


# --- closure -----------------------------------------------------------------------------------

def _marker_env(python_version: str, extra: str, base: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    env = default_environment()
    env.update(base or {})
    env.update(python_version=python_version, python_full_version=f"{python_version}.0",
               implementation_name="cpython", platform_python_implementation="CPython", extra=extra)
    return env


def applying_requirements(pins: Sequence[Pin], requires: Callable[[str], Iterable[str]],
                          python_versions: Sequence[str] = PYTHON_VERSIONS,
                          platform: Optional[Mapping[str, str]] = None
                          ) -> Iterator[tuple[Pin, str, Requirement, list[str]]]:
    """The closure walk: (pin, the extra it is read with, one of its Requires-Dist, the Pythons of
    `python_versions` on which it applies) for each requirement (`requires(name)`) that applies on
    one of them (this host's platform, or the marker values `platform` gives); each pin read once
    without extras and once with each extra a pinned requirement asks for."""
    by_key = {p.key: p for p in pins}
    todo = [(p, "") for p in pins]
    seen: set[tuple[str, str]] = set()
    while todo:
        pin, extra = todo.pop()
        if (pin.key, extra) in seen:
            continue
        seen.add((pin.key, extra))
        for line in requires(pin.name):
            req = Requirement(line)
            where = [v for v in python_versions
                     if req.marker is None or req.marker.evaluate(_marker_env(v, extra, platform))]
            if not where:
                continue
            yield pin, extra, req, where
            dep = by_key.get(canonicalize_name(req.name))
            if dep is not None:
                todo += [(dep, e) for e in sorted(req.extras)]


def missing_requirements(pins: Sequence[Pin], requires: Callable[[str], Iterable[str]],
                         python_versions: Sequence[str] = PYTHON_VERSIONS,
                         platform: Optional[Mapping[str, str]] = None) -> list[str]:
    """What `pip install --no-deps` of the lock would leave unsatisfied: each requirement of the
    closure walk (`applying_requirements`) must name a pin whose version it accepts."""
    by_key = {p.key: p for p in pins}
    problems: set[str] = set()
    for pin, extra, req, where in applying_requirements(pins, requires, python_versions, platform):
        on = f" (Python {', '.join(where)})"
        dep = by_key.get(canonicalize_name(req.name))
        who = f"{pin.name}=={pin.version}" + (f"[{extra}]" if extra else "")
        if dep is None:
            problems.add(f"{who} requires {req}{on}, which is not in the lock")
        elif not req.specifier.contains(Version(dep.version), prereleases=True):
            problems.add(f"{who} requires {req}{on}, but the lock pins {dep.name}=={dep.version}")
    return sorted(problems)


def installed_requires(name: str) -> list[str]:
    """Requires-Dist of the installed distribution `name` (this interpreter's environment)."""
    return list(metadata.requires(name) or [])


# --- the file ----------------------------------------------------------------------------------

def render(pins: Sequence[Pin], hashes: dict[str, list[str]]) -> str:
    """The lock text: header, then one requirement per pin, its hashes on continuation lines;
    a pin in UNHASHED is a single line (no continuation on it or before it)."""
    out = [HEADER]
    for pin in pins:
        if pin.key in UNHASHED:
            out.append(f"{pin.name}=={pin.version}\n")
            continue
        lines = [f"{pin.name}=={pin.version}"] + [f"    --hash=sha256:{h}" for h in hashes[pin.key]]
        out.append(" \\\n".join(lines) + "\n")
    return "".join(out)


@dataclass(frozen=True)
class LockEntry:
    name: str
    version: str
    hashes: tuple[str, ...]


def parse_lock(text: str) -> list[LockEntry]:
    """The requirements of a lock written by `render` (comments skipped, continuations joined)."""
    logical, current = [], ""
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line and not current:
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    if current:
        logical.append(current)
    entries = []
    for line in logical:
        words = line.split()
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", words[0])
        if m is None:
            raise LockError(f"lock line {line!r} is not name==version [--hash=sha256:...]")
        hashes = tuple(w.removeprefix("--hash=sha256:") for w in words[1:] if w.startswith("--hash=sha256:"))
        others = [w for w in words[1:] if not w.startswith("--hash=sha256:")]
        if others:
            raise LockError(f"lock line {line!r}: unexpected {' '.join(others)}")
        entries.append(LockEntry(m[1], m[2], hashes))
    return entries


def write_text_atomic(path: Path, text: str) -> None:
    """Write to a temp file beside `path` (mode 0644), then rename over it: never half a file.
    (Self-contained on purpose: these tools also run in a bare copy of containers/.)"""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m containers.lock", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=LOCK_PATH, help="the lock to write (default: requirements.lock)")
    ns = ap.parse_args(argv)
    try:
        pins = freeze()
        missing = missing_requirements(pins, installed_requires)
        if missing:
            raise LockError("the venv is not a complete closure for `pip install --no-deps`:\n  "
                            + "\n  ".join(missing))
        if not any(p.key in UNHASHED for p in pins):
            raise LockError("torch is not installed in this environment; run `make venv` first")
        text = render(pins, all_hashes(pins))
    except LockError as e:
        print(f"error: {e}\n{ns.out} was not written", file=sys.stderr)
        return 1
    write_text_atomic(ns.out, text)
    num_hashes = sum(len(e.hashes) for e in parse_lock(text))
    print(f"wrote {ns.out} ({len(pins)} packages, {num_hashes} hashes; torch without a hash)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
