"""The wheelhouse an image installs from with `pip install --no-index`: every file of the image's
lock, downloaded on the host with every hash checked, so that the image build needs no network (the
build's own pip reaches no index here, nor on an offline HPC login node).

    python -m containers.wheelhouse --image cpu|gpu [--move NAME==VERSION ...] [--lock PATH]

Each image installs the lock of the venv of its kind (one closure, two consumers): the cpu image
requirements.lock, the gpu image requirements-gpu.lock (PyPI's CUDA 13 torch with its nvidia-*,
cuda-* and triton wheels, liger-kernel, torchao; every file hashed). It writes
build/wheelhouse/<image>[+name-version...]/:
- every hashed pin's file for the image's Python and platform, fetched by one `pip download
  --require-hashes --no-deps` (pip refuses a file whose sha256 is not one of the lock's); the gpu
  image's for CPython 3.12 on Linux x86-64 (gpu_lock.PLATFORM_TAGS), torch and its CUDA wheels
  among them: no torch index, no file without a lock hash;
- a wheel built here from each sdist the lock pins (deepspeed, antlr4-python3-runtime), so the
  image's pip needs no build backend from an index; the sdist's lock-verified sha256 is kept in
  MANIFEST.json beside the wheel's own;
- the cpu image's torch, which requirements.lock pins without a hash (its files are a
  host-specific build: a local wheel, or the PyTorch index given as TORCH_INDEX_URL); refused
  unless it is a +cpu build;
- torch.txt and requirements.txt: every file pinned by the sha256 of the file that is here, which
  the image installs with --require-hashes (torch first, as `make venv` does);
- a copy of the lock it was made from, under its own name (with --move: the lock with those pins
  moved to another release, hashed from PyPI's JSON API);
- MANIFEST.json: the lock's name and sha256, the target, and each file's origin and sha256.

A wheelhouse whose MANIFEST names the same lock sha256 is reused as it is ("up to date").
--move makes the second image of a real library change (containers/README.md)."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename

from containers.gpu_lock import GPU_LOCK_PATH, PLATFORM_TAGS, supported_tags
from containers.lock import (LOCK_PATH, REPO_ROOT, LockEntry, LockError, Pin, fetch_json, file_hashes, parse_lock,
                             write_text_atomic)

WHEELHOUSE_DIR = REPO_ROOT / "build" / "wheelhouse"
MANIFEST = "MANIFEST.json"


@dataclass(frozen=True)
class Target:
    python: str
    """The image's Python, X.Y (the locks' hashes cover 3.11 and 3.12)."""
    lock: Path
    """The lock the image installs: the one the venv of its kind installs (`make venv`)."""
    platform_args: tuple[str, ...]
    """How pip fetches for the image's Python and platform; none: this host's (checked)."""
    torch_tag: Optional[str] = None
    """Where the lock pins torch without a hash (taken from the host's torch source): the local tag
    that torch must carry."""


TARGETS = {
    "cpu": Target("3.11", LOCK_PATH, (), torch_tag="cpu"),
    "gpu": Target("3.12", GPU_LOCK_PATH, ("--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
                                          *(a for tag in PLATFORM_TAGS for a in ("--platform", tag)))),
}
"""The cpu image: requirements.lock for the host's Python 3.11 (its torch from the host's torch
source); the gpu image: requirements-gpu.lock for CPython 3.12 on Linux x86-64, every file hashed.
No --only-binary: --no-deps lets pip fetch the lock's sdists for another platform too."""


class WheelhouseError(Exception):
    """The wheelhouse cannot be made; the message says what and which package."""


@dataclass(frozen=True)
class Move:
    name: str
    version: str

    @staticmethod
    def parse(text: str) -> "Move":
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)", text.strip())
        if m is None:
            raise WheelhouseError(f"--move {text!r}: expected NAME==VERSION, e.g. deepspeed==0.19.7")
        return Move(m[1], m[2])

    @property
    def label(self) -> str:
        return f"{canonicalize_name(self.name)}-{self.version}"


