"""The training stack's settings (workload.compile, compile_mode, kernels, attention, precision=fp8):
refusals before launch, the DeepSpeed JSON and spec they make, the warm-up rule, the record's
compile figures, the reference key and the loss-parity twins. The runs themselves: tests/integration
(compile=torch on cpu, for real) and tests/integration/test_gpu.py (liger, flash, fp8 on a GPU)."""
from __future__ import annotations

import json
import warnings

import pytest

from contract.spec import StackSpec, TrainSpec
from harness.config.compose import compose
from harness.config.stack import check_packages, fp8_refusal
from harness.config.choices import Device
from harness.errors import ConfigError
from harness.plan import deepspeed_config, train_spec
from harness.stack_view import compile_seconds, stack_metrics
from harness.tune.parity import FP8_TOLERANCE, stack_tolerance

GPU = ["platform=h100", "workload=llama-440m", "workload.micro_batch_size=128"]


@pytest.mark.parametrize("overrides,field,why", [
    (["workload.precision=fp8"], "workload.precision", "the cpu platform has no FP8 tensor cores"),
    (["platform=ib-a100", "platform.launcher=local", "platform.nodes=1", "workload=llama-440m",
      "workload.precision=fp8"], "workload.precision", "A100-SXM4-80GB has no FP8 tensor cores"),
    (["workload.kernels=liger"], "workload.kernels", "Triton GPU kernels; platform cpu has no GPU"),
    (["workload.compile=deepcompile"], "workload.compile", "DeepCompile runs on CUDA only"),
    ([*GPU, "zero=stage0", "workload.compile=deepcompile"], "workload.compile", "zero.stage 1, 2 or 3"),
    (["workload.compile_mode=max-autotune"], "workload.compile_mode", "has no effect without workload.compile"),
    (["workload.compile=torch", "workload.compile_mode=reduce-overhead"], "workload.compile_mode", "CUDA graphs"),
    (["workload.attention=efficient"], "workload.attention", "no CPU implementation"),
    (["workload.attention=cudnn"], "workload.attention", "no CPU implementation"),
    (["workload=llama-tiny-kd", "workload.distill.teacher.precision=fp8"], "workload.distill.teacher.precision",
     "fp32, bf16 or fp16"),
    ([*GPU, "workload.precision=fp8", "workload.grad_accum_dtype=fp8"], "workload.grad_accum_dtype",
     "fp32, bf16 or fp16"),
])
def test_each_setting_a_platform_cannot_run_is_refused_naming_field_and_why(overrides, field, why):
    with pytest.raises(ConfigError) as e, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compose(overrides)
    assert field in str(e.value) and why in str(e.value)


def test_an_unknown_choice_names_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        compose(["workload.compile=jit"])
    assert "workload.compile" in str(e.value) and "deepcompile" in str(e.value)


def test_fp8_is_let_through_on_gpus_with_fp8_tensor_cores_and_unknown_ones():
    assert fp8_refusal(Device.cuda, "H100-SXM5-80GB") is None and fp8_refusal(Device.cuda, "H200-SXM-141GB") is None
    assert fp8_refusal(Device.cuda, "some future GPU") is None      # the rank checks its capability
    assert "no FP8 tensor cores" in fp8_refusal(Device.cuda, "V100-SXM2-32GB")


def test_fp8_on_an_h100_is_bf16_weights_and_the_fp8_peak_and_warns_without_compile():
    with pytest.warns(UserWarning, match="without workload.compile"):
        cfg = compose([*GPU, "workload.precision=fp8"])
    ds = deepspeed_config(cfg)
    assert ds["bf16"] == {"enabled": True} and ds["data_types"]["grad_accum_dtype"] == "bf16"
    assert cfg.platform.peak_tflops["fp8"] == pytest.approx(1978.9)   # what MFU divides by (harness/record.py)


def test_deepcompile_is_written_into_the_deepspeed_json_and_the_spec_carries_the_stack():
    cfg = compose([*GPU, "zero=stage3", "workload.compile=deepcompile", "workload.attention=flash"])
    ds = deepspeed_config(cfg)
    assert ds["compile"] == {"deepcompile": True}
    spec = train_spec(cfg, "r", ds)
    assert spec.stack == StackSpec(compile="deepcompile", compile_mode="default", kernels="eager", attention="flash",
                                   fp8_recipe="tensorwise", compile_warmup_max=4)
    back = TrainSpec.from_dict(json.loads(spec.to_json()))
    assert back.stack == spec.stack
    older = json.loads(spec.to_json())
    del older["stack"]                                   # a spec.json written before the field: eager
    assert TrainSpec.from_dict(older).stack == StackSpec()


