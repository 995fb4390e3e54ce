"""The platform's declared GPU against the one the ranks detected (issue 14). A run on other
hardware than its platform declares is scored against the wrong peak (an H100 PCIe against the
SXM's 989 TFLOP/s) and compared with the wrong references: the mismatch is a warning in the run, a
field of the record (`environment.hardware_mismatch`), and a reason `submit` refuses the record.
"""
from __future__ import annotations

import re
from typing import Any, Optional

from .config.choices import Device
from .config.schema import PlatformConfig

GPU_NAMES: dict[str, str] = {
    "H100-SXM5-80GB": r"H100 80GB HBM3|H100 SXM",
    "H100-PCIe-80GB": r"H100 PCIe",
    "H100-NVL-94GB": r"H100 NVL",
    "H200-SXM-141GB": r"H200(?! NVL)",
    "H200-NVL-141GB": r"H200 NVL",
    "A100-SXM4-80GB": r"A100[- ]SXM4[- ]80GB|A100 80GB SXM",
    "A100-SXM4-40GB": r"A100[- ]SXM4[- ]40GB",
    "A100-PCIe-80GB": r"A100 80GB PCIe",
    "A100-PCIe-40GB": r"A100[- ]PCIE[- ]40GB",
}
"""A platform's `gpu_model` -> the device names (torch.cuda.get_device_name / nvidia-smi) it
covers, as a regular expression searched case-insensitively. A platform declaring a model not
listed here cannot be checked, which is itself reported: add the model here."""
MEMORY_TOLERANCE = 0.03
"""Detected total memory per GPU may differ from the declared mem_per_device_gib by this share
(nvidia-smi's MiB against a GiB figure rounded in the platform file)."""


def _gpu_memory_gib(env: dict[str, Any]) -> Optional[float]:
    gpus = ((env.get("machine") or {}).get("gpus")) or []
    mib = [g.get("memory_mib") for g in gpus if isinstance(g, dict) and g.get("memory_mib")]
    return min(mib) / 1024 if mib else None


def hardware_mismatches(platform: PlatformConfig, env: dict[str, Any]) -> Optional[list[str]]:
    """What differs between the declared and the detected GPU ([] when nothing does; None when
    the ranks reported no device to compare with). The cpu device declares no GPU to check."""
    if platform.device != Device.cuda:
        return []
    detected = env.get("gpu_model")
    if not detected:
        return None
    problems = []
    pattern = GPU_NAMES.get(platform.gpu_model)
    peak = platform.peak_tflops.get("bf16")
    if pattern is None:
        problems.append(f"platform {platform.name} declares gpu_model {platform.gpu_model!r}, which the suite "
                        f"cannot match against the detected {detected!r} (add it to harness/hardware.py GPU_NAMES)")
    elif not re.search(pattern, detected, re.I):
        problems.append(f"platform {platform.name} declares {platform.gpu_model} (bf16 peak {peak} TFLOP/s, "
                        f"used for MFU), the ranks ran on {detected!r}")
    mem = _gpu_memory_gib(env)
    if mem is not None and abs(mem - platform.mem_per_device_gib) > MEMORY_TOLERANCE * platform.mem_per_device_gib:
        problems.append(f"platform {platform.name} declares {platform.mem_per_device_gib:g} GiB per GPU, "
                        f"the detected GPU has {mem:.1f} GiB")
    count = env.get("gpu_count")
    if isinstance(count, int) and count < platform.gpus_per_node:
        problems.append(f"platform {platform.name} declares {platform.gpus_per_node} GPUs per node, "
                        f"{count} detected on {env.get('host')}")
    return problems
