"""The environment fingerprint's vocabulary and its one builder: the variables the harness tells the
ranks about their image, the environment variables a record keeps, the fields each side fills (in
the order a record holds them), and which fields a comparison names when they change and a
submission requires. The ranks fill the fingerprint (benchmarks/node/environment.py), the controller
completes it (harness/record.py), an imported nccl-tests output fills what its text says
(harness/nccl_tests/importer.py); all three build it with build(). Pure: no torch, no harness."""
from __future__ import annotations

import json
from importlib import metadata
from typing import Any, Mapping, Optional

IMAGE_VAR, DIGEST_VAR, RUNTIME_VAR = "SUITE_CONTAINER_IMAGE", "SUITE_CONTAINER_DIGEST", "SUITE_CONTAINER_RUNTIME"
"""What the harness tells the ranks about the image they run in."""
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "CUDA_VISIBLE_DEVICES", "OMP_", "UCX_", "FI_", "GLOO_SOCKET_IFNAME",
                "MKL_", "KMP_", "DNNL_", "ONEDNN_", "ATEN_CPU_CAPABILITY", "MALLOC_", "PYTORCH_CUDA_ALLOC_CONF",
                "TORCHINDUCTOR_", "TORCH_COMPILE_", "TORCHDYNAMO_", "TORCH_DYNAMO_", "TRITON_")
"""Environment variables a record keeps (environment.env): those that change what the ranks do: the
collectives' (NCCL, UCX, libfabric, gloo), the CPU math libraries' threads and kernels (OpenMP, MKL,
oneDNN, ATen's CPU capability), glibc's allocator and PyTorch's CUDA allocator, and the compiler's:
Inductor's settings (TORCHINDUCTOR_DEBUG_COMPILE=1 builds its C++ kernels at -O0), Dynamo's
(TORCHDYNAMO_, TORCH_DYNAMO_, TORCH_COMPILE_DISABLE) and Triton's. An image's ENV of them is seen by
the ranks like any other (a changed one is named by a comparison). Not TORCH_EXTENSIONS_DIR (no
prefix here): like ENV_EXCLUDED, a path."""
ENV_EXCLUDED = ("TRITON_CACHE_DIR", "TRITON_HOME", "TORCHINDUCTOR_CACHE_DIR")
"""Variables of those prefixes a record leaves out: where the compilers keep their caches, a path that
says nothing of what runs and differs between checkouts (harness/plan.py sets TRITON_CACHE_DIR under
each checkout's .cache/) and jobs; what the caches held is measure.compile_cache (cold: the run's own,
empty) and the record's compile_watch.cache (hits and misses)."""