def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _keep(files: dict[str, dict], part: Path, f: Path, pkg: str, origin: str) -> None:
    """Move `f` into the wheelhouse `part` and record it: its package, sha256, size and origin."""
    kept = part / f.name
    f.rename(kept)
    files[f.name] = {"package": pkg, "sha256": sha256_of(kept), "size": kept.stat().st_size, "origin": origin}


def moved_lock(text: str, moves: Sequence[Move], fetch: Callable[[str], Optional[dict]] = fetch_json) -> str:
    """The lock `text` with each moved pin's version and hashes replaced (hashes from PyPI's JSON API)."""
    entries = {canonicalize_name(e.name): e for e in parse_lock(text)}
    out = text
    for mv in moves:
        key = canonicalize_name(mv.name)
        if key not in entries:
            raise WheelhouseError(f"--move {mv.name}=={mv.version}: {mv.name} is not pinned in the lock")
        if key == "torch":
            raise WheelhouseError("--move torch: torch is not one pin (the cpu image's is host-specific, the gpu "
                                  "image's brings its CUDA wheels); move another package")
        old = entries[key]
        if old.version == mv.version:
            raise WheelhouseError(f"--move {mv.name}=={mv.version}: the lock already pins that version")
        try:
            hashes = file_hashes(Pin(old.name, mv.version), fetch)
        except LockError as e:
            raise WheelhouseError(str(e)) from None
        block = re.compile(rf"(?ms)^{re.escape(old.name)}=={re.escape(old.version)}(?: \\\n(?:    --hash=sha256:[0-9a-f]+(?: \\)?\n?)+|\n)")
        new = f"{old.name}=={mv.version} \\\n" + " \\\n".join(f"    --hash=sha256:{h}" for h in hashes) + "\n"
        out, n = block.subn(lambda _m: new, out, count=1)
        if n != 1:
            raise WheelhouseError(f"--move {mv.name}: its lock entry is not in the form `make lock` writes")
    return out


def folder_name(image: str, moves: Sequence[Move]) -> str:
    return "+".join([image] + sorted(m.label for m in moves))


def up_to_date(folder: Path, lock_sha: str) -> bool:
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    files = manifest.get("files") or {}
    return manifest.get("lock_sha256") == lock_sha and bool(files) and all(
        (folder / name).is_file() and (folder / name).stat().st_size == meta.get("size") for name, meta in files.items())


def _pip(python: str, args: list[str], env: Optional[dict[str, str]] = None) -> None:
    argv = [python, "-m", "pip", *args]
    print("+ " + " ".join(argv), flush=True)
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise WheelhouseError(f"`pip {' '.join(args[:2])} ...` failed (exit {done.returncode}):\n{tail}")


def _package_of(filename: str) -> str:
    if filename.endswith(".whl"):
        return canonicalize_name(parse_wheel_filename(filename)[0])
    return canonicalize_name(parse_sdist_filename(filename)[0])


def _download(python: str, target: Target, entries: Sequence[LockEntry], part: Path, env: dict[str, str]) -> Path:
    """Every hashed pin of `entries` into part/sdists by one `pip download --require-hashes --no-deps`."""
    hashed = part / "hashed-pins.txt"
    hashed.write_text("".join(f"{e.name}=={e.version} " + " ".join(f"--hash=sha256:{h}" for h in e.hashes) + "\n"
                              for e in entries if e.hashes), encoding="utf-8")
    _pip(python, ["download", "--no-deps", "--require-hashes", "--dest", str(part / "sdists"),
                  *target.platform_args, "-r", str(hashed)], env)
    hashed.unlink()
    return part / "sdists"


def _build_env() -> dict[str, str]:
    """pip's environment for fetching and building: DeepSpeed's wheel without its ops, no venv constraint."""
    return {**os.environ, "DS_BUILD_OPS": "0", "PIP_CONSTRAINT": ""}


