"""Files that others read (records, references, reports, plots) are written atomically."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
