"""The environment fingerprint as seen by a rank (inside the container, if any)."""
from __future__ import annotations

import os
import platform
import socket
import subprocess
from importlib import metadata
from typing import Any, Optional

# Environment variables that change communication behaviour and so belong in the fingerprint.
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "UCX_",
                "FI_", "GLOO_SOCKET_IFNAME")


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _driver_version() -> Optional[str]:
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as f:
            first = f.readline()
        for token in first.split():
            if token[:1].isdigit() and "." in token:
                return token
    except OSError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def fingerprint(world_size: int) -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    nccl = None
    if cuda:
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "deepspeed": _version("deepspeed"),
        "transformers": _version("transformers"),
        "datasets": _version("datasets"),
        "cuda": torch.version.cuda if cuda else None,
        "nccl": nccl,
        "driver": _driver_version() if cuda else None,
        "gpu_model": torch.cuda.get_device_name(0) if cuda else None,
        "gpu_count": world_size if cuda else 0,
        "cpu_model": platform.processor() or platform.machine(),
        "os": platform.platform(),
        "container_image": os.environ.get("SUITE_CONTAINER_IMAGE") or os.environ.get("APPTAINER_CONTAINER"),
        "container_digest": os.environ.get("SUITE_CONTAINER_DIGEST"),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
        "host": socket.gethostname(),
        "world_size": world_size,
    }
