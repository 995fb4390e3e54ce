"""The training stack on a rank: fused kernels (Liger Kernel), FP8 linears (torchao), compilation
(DeepSpeed's engine.compile or DeepCompile) and the SDPA backend, applied as the spec's `stack` says,
and what each really did, for the record (the STACK event).

Order (benchmarks/training/train.py setup): the model is built, initialised, checkpointed and cast; then
`prepare_model` patches Liger's kernels into it and swaps its linears for torchao's Float8Linear;
then deepspeed.initialize; then `compile_engine` (engine.compile(backend="inductor"), which
torch.compiles the wrapped module under every ZeRO stage; with DeepSpeed's compile.deepcompile in the
config the same call builds DeepCompile's backend for ZeRO 1-3). Every forward and backward runs
inside `attention_context` (torch.nn.attention.sdpa_kernel with the asked backend); `AttentionProbe`
reads which SDPA kernel the dispatcher really ran, once, on a warm-up micro-step.

`CompileWatch` reads TorchDynamo's own counters and compilation metrics around each step: frames
compiled, recompilations with Dynamo's reason, graph breaks by reason and where each happened (`BreakSites`,
from Dynamo's graph-break log), and Dynamo/Inductor's seconds;
a warm-up step that compiled anything is followed by another (at most compile_warmup_max more), so
the measured steps hold no compile time.
"""
from __future__ import annotations

import contextlib
import logging
import re
from pathlib import Path
from typing import Any, Iterator

from contract.spec import TrainSpec

SDPA_KERNELS = {
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash",
    "aten::_scaled_dot_product_efficient_attention": "efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
    "aten::_flash_attention_forward": "flash",
    "aten::_efficient_attention_forward": "efficient",
}
"""The dispatcher's SDPA kernels (what torch.profiler names) and the backend each is."""
FP8_MIN_CAPABILITY = (8, 9)
"""FP8 tensor cores: Ada (8.9), Hopper (9.0), Blackwell (10.x)."""


def fp8_filter(module: Any, fqn: str) -> bool:
    """Which linears run in FP8: every decoder projection whose both dimensions are multiples of 16
    (torch._scaled_mm's rule); not the output head (lm_head: its logits feed the loss in full
    precision, as torchtitan leaves it)."""
    return (not fqn.endswith("lm_head") and module.in_features % 16 == 0 and module.out_features % 16 == 0)


def prepare_model(model: Any, spec: TrainSpec) -> dict[str, Any]:
    """Liger's kernels and torchao's FP8 linears patched into `model` (before deepspeed.initialize);
    what was done, for the record. A missing package or an unsupported GPU raises with its own message."""
    import torch

    done: dict[str, Any] = {"kernels": spec.stack.kernels}
    if spec.stack.kernels == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama

        apply_liger_kernel_to_llama(rope=True, swiglu=True, rms_norm=True, cross_entropy=False,
                                    fused_linear_cross_entropy=True, model=model)
        done["liger"] = ["rope", "swiglu", "rms_norm", "fused_linear_cross_entropy"]
    if spec.precision == "fp8":
        if spec.device != "cuda":
            raise RuntimeError("precision fp8: torchao's float8 training needs a CUDA GPU with FP8 tensor cores")
        cap = torch.cuda.get_device_capability()
        if cap < FP8_MIN_CAPABILITY:
            raise RuntimeError(f"precision fp8: {torch.cuda.get_device_name()} has compute capability "
                               f"{cap[0]}.{cap[1]}; FP8 tensor cores need 8.9+ (Ada, Hopper, Blackwell)")
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = Float8LinearConfig.from_recipe_name(spec.stack.fp8_recipe)
        convert_to_float8_training(model, config=config, module_filter_fn=fp8_filter)
        converted = [n for n, m in model.named_modules() if type(m).__name__ == "Float8Linear"]
        done["fp8"] = {"recipe": spec.stack.fp8_recipe, "library": "torchao.float8", "linears": len(converted)}
    return done


def compile_engine(engine: Any, spec: TrainSpec) -> dict[str, Any]:
    """engine.compile() as the spec asks; what DeepSpeed made of it."""
    if spec.stack.compile == "none":
        return {"compile": "none"}
    kwargs = {} if spec.stack.compile_mode == "default" else {"mode": spec.stack.compile_mode}
    engine.compile(backend="inductor", compile_kwargs=kwargs)
    deep = bool(getattr(engine, "is_deepcompile_active", lambda: False)())
    if spec.stack.compile == "deepcompile" and not deep:
        raise RuntimeError("workload.compile=deepcompile: DeepSpeed did not activate DeepCompile "
                           "(engine.is_deepcompile_active() is False after engine.compile(); see its log)")
    done = {"compile": spec.stack.compile, "mode": spec.stack.compile_mode, "backend": "inductor",
            "path": "deepspeed engine.compile (DeepCompile)" if deep else "deepspeed engine.compile (torch.compile)"}
    if deep:
        done["pass_steps"] = deepcompile_pass_steps()
    return done


