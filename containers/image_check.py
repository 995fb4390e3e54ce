"""Static check of the container images' software stack, without a container engine: from a
Dockerfile and requirements.lock, the Python and the packages the image ends up with, and whether
every package's declared requirements hold in that set.

containers/image_stack.py derives what the image holds from the Dockerfile (the base image's
Python and packages, then each step that installs); containers/image_requirements.py checks
each package's Requires-Dist and Requires-Python against that set, for the image's Python.

Usage, from the repository root with the venv's python:
  python -m containers.image_check [--dockerfile PATH ...] [--lock PATH] [--packages]
prints each image's stack and each problem; exit 1 on a problem (0: every image resolves).
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Callable, Optional, Sequence

from containers.image_requirements import SUITE_EXTRAS, Dist, installed_dist, resolve
from containers.image_stack import ImageCheckError, Stack, derive
from containers.lock import LOCK_PATH, REPO_ROOT

DOCKERFILES = tuple(REPO_ROOT / "containers" / f"Dockerfile.{image}" for image in ("gpu", "cpu"))


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
