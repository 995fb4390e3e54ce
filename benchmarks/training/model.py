"""LLaMA models from transformers, randomly initialised; parameter counts on the meta device."""
from __future__ import annotations

import contextlib
import hashlib

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from contract.spec import ModelSpec

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}
"""A workload's precision -> its weights' dtype (fp8: bf16 weights, FP8 matmuls by benchmarks/training/stack.py)."""


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
    """A LlamaForCausalLM with transformers' own initialisation (seed with torch.manual_seed
    beforehand); `initialise` replaces it with one that every placement reproduces."""
    with torch.device(device):
        model = LlamaForCausalLM(llama_config(spec))
    return model


def count_params_meta(spec: ModelSpec) -> int:
    """Parameter count of the model built on the meta device: no memory, no init."""
    model = build_model(spec, device="meta")
    return sum(p.numel() for p in model.parameters())


def parameter_seed(seed: int, name: str) -> int:
    """A seed of its own for each parameter, from the run's seed and the parameter's name."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") >> 1


@torch.no_grad()
def initialise(model: LlamaForCausalLM, seed: int, zero3: bool) -> None:
    """transformers' LLaMA scheme (weights ~ N(0, initializer_range), RMSNorm weights 1) drawn
    parameter by parameter from per-name seeds, so that a model built plainly and one built inside
    deepspeed.zero.Init hold the same values. (Inside zero.Init, transformers' own post-init sees
    already partitioned, empty parameters and does nothing: ZeRO-3 models kept PyTorch's default
    init, N(0, 1) embeddings among it.) Under ZeRO-3 each parameter is gathered, rank 0 draws it,
    and it is re-partitioned on exit."""
    import deepspeed
    import torch.distributed as dist

    std = model.config.initializer_range
    writer = not zero3 or dist.get_rank() == 0
    for name, param in model.named_parameters():
        gathered = deepspeed.zero.GatheredParameters([param], modifier_rank=0) if zero3 else contextlib.nullcontext()
        with gathered:
            if not writer:
                continue
            if param.ndim == 1:  # RMSNorm scales
                param.fill_(1.0)
                continue
            gen = torch.Generator(device=param.device).manual_seed(parameter_seed(seed, name))
            values = torch.empty(param.shape, dtype=torch.float32, device=param.device)
            param.copy_(values.normal_(0.0, std, generator=gen))