def deepcompile_pass_steps() -> list[int]:
    """The optimizer steps at which DeepCompile (re)compiles its graphs with a new set of passes, as the
    installed DeepSpeed scheduled them in engine.compile(): 0.19.8's ZeRO-3 schedule is [0, 5] (gather and
    release at once; prefetch and selective gather from its WARMUP step 5, profiled on the steps before).
    The warm-up covers the last (train.warmup_plan): on an H200 a llama-440m step 5 recompiled for 125 s
    inside the measured steps, and the steps after it ran 0.81 s against 1.07-1.10 s before."""
    from deepspeed.compile import backend

    return sorted(step for step, _ in (getattr(backend, "remaining_schedule", None) or []))  # a DeepSpeed without it: none


def cache_counts(setting: str) -> dict[str, Any]:
    """What the compilers' on-disk caches gave over the run (Dynamo's counters): Inductor's FX graph cache and
    AOT autograd's, each graph a hit, a miss (compiled, then stored) or a bypass (not cacheable). Which caches
    the rank found is the harness's (harness/plan.py compile_cache_env: measure.compile_cache)."""
    from torch._dynamo.utils import counters

    return {"setting": setting,
            "fx_graph": {k: counters["inductor"][f"fxgraph_cache_{k}"] for k in ("hit", "miss", "bypass")},
            "aot_autograd": {k: counters["aot_autograd"][f"autograd_cache_{k}"] for k in ("hit", "miss", "bypass")}}


def attention_context(backend: str) -> contextlib.AbstractContextManager:
    """sdpa_kernel with the one backend asked for; auto: PyTorch's own choice (no context)."""
    if backend == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    return sdpa_kernel([names[backend]])


@contextlib.contextmanager
def attention_probe(found: dict[str, Any]) -> Iterator[None]:
    """Within it, torch.profiler (CPU activities: the dispatcher's ops, compiled graphs' extern calls
    included) notes which SDPA kernels ran: found['attention_used'] (a sorted list of backends, or
    ['none seen'] when none ran as an op of its own: e.g. Inductor lowered the math path into its
    own kernels)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield
    seen = {SDPA_KERNELS[e.key] for e in prof.key_averages() if e.key in SDPA_KERNELS}
    code = set() if seen else compiled_sdpa()
    found["attention_used"] = sorted(seen or code) or ["none seen"]
    if code:
        found["attention_from"] = "the compiled graphs' extern calls"


EXTERN_CALL = re.compile(r"(?:torch\.ops\.aten\.(\w+)\.default|aoti_torch_(?:cpu|cuda|xpu)_(_\w+?))\(")
"""An extern kernel's call in Inductor's generated code: the Python wrapper's `torch.ops.aten.<op>.default(`,
the C++ wrapper's `aoti_torch_cpu_<op>(` (its C shim, which the profiler's dispatcher never sees)."""


def compiled_sdpa() -> set[str]:
    """The SDPA backends the compiled graphs loaded in this process call as extern kernels (Inductor's
    wrapper modules, PyCodeCache): with TORCHINDUCTOR_CPP_WRAPPER=1 the kernel runs past the profiler, so
    the code says which one the graph calls (a backward's op names its forward's backend). Measured on the
    2-core AVX-512 EPYC, SDPA compiled on cpu: the profiler saw flash under the Python wrapper, nothing under
    the C++ one, whose code calls aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu."""
    from torch._inductor.codecache import PyCodeCache

    seen = set()
    for module in list(getattr(PyCodeCache, "modules", []) or []):
        try:
            text = Path(getattr(module, "__file__", "") or "").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for m in EXTERN_CALL.finditer(text):
            op = (m.group(1) or m.group(2)).removesuffix("_backward")
            if f"aten::{op}" in SDPA_KERNELS:
                seen.add(SDPA_KERNELS[f"aten::{op}"])
    return seen


class CompileWatch:
    """TorchDynamo's view of the compilation, step by step (cumulative from `start`)."""

    def __init__(self, enabled: bool, cache: str = "cold"):
        self.enabled = enabled
        self.cache = cache
        self.frames_seen = 0
        self.break_sites = BreakSites()
        if enabled:
            from torch._dynamo.utils import clear_compilation_metrics, counters

            counters.clear()
            clear_compilation_metrics()
            self.break_sites.listen()

    def compiled_since_last(self) -> tuple[int, int]:
        """(frames compiled, of them Dynamo's recompilations: those with a recompile reason) since the previous
        call; each compile or recompile of a code object is one frame."""
        if not self.enabled:
            return 0, 0
        from torch._dynamo.utils import get_compilation_metrics

        metrics = get_compilation_metrics()
        new, self.frames_seen = metrics[self.frames_seen:], len(metrics)
        return len(new), sum(1 for m in new if m.recompile_reason)

    def summary(self) -> dict[str, Any]:
        if not self.enabled:
            return {}
        from torch._dynamo.utils import counters, get_compilation_metrics

        metrics = get_compilation_metrics()
        recompiles = [{"frame": m.co_name, "reason": (m.recompile_reason or "")[:300]}
                      for m in metrics if m.recompile_reason]
        by_name: dict[str, int] = {}
        for reason, n in counters["graph_break"].items():
            by_name[_break_name(reason)] = by_name.get(_break_name(reason), 0) + n
        breaks = sorted(by_name.items(), key=lambda x: -x[1])
        seconds = {k: round(sum(getattr(m, k) or 0.0 for m in metrics), 3)
                   for k in ("entire_frame_compile_time_s", "backend_compile_time_s", "inductor_compile_time_s")}
        backward_s = sum((m.backward_cumulative_compile_time_us or 0) for m in metrics) / 1e6
        return {"frames_compiled": len(metrics), "recompiles": len(recompiles),
                "recompile_reasons": recompiles[:20], "graph_breaks": sum(n for _, n in breaks),
                "graph_break_reasons": [{"reason": r, "count": n, "where": self.break_sites.of(r)} for r, n in breaks[:30]],
                "dynamo_seconds": {**seconds, "backward_compile_time_s": round(backward_s, 3)},
                "cache": cache_counts(self.cache),
                "failures": [m.fail_reason[:300] for m in metrics if m.fail_reason][:5]}


