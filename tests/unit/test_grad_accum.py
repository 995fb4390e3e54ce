"""The dtype gradients accumulate in (issue 14): DeepSpeed's default accumulates a bf16 model's
gradients in bf16 over the 16-32 micro-steps of the paper's grids. The suite always writes
data_types.grad_accum_dtype: fp32 under ZeRO-2/3 unless a workload pins otherwise (the paper's
workloads pin bf16, what they ran), the model's dtype under ZeRO-0/1 unless fp32 is asked for."""
from __future__ import annotations

import pytest

from harness.config.choices import Precision
from harness.config.schema import grad_accum_precision
from harness.errors import ConfigError
from harness.model.memory import memory_estimate
from harness.model.traffic import comm_traffic
from harness.plan import deepspeed_config, merge_user_deepspeed
from harness.verdict.references import record_config
from unit_helpers import typed


def _accum(cfg) -> str:
    return deepspeed_config(cfg)["data_types"]["grad_accum_dtype"]


@pytest.mark.parametrize("stage,expected", [(0, "bf16"), (1, "bf16"), (2, "fp32"), (3, "fp32")])
def test_a_bf16_model_accumulates_in_fp32_under_zero_2_3_by_default(composed, stage, expected):
    cfg = composed(["platform=h100", "workload=llama-8b", f"zero=stage{stage}"])
    assert cfg.workload.grad_accum_dtype is None
    assert _accum(cfg) == expected


def test_fp32_models_and_the_paper_workloads_say_what_they_accumulate_in(composed):
    assert _accum(composed(["platform=cpu", "workload=llama-tiny", "zero=stage2"])) == "fp32"
    for workload in ("llama-440m", "llama-8b-kd"):   # pinned to DeepSpeed's default, what the paper ran
        for stage in (1, 2, 3):
            cfg = composed(["platform=roce-h100", f"workload={workload}", f"zero=stage{stage}"])
            assert _accum(cfg) == "bf16", (workload, stage)


def test_fp32_accumulation_can_be_asked_for_under_zero_1(composed):
    cfg = composed(["platform=h100", "workload=llama-8b", "zero=stage1", "workload.grad_accum_dtype=fp32"])
    assert _accum(cfg) == "fp32"


@pytest.mark.parametrize("overrides,words", [
    (["workload=llama-8b", "zero=stage0", "workload.grad_accum_dtype=fp32"], "without ZeRO"),
    (["workload=llama-tiny", "workload.precision=fp32", "workload.grad_accum_dtype=bf16"], "fp32 model's gradients in fp32"),
    (["workload=llama-8b", "workload.grad_accum_dtype=fp16"], "in bf16 or fp32"),
    (["workload=llama-8b", "zero=stage1", "zero.gradient_collective=reduce_scatter",
      "workload.grad_accum_dtype=fp32"], "BF16_Optimizer"),
])
def test_an_accumulation_deepspeed_cannot_run_is_refused_by_name(composed, overrides, words):
    with pytest.raises(ConfigError, match="workload.grad_accum_dtype") as exc:
        composed(["platform=h100", *overrides])
    assert words in str(exc.value)


def test_a_user_deepspeed_file_cannot_change_the_accumulation_behind_the_suite(composed):
    cfg = composed(["platform=h100", "workload=llama-8b", "zero=stage2"])
    with pytest.raises(ConfigError, match="data_types.grad_accum_dtype='bf16'.*workload.grad_accum_dtype"):
        merge_user_deepspeed(deepspeed_config(cfg), {"data_types": {"grad_accum_dtype": "bf16"}}, "my.json")


def test_the_rule_is_one_function():
    assert grad_accum_precision(Precision.bf16, 2) == Precision.fp32
    assert grad_accum_precision(Precision.bf16, 1) == Precision.bf16
    assert grad_accum_precision(Precision.bf16, 2, Precision.bf16) == Precision.bf16
    assert grad_accum_precision(Precision.fp32, 3) == Precision.fp32


def _record(cfg, **workload) -> dict:
    from harness.config.schema import to_dict
    c = to_dict(cfg)
    c["workload"].update(workload)
    return {"kind": "training", "config": c, "environment": {"num_ranks": cfg.platform.world_size}}


def test_references_match_on_the_accumulation_only_where_it_differs_from_the_model_dtype(composed):
    cfg = composed(["platform=h100", "workload=llama-8b", "zero=stage2"])
    assert record_config(typed([_record(cfg)])[0])["grad_accum_dtype"] == "fp32"       # unset: fp32 under ZeRO-2
    old = _record(cfg)
    del old["config"]["workload"]["grad_accum_dtype"]                       # a record from before the field
    assert "grad_accum_dtype" not in record_config(typed([old])[0])                     # ran in the model's dtype
    assert "grad_accum_dtype" not in record_config(typed([_record(cfg, grad_accum_dtype="bf16")])[0])


def test_the_memory_model_holds_fp32_gradient_partitions_and_bf16_optimizer_buffers(composed):
    psi = 8_030_261_248
    z2 = composed(["platform=h100", "workload=llama-8b", "zero=stage2"])
    z2_bf16 = composed(["platform=h100", "workload=llama-8b", "zero=stage2", "workload.grad_accum_dtype=bf16"])
    assert memory_estimate(z2).grads_gib == pytest.approx(4 * psi / 2**30, rel=1e-3)
    assert memory_estimate(z2_bf16).grads_gib == pytest.approx(2 * psi / 2**30, rel=1e-3)
    z1 = composed(["platform=h100", "workload=llama-8b", "zero=stage1", "workload.grad_accum_dtype=fp32"])
    est = memory_estimate(z1)
    assert est.grads_gib == pytest.approx(6 * psi / 2**30, rel=1e-3)
    assert "BF16_Optimizer" in est.formulas["grads"]


def test_bf16_optimizer_traffic_is_one_fp32_all_reduce_at_the_boundary(composed):
    cfg = composed(["platform=roce-h100", "workload=llama-440m", "zero=stage1", "workload.grad_accum_dtype=fp32"])
    grads = comm_traffic(cfg)[0]
    assert grads.op == "all_reduce" and grads.microsteps == 1 and "fp32" in grads.what
    assert sum(grads.sizes) == 4 * 439_927_808
