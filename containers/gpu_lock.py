"""requirements-gpu.lock (`make lock`, after requirements.lock): the GPU venv's exact pins, each with
the sha256 of every file PyPI has for that version, for `pip install --require-hashes --no-deps`.

One closure for Linux x86-64 (manylinux_2_28) and CPython 3.11 and 3.12:
- pip's own resolution (`pip install --dry-run --report`, wheels only, PyPI alone: this host's pip
  configuration, find-links and constraint files are ignored) of torch at requirements.lock's
  version, which on PyPI is the CUDA 13 build, plus GPU_ADDS, every version held to
  requirements.lock's by a constraints file: torch's nvidia-*, cuda-bindings and triton wheels;
- every other pin of requirements.lock at the same version and hashes (deepspeed and
  antlr4-python3-runtime stay sdists, built at install as in the CPU venv);
- torch hashed like every other pin: PyPI's files are the CUDA build's.

Under each pin, `# requires:` lines keep its Requires-Dist that apply there (the extras the
closure asks for included), so the closure can be checked offline (`--check`, the unit tests).

    python -m containers.gpu_lock [--cpu-lock requirements.lock] [--out requirements-gpu.lock]
    python -m containers.gpu_lock --check        # offline: hashes, agreement, closure
PYPI_SIMPLE_URL replaces https://pypi.org/simple for the resolution (PYPI_JSON_URL: see lock.py).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional, Sequence

from packaging import tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from containers.lock import (LOCK_PATH, NUM_FETCH_THREADS, PYTHON_VERSIONS, REPO_ROOT, LockError, Pin,
                             applying_requirements, fetch_json, installed_requires, missing_requirements, parse_lock,
                             release_files, write_text_atomic)

GPU_LOCK_PATH = REPO_ROOT / "requirements-gpu.lock"
GPU_ADDS = ("liger-kernel==0.8.5", "torchao==0.18.0")
"""What the GPU venv has beyond requirements.lock (issue 38): Liger's fused Triton kernels, torchao's FP8."""
PYPI_SIMPLE_URL = os.environ.get("PYPI_SIMPLE_URL", "https://pypi.org/simple").rstrip("/")
PLATFORM_TAGS = tuple(f"manylinux_2_{m}_x86_64" for m in range(28, 4, -1)) + (
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64")
"""What pip on a glibc 2.28 x86-64 host accepts (`--platform` does not widen manylinux_2_28 itself:
the nvidia-* wheels are manylinux_2_27 and older)."""
LINUX_X86_64 = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix"}
"""Marker values of the GPU venv's host, whatever host writes or checks the lock."""
REQUIRES = "    # requires: "
NO_REQUIREMENTS = "(none)"

HEADER = """\
# requirements-gpu.lock -- the GPU venv ('make venv' on a node with an NVIDIA GPU,
# for a GPU platform, or with VENV_KIND=gpu; see the Makefile): torch as PyPI
# builds it for Linux x86-64 (CUDA 13), its nvidia-*, cuda-bindings and triton
# wheels, {adds}, and every pin of requirements.lock
# at the same version.
#
# Regenerate with 'make lock' (containers/gpu_lock.py, right after requirements.lock):
# pip's own resolution of torch=={torch} {adds_plain}
# for manylinux_2_28_x86_64 and CPython 3.11 and 3.12 (pip install --dry-run
# --report --only-binary=:all:, PyPI alone), every version held to requirements.lock's;
# then the sha256 of EVERY file PyPI has for each pinned version.  Do not edit by hand.
#
# Install (all at once; nothing is resolved, so nothing can swap torch):
#   DS_BUILD_OPS=0 pip install --require-hashes --no-deps -r requirements-gpu.lock
#
# The '# requires:' lines under a pin are its Requires-Dist that apply on Linux
# x86-64 with CPython 3.11 or 3.12: what the offline closure check reads
# (python -m containers.gpu_lock --check; tests/unit/test_gpu_lock.py).
"""


@dataclass(frozen=True)
class Resolved:
    name: str
    version: str
    requires: tuple[str, ...]


# --- the resolution ----------------------------------------------------------------------------

