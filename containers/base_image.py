"""A local Debian bookworm base image, for where no registry base can be pulled (`make base-image`;
`make containers` makes it itself when the Dockerfile's pinned base cannot be pulled).

    python -m containers.base_image [--engine podman|docker] [--force]

debootstrap (as root) writes a minimal bookworm with python3 (3.11, the lock's Python minor),
python3-venv, python3-pip, python3-dev, g++ and make (DeepSpeed's CPU op is compiled in the
image); `tar | ENGINE import` makes it the image BASE_NAME with labels saying how it was made;
build/containers/base-image.json keeps its id, Python, and the Debian packages it holds."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from containers.lock import REPO_ROOT, write_text_atomic
from harness.launch.engine import engine_args

BASE_NAME = "localhost/llm-pretrain-bench-base:bookworm"
SUITE = "bookworm"
PYTHON_MINOR = "3.11"
PACKAGES = ("python3", "python3-venv", "python3-pip", "python3-dev", "g++", "make")
MIRROR = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
ROOTFS = REPO_ROOT / "build" / "base-rootfs"
RECORD = REPO_ROOT / "build" / "containers" / "base-image.json"


class BaseImageError(Exception):
    """The base cannot be made here; the message says why and what to do."""


def engine_cmd(engine: str) -> list[str]:
    args = engine_args(engine)
    if args.problem:
        raise BaseImageError(f"{engine}: {args.problem}")
    return [engine, *args.global_args]


def image_id(engine: str, name: str) -> Optional[str]:
    done = subprocess.run([*engine_cmd(engine), "image", "inspect", "--format", "{{.Id}}", name],
                          capture_output=True, text=True, timeout=60)
    return done.stdout.strip() or None if done.returncode == 0 else None


def make(engine: str, force: bool = False) -> str:
    """BASE_NAME's image id, making the image when missing (or when `force`)."""
    have = image_id(engine, BASE_NAME)
    if have and not force:
        print(f"base image {BASE_NAME}: present ({have[:12]}); --force (make base-image FORCE=1) remakes it")
        return have
    if os.geteuid() != 0:
        raise BaseImageError("debootstrap needs root: run `make base-image` as root, or build on a host "
                             "that can pull the Dockerfile's base")
    if shutil.which("debootstrap") is None:
        raise BaseImageError("debootstrap is not installed (Debian/Ubuntu: apt-get install debootstrap)")
    shutil.rmtree(ROOTFS, ignore_errors=True)
    ROOTFS.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    argv = ["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES), SUITE, str(ROOTFS), MIRROR]
    print("+ " + " ".join(argv), flush=True)
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-10:])
        raise BaseImageError(f"debootstrap failed (exit {done.returncode}):\n{tail}")
    t_boot = time.monotonic() - t0
    python = subprocess.run(["chroot", str(ROOTFS), "python3", "-c", "import platform; print(platform.python_version())"],
                            capture_output=True, text=True, check=True).stdout.strip()
    if not python.startswith(PYTHON_MINOR + "."):
        raise BaseImageError(f"debootstrap {SUITE} gave Python {python}; the lock is for {PYTHON_MINOR}")
    dpkg = subprocess.run(["chroot", str(ROOTFS), "dpkg-query", "-W", "-f", "${Package} ${Version}\n"],
                          capture_output=True, text=True, check=True).stdout.split("\n")
    made = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    labels = {"org.opencontainers.image.description": f"Debian {SUITE} minbase made by debootstrap (make base-image)",
              "org.opencontainers.image.created": made,
              "llm-pretrain-bench.base.debootstrap": f"{SUITE} minbase from {MIRROR}, +{','.join(PACKAGES)}",
              "llm-pretrain-bench.base.python": python}
    changes = [a for k, v in labels.items() for a in ("--change", f"LABEL {k}={json.dumps(v)}")]
    t1 = time.monotonic()
    tar = subprocess.Popen(["tar", "-C", str(ROOTFS), "-c", "."], stdout=subprocess.PIPE)
    imp = subprocess.run([*engine_cmd(engine), "import", *changes, "-", BASE_NAME], stdin=tar.stdout,
                         capture_output=True, text=True)
    tar.wait()
    if imp.returncode != 0 or tar.returncode != 0:
        raise BaseImageError(f"`{engine} import` failed (exit {imp.returncode}): {imp.stderr.strip()[-500:]}")
    new = image_id(engine, BASE_NAME)
    assert new is not None
    record = {"name": BASE_NAME, "id": new, "engine": engine, "made": made, "python": python, "labels": labels,
              "debootstrap_s": round(t_boot, 1), "import_s": round(time.monotonic() - t1, 1),
              "debian_packages": sorted(p for p in dpkg if p)}
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(RECORD, json.dumps(record, indent=1) + "\n")
    shutil.rmtree(ROOTFS, ignore_errors=True)
    print(f"base image {BASE_NAME}: {new[:12]}, Python {python}; debootstrap {t_boot:.0f} s, import "
          f"{record['import_s']:.0f} s ({len(record['debian_packages'])} Debian packages, listed in {RECORD.relative_to(REPO_ROOT)})")
    return new


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m containers.base_image", description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", choices=("podman", "docker"),
                    default=os.environ.get("CONTAINER_ENGINE") or ("podman" if shutil.which("podman") else "docker"))
    ap.add_argument("--force", action="store_true", help="remake it even when present")
    ns = ap.parse_args(argv)
    if shutil.which(ns.engine) is None:
        print(f"error: {ns.engine} is not installed; the base image is imported into docker or podman", file=sys.stderr)
        return 2
    try:
        make(ns.engine, ns.force)
    except (BaseImageError, subprocess.SubprocessError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