def test_a_missing_package_is_refused_before_launch_for_runs_of_this_environment_only(monkeypatch):
    import harness.config.stack as stack
    monkeypatch.setattr(stack, "missing_modules", lambda mods: [m for m in mods if m != "triton"])
    local = compose([*GPU, "workload.kernels=liger"])
    with pytest.raises(ConfigError, match="needs liger-kernel, which this environment lacks; nothing was launched"):
        check_packages([local])
    slurm = compose(["platform=roce-h100", "workload=llama-440m", "workload.kernels=liger"])
    check_packages([slurm])                              # its ranks run elsewhere: not judged here


def test_the_warm_up_grows_while_a_step_still_compiles_and_no_further_than_its_cap():
    from benchmarks.training.train import grow_warmup, planned_warmup, warmup_plan
    spec = train_spec(compose(["workload.compile=torch", "measure.warmup_steps=1", "measure.compile_warmup_max=2"]),
                      "r", {})
    assert planned_warmup(spec) == 2                     # a first compile, then what the optimizer step changed
    plan = warmup_plan(spec)
    assert [w for _, w in plan][:3] == [True, True, False]
    assert not grow_warmup(plan, 0, compiled=5, spec=spec)       # not the last warm-up step yet
    assert grow_warmup(plan, 1, compiled=1, spec=spec)           # the last one recompiled: one more
    assert grow_warmup(plan, 2, compiled=1, spec=spec)
    assert not grow_warmup(plan, 3, compiled=1, spec=spec)       # compile_warmup_max reached
    assert not grow_warmup(warmup_plan(spec), 1, compiled=0, spec=spec)   # nothing compiled: measure
    eager = train_spec(compose(["measure.warmup_steps=1"]), "r", {})
    assert planned_warmup(eager) == 1


def test_compile_seconds_are_the_warm_up_beyond_the_steady_state_and_eager_runs_have_none():
    steps = [{"warmup": True, "mode": "throughput", "step_time_s": 50.0},
             {"warmup": True, "mode": "throughput", "step_time_s": 1.5},
             *({"warmup": False, "mode": "throughput", "step_time_s": t} for t in (1.0, 1.1, 0.9))]
    assert compile_seconds(steps) == pytest.approx(51.5 - 2 * 1.0)
    stack = {"compile": "torch", "warmup_steps_run": 2,
             "compile_watch": {"graph_breaks": 1, "recompiles": 0, "dynamo_seconds": {"entire_frame_compile_time_s": 30.0}}}
    m = stack_metrics(stack, steps)
    assert m["compile_s"]["value"] == pytest.approx(49.5) and m["compile_s"]["dynamo_frame_compile_s"] == 30.0
    assert m["graph_breaks"]["value"] == 1 and m["recompiles"]["value"] == 0
    assert stack_metrics({"compile": "none"}, steps) == {}


def test_a_compile_in_two_parts_is_shown_step_by_step():
    """DeepCompile compiles at its first step and recompiles at its pass step (an H200, 2026-12-04: 105.7 s at
    step 0, 125.2 s at step 5, with the warm-up now reaching past it): compile_s holds both and says each apart,
    in the record and in the training-stack table; one compiling step is shown as before."""
    from harness.stack_view import stack_fields, stack_row
    times = [105.713, 2.201, 1.096, 1.065, 1.095, 125.23, 0.811, 0.811, 0.807, 0.81]
    frames = [4, 0, 0, 0, 0, 3, 0, 0, 0, 0]
    steps = [{"index": i, "warmup": i < 7, "mode": "throughput", "step_time_s": t, "frames_compiled": n}
             for i, (t, n) in enumerate(zip(times, frames))]
    m = stack_metrics({"compile": "deepcompile", "warmup_steps_run": 7, "compile_watch": {}}, steps)
    by = m["compile_s"]["by_step"]
    assert [(p["step"], p["frames"]) for p in by] == [(0, 4), (5, 3)]
    assert by[0]["s"] == pytest.approx(105.713 - 0.81, abs=1e-3) and by[1]["s"] == pytest.approx(125.23 - 0.81, abs=1e-3)
    assert m["compile_s"]["value"] == pytest.approx(sum(times[:7]) - 7 * 0.81)   # the measured steps: 7-9
    row = stack_row("z3-deepcompile", "deepcompile", stack_fields(m, {}))
    assert row[2].endswith("(step 0 104.9, step 5 124.4)")
    one = stack_metrics({"compile": "torch", "compile_watch": {}}, [{**s, "frames_compiled": 0} if s["index"] == 5 else s
                                                                    for s in steps])
    assert "(" not in stack_row("z1-compile", "compile", stack_fields(one, {}))[2]


