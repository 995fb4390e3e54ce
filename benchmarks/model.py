"""LLaMA models from transformers, randomly initialised; parameter counts on the meta device."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .spec import ModelSpec

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def llama_config(spec: ModelSpec) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_embeddings,
        rope_theta=spec.rope_theta,
        rms_norm_eps=spec.rms_norm_eps,
        attention_bias=False,
        mlp_bias=False,
        use_cache=False,
    )


def build_model(spec: ModelSpec, device: str | torch.device = "cpu") -> LlamaForCausalLM:
    """A randomly initialised LlamaForCausalLM (seed with torch.manual_seed beforehand)."""
    with torch.device(device):
        model = LlamaForCausalLM(llama_config(spec))
    return model


def count_params_meta(spec: ModelSpec) -> int:
    """Parameter count of the model built on the meta device: no memory, no init."""
    model = build_model(spec, device="meta")
    return sum(p.numel() for p in model.parameters())