def resolve_argv(python: str, python_version: str, report: Path, target: Path, constraints: Path,
                 requirements: Sequence[str]) -> list[str]:
    """pip's dry run for Linux x86-64 and `python_version`, wheels only, PyPI alone (--isolated:
    no user configuration or PIP_* variables; the caller sets PIP_CONFIG_FILE=/dev/null for the
    global files). --target: pip refuses --platform for an install into an environment."""
    abi = "cp" + python_version.replace(".", "")
    return [python, "-m", "pip", "install", "--isolated", "--dry-run", "--quiet", "--ignore-installed",
            "--target", str(target), "--report", str(report), "--index-url", PYPI_SIMPLE_URL,
            *[a for p in PLATFORM_TAGS for a in ("--platform", p)], "--python-version", python_version,
            "--implementation", "cp", "--abi", abi, "--only-binary=:all:", "-c", str(constraints), *requirements]


def parse_report(report: Mapping) -> dict[str, Resolved]:
    """{canonical name: what pip would install} of a `pip install --report` document."""
    out = {}
    for item in report.get("install") or []:
        md = item["metadata"]
        out[canonicalize_name(md["name"])] = Resolved(md["name"], md["version"], tuple(md.get("requires_dist") or ()))
    return out


def resolve(python_version: str, requirements: Sequence[str], constraints: Sequence[Pin],
            python: str = sys.executable) -> dict[str, Resolved]:
    with tempfile.TemporaryDirectory(prefix="gpu-lock-") as tmp:
        t = Path(tmp)
        (t / "constraints.txt").write_text("".join(f"{p.name}=={p.version}\n" for p in constraints))
        argv = resolve_argv(python, python_version, t / "report.json", t / "target", t / "constraints.txt",
                            requirements)
        print(f"+ pip install --dry-run --report ... --python-version {python_version} {' '.join(requirements)}",
              flush=True)
        done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-10:])
            raise LockError(f"pip's resolution for Python {python_version} failed (exit {done.returncode}):\n{tail}")
        return parse_report(json.loads((t / "report.json").read_text()))


# --- the closure's requirements ------------------------------------------------------------------

def applicable_requires(pins: Sequence[Pin], requires: Callable[[str], Iterable[str]],
                        python_versions: Sequence[str] = PYTHON_VERSIONS,
                        platform: Mapping[str, str] = LINUX_X86_64) -> dict[str, list[str]]:
    """{canonical name: its Requires-Dist lines that apply on one of `python_versions` on
    `platform`, with no extra or an extra some pin of the closure asks for}: what the lock keeps
    as `# requires:` lines, and all that `missing_requirements` then needs."""
    out: dict[str, list[str]] = {p.key: [] for p in pins}
    for pin, _extra, req, _where in applying_requirements(pins, requires, python_versions, platform):
        if str(req) not in out[pin.key]:
            out[pin.key].append(str(req))
    return {key: sorted(lines) for key, lines in out.items()}


def parse_requires(text: str) -> dict[str, list[str]]:
    """{canonical name: its `# requires:` lines} of a lock `render` wrote; a pin without any
    such line (not even `(none)`) is absent."""
    out: dict[str, list[str]] = {}
    current = None
    for raw in text.splitlines():
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==", raw)
        if m:
            current = canonicalize_name(m[1])
        elif raw.startswith(REQUIRES) and current is not None:
            line = raw[len(REQUIRES):].strip()
            out.setdefault(current, [])
            if line != NO_REQUIREMENTS:
                out[current].append(line)
    return out


def supported_tags(python_version: str) -> frozenset[tags.Tag]:
    """The wheel tags pip accepts for CPython `python_version` on PLATFORM_TAGS."""
    major, minor = (int(x) for x in python_version.split("."))
    interpreter = f"cp{major}{minor}"
    return frozenset([*tags.cpython_tags((major, minor), abis=[interpreter], platforms=PLATFORM_TAGS),
                      *tags.compatible_tags((major, minor), interpreter, PLATFORM_TAGS)])


def wheel_gaps(pin: Pin, filenames: Iterable[str], python_versions: Sequence[str] = PYTHON_VERSIONS) -> list[str]:
    """The Pythons of `python_versions` for which `pin` has no wheel here (pip builds its sdist)."""
    wheels = [parse_wheel_filename(f)[3] for f in filenames if f.endswith(".whl")]
    return [v for v in python_versions if not any(t in supported_tags(v) for w in wheels for t in w)]


