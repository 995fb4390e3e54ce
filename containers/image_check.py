"""Static check of the container images' software stack, without a container engine: from a
Dockerfile and the image's lock (requirements.lock for Dockerfile.cpu, requirements-gpu.lock for
Dockerfile.gpu: containers/wheelhouse.py's TARGETS), the Python and the packages the image ends up
with, whether they are exactly the lock's pins, and whether every package's declared requirements
hold in that set.

containers/image_stack.py derives what the image holds from the Dockerfile (the base image's
Python and packages, then each step that installs); containers/image_requirements.py checks
each package's Requires-Dist and Requires-Python against that set, for the image's Python.

Usage, from the repository root with the venv's python:
  python -m containers.image_check [--dockerfile PATH ...] [--lock PATH] [--gpu-lock PATH] [--packages]
prints each image's stack and each problem; exit 1 on a problem (0: every image resolves).
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Callable, Optional, Sequence

from packaging.utils import canonicalize_name
from packaging.version import Version

from containers.image_requirements import SUITE_EXTRAS, Dist, lock_dists, resolve
from containers.image_stack import ImageCheckError, Stack, derive, image_of
from containers.lock import REPO_ROOT, parse_lock
from containers.wheelhouse import TARGETS

DOCKERFILES = tuple(REPO_ROOT / "containers" / f"Dockerfile.{image}" for image in ("gpu", "cpu"))


def check(dockerfile: Path, lock_path: Optional[Path] = None, dist: Optional[Callable[[str], Optional[Dist]]] = None,
          context: Path = REPO_ROOT) -> Stack:
    """derive + the lock's pins + resolve; `lock_path` stands for the image's lock (default: that
    lock), `dist` for what is read of each package (default: image_requirements.lock_dists)."""
    lock_path = Path(lock_path or TARGETS[image_of(dockerfile)].lock)
    lock_text = lock_path.read_text(encoding="utf-8")
    stack = derive(dockerfile, lock_path, context)
    stack.problems += against_lock(stack, lock_text, lock_path.name)
    return resolve(stack, dist or lock_dists(lock_text))


def against_lock(stack: Stack, lock_text: str, lock_name: str) -> list[str]:
    """Where the image's packages are not its lock's: a pin it lacks or holds at another release, a
    package the lock does not pin (the base image's own aside: the requirement check reads those)."""
    pins = {canonicalize_name(e.name): e for e in parse_lock(lock_text)}
    problems = []
    for key, e in pins.items():
        have = stack.packages.get(key)
        if have is None:
            problems.append(f"{lock_name} pins {e.name}=={e.version}; the image does not install it")
        elif Version(have.version).public != Version(e.version).public:
            problems.append(f"{lock_name} pins {e.name}=={e.version}; the image has {have.version} ({have.source})")
    problems += [f"{have.name} {have.version} ({have.source}) is not pinned by {lock_name}"
                 for key, have in stack.packages.items() if key not in pins and not have.source.startswith("base image")]
    return problems


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
    ap.add_argument("--lock", type=Path, default=TARGETS["cpu"].lock,
                    help="the lock of a Dockerfile that installs requirements.lock (Dockerfile.cpu)")
    ap.add_argument("--gpu-lock", type=Path, default=TARGETS["gpu"].lock,
                    help="the lock of Dockerfile.gpu, which installs requirements-gpu.lock")
    ap.add_argument("--packages", action="store_true", help="list every package of each image")
    ns = ap.parse_args(argv)
    failed = False
    for dockerfile in ns.dockerfile or DOCKERFILES:
        try:
            stack = check(dockerfile, ns.gpu_lock if image_of(dockerfile) == "gpu" else ns.lock)
        except (ImageCheckError, OSError) as e:
            print(f"{_rel(dockerfile)}: error: {e}", file=sys.stderr)
            failed = True
            continue
        print(report(stack, ns.packages))
        failed |= bool(stack.problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
