"""Apptainer (or SingularityCE) through spython's client: build, inspect and exec of a .sif
(containers/sif.py builds the suite's with it; harness/launch/container.py reads the record it leaves).

spython 0.3 runs every command as `singularity`, the name Apptainer's packages also install as a
link to `apptainer`. The runtime found here (apptainer first, then singularity) is put first on
PATH under that name for the duration of each call (a short script in a temporary folder), so
spython runs exactly that binary wherever the link is missing or names another install. During a
build the script sends the runtime's messages to stdout, which spython streams line by line (it
reads stderr only once the build has ended). spython's own exits (sys.exit on an error) become
ApptainerError.

The ranks' `apptainer exec` stays an argv (harness/launch/container.py prefix()): it is handed to
srun or to the local launcher to run later, on the compute nodes, where spython's execute() runs a
command now and returns its output; and the controller does not import spython (0.1 s of every
harness command for nothing it needs: the route of a .sif is in the record containers/sif.py writes)."""
from __future__ import annotations

import atexit
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from spython.main import Client

SIF_RUNTIMES = ("apptainer", "singularity")


class ApptainerError(Exception):
    """An apptainer command through spython failed; the message says which and why."""


@dataclass(frozen=True)
class Runtime:
    name: str
    path: str
    version: str

    def describe(self) -> str:
        return f"{self.name}: {self.path} ({self.version})"


def which(search_path: Optional[str] = None) -> Optional[str]:
    """The first of SIF_RUNTIMES on PATH (or on `search_path`), as a path."""
    return next(filter(None, (shutil.which(n, path=search_path) for n in SIF_RUNTIMES)), None)


_SHIMS: dict[str, str] = {}


def _shim(exe: str) -> str:
    """A folder holding `singularity`, a script that runs `exe` (one per process and binary)."""
    if exe not in _SHIMS:
        folder = tempfile.mkdtemp(prefix="spython-runtime-")
        atexit.register(shutil.rmtree, folder, True)
        script = Path(folder) / "singularity"
        script.write_text("#!/bin/sh\n# spython runs `singularity`: this runs the runtime the suite found "
                          "(containers/apptainer_client.py)\n"
                          'for a; do case "$a" in -*) ;; build) exec ' + shlex.quote(exe) + ' "$@" 2>&1;; *) break;; esac; done\n'
                          "exec " + shlex.quote(exe) + ' "$@"\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        _SHIMS[exe] = folder
    return _SHIMS[exe]


@contextmanager
def client(exe: str) -> Iterator[Any]:
    """spython's Client, running `exe` for `singularity`; spython's sys.exit -> ApptainerError."""
    old = os.environ.get("PATH", os.defpath)
    os.environ["PATH"] = _shim(exe) + os.pathsep + old
    try:
        yield Client
    except SystemExit as e:
        raise ApptainerError(f"{Path(exe).name} through spython stopped (exit {e.code}); its message is above") from None
    finally:
        os.environ["PATH"] = old


def runtime(search_path: Optional[str] = None) -> Optional[Runtime]:
    """The Apptainer runtime here, with the version spython reads from it; None when none is on PATH."""
    exe = which(search_path)
    if exe is None:
        return None
    with client(exe) as c:
        version = c.version()
    if isinstance(version, dict) or not version:
        raise ApptainerError(f"{exe} --version failed: {version}")
    return Runtime(Path(exe).name, exe, str(version).strip())


def build(rt: Runtime, recipe: str, image: Path, options: Sequence[str] = ()) -> None:
    """`apptainer build --force IMAGE RECIPE` (a definition file, or docker-archive:PATH), its output
    streamed; ApptainerError when it fails."""
    print(f"{rt.name} build (spython's Client.build): {image} from {recipe}", flush=True)
    with client(rt.path) as c:
        _, lines = c.build(recipe=recipe, image=str(image), sudo=False, stream=True, force=True,
                           options=list(options), quiet=True)
        try:
            for line in lines:
                print(line, end="", flush=True)
        except subprocess.CalledProcessError as e:
            raise ApptainerError(f"{rt.name} build of {image} from {recipe} failed (exit {e.returncode}; its output "
                                 "is above)") from None


def inspect(rt: Runtime, image: Path) -> dict[str, Any]:
    """The .sif's attributes (labels, deffile, environment, ...) as `apptainer inspect --json` gives them."""
    with client(rt.path) as c:
        result = c.inspect(image=str(image), quiet=True)
    if "attributes" not in result:
        said = result.get("message") if isinstance(result, dict) else result
        raise ApptainerError(f"{rt.name} inspect {image} failed: {_last(said)}")
    return result["attributes"]


def execute(rt: Runtime, image: Path, command: Sequence[str], binds: Sequence[str] = ()) -> tuple[int, str]:
    """(exit status, output) of `command` run in the image."""
    with client(rt.path) as c:
        result = c.execute(image=str(image), command=list(command), bind=list(binds) or None,
                           return_result=True, quiet=True)
    message = result.get("message", "")
    return int(result.get("return_code", 1)), message if isinstance(message, str) else "".join(message)


def _last(said: Any) -> str:
    text = said if isinstance(said, str) else "".join(str(s) for s in (said or []))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"