def _break_name(reason: str) -> str:
    """A graph break's reason as one line: Dynamo's first line and its explanation, hints left out."""
    lines = [ln.strip() for ln in str(reason).splitlines() if ln.strip()]
    head = lines[0] if lines else "unknown"
    explanation = next((ln for ln in lines[1:] if ln.startswith("Explanation:")), "")
    name = head + (" -- " + explanation[len("Explanation:"):].strip() if explanation else "")
    return _ADDRESS.sub("", name)[:300]


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
"""An object's address in a reason (`<function f at 0x7f8c...>`): one break per hook, not per address."""


BREAK_LOGGER = "torch._dynamo.symbolic_convert.__graph_breaks"
"""Dynamo's graph-break artifact logger (torch._logging.getArtifactLogger(symbolic_convert, "graph_breaks"),
what TORCH_LOGS=graph_breaks prints): one message a break, 'Graph break ... in user code at FILE:LINE',
its reason, then the user code's traceback (innermost last)."""
SITE_FRAMES, SITES_PER_BREAK = 3, 3
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_AT = re.compile(r"in user code at (.+):(\d+)")


class BreakSites:
    """Where in the code each graph break happened, read from Dynamo's own graph-break log (its counters
    key a break by reason alone, and a reason such as 'the function `synchronize` in torch/cuda/__init__.py
    should not be traced' does not say who called it). Listening prints nothing unless the user asked
    for the log (TORCH_LOGS): the logger is then left as torch set it, and only read."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def listen(self) -> None:
        log = logging.getLogger(BREAK_LOGGER)
        if not log.isEnabledFor(logging.DEBUG):
            log.setLevel(logging.DEBUG)
            log.propagate = False
        for old in [h for h in log.handlers if isinstance(h, _Collect)]:
            log.removeHandler(old)        # an earlier watch's, in this process
        log.addHandler(_Collect(self.messages))

    def of(self, reason: str) -> list[str]:
        """The sites of one break (the messages holding its name's parts, as _break_name keeps them),
        innermost first ('deepspeed/utils/timer.py:238 in start <- deepspeed/runtime/engine.py:2946 in
        _forward_prologue'), at most SITES_PER_BREAK; a repeat Dynamo logs without its traceback ('at
        FILE:LINE') only when no message of the break had one; [] when the log named none."""
        parts = [part.strip() for part in reason.split(" -- ") if part.strip()]
        mine = [m for m in self.messages if parts and all(part in m for part in parts)]
        traced = [m for m in mine if "User code traceback:" in m]
        sites: list[str] = []
        for site in map(break_site, traced or mine):
            if site and site not in sites:
                sites.append(site)
        return sites[:SITES_PER_BREAK]


class _Collect(logging.Handler):
    def __init__(self, into: list[str]):
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        self.into.append(_ADDRESS.sub("", record.getMessage()))   # as _break_name keeps a reason


def break_site(message: str) -> str:
    """One graph-break log message's site: the last SITE_FRAMES frames of its user traceback outside torch
    (module.py's hook calls, functorch's wrappers: the code that made the call is above them), innermost
    first, each as a short path (from site-packages/ on), line and function; all frames when every one is
    torch's; else the 'at FILE:LINE' it names."""
    frames = _FRAME.findall(message.split("User code traceback:", 1)[1]) if "User code traceback:" in message else []
    own = [f for f in frames if not short_path(f[0]).startswith("torch/")] or frames
    if own:
        return " <- ".join(f"{short_path(f)}:{line} in {fn}" for f, line, fn in reversed(own[-SITE_FRAMES:]))
    at = _AT.search(message)
    return f"{short_path(at.group(1))}:{at.group(2)}" if at else ""


def short_path(path: str) -> str:
    """A source file as a reader finds it: from site-packages/ (or dist-packages/) on, the suite's own
    from its top, else as given."""
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path[len(SUITE_TOP):] if path.startswith(SUITE_TOP) else path


SUITE_TOP = str(Path(__file__).resolve().parents[2]) + "/"
