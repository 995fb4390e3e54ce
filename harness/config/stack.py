"""The training stack's settings (workload.compile, compile_mode, kernels, attention, precision=fp8 and
fp8_recipe): what each needs, checked before anything launches. Every refusal names the field, the
value, the platform or GPU, and why (benchmarks/training/stack.py applies them on the ranks)."""
from __future__ import annotations

import importlib.util
import re
import warnings
from typing import Optional

from ..errors import ConfigError
from .choices import Attention, Compile, CompileMode, ContainerRuntime, Device, Kernels, LauncherKind, Precision
from .schema import BenchConfig

FP8_GPUS = re.compile(r"H100|H200|H800|H20\b|GH200|GB200|B100|B200|B300|L40|L4\b|RTX ?4090|RTX ?6000 ?Ada|Ada", re.I)
"""GPUs with FP8 tensor cores (compute capability 8.9: Ada; 9.0: Hopper; 10.x: Blackwell)."""
NO_FP8_GPUS = re.compile(r"A100|A800|A30\b|A40\b|A10\b|A10G|A16\b|V100|T4\b|P100|MI50|MI100", re.I)
"""GPUs without: Ampere (8.0/8.6), Volta (7.0), Turing (7.5), Pascal (6.0) and older."""
PACKAGES = {"liger_kernel": "liger-kernel", "torchao": "torchao", "triton": "triton"}
"""Importable module -> the package that brings it."""


def fp8_refusal(device: Device, gpu_model: str) -> Optional[str]:
    """Why FP8 training cannot run on this platform's GPU, or None (a GPU the table does not know is
    let through; the rank checks its compute capability and records an error below 8.9)."""
    if device == Device.cpu:
        return "the cpu platform has no FP8 tensor cores; FP8 training needs a GPU of compute capability 8.9+ (Ada, Hopper, Blackwell)"
    if NO_FP8_GPUS.search(gpu_model or "") and not FP8_GPUS.search(gpu_model or ""):
        return (f"{gpu_model} has no FP8 tensor cores (FP8 needs compute capability 8.9+: Ada, Hopper, "
                "Blackwell); use bf16")
    return None


def missing_modules(modules: list[str]) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def needed_modules(cfg: BenchConfig) -> list[str]:
    """The modules the ranks will import for this run's stack."""
    w, p = cfg.workload, cfg.platform
    need = []
    if w.compile != Compile.none and p.device == Device.cuda:
        need.append("triton")
    if w.kernels == Kernels.liger:
        need.append("liger_kernel")
    if w.precision == Precision.fp8:
        need.append("torchao")
    return need


def validate_stack(cfg: BenchConfig) -> None:
    """Every rule of the stack settings; ConfigError naming what is wrong."""
    w, p, z = cfg.workload, cfg.platform, cfg.zero

    def refuse(field: str, value: str, why: str) -> None:
        raise ConfigError(f"{field}={value!r} is invalid: {why}")

    if w.compile == Compile.none and w.compile_mode != CompileMode["default"]:
        refuse("workload.compile_mode", w.compile_mode.value, "has no effect without workload.compile=torch or deepcompile")
    if w.compile == Compile.deepcompile:
        if p.device != Device.cuda:
            refuse("workload.compile", "deepcompile", f"DeepSpeed's DeepCompile runs on CUDA only; platform {p.name} is "
                   f"{p.device.value} (use workload.compile=torch there)")
        if z.stage == 0:
            refuse("workload.compile", "deepcompile", "DeepCompile schedules ZeRO's collectives: zero.stage 1, 2 or 3; "
                   "under ZeRO-0 use workload.compile=torch")
    if w.compile_mode == CompileMode["reduce-overhead"] and p.device != Device.cuda:
        refuse("workload.compile_mode", w.compile_mode.value, "reduce-overhead records CUDA graphs: a GPU only")
    if w.kernels == Kernels.liger and p.device != Device.cuda:
        refuse("workload.kernels", "liger", f"Liger Kernel's kernels are Triton GPU kernels; platform {p.name} has no GPU "
               "(use kernels=eager)")
    if p.device == Device.cpu and w.attention in (Attention.efficient, Attention.cudnn):
        refuse("workload.attention", w.attention.value, "that SDPA backend has no CPU implementation; on the cpu "
               "platform: auto, flash (PyTorch's CPU flash attention) or math")
    if w.precision == Precision.fp8:
        why = fp8_refusal(p.device, p.gpu_model)
        if why:
            refuse("workload.precision", "fp8", why)
        if w.compile == Compile.none:
            warnings.warn("workload.precision=fp8 without workload.compile: torchao's float8 casts run as "
                          "separate kernels in eager mode and usually make it slower than bf16", stacklevel=2)
    if w.distill is not None and w.distill.teacher.precision == Precision.fp8:
        refuse("workload.distill.teacher.precision", "fp8", "the teacher runs its forward in fp32, bf16 or fp16")


def check_packages(cfgs: list[BenchConfig]) -> None:
    """Before launch (harness/launch/preflight.py), for runs whose ranks use this environment (the local
    launcher, no container): ConfigError naming every package the stack needs and this environment
    lacks. A plan or a dry run for another machine is not refused for what this one lacks."""
    missing: dict[str, str] = {}
    for cfg in cfgs:
        p, w = cfg.platform, cfg.workload
        if p.container.runtime != ContainerRuntime.none or p.launcher != LauncherKind.local:
            continue
        for module in missing_modules(needed_modules(cfg)):
            missing.setdefault(PACKAGES[module], f"compile={w.compile.value}, kernels={w.kernels.value}, "
                                                 f"precision={w.precision.value}")
    if missing:
        raise ConfigError("; ".join(f"a run with {why} needs {pkg}" for pkg, why in missing.items())
                          + ", which this environment lacks; nothing was launched. The GPU lock "
                          "(requirements-gpu.lock) pins them: `make venv` on a GPU node installs it")
