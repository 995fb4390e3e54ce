"""Files that others read (records, references, reports, plots) are written atomically."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import HarnessError


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    """Write to a temp file beside `path`, fsync, then rename over it: readers see the old file
    or the new one, never a part; on any failure the temp file is removed and the old file stays."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode(path))  # mkstemp's 0600 would hide results from the rest of a team
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    """write_bytes_atomic of UTF-8 text."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def _mode(path: Path) -> int:
    """The file's present mode, or what a plain open() would give it (0666 less the umask)."""
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def make_folder(path: Path, what: str = "out") -> Path:
    """Create the results folder `path` (and its parents) before anything runs; a path that cannot be one (a
    file there, no such parent, read-only, /proc/...) is one clear error naming it, not a traceback later."""
    if Path(path).exists() and not Path(path).is_dir():
        raise HarnessError(f"{what}={path} cannot be a results folder: a file is there; choose another {what}=")
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HarnessError(f"{what}={path} cannot be a results folder: {exc.strerror or exc} "
                           f"({type(exc).__name__}); choose another {what}=") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise HarnessError(f"{what}={path} cannot be a results folder: not writable; choose another {what}=")
    return Path(path)