# --- the file ----------------------------------------------------------------------------------

def render(pins: Sequence[Pin], hashes: Mapping[str, Sequence[str]], requires: Mapping[str, Sequence[str]],
           torch_version: str) -> str:
    adds = ", ".join(GPU_ADDS)
    out = [HEADER.format(adds=adds, adds_plain=" ".join(GPU_ADDS), torch=torch_version)]
    for pin in pins:
        lines = [f"{pin.name}=={pin.version}"] + [f"    --hash=sha256:{h}" for h in hashes[pin.key]]
        out.append(" \\\n".join(lines) + "\n")
        out += [f"{REQUIRES}{r}\n" for r in (requires.get(pin.key) or [NO_REQUIREMENTS])]
    return "".join(out)


def _torch_of(entries) -> str:
    for e in entries:
        if canonicalize_name(e.name) == "torch":
            return e.version
    raise LockError("requirements.lock pins no torch")


def build(cpu_text: str, python: str = sys.executable, fetch: Callable[[str], Optional[dict]] = fetch_json,
          resolver: Callable[..., dict[str, Resolved]] = resolve,
          requires_of: Callable[[str], list[str]] = installed_requires,
          installed_version: Callable[[str], str] = metadata.version) -> tuple[str, list[str]]:
    """The GPU lock's text from requirements.lock's, and notes worth printing."""
    cpu = parse_lock(cpu_text)
    torch = _torch_of(cpu)
    wanted = [f"torch=={torch}", *GPU_ADDS]
    cpu_pins = [Pin(e.name, e.version) for e in cpu]
    resolved = {v: resolver(v, wanted, cpu_pins, python=python) for v in PYTHON_VERSIONS}
    first = resolved[PYTHON_VERSIONS[0]]
    for v, r in resolved.items():
        if {k: x.version for k, x in r.items()} != {k: x.version for k, x in first.items()}:
            raise LockError(f"pip resolves {' '.join(wanted)} differently for Python {PYTHON_VERSIONS[0]} and {v}")
    by_key = {p.key: p for p in cpu_pins}
    for key, r in first.items():
        if key in by_key and by_key[key].version != r.version:
            raise LockError(f"pip resolved {r.name}=={r.version}, requirements.lock pins {by_key[key].version}")
        by_key.setdefault(key, Pin(r.name, r.version))
    pins = sorted(by_key.values(), key=lambda p: p.key)

    def requires(name: str) -> list[str]:
        key = canonicalize_name(name)
        if key in first:  # the wheels pip resolved (torch's CUDA build among them): their own metadata
            return list(dict.fromkeys(req for r in resolved.values() for req in r[key].requires))
        try:  # the rest as in requirements.lock's own check: this (CPU) venv's metadata, same version
            have = installed_version(name).split("+")[0]
        except metadata.PackageNotFoundError:
            raise LockError(f"{name} is not installed in this venv: its requirements cannot be read "
                            "(run `make venv`)") from None
        if have != by_key[key].version:
            raise LockError(f"this venv has {name} {have}, the lock pins {by_key[key].version}: run `make venv`")
        return requires_of(name)

    missing = missing_requirements(pins, requires, PYTHON_VERSIONS, LINUX_X86_64)
    if missing:
        raise LockError("the GPU closure is incomplete for `pip install --no-deps`:\n  " + "\n  ".join(missing))
    files, errors = {}, []

    def one(pin: Pin):
        try:
            return release_files(pin, fetch)
        except LockError as e:
            errors.append(str(e))
            return []
    with ThreadPoolExecutor(NUM_FETCH_THREADS) as pool:
        files = dict(zip((p.key for p in pins), pool.map(one, pins)))
    if errors:
        raise LockError("\n".join(sorted(errors)))
    hashes = {p.key: sorted({f["digests"]["sha256"] for f in files[p.key] if (f.get("digests") or {}).get("sha256")})
              for p in pins}
    notes = []
    for e in cpu:
        if e.hashes and tuple(hashes[canonicalize_name(e.name)]) != e.hashes:
            raise LockError(f"{e.name}=={e.version}: PyPI's files are not requirements.lock's hashes; run `make lock`")
    for p in pins:
        if not hashes[p.key]:
            raise LockError(f"{p.name}=={p.version}: PyPI lists no files with a sha256 for this version")
        gaps = wheel_gaps(p, [f["filename"] for f in files[p.key]])
        sdist = any(not f["filename"].endswith(".whl") for f in files[p.key])
        if gaps and not sdist:
            raise LockError(f"{p.name}=={p.version}: no wheel for CPython {', '.join(gaps)} on Linux x86-64, no sdist")
        if gaps:
            notes.append(f"{p.name}=={p.version}: no wheel for CPython {', '.join(gaps)}; pip builds its sdist")
    text = render(pins, hashes, applicable_requires(pins, requires), torch)
    added = [p.name for p in pins if p.key not in {canonicalize_name(e.name) for e in cpu}]
    notes.append(f"{len(added)} pins beyond requirements.lock: {', '.join(added)}")
    return text, notes