def test_the_warm_up_reaches_past_deepcompiles_last_pass_step_as_deepspeed_scheduled_it():
    """An H200's llama-440m ZeRO-3 DeepCompile run (2026-12-04) measured from step 2; DeepCompile applied its
    prefetch and selective-gather passes at step 5: 125 s of recompiling inside the measured steps, and
    0.81 s a step after it against 1.07-1.10 s before. The schedule is read from DeepSpeed itself."""
    from deepspeed.compile import backend

    from benchmarks.training.stack import deepcompile_pass_steps
    from benchmarks.training.train import warmup_plan
    saved = backend.remaining_schedule
    try:
        backend.init_schedule([(0, []), (5, [])])       # 0.19.8's ZeRO-3 default: init_z3.WARMUP = 5
        assert deepcompile_pass_steps() == [0, 5]
    finally:
        backend.remaining_schedule = saved
    spec = train_spec(compose(["workload.compile=torch", "measure.warmup_steps=2", "measure.steps=3"]), "r", {})
    plan = warmup_plan(spec, [0, 5])
    assert [w for _, w in plan] == [True] * 6 + [False] * (3 + spec.profile_steps)
    assert [w for _, w in warmup_plan(spec, [])][:3] == [True, True, False]
    assert sum(w for _, w in warmup_plan(spec, [0, 1])) == 2     # already covered by the planned warm-up
    # the pass steps' warm-up is planned, not growth: step 5's pass recompile still earns one more step
    from benchmarks.training.train import grow_warmup
    assert grow_warmup(plan, 5, compiled=3, spec=spec, pass_steps=[0, 5]) and [w for _, w in plan][:7] == [True] * 7


def test_frames_compiled_during_measured_steps_are_counted_as_recompiles_with_their_steps():
    steps = [{"index": 0, "warmup": True, "mode": "throughput", "step_time_s": 105.7, "frames_compiled": 4},
             {"index": 1, "warmup": True, "mode": "throughput", "step_time_s": 2.2, "frames_compiled": 0},
             *({"index": i, "warmup": False, "mode": "throughput", "step_time_s": t, "frames_compiled": n}
               for i, t, n in ((2, 1.096, 0), (3, 1.065, 0), (4, 1.095, 0), (5, 125.23, 3), (6, 0.811, 0)))]
    stack = {"compile": "deepcompile", "warmup_steps_run": 2, "compile_watch": {"graph_breaks": 0, "recompiles": 0}}
    rec = stack_metrics(stack, steps)["recompiles"]
    assert rec["value"] == 3 and rec["measured_steps"] == [{"step": 5, "frames": 3, "step_time_s": 125.23}]
    steps[6].update(frames_compiled=2, frames_recompiled=1)     # one of them a Dynamo recompile, in watch's count too
    stack["compile_watch"]["recompiles"] = 1
    rec = stack_metrics(stack, steps)["recompiles"]
    assert rec["value"] == 1 + 3 + 1 and rec["measured_steps"][1] == {"step": 6, "frames": 2, "recompiled": 1,
                                                                        "step_time_s": 0.811}
    steps[6].update(frames_compiled=0, frames_recompiled=0)
    stack["compile_watch"]["recompiles"] = 0
    steps[5]["warmup"] = True                           # the warm-up that reaches past step 5
    assert stack_metrics(stack, steps)["recompiles"] == {"value": 0, "unit": "count", "mode": "throughput"}


def test_each_variant_states_its_parity_tolerance_fp8_looser_with_its_reason():
    assert stack_tolerance({"precision": "fp8", "compile": "torch"})[0] == FP8_TOLERANCE
    assert "3 mantissa bits" in stack_tolerance({"precision": "fp8"})[1]
    tol, why = stack_tolerance({"precision": "fp32", "compile": "torch"})
    assert tol == 1e-3 and "Inductor" in why
    assert stack_tolerance({"precision": "bf16", "kernels": "liger"})[0] == 3e-2


