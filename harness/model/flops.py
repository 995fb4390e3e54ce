"""Parameter counts, FLOPs per token and MFU: pure formulas, sources cited."""
from __future__ import annotations

from dataclasses import dataclass

from ..config.choices import CheckpointPolicy
from ..config.schema import WorkloadConfig

FLOPS_FORMULA = "6*N + 12*L*h*s"  # PaLM (Chowdhery et al. 2022), appendix B
TEACHER_FLOPS_FORMULA = "2*N_t + 4*L_t*h_t*s"  # the forward third of the same count


def llama_param_count(w: WorkloadConfig) -> int:
    """Exact parameter count of transformers' LlamaForCausalLM (no biases, RMSNorm weights only)."""
    head_dim = w.hidden_size // w.num_heads
    attn = w.hidden_size * head_dim * (2 * w.num_heads + 2 * w.num_kv_heads)  # q, o + k, v
    mlp = 3 * w.hidden_size * w.intermediate_size                             # gate, up, down
    norms = 2 * w.hidden_size
    embed = w.vocab_size * w.hidden_size
    head = 0 if w.tie_embeddings else w.vocab_size * w.hidden_size
    return w.num_layers * (attn + mlp + norms) + embed + head + w.hidden_size  # + final norm


def checkpointed_layers(w: WorkloadConfig) -> int:
    """Decoder layers whose forward is recomputed in backward: ceil(L / n) of them with activation
    checkpointing every n-th layer (layer i where i % n == 0), none without."""
    return -(-w.num_layers // w.checkpoint_every_n_layers) if w.activation_checkpointing else 0


def recompute_fraction(w: WorkloadConfig) -> float:
    """The share of the decoder layers recomputed in backward (checkpointed_layers / L)."""
    return checkpointed_layers(w) / w.num_layers


def recompute_flops_per_token(w: WorkloadConfig) -> float:
    """FLOPs the checkpointing recompute adds per token, per checkpointed layer x checkpointed_layers.
    full: the layer's forward up to its last saved tensor (non-reentrant torch.utils.checkpoint stops
    early: the down projection's output is saved by nothing, so it is not recomputed; measured in
    tests/unit/test_checkpointing.py): q, k, v, o, gate, up, 2 x (2 h^2 + 2 h kv + 2 h f), and
    attention, 4 h s (PaLM's forward third). selective (benchmarks/training/checkpoint_policy.py): only the
    matmuls not kept, k, o and up, 2 x (h kv + h^2 + h f); the attention kernel's output is kept."""
    h = w.hidden_size
    kv = w.num_kv_heads * (h // w.num_heads)
    if w.checkpoint_policy == CheckpointPolicy.selective:
        per_layer = 2.0 * (h * kv + h * h + h * w.intermediate_size)
    else:
        per_layer = 2.0 * (2 * h * h + 2 * h * kv + 2 * h * w.intermediate_size) + 4.0 * h * w.seq_len
    return checkpointed_layers(w) * per_layer


def matmul_param_count(w: WorkloadConfig, num_params: int) -> int:
    """N of the FLOP formula: parameters that take part in matmuls (the input embedding is a
    lookup, so it is excluded unless tied to the output head)."""
    return num_params - (0 if w.tie_embeddings else w.vocab_size * w.hidden_size)


@dataclass(frozen=True)
class FlopModel:
    formula: str
    num_params: int
    num_matmul_params: int
    flops_per_token: float


def training_flops_per_token(w: WorkloadConfig, num_params: int) -> FlopModel:
    """Forward + backward FLOPs per token: 6N for the matmuls with weights plus 12*L*h*s for
    attention scores and values (PaLM appendix B), h = hidden size, s = sequence length."""
    n = matmul_param_count(w, num_params)
    per_token = 6 * n + 12 * w.num_layers * w.hidden_size * w.seq_len
    return FlopModel(FLOPS_FORMULA, num_params, n, float(per_token))


def forward_flops_per_token(w: WorkloadConfig, num_params: int) -> FlopModel:
    """Forward-only FLOPs per token (a frozen distillation teacher): a third of the training count,
    2N for the weight matmuls and 4*L*h*s for attention (PaLM appendix B, backward = 2x forward)."""
    n = matmul_param_count(w, num_params)
    per_token = 2 * n + 4 * w.num_layers * w.hidden_size * w.seq_len
    return FlopModel(TEACHER_FLOPS_FORMULA, num_params, n, float(per_token))


def mfu_pct(tokens_per_s_per_device: float, flops_per_token: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s per device over the declared peak."""
    if peak_tflops <= 0:
        raise ValueError(f"peak_tflops={peak_tflops} must be > 0")
    return 100.0 * tokens_per_s_per_device * flops_per_token / (peak_tflops * 1e12)
