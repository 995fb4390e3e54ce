"""Op-level selective activation checkpointing (workload.checkpoint_policy=selective): torchtitan's
policy (torchtitan/models/llama/parallelize_llama.py, _apply_ac_to_transformer_block, "op" mode, as of
2024-12): inside a checkpointed layer, keep the outputs of the attention kernel and of every other
matmul (the 1st, 3rd, 5th and 7th of a LLaMA layer: q, v, gate, down), recompute everything else in
backward (norms, RoPE, k, o, up, SiLU, products). The counts are per layer and per pass (forward,
recompute), so both passes save the same ops. harness/model/memory.py counts what it keeps."""
from __future__ import annotations

from collections import defaultdict


def saved_ops() -> set:
    import torch
    aten = torch.ops.aten
    names = ("mm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
    return {getattr(aten, n).default for n in names if hasattr(aten, n)}


def selective_context():
    """A context_fn for torch.utils.checkpoint (non-reentrant): a fresh policy per checkpointed call."""
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    keep, counts = saved_ops(), defaultdict(int)
    mm = torch.ops.aten.mm.default

    def policy(ctx, op, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if op == mm:
            counts[key] += 1
        save = op in keep and not (op == mm and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)