def test_a_graph_break_is_named_by_dynamos_first_line_and_explanation():
    from benchmarks.training.stack import _break_name
    reason = ("Failed to trace builtin operator\n  Explanation: Dynamo does not know how to trace `print`\n"
              "  Hint: Avoid calling builtin `print`\n")
    assert _break_name(reason) == "Failed to trace builtin operator -- Dynamo does not know how to trace `print`"


def _timer_start(untraced):              # stands in for DeepSpeed's ThroughputTimer.start
    return untraced()


def test_each_graph_break_names_where_it_happened_in_code_outside_torch():
    """A real compile (Dynamo, eager backend): a forward pre-hook calls, through a helper, a function Dynamo
    will not trace, as DeepSpeed's engine hook calls torch.cuda.synchronize on a GPU. The record names the
    break (no object address in it) at this file's lines, innermost first, module.py's hook calls left out."""
    import torch
    from benchmarks.training.stack import CompileWatch

    watch = CompileWatch(True)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    untraced = torch.compiler.disable(lambda: None)
    model.register_forward_pre_hook(lambda module, args: _timer_start(untraced))
    model.compile(backend="eager")
    model(torch.randn(2, 4)).sum().backward()
    breaks = watch.summary()["graph_break_reasons"]
    assert [b["count"] for b in breaks] == [1] and " at 0x" not in breaks[0]["reason"]
    where = breaks[0]["where"][0].split(" <- ")
    assert where[0].startswith("tests/unit/test_stack.py:") and where[0].endswith(" in _timer_start")
    assert where[1].endswith(" in <lambda>") and not any(w.startswith("torch/") for w in where)


def test_one_break_at_two_addresses_is_one_reason_counted_twice():
    """ZeRO-3's per-module hooks are closures: Dynamo's reason holds each one's address."""
    from torch._dynamo.utils import counters
    from benchmarks.training.stack import CompileWatch

    watch = CompileWatch(True)
    for address in ("0x7f8c89712c00", "0x7f8c8988b740"):
        counters["graph_break"][f"Skip calling `torch.compiler.disable()`d function\n  Explanation: Skip calling "
                                f"function `<function _pre_forward_module_hook at {address}>`"] += 1
    breaks = watch.summary()["graph_break_reasons"]
    assert breaks == [{"reason": "Skip calling `torch.compiler.disable()`d function -- Skip calling function "
                                 "`<function _pre_forward_module_hook>`", "count": 2, "where": []}]
    counters.clear()


def test_a_graph_break_site_reads_a_gpu_nodes_log_message():
    from benchmarks.training.stack import break_site
    sp = "/opt/torch/.venv/lib/python3.12/site-packages/"
    message = (f"Graph break in user code at {sp}deepspeed/accelerator/cuda_accelerator.py:89\n"
               "Graph Break Reason: Attempted to call function marked as skipped\n\nUser code traceback:\n"
               + "".join(f'  File "{sp}{f}", line {n}, in {fn}\n    code\n' for f, n, fn in [
                   ("torch/nn/modules/module.py", 1821, "inner"), ("deepspeed/runtime/engine.py", 2920, "_module_forward_pre_hook"),
                   ("deepspeed/runtime/engine.py", 2946, "_forward_prologue"), ("deepspeed/utils/timer.py", 238, "start"),
                   ("deepspeed/accelerator/cuda_accelerator.py", 89, "synchronize")]))
    assert break_site(message) == ("deepspeed/accelerator/cuda_accelerator.py:89 in synchronize <- "
                                   "deepspeed/utils/timer.py:238 in start <- deepspeed/runtime/engine.py:2946 in _forward_prologue")
    assert break_site(f"Graph break (user stack suppressed due to duplicate graph break) in user code at "
                      f"{sp}deepspeed/utils/timer.py:238\nGraph Break Reason: x") == "deepspeed/utils/timer.py:238"


def test_fp8_leaves_the_output_head_and_unaligned_linears_in_bf16():
    from types import SimpleNamespace as NS
    from benchmarks.training.stack import fp8_filter
    assert fp8_filter(NS(in_features=1024, out_features=3712), "model.layers.0.mlp.up_proj")
    assert not fp8_filter(NS(in_features=1024, out_features=32000), "lm_head")
    assert not fp8_filter(NS(in_features=1000, out_features=1024), "model.layers.0.self_attn.q_proj")


