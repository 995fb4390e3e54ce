"""Which suite made a record: its own git commit when it runs from its own checkout ('-dirty' when tracked
files changed), else a content hash of its files, never the commit of a repository the copy sits in
(a `git archive` of the suite inside another checkout). Read once per process (suite_commit) into
every record's environment and each bench's suite.json; a comparison names a change of it, the
submission checks it."""
from __future__ import annotations

import hashlib
import subprocess
from functools import lru_cache
from pathlib import Path

from .config.schema import REPO_ROOT

SUITE_FILES = ("harness", "benchmarks", "contract", "conf", "schemas", "containers", "Makefile", "pyproject.toml")
CONTENT_PREFIX = "content:sha256:"
"""suite_commit of a copy of the suite outside its own git checkout: the hash of SUITE_FILES (content_hash)."""


def content_hash(root: Path) -> str:
    """'content:sha256:<16 hex>' over the path (relative to root) and bytes of each of the suite's files, in
    path order: SUITE_FILES and requirements*.lock, Python's caches left out."""
    paths = [root / name for name in SUITE_FILES] + sorted(root.glob("requirements*.lock"))
    files = sorted((f.relative_to(root).as_posix(), f) for p in paths for f in ([p] if p.is_file() else p.rglob("*"))
                   if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc")
    digest = hashlib.sha256()
    for name, f in files:   # the path, its length in bytes, the bytes: no two suites hash alike by accident
        digest.update(name.encode() + b"\0" + len(data := f.read_bytes()).to_bytes(8, "big") + data)
    return CONTENT_PREFIX + digest.hexdigest()[:16]


def suite_identity(root: Path = REPO_ROOT) -> str:
    """'<sha>' ('<sha>-dirty': tracked files changed) when root is the top of a git checkout whose HEAD holds the
    suite, else content_hash(root): a copy (git archive) inside another repository never takes its commit."""
    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    try:
        head = git("rev-parse", "--show-toplevel", "HEAD")
        top, _, sha = head.stdout.strip().partition("\n")
        if (head.returncode == 0 and Path(top).resolve() == root.resolve()
                and git("cat-file", "-e", "HEAD:harness/__init__.py").returncode == 0):
            dirty = git("status", "--porcelain", "--untracked-files=no")
            if dirty.returncode == 0:
                return sha + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass   # no git, or it hung: the files still say which suite this is
    return content_hash(root)


suite_commit = lru_cache(maxsize=1)(suite_identity)
"""suite_commit(): this suite's identity (suite_identity), read once per process."""
