"""Where a GPU micro-step of llama-440m (seq 128, mb 128, bf16) spends its time, for the model's
next mechanism (issue 28: computation at the uncalibrated efficiency is what the published runs miss).

    python3 tests/gpu/compute_breakdown.py [--mb 128] [--seq 128] [--layers 24] [--out FILE.json]

1. the forward+backward of transformers' LlamaForCausalLM (the suite's llama-440m shape, SDPA, as the
   harness builds it) under torch.profiler: device time per kernel class (GEMM, attention,
   elementwise/norm, softmax/cross-entropy, other) and the micro-step's wall time;
2. each of the model's GEMM shapes alone (tokens x in x out, forward and the two backward GEMMs):
   achieved TFLOP/s, against the declared peak and a plateau 8192^3 GEMM;
3. on a GPU, its SM clock and power while the micro-steps run (nvidia-smi, sampled every 0.2 s): the
   same GEMM kernels ran 8-9 % slower in an H100's compiled micro-step than in its eager one, which the
   clocks under a denser load would explain (docs/performance-model.md, "The training stack").
--compile: the model under torch.compile; --attention: the SDPA backend (auto: PyTorch's choice; math:
the backend that computes bf16 in float32, whose step the model explains only in part).
Runs on cpu too (tiny sizes, to check the script); on cpu the figures mean nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import threading
import time

import torch


def classify(name: str) -> str:
    n = name.lower()
    # Inductor's kernels first: their names list the fused ops (a RoPE kernel's holds "bmm")
    if n.startswith(("triton_poi", "triton_tem")):   # pointwise (fused elementwise)
        return "elementwise"
    if n.startswith(("triton_red", "triton_per")):   # reductions (norms, losses, fused with their pointwise)
        return "reduce/norm"
    if any(k in n for k in ("gemm", "cutlass", "xmma", "cublas", "sm90", "nvjet", "matmul", "addmm", "::mm", "bmm")):
        return "gemm"
    if any(k in n for k in ("flash", "fmha", "attention", "sdpa", "efficient_attention")):
        return "attention"
    if any(k in n for k in ("softmax", "cross_entropy", "nll", "log_softmax")):
        return "softmax/xent"
    if any(k in n for k in ("reduce", "norm", "sum", "mean")):
        return "reduce/norm"
    if any(k in n for k in ("elementwise", "vectorized", "mul", "add", "silu", "copy", "cat", "fill", "pow", "rsqrt")):
        return "elementwise"
    return "other"


class Clocks:
    """The GPU's SM clock (MHz) and power draw (W) sampled every `every` s by nvidia-smi while in use:
    {sm_mhz: {min, median, max}, power_w: {...}, samples}; {} where nvidia-smi is missing."""

    def __init__(self, every: float = 0.2):
        self.every, self.rows, self._stop = every, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                line = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=clocks.sm,power.draw",
                                       "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                      timeout=5).stdout.strip().splitlines()[0]
                self.rows.append([float(x) for x in line.split(",")[:2]])
            except (OSError, subprocess.SubprocessError, ValueError, IndexError):
                return
            self._stop.wait(self.every)

    def __enter__(self) -> "Clocks":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def summary(self) -> dict:
        if not self.rows:
            return {}
        def stats(xs):
            return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}
        return {"sm_mhz": stats([r[0] for r in self.rows]), "power_w": stats([r[1] for r in self.rows]),
                "samples": len(self.rows)}


def sdpa_backend(name: str):
    """The context that pins SDPA to one backend (auto: none)."""
    if name == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[name])


def timed(fn, reps: int, sync) -> float:
    for _ in range(2):
        fn()
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t) / reps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=128)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=3712)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--out", default=None)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (Inductor): the compiled "
                    "micro-step's kernels, for the model's compiled roofline and host cost")
    ap.add_argument("--attention", default="auto", choices=["auto", "flash", "efficient", "cudnn", "math"],
                    help="the SDPA backend the micro-steps run under (auto: PyTorch's choice)")
    a = ap.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM
    cuda = torch.cuda.is_available()
    dev = "cuda" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dtype = torch.bfloat16
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
                      num_attention_heads=a.heads, num_key_value_heads=a.heads, max_position_embeddings=max(2048, a.seq),
                      attn_implementation="sdpa", tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(dev, dtype)
    ids = torch.randint(0, a.vocab, (a.mb, a.seq), device=dev)
    if a.compile:
        started = time.perf_counter()
        model = torch.compile(model)
        with sdpa_backend(a.attention):
            model(input_ids=ids, labels=ids).loss.backward()
        sync()
        compile_s = time.perf_counter() - started

    def step():
        with sdpa_backend(a.attention):
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()

    clocks = Clocks() if cuda else contextlib.nullcontext()
    with clocks:
        wall = timed(step, 5, sync)
    out = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__, "args": vars(a),
           "micro_step_wall_ms": wall * 1e3, "compiled": a.compile}
    if a.compile:
        out["compile_s"] = compile_s
    if cuda:
        out["clocks_while_timed"] = clocks.summary()
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(3):
            step()
        sync()
    classes: dict[str, float] = {}
    top = []
    for e in prof.key_averages():
        if cuda:   # kernels alone: device time of their own, no host time (an aten op holds both)
            t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) or 0
            if e.self_cpu_time_total > 0:
                continue
        else:
            t = e.self_cpu_time_total
        if t <= 0:
            continue
        top.append((t / 3 / 1e3, e.key[:90]))
        classes[classify(e.key)] = classes.get(classify(e.key), 0.0) + t / 3 / 1e3
    out["device_ms_by_class"] = dict(sorted(classes.items(), key=lambda kv: -kv[1]))
    out["device_ms_total"] = sum(classes.values())
    out["top_kernels_ms"] = sorted(top, reverse=True)[:25]
    tokens = a.mb * a.seq
    shapes = {"qkv/o": (a.hidden, a.hidden), "gate/up": (a.hidden, a.ffn), "down": (a.ffn, a.hidden),
              "lm_head": (a.hidden, a.vocab)}
    gemms = {}
    for name, (k, n) in shapes.items():
        x = torch.randn(tokens, k, device=dev, dtype=dtype)
        w = torch.randn(n, k, device=dev, dtype=dtype)
        g = torch.randn(tokens, n, device=dev, dtype=dtype)
        f = timed(lambda: x @ w.t(), 20, sync)
        dx = timed(lambda: g @ w, 20, sync)
        dw = timed(lambda: g.t() @ x, 20, sync)
        fl = 2 * tokens * k * n
        gemms[name] = {"m_k_n": [tokens, k, n], "fwd_tflops": fl / f / 1e12, "dgrad_tflops": fl / dx / 1e12,
                       "wgrad_tflops": fl / dw / 1e12}
    big = 8192 if cuda else 512
    x = torch.randn(big, big, device=dev, dtype=dtype)
    gemms["plateau"] = {"m_k_n": [big] * 3, "fwd_tflops": 2 * big ** 3 / timed(lambda: x @ x, 10, sync) / 1e12}
    out["gemm"] = gemms
    print(json.dumps(out, indent=1))
    if a.out:
        with open(a.out, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