def fetch(python: str, image: str, entries: Sequence[LockEntry], part: Path, lock_name: str,
          env: Optional[dict[str, str]] = None) -> dict[str, dict]:
    """Every hashed pin of `entries` for `image`'s Python and platform, into `part`: the wheels as
    downloaded (each sha256 one of the lock's), a wheel built here from each sdist (reproducibly, and
    refused when it fits only this host). Returns each file's package, sha256, size and origin."""
    target = TARGETS[image]
    env = env or _build_env()
    (part / "sdists").mkdir(parents=True)
    files: dict[str, dict] = {}
    lock_hashes = {canonicalize_name(e.name): set(e.hashes) for e in entries}
    for f in sorted(_download(python, target, entries, part, env).iterdir()):
        digest, pkg = sha256_of(f), _package_of(f.name)
        if digest not in lock_hashes.get(pkg, set()):   # pip checked it; a second look costs nothing
            raise WheelhouseError(f"{f.name}: sha256 {digest} is not one of {lock_name}'s for {pkg}")
        if f.name.endswith(".whl"):
            _keep(files, part, f, pkg, f"downloaded; sha256 is {lock_name}'s")
            continue
        built = part / "built"
        # reproducible: the same bytes in every clone (zip times from SOURCE_DATE_EPOCH; DeepSpeed's
        # setup.py lists its extras from a set, whose order PYTHONHASHSEED fixes), so the image's
        # install layer stays cached across clones of one lock
        _pip(python, ["wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(built), str(f)],
             {**env, "SOURCE_DATE_EPOCH": "315532800", "PYTHONHASHSEED": "0"})
        for w in built.iterdir():
            if target.platform_args and not set(parse_wheel_filename(w.name)[3]) & supported_tags(target.python):
                raise WheelhouseError(f"{w.name}, built here from {f.name}, does not fit the {image} image's "
                                      f"CPython {target.python} on Linux x86-64: {lock_name} needs a wheel for it")
            _keep(files, part, w, pkg, f"built here from {f.name} (sha256 {digest}, {lock_name}'s)")
        built.rmdir()
    shutil.rmtree(part / "sdists")
    return files


def make(image: str, lock_text: str, out: Path, python: str = sys.executable,
         torch_index_url: Optional[str] = None, lock_name: Optional[str] = None) -> Path:
    """Fill `out` (atomically: a .partial folder renamed at the end) for `image` from `lock_text`
    (the text of the image's lock, named `lock_name`: by default the target's)."""
    target = TARGETS[image]
    lock_name = lock_name or target.lock.name
    lock_sha = hashlib.sha256(lock_text.encode()).hexdigest()
    if up_to_date(out, lock_sha):
        print(f"wheelhouse {out.relative_to(REPO_ROOT) if out.is_relative_to(REPO_ROOT) else out}: up to date "
              f"({lock_name} sha256 {lock_sha[:12]})")
        return out
    if not target.platform_args:
        host = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        if host != target.python:
            raise WheelhouseError(f"the {image} image runs Python {target.python} but {python} is {host}: its "
                                  f"wheels would not fit; run with a Python {target.python} (make venv's)")
    entries = parse_lock(lock_text)
    torch = next((e for e in entries if canonicalize_name(e.name) == "torch"), None)
    if torch is None:
        raise WheelhouseError(f"{lock_name} pins no torch")
    unhashed = [e.name for e in entries if not e.hashes]
    if unhashed and (target.torch_tag is None or unhashed != [torch.name]):
        raise WheelhouseError(f"{lock_name} pins {', '.join(unhashed)} without a hash: the {image} image takes "
                              + ("every file, torch's too, hashed from its lock (requirements-gpu.lock: `make lock`)"
                                 if target.torch_tag is None else "only torch from the host's torch source"))
    if torch_index_url and torch.hashes:
        print(f"note: TORCH_INDEX_URL={torch_index_url} does not apply to the {image} image: {lock_name} hashes "
              "torch like every pin (PyPI's files)", flush=True)
    part = out.with_name(out.name + ".partial")
    shutil.rmtree(part, ignore_errors=True)
    env = _build_env()
    files = fetch(python, image, entries, part, lock_name, env)
    lock_hashes = {canonicalize_name(e.name): set(e.hashes) for e in entries}
    if not torch.hashes:
        _host_torch(python, image, target, torch.version, part, files, torch_index_url, env)
    have = {meta["package"] for meta in files.values()}
    missing = sorted(set(lock_hashes) - have)
    if missing:
        raise WheelhouseError(f"no file for {', '.join(missing)} in the wheelhouse")
    versions = {canonicalize_name(e.name): e for e in entries}
    lines = {meta["package"]: f"{versions[meta['package']].name}=={versions[meta['package']].version} "
                              f"--hash=sha256:{meta['sha256']}\n" for meta in files.values()}
    (part / "torch.txt").write_text(lines.pop("torch"), encoding="utf-8")
    (part / "requirements.txt").write_text("".join(lines[k] for k in sorted(lines)), encoding="utf-8")
    (part / lock_name).write_text(lock_text, encoding="utf-8")
    manifest = {"image": image, "python": target.python, "lock": lock_name, "lock_sha256": lock_sha, "files": files}
    write_text_atomic(part / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    part.rename(out)
    total = sum(m["size"] for m in files.values()) / 2**20
    print(f"wheelhouse {out}: {len(files)} files, {total:.0f} MiB ({lock_name} sha256 {lock_sha[:12]})")
    return out


def _host_torch(python: str, image: str, target: Target, version: str, part: Path, files: dict[str, dict],
                index_url: Optional[str], env: dict[str, str]) -> None:
    """The torch a lock pins without a hash, from the host's torch source (TORCH_INDEX_URL, or pip's
    configuration), alone (--no-deps); refused unless it is the image's build (+cpu)."""
    torch_dir = part / "torch"
    index = ["--index-url", index_url] if index_url else []
    _pip(python, ["download", "--no-deps", "--dest", str(torch_dir), *target.platform_args, *index,
                  f"torch=={version}"], env)
    for f in sorted(torch_dir.iterdir()):
        tag = parse_wheel_filename(f.name)[1].local if f.name.endswith(".whl") else None
        if tag != target.torch_tag:
            raise WheelhouseError(
                f"{f.name}: the {image} image needs torch {version}+{target.torch_tag}, this is "
                f"{version}{'+' + tag if tag else ' (no local tag: a CUDA build from PyPI)'}; "
                "set TORCH_INDEX_URL=https://download.pytorch.org/whl/" + str(target.torch_tag))
        _keep(files, part, f, "torch", "host's torch source (the lock pins torch without a hash)"
              + (f": {index_url}" if index_url else ""))
    torch_dir.rmdir()


def ensure(image: str, moves: Sequence[Move] = (), lock_path: Optional[Path] = None,
           torch_index_url: Optional[str] = None, python: str = sys.executable) -> Path:
    """The wheelhouse of `image` for its lock (default: the target's; with `moves` applied), made
    when missing or stale."""
    lock_path = Path(lock_path or TARGETS[image].lock)
    text = lock_path.read_text(encoding="utf-8")
    if moves:
        text = moved_lock(text, moves)
    return make(image, text, WHEELHOUSE_DIR / folder_name(image, moves), python=python,
                torch_index_url=torch_index_url, lock_name=lock_path.name)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m containers.wheelhouse", description=__doc__.split("\n\n")[0])
    ap.add_argument("--image", choices=sorted(TARGETS), default="cpu")
    ap.add_argument("--move", action="append", default=[], metavar="NAME==VERSION",
                    help="pin NAME to another release for this wheelhouse (a second image of a library change)")
    ap.add_argument("--lock", type=Path, default=None,
                    help="the lock (default: the image's: " + ", ".join(f"{i}: {t.lock.name}" for i, t in TARGETS.items())
                         + ")")
    ns = ap.parse_args(argv)
    try:
        moves = [Move.parse(m) for m in ns.move]
        ensure(ns.image, moves, ns.lock, torch_index_url=os.environ.get("TORCH_INDEX_URL") or None)
    except (WheelhouseError, LockError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
