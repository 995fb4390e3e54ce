"""Parameter counts, FLOPs per token and MFU (harness.model.flops) against the real model and by hand."""
from __future__ import annotations

import dataclasses

import pytest
import yaml
from unit_helpers import CONF_DIR

from harness.config.schema import WorkloadConfig
from harness.model.flops import FLOPS_FORMULA, llama_param_count, mfu_pct, training_flops_per_token
from harness.plan import model_spec


def workload(name: str, **changes) -> WorkloadConfig:
    """conf/workload/<name>.yaml as a WorkloadConfig (no Hydra: these are pure formulas)."""
    data = yaml.safe_load((CONF_DIR / "workload" / f"{name}.yaml").read_text(encoding="utf-8"))
    data.pop("defaults", None)
    return dataclasses.replace(WorkloadConfig(**data), **changes)


# A model small enough to count by hand: vocab 10, h 4, ffn 8, 1 layer, 2 heads (head_dim 2),
# 1 kv head, seq 3.  Per layer: q,o 2*(4*4)=32 + k,v 2*(4*2)=16 -> attn 48; mlp 3*4*8=96;
# 2 norms 8 -> 152.  Embedding 40, head 40 (untied), final norm 4.  N = 236; N_matmul = 196.
# FLOPs/token = 6*196 + 12*L*h*s = 1176 + 12*1*4*3 = 1176 + 144 = 1320.
SMALL = WorkloadConfig(name="small", vocab_size=10, hidden_size=4, intermediate_size=8, num_layers=1,
                       num_heads=2, num_kv_heads=1, seq_len=3, samples_per_step=1, micro_batch_size=1)


@pytest.mark.parametrize("w,expected", [
    pytest.param(workload("llama-tiny"), None, id="llama-tiny"),
    pytest.param(workload("llama-tiny", tie_embeddings=True), None, id="llama-tiny-tied"),
    pytest.param(workload("llama-440m"), 439_927_808, id="llama-440m"),
    pytest.param(workload("llama-8b"), 8_030_261_248, id="llama-8b (Llama-3-8B)"),
    pytest.param(SMALL, 236, id="hand-counted"),
    pytest.param(dataclasses.replace(SMALL, tie_embeddings=True), 196, id="hand-counted-tied"),
])
def test_param_count_formula_matches_the_real_transformers_model(w, expected):
    from benchmarks.training.model import count_params_meta

    real = count_params_meta(model_spec(w))
    assert llama_param_count(w) == real
    if expected is not None:
        assert real == expected


@pytest.mark.parametrize("w,num_params,matmul,flops_per_token", [
    pytest.param(SMALL, 236, 196, 1320.0, id="untied: the input embedding is a lookup"),
    pytest.param(dataclasses.replace(SMALL, tie_embeddings=True), 196, 196, 1320.0,
                 id="tied: the shared matrix is the output head"),
    pytest.param(dataclasses.replace(SMALL, seq_len=30), 236, 196, 6 * 196 + 12 * 1 * 4 * 30,
                 id="attention term grows with seq_len"),
    pytest.param(dataclasses.replace(SMALL, num_layers=2), 388, 348, 6 * 348 + 12 * 2 * 4 * 3,
                 id="two layers"),
])
def test_training_flops_per_token_is_6n_plus_12lhs(w, num_params, matmul, flops_per_token):
    assert llama_param_count(w) == num_params
    fm = training_flops_per_token(w, num_params)
    assert fm.num_params == num_params
    assert fm.num_matmul_params == matmul
    assert fm.flops_per_token == flops_per_token
    assert fm.formula == FLOPS_FORMULA == "6*N + 12*L*h*s"


def test_llama_8b_flops_per_token_worked_example():
    w = workload("llama-8b")
    fm = training_flops_per_token(w, 8_030_261_248)
    matmul = 8_030_261_248 - 128256 * 4096  # the input embedding is not a matmul
    assert fm.num_matmul_params == matmul
    assert fm.flops_per_token == 6 * matmul + 12 * 32 * 4096 * 512


@pytest.mark.parametrize("tokens_per_s_per_device,flops_per_token,peak_tflops,expected_pct", [
    (1000.0, 6e9, 100.0, 6.0),
    (500.0, 6e9, 100.0, 3.0),
    (1000.0, 6e9, 50.0, 12.0),
    (2e5, 3e9, 989.4, 100.0 * 2e5 * 3e9 / 989.4e12),
    (0.0, 6e9, 100.0, 0.0),
])
def test_mfu_pct_worked_examples(tokens_per_s_per_device, flops_per_token, peak_tflops, expected_pct):
    assert mfu_pct(tokens_per_s_per_device, flops_per_token, peak_tflops) == pytest.approx(expected_pct)


@pytest.mark.parametrize("peak", [0.0, -1.0])
def test_mfu_pct_refuses_a_non_positive_peak(peak):
    with pytest.raises(ValueError, match="peak_tflops"):
        mfu_pct(1000.0, 6e9, peak)
