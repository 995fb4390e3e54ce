"""The host's share of a ZeRO-3 step with the optimizer offloaded to the host, measured mechanism by
mechanism on this node: what the performance model's offload terms take (harness/model/offload_time.py;
their values in harness/model/params.py, `offload_*` and `pcie_*`).

    python3 tests/gpu/offload_rates.py [--elements 2e8] [--out FILE.json]

1. DeepSpeedCPUAdam's step over fp32 parameters with their gradients (the cpu_adam op the suite
   builds: `python -m benchmarks.node.ops build cpu_adam [--accelerator cuda]`), in elements per second
   with one thread and with every usable core (torch's intra-op threads: the op shares torch's OpenMP
   runtime);
2. the cast of the updated fp32 parameters to bf16 into a fresh tensor, as torch makes it on the host
   before a CPU -> GPU copy of another dtype (DeepSpeed's `fp16_partitioned_groups_flat[i].copy_(fp32)`),
   with one thread and with every core;
3. a host triad (a = b + s c, fp32, every core, arrays of --elements): the host memory bandwidth Adam
   meets at many threads (the node probe's triad is one core's over 32 MiB, which a large L3 holds);
4. on a GPU: the copies of the offloaded step, GB/s: pinned GPU -> host (the gradients), pinned host -> GPU,
   pageable host -> GPU (the cast parameters: torch stages a fresh tensor through its own pinned buffer).
Runs on cpu too (the GPU copies are skipped): there the figures are the host's alone.
Each figure is the best of `--repeats` after one unmeasured pass.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402


def best_s(fn: Callable[[], Any], repeats: int, sync: Callable[[], None] = lambda: None) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return min(times)


def adam_rate(n: int, repeats: int) -> float:
    """DeepSpeedCPUAdam elements per second at torch's current thread count."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    p = torch.nn.Parameter(torch.zeros(n))
    p.grad = torch.randn(n)
    opt = DeepSpeedCPUAdam([p], lr=1e-4)
    return n / best_s(opt.step, repeats)


def cast_rate(n: int, repeats: int) -> float:
    x = torch.randn(n)
    return n / best_s(lambda: x.to(torch.bfloat16), repeats)


def triad_gbps(n: int, repeats: int) -> float:
    a, b, c = torch.empty(n), torch.randn(n), torch.randn(n)
    return 12 * n / best_s(lambda: torch.add(b, c, alpha=3.0, out=a), repeats) / 1e9


def copy_gbps(n: int, repeats: int) -> dict[str, float]:
    """GB/s of the offloaded step's copies (bf16 tensors of n elements; fp32 for the pageable cast's source)."""
    dev = torch.device("cuda")
    sync = torch.cuda.synchronize
    gpu = torch.randn(n, device=dev).to(torch.bfloat16)
    pinned = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
    fp32 = torch.randn(n)
    out = {"d2h_pinned": 2 * n / best_s(lambda: pinned.copy_(gpu, non_blocking=True), repeats, sync) / 1e9,
           "h2d_pinned": 2 * n / best_s(lambda: gpu.copy_(pinned, non_blocking=True), repeats, sync) / 1e9}
    # what DeepSpeed's parameter write-back does: fp32 host -> bf16 GPU, cast on the host, then copied
    out["h2d_cast_from_fp32"] = 2 * n / best_s(lambda: gpu.copy_(fp32), repeats, sync) / 1e9
    out["h2d_pageable"] = 2 * n / best_s(lambda: gpu.copy_(fp32.to(torch.bfloat16)), repeats, sync) / 1e9
    return out


def measure(n: int, repeats: int, threads: Optional[list[int]] = None) -> dict[str, Any]:
    from benchmarks.node.machine import machine, usable_cpus
    from benchmarks.node.probe import isa

    usable = usable_cpus() or os.cpu_count() or 1
    threads = threads or sorted({1, usable})

    out: dict[str, Any] = {"elements": n, "repeats": repeats, "usable_cpus": usable, "cpu": machine()["cpu"]["model"],
                           "isa": isa()["class"], "python": platform.python_version(), "torch": torch.__version__, "adam_elements_per_s": {}, "cast_elements_per_s": {},
                           "adam_error": None}
    try:
        import deepspeed
        from benchmarks.node.ops import preload

        out["deepspeed"] = deepspeed.__version__
        preload()
    except Exception as e:   # noqa: BLE001 - reported, the other figures still measured
        out["adam_error"] = f"{type(e).__name__}: {e}"
    for t in threads:
        torch.set_num_threads(t)
        if out["adam_error"] is None:
            try:
                out["adam_elements_per_s"][str(t)] = adam_rate(n, repeats)
            except Exception as e:   # noqa: BLE001 - the op not built: named, the rest measured
                out["adam_error"] = f"{type(e).__name__}: {e}"
        out["cast_elements_per_s"][str(t)] = cast_rate(n, repeats)
    torch.set_num_threads(max(threads))
    out["triad_gbps"] = triad_gbps(n, repeats)
    out["triad_threads"] = max(threads)
    out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    out["copies_gbps"] = copy_gbps(n, repeats) if torch.cuda.is_available() else None
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--elements", type=float, default=2e8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="*", help="thread counts to measure (default: 1 and every usable core)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if not (1e3 <= args.elements <= 2e9) or args.repeats < 1:
        ap.error("--elements in [1e3, 2e9] and --repeats >= 1")
    out = measure(int(args.elements), args.repeats, args.threads)
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
