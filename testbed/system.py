"""Processes and packages of the host, for the test beds (a private Slurm, an emulated cluster):
finding binaries in sbin too, installing missing Debian packages as root, and stopping only the
processes we started (by pid, checked against their command line)."""
from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/bin", "/sbin"])


APT_LOCK = Path(tempfile.gettempdir()) / "suite-apt.lock"
"""One apt-get at a time on this host, whoever asks (flock on this file): the integration tests install Slurm or
Chromium while a thread of theirs installs podman for the image build (tests/integration/background.py), and since
make test runs them two at a time, another process (an xdist worker) may install beside it; dpkg's lock is held
through a whole install, longer than apt-get's own wait for it (DPkg::Lock::Timeout below)."""


@contextmanager
def one_apt_at_a_time() -> Iterator[None]:
    """Holds APT_LOCK: an flock belongs to an open file, so a second thread of this process waits on it too."""
    with open(APT_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class Unavailable(RuntimeError):
    """The test bed cannot be provided here (not root, no apt-get, install or start failed)."""


def find_binary(name: str) -> str | None:
    return shutil.which(name, path=SEARCH_PATH)


def missing_packages(binaries: dict[str, str]) -> list[str]:
    """The packages (binary -> package) whose binary is not found."""
    return sorted({pkg for binary, pkg in binaries.items() if find_binary(binary) is None})


def install_packages(packages: list[str], binaries: dict[str, str], timeout_s: float = 600,
                     error: type[Exception] = Unavailable) -> float:
    """apt-get install (apt-get update first only if a package has no candidate); seconds taken."""
    if os.geteuid() != 0:
        raise error(f"packages {packages} are missing and we are not root (cannot apt-get install them)")
    apt_get = find_binary("apt-get")
    if apt_get is None:
        raise error(f"packages {packages} are missing and there is no apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    start = time.monotonic()

    def apt(*args: str) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([apt_get, "-o", "DPkg::Lock::Timeout=120", *args], env=env,
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            raise error(f"apt-get {' '.join(args)} ran past {timeout_s} s") from e

    with one_apt_at_a_time():
        known = subprocess.run(["apt-cache", "show", *packages], capture_output=True, text=True)
        if known.returncode != 0:
            update = apt("update")
            if update.returncode != 0:
                raise error(f"apt-get update failed (rc {update.returncode}):\n{update.stderr[-2000:]}")
        result = apt("install", "-y", "--no-install-recommends", *packages)
        if result.returncode != 0 and INTERRUPTED in result.stderr:
            _mend_dpkg(env, timeout_s, error)
            result = apt("install", "-y", "--no-install-recommends", *packages)
    if result.returncode != 0:
        raise error(f"apt-get install {' '.join(packages)} failed (rc {result.returncode}):\n"
                    f"{result.stderr[-2000:]}")
    still_missing = missing_packages(binaries)
    if still_missing:
        raise error(f"after apt-get install, still missing: {still_missing}")
    return time.monotonic() - start


INTERRUPTED = "dpkg was interrupted"
"""What apt-get says when an earlier install was killed half-way (a stopped test run, a killed `make cluster-up`):
every later install refuses until `dpkg --configure -a` finishes the configuring it left."""


def _mend_dpkg(env: dict[str, str], timeout_s: float, error: type[Exception]) -> None:
    """`dpkg --configure -a`, said on stderr, for an install an earlier one left half-done; `error` where it fails."""
    print("apt-get: dpkg was interrupted by an earlier install; running `dpkg --configure -a`, then installing "
          "again", file=sys.stderr, flush=True)
    try:
        mended = subprocess.run([find_binary("dpkg") or "dpkg", "--configure", "-a"], env=env, capture_output=True,
                                text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise error(f"dpkg --configure -a ran past {timeout_s} s") from e
    if mended.returncode != 0:
        raise error(f"apt-get refused ({INTERRUPTED}) and dpkg --configure -a failed (rc {mended.returncode}):\n"
                    f"{mended.stderr[-2000:]}")


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    """Running (a zombie counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def terminate(pid: int, grace_s: float) -> None:
    """SIGTERM, wait up to grace_s, then SIGKILL one process we started."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.05)


def tail(path: Path, num_lines: int = 25) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return "\n".join(lines[-num_lines:]) or "<empty>"