def recorded_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of `environ` a record keeps (ENV_PREFIXES less ENV_EXCLUDED), sorted by name."""
    return {k: v for k, v in sorted(environ.items()) if k.startswith(ENV_PREFIXES) and k not in ENV_EXCLUDED}


STACK_PACKAGES = {"triton": ("triton", "pytorch-triton", "pytorch-triton-rocm", "pytorch-triton-xpu"),
                  "liger_kernel": ("liger-kernel", "liger-kernel-nightly"),
                  "torchao": ("torchao",)}
"""The training stack's packages (fingerprint field -> the distributions that bring its module, the
first installed one read): Triton (Inductor's GPU kernels; PyTorch's own builds ship it as
pytorch-triton), Liger Kernel, torchao (FP8 training)."""


def stack_versions() -> dict[str, Optional[str]]:
    """{field: version or None} of STACK_PACKAGES, from the installed distributions' metadata: nothing is
    imported (the controller reads them without torch; a rank without paying Triton's import)."""
    out: dict[str, Optional[str]] = {}
    for name, dists in STACK_PACKAGES.items():
        out[name] = None
        for dist in dists:
            try:
                out[name] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return out


FIELDS = ("python", "torch", "deepspeed", "transformers", "datasets", "triton", "liger_kernel", "torchao", "cuda",
          "nccl", "driver", "gpu_model", "gpu_count", "cpu_model", "machine", "os", "container_image",
          "container_digest", "container_runtime", "lock_mismatches", "env", "host", "world_size", "hosts",
          "suite_commit", "nccl_tests", "num_ranks")
"""Every field a builder fills, in the order a fingerprint holds them (the controller adds more
afterwards: nodes, links, num_nodes, settings, load, ...; harness.record.environment)."""
RANK_FIELDS = FIELDS[:FIELDS.index("world_size") + 1]
"""What a rank knows (benchmarks.node.environment.fingerprint): everything torch and its node tell it."""
CONTROLLER_FIELDS = ("python", "torch", "deepspeed", "transformers", "datasets", "triton", "liger_kernel", "torchao",
                     "cuda", "nccl", "driver", "gpu_model", "gpu_count", "container_image", "container_digest", "env",
                     "host")
"""What the controller starts from without torch (harness.record.controller_environment); the
ranks' own view, when they report it, overrides it."""
IMPORTED_FIELDS = ("python", "torch", "deepspeed", "transformers", "cuda", "nccl", "driver", "gpu_model",
                   "gpu_count", "machine", "container_image", "env", "hosts", "suite_commit", "nccl_tests", "num_ranks")
"""What a record of an imported nccl-tests output holds (harness.nccl_tests.importer.records_from_output):
what the output's text says, None for what it cannot (`machine`: a node's GPUs as its Rank lines name them)."""
OUTPUT_MACHINE = "a saved nccl-tests output"
"""An imported record's environment.machine.source: the GPUs as the output names them (its Rank lines, a -J
JSON output's devices), with no probe."""
IMPORTED_REQUIRED = ("nccl", "gpu_model")
"""What a submitted imported output's fingerprint must name: the library it measured and the GPUs (an output
names no Python, suite or driver; REQUIRED is the suite's own records')."""


def build(fields: tuple[str, ...], **facts: Any) -> dict[str, Any]:
    """The fingerprint holding `fields` (one of the views above), in FIELDS' order: each field as
    given in facts, None (unknown) when not given. A fact or field outside the view is an error."""
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise ValueError(f"not fingerprint fields: {', '.join(unknown)}")
    outside = sorted(set(facts) - set(fields))
    if outside:
        raise ValueError(f"facts outside this fingerprint's fields: {', '.join(outside)}")
    return {k: facts.get(k) for k in FIELDS if k in fields}


COMPARED = ("driver", "cuda", "nccl", "torch", "deepspeed", "transformers", "triton", "liger_kernel", "torchao",
            "python", "container_image", "container_digest", "container_runtime", "gpu_model", "gpu_count",
            "num_nodes", "num_ranks")
"""Fingerprint fields a comparison lists as what changed (with env, hardware, links, load, settings, the
training stack and the suite commit, which it compares by their own rules)."""
STACK_COMPARED = ("mode", "backend", "path", "attention_used", "liger", "fp8", "host_threads")
"""What a comparison names of environment.stack (`stack.attention_used: flash -> cudnn`) when both records
hold one: what really ran of the training stack, and the rank's host threads. What was asked (compile, kernels, attention,
fp8_recipe) is in the configuration's key, so two runs compared asked the same; the compile watch's
counts are metrics (compile_s, graph_breaks, recompiles)."""
STACK_WHEN_BOTH = ("host_threads",)
"""Of STACK_COMPARED, the fields named only where both records hold them: records from before the field
say nothing of it (a GPU rank then ran one thread, which no record states)."""
DEEPSPEED_JSON = "deepspeed_json"
"""environment.deepspeed_json: the DeepSpeed JSON the ranks ran (config.deepspeed: the suite's, with a user's
deepspeed_config= merged over it) flattened to dotted keys (flat_json). A comparison names each key that
differs (`deepspeed.memory_breakdown: None -> True`) where both records hold the field: the reference key
holds the configuration, not a user's JSON, so a debugging flag left on (memory_breakdown made llama-tiny
13x slower on cpu), DeepSpeed's timers or its compile section would otherwise slow a run unnamed."""


def flat_json(value: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted key: scalar} of a JSON object; a list as its compact JSON text; an empty object as {}."""
    if isinstance(value, Mapping):
        if not value and prefix:
            return {prefix: {}}
        out: dict[str, Any] = {}
        for k in sorted(value, key=str):
            out.update(flat_json(value[k], f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, (list, tuple)):
        return {prefix: json.dumps(value, separators=(",", ":"), sort_keys=True)}
    return {prefix: value}


REQUIRED = ("python", "torch", "deepspeed", "transformers", "suite_commit")
REQUIRED_CUDA = ("cuda", "nccl", "driver", "gpu_model")
"""What a submitted record's fingerprint must name (REQUIRED_CUDA too on a cuda platform)."""