def test_the_attention_context_asks_sdpa_for_one_backend_and_auto_for_none():
    import torch
    from benchmarks.training.stack import attention_context, attention_probe
    q = torch.randn(1, 2, 8, 16)
    found: dict = {}
    with attention_context("math"), attention_probe(found):
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert found["attention_used"] == ["math"]
    with attention_context("auto"), attention_probe(found):
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert found["attention_used"] == ["flash"]           # PyTorch's CPU flash attention


# Lines of Inductor's generated wrappers (SDPA compiled on cpu, torch 2.13): the C++ wrapper calls the kernel
# through its C shim, the Python one through the dispatcher; both name the op in comments and asserts too.
CPP_WRAPPER = """    // Topologically Sorted Source Nodes: [scaled_dot_product_attention], Original ATen: [aten._scaled_dot_product_flash_attention_for_cpu]
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu(primals_1, primals_2, primals_3, 0.0, 1, nullptr, nullptr, &buf1_handle, &buf2_handle));
    assert_size_stride(buf1, {2L, 4L, 64L, 32L}, {8192L, 2048L, 32L, 1L}, "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default");
"""
CPP_BACKWARD = """    cpp_fused__scaled_dot_product_flash_attention_for_cpu_backward_0((const float*)(getitem_1.data_ptr()), (float*)(buf0.data_ptr()));
    AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cuda__scaled_dot_product_efficient_attention_backward(tangents_1, primals_1));
"""
PY_WRAPPER_NAMED_ONLY = """        # Topologically Sorted Source Nodes: [scaled_dot_product_attention], Original ATen: [aten._scaled_dot_product_flash_attention_for_cpu]
        assert_size_stride(buf1, (2, 4, 64, 32), (8192, 2048, 32, 1), 'torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default')
        cpp_fused__scaled_dot_product_flash_attention_for_cpu_backward_0(buf0, buf1)
"""


@pytest.mark.parametrize("code, used", [(CPP_WRAPPER, ["flash"]), (CPP_BACKWARD, ["efficient"]),
                                        (PY_WRAPPER_NAMED_ONLY, ["none seen"])])
def test_attention_the_profiler_cannot_see_is_read_from_the_compiled_graphs_extern_calls(tmp_path, monkeypatch,
                                                                                          code, used):
    """Under Inductor's C++ wrapper the SDPA kernel runs past the profiler: the compiled wrappers' calls name
    it (a backward names its forward's backend); a name in a comment, an assert or a fused kernel is no call."""
    import types

    from torch._inductor.codecache import PyCodeCache

    from benchmarks.training.stack import attention_probe
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(code, encoding="utf-8")
    monkeypatch.setattr(PyCodeCache, "modules", [types.SimpleNamespace(__file__=str(wrapper)),
                                                 types.SimpleNamespace(__file__=str(tmp_path / "gone.py"))])
    found: dict = {}
    with attention_probe(found):
        pass   # nothing the dispatcher sees
    assert found["attention_used"] == used
    assert ("attention_from" in found) == (used != ["none seen"])


def test_cuda_arch_suffixes_are_dropped_for_deepspeeds_jit_builder():
    from benchmarks.node.ops import arch_list_for_deepspeed
    env = {"TORCH_CUDA_ARCH_LIST": "8.0 9.0a;10.0a+PTX"}
    assert arch_list_for_deepspeed(env) == "8.0;9.0;10.0+PTX" and env["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0;10.0+PTX"
    assert arch_list_for_deepspeed({"TORCH_CUDA_ARCH_LIST": "9.0"}) is None and arch_list_for_deepspeed({}) is None


def test_the_watch_tells_a_frames_first_compile_from_dynamos_recompilation_of_it():
    """A real compile (Dynamo, eager backend): the first call compiles one frame, a call that fails its guard
    recompiles it (Dynamo gives the reason), a call that passes compiles nothing."""
    import torch
    from benchmarks.training.stack import CompileWatch

    torch._dynamo.reset()
    watch = CompileWatch(True)

    @torch.compile(backend="eager", dynamic=False)
    def scaled(x, k):
        return x * k

    scaled(torch.ones(2), 2)
    assert watch.compiled_since_last() == (1, 0)
    scaled(torch.ones(2), 3)                     # the constant k is guarded: a recompilation
    assert watch.compiled_since_last() == (1, 1)
    scaled(torch.ones(2), 3)
    assert watch.compiled_since_last() == (0, 0)
    assert watch.summary()["recompiles"] == 1
    torch._dynamo.reset()