def check(gpu_text: str, cpu_text: str) -> list[str]:
    """Offline: what is wrong with a GPU lock (empty: nothing). Every pin hashed; requirements.lock's
    pins all there at their versions and hashes; torch at requirements.lock's version and GPU_ADDS
    pinned; each pin's `# requires:` satisfied within the lock on Linux x86-64, CPython 3.11/3.12."""
    try:
        entries, cpu = parse_lock(gpu_text), parse_lock(cpu_text)
    except LockError as e:
        return [str(e)]
    problems = []
    by_key = {canonicalize_name(e.name): e for e in entries}
    for e in entries:
        if not e.hashes or not all(re.fullmatch(r"[0-9a-f]{64}", h) for h in e.hashes):
            problems.append(f"{e.name}=={e.version}: no --hash=sha256 (or one that is not 64 hex digits)")
    for c in cpu:
        g = by_key.get(canonicalize_name(c.name))
        if g is None or g.version != c.version:
            problems.append(f"requirements.lock pins {c.name}=={c.version}, the GPU lock "
                            + (f"{g.version}" if g else "does not"))
        elif c.hashes and set(c.hashes) != set(g.hashes):
            problems.append(f"{c.name}=={c.version}: the GPU lock's hashes are not requirements.lock's")
    for want in (f"torch=={_torch_of(cpu)}", *GPU_ADDS):
        name, version = want.split("==")
        g = by_key.get(canonicalize_name(name))
        if g is None or g.version != version:
            problems.append(f"the GPU lock must pin {want}")
    requires = parse_requires(gpu_text)
    problems += [f"{e.name}=={e.version}: no '# requires:' line" for e in entries
                 if canonicalize_name(e.name) not in requires]
    pins = [Pin(e.name, e.version) for e in entries]
    problems += missing_requirements(pins, lambda name: requires.get(canonicalize_name(name), []),
                                     PYTHON_VERSIONS, LINUX_X86_64)
    return problems


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m containers.gpu_lock", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu-lock", type=Path, default=LOCK_PATH, help="requirements.lock (read)")
    ap.add_argument("--out", type=Path, default=GPU_LOCK_PATH, help="the GPU lock (written; read by --check)")
    ap.add_argument("--check", action="store_true", help="check the GPU lock offline instead of writing it")
    ns = ap.parse_args(argv)
    cpu_text = ns.cpu_lock.read_text(encoding="utf-8")
    if ns.check:
        problems = check(ns.out.read_text(encoding="utf-8"), cpu_text)
        print("\n".join(problems) or f"{ns.out}: complete and consistent with {ns.cpu_lock}")
        return 1 if problems else 0
    try:
        text, notes = build(cpu_text)
        problems = check(text, cpu_text)
        if problems:
            raise LockError("\n".join(problems))
    except LockError as e:
        print(f"error: {e}\n{ns.out} was not written", file=sys.stderr)
        return 1
    write_text_atomic(ns.out, text)
    entries = parse_lock(text)
    for note in notes:
        print(f"  {note}")
    print(f"wrote {ns.out} ({len(entries)} packages, {sum(len(e.hashes) for e in entries)} hashes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
