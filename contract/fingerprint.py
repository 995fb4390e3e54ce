"""The environment fingerprint's vocabulary: the variables the harness tells the ranks about their
image, the environment variables a record keeps, and which fingerprint fields a comparison names
when they change and a submission requires. The ranks fill the fingerprint
(benchmarks/environment.py), the controller completes it (harness/record.py)."""
from __future__ import annotations

IMAGE_VAR, DIGEST_VAR, RUNTIME_VAR = "SUITE_CONTAINER_IMAGE", "SUITE_CONTAINER_DIGEST", "SUITE_CONTAINER_RUNTIME"
"""What the harness tells the ranks about the image they run in."""
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "UCX_",
                "FI_", "GLOO_SOCKET_IFNAME")
"""Environment variables a record keeps (environment.env): those that change what the ranks do."""

COMPARED = ("driver", "cuda", "nccl", "torch", "deepspeed", "transformers", "python",
            "container_image", "container_digest", "container_runtime", "gpu_model", "gpu_count", "num_nodes",
            "num_ranks")
"""Fingerprint fields a comparison lists as what changed (with env, hardware, links, load, settings and
the suite commit, which it compares by their own rules)."""
REQUIRED = ("python", "torch", "deepspeed", "transformers", "suite_commit")
REQUIRED_CUDA = ("cuda", "nccl", "driver", "gpu_model")
"""What a submitted record's fingerprint must name (REQUIRED_CUDA too on a cuda platform)."""
