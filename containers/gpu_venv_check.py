"""`make gpu-venv-check`: requirements-gpu.lock installed for real into a throwaway venv by `make
venv`'s own GPU recipe (VENV_KIND=gpu), then torch, triton, liger_kernel and torchao imported;
their versions, CUDA's and cuDNN's (read from the libraries: no GPU needed), the install's time
and the venv's size on disk printed; the venv removed, whatever happened.

The venv's Python is a 3.12 (the gpu image's; the lock covers 3.11 too), found on PATH or under
pyenv, else --python. pip sees PyPI alone, with no cache: this host's pip configuration, find-links
and constraint files are set aside (a local torch 2.13.0+cpu wheel would otherwise be taken for
torch==2.13.0 and fail its hash), so the time is a cold install's.

    python -m containers.gpu_venv_check [--venv build/gpu-venv-check] [--python PATH] [--make make]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from containers.gpu_lock import PYPI_SIMPLE_URL
from containers.lock import REPO_ROOT

KEEP_PIP_VARIABLES = frozenset({"PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_DISABLE_PIP_VERSION_CHECK"})
PROBE = r"""
import json, time
t = time.perf_counter()
import torch, triton, liger_kernel, torchao
from importlib import metadata
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                  "triton": triton.__version__, "liger_kernel": metadata.version("liger_kernel"),
                  "torchao": torchao.__version__, "cuda_available": torch.cuda.is_available(),
                  "import_s": round(time.perf_counter() - t, 1)}))
"""


def python_version(python: str) -> Optional[str]:
    try:
        done = subprocess.run([python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def find_python312() -> Optional[str]:
    """A Python 3.12 that runs: on PATH (a pyenv shim may not), then pyenv's, then /usr's."""
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates = [shutil.which("python3.12"), *sorted(glob.glob(f"{pyenv}/versions/3.12*/bin/python3.12"), reverse=True),
                  "/usr/bin/python3.12", "/usr/local/bin/python3.12"]
    for c in candidates:
        if c and (python_version(c) or "").startswith("3.12."):
            return c
    return None


def pypi_alone_env() -> dict[str, str]:
    """This environment with pip's configuration set aside: PyPI only, no cache, no constraint."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in KEEP_PIP_VARIABLES}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=PYPI_SIMPLE_URL, PIP_NO_CACHE_DIR="1")
    return env


def disk_usage(path: Path) -> int:
    """Bytes on disk under `path` (st_blocks; hard links once)."""
    seen, total = set(), 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m containers.gpu_venv_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", type=Path, default=Path("build/gpu-venv-check"))
    ap.add_argument("--python", help="the venv's interpreter (default: a Python 3.12 found here)")
    ap.add_argument("--make", default="make")
    ns = ap.parse_args(argv)
    python = ns.python or find_python312()
    if python is None:
        python = sys.executable
        print(f"gpu-venv-check: no Python 3.12 here; {python} instead (the lock covers 3.11 and 3.12)")
    version = python_version(python)
    if version is None:
        print(f"error: {python} does not run", file=sys.stderr)
        return 2
    venv = ns.venv if ns.venv.is_absolute() else REPO_ROOT / ns.venv
    print(f"gpu-venv-check: Python {version} ({python}), venv {venv}, {PYPI_SIMPLE_URL} alone, no pip cache",
          flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    env = pypi_alone_env()
    started = time.perf_counter()
    try:
        built = subprocess.run([ns.make, "--no-print-directory", str(venv / ".installed"), f"VENV={venv}",
                                "VENV_KIND=gpu", f"PYTHON={python}"], cwd=REPO_ROOT, env=env)
        install_s = time.perf_counter() - started
        if built.returncode != 0:
            print(f"error: the GPU lock's install failed after {install_s:.0f} s", file=sys.stderr)
            return 1
        py = str(venv / "bin" / "python")
        check = subprocess.run([py, "-m", "pip", "check"], env=env, capture_output=True, text=True)
        print(f"gpu-venv-check: pip check: {(check.stdout or check.stderr).strip()}")
        probe = subprocess.run([py, "-c", PROBE], cwd="/", env=env, capture_output=True, text=True)
        if probe.returncode != 0:
            print(f"error: importing the GPU stack failed:\n{probe.stderr.strip()[-3000:]}", file=sys.stderr)
            return 1
        got = json.loads(probe.stdout.strip().splitlines()[-1])
        size = disk_usage(venv)
        packages = len(list((venv / "lib").glob("python*/site-packages/*.dist-info")))
        print(f"gpu-venv-check: torch {got['torch']} (CUDA {got['cuda']}, cuDNN {got['cudnn']}), triton {got['triton']}, "
              f"liger_kernel {got['liger_kernel']}, torchao {got['torchao']}; a GPU here: {got['cuda_available']}")
        print(f"gpu-venv-check: installed in {install_s:.0f} s ({packages} packages), {size / 2**30:.2f} GiB on disk; "
              f"imports {got['import_s']} s")
        return 0 if check.returncode == 0 else 1
    finally:
        shutil.rmtree(venv, ignore_errors=True)
        print(f"gpu-venv-check: removed {venv} ({time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    sys.exit(main())
