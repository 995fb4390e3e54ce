"""The choices a configuration field takes: each a str Enum, so YAML and overrides carry its value."""
from __future__ import annotations

import re
from enum import Enum
from typing import NamedTuple

from contract.collectives import DTYPES, OPS, REDOPS


class Fabric(str, Enum):
    ib = "ib"
    roce = "roce"
    tcp = "tcp"
    none = "none"


class LauncherKind(str, Enum):
    local = "local"
    slurm = "slurm"


class ContainerRuntime(str, Enum):
    none = "none"
    apptainer = "apptainer"
    docker = "docker"
    podman = "podman"


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"


class Precision(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    """A workload's only: bf16 weights and activations, every decoder linear layer's matmuls in FP8
    through torchao's float8 training (workload.fp8_recipe); GPUs with FP8 tensor cores only."""


class Compile(str, Enum):
    """How the model is compiled (benchmarks/training/stack.py)."""
    none = "none"
    """Eager: transformers' modules as they are (what the paper measured)."""
    torch = "torch"
    """DeepSpeed's own compile path, engine.compile(): torch.compile of the wrapped module with
    Inductor, under every ZeRO stage (ZeRO-3's parameter hooks stay eager: graph breaks, counted)."""
    deepcompile = "deepcompile"
    """DeepSpeed's DeepCompile (its config's compile.deepcompile, then engine.compile()): ZeRO's
    collectives scheduled inside the compiled graph; ZeRO 1-3 on CUDA only."""


class CompileCache(str, Enum):
    """The compilers' on-disk caches a compiled run starts from (measure.compile_cache)."""
    cold = "cold"
    """Empty: the run's ranks compile into fresh Inductor and Triton caches in the run folder, which they
    share and the harness removes after the launch, so compile_s is what a first job on the machine waits
    for, whatever ran before."""
    warm = "warm"
    """The caches as the environment has them (TORCHINDUCTOR_CACHE_DIR, else torch's own under the temp
    folder; Triton's under the checkout's .cache/): a repeat of a configuration loads its compiled graphs."""


CompileMode = Enum("CompileMode", {m: m for m in ("default", "reduce-overhead", "max-autotune",
                                                 "max-autotune-no-cudagraphs")}, type=str)
"""torch.compile's mode (workload.compile_mode), as torch.compile spells it (a functional Enum: the
names carry hyphens, and a user writes the name)."""


class Kernels(str, Enum):
    eager = "eager"
    """transformers' own RMSNorm, RoPE, SwiGLU and cross-entropy."""
    liger = "liger"
    """Liger Kernel's Triton kernels patched into the model: RMSNorm, RoPE, SwiGLU and the fused
    linear cross-entropy (the logits are never materialised); needs a GPU (Triton)."""


class Attention(str, Enum):
    """The scaled-dot-product attention backend (torch.nn.attention.sdpa_kernel); auto: PyTorch's own
    choice. The one that actually ran is recorded (benchmarks/training/stack.py attention_used)."""
    auto = "auto"
    flash = "flash"
    efficient = "efficient"
    cudnn = "cudnn"
    math = "math"


class Fp8Recipe(str, Enum):
    """torchao's float8 training recipe (Float8LinearConfig.from_recipe_name)."""
    tensorwise = "tensorwise"
    """One scale per tensor, dynamic: the fastest recipe, what torchtitan trains with by default."""
    rowwise = "rowwise"
    """One scale per row: more accurate with outliers, slower (needs CUDA 12.4+ and SM 9.0)."""


class CheckpointPolicy(str, Enum):
    full = "full"
    """Recompute every op of a checkpointed layer; it keeps only its input."""
    selective = "selective"
    """torchtitan's op-level selective AC: keep the outputs of attention and of every other matmul
    (the 1st, 3rd, ... of each layer), recompute the rest (benchmarks/training/checkpoint_policy.py)."""


class Checkpointing(NamedTuple):
    """One activation-checkpointing choice: workload.activation_checkpointing, checkpoint_every_n_layers
    and checkpoint_policy together."""
    on: bool
    every_n_layers: int
    policy: CheckpointPolicy

    @property
    def word(self) -> str:
        """none, full, selective, every_<n> (full, every n-th layer), selective_every_<n>."""
        if not self.on:
            return "none"
        head = "selective" if self.policy == CheckpointPolicy.selective else ("full" if self.every_n_layers == 1 else "")
        tail = f"every_{self.every_n_layers}" if self.every_n_layers != 1 else ""
        return "_".join(p for p in (head, tail) if p)

    def overrides(self) -> tuple[str, ...]:
        return (f"workload.activation_checkpointing={str(self.on).lower()}",
                f"workload.checkpoint_every_n_layers={self.every_n_layers}",
                f"workload.checkpoint_policy={self.policy.value}")


CHECKPOINTING_WORDS = "none, full, selective, every_<n> (full, every n-th layer) or selective_every_<n>"
_CHECKPOINTING_WORD = re.compile(r"^(?:(none|full|selective)|(selective_)?every_([1-9][0-9]*))$")


def checkpointing_of(word: str) -> Checkpointing:
    """The choice a word names (see CHECKPOINTING_WORDS); ValueError for any other word."""
    m = _CHECKPOINTING_WORD.match(str(word).strip())
    if not m:
        raise ValueError(f"{word!r} is not a checkpointing choice: {CHECKPOINTING_WORDS}")
    if m.group(1):
        return Checkpointing(m.group(1) != "none", 1,
                             CheckpointPolicy.selective if m.group(1) == "selective" else CheckpointPolicy.full)
    return Checkpointing(True, int(m.group(3)), CheckpointPolicy.selective if m.group(2) else CheckpointPolicy.full)


class DataSource(str, Enum):
    synthetic = "synthetic"
    corpus = "corpus"


class OptimizerImpl(str, Enum):
    torch = "torch"
    deepspeed = "deepspeed"


class GradientCollective(str, Enum):
    all_reduce = "all_reduce"
    reduce_scatter = "reduce_scatter"


class SearchStrategy(str, Enum):
    auto = "auto"
    grid = "grid"
    bayes = "bayes"


class RunKind(str, Enum):
    training = "training"
    collective = "collective"


# The collective vocabulary is contract.collectives' (the ranks read it too); these are its choices as
# str Enums, built from it so the names live in one place. A member's name is its value, as a user
# writes it (collective.source=nccl-tests), so the functional form: "nccl-tests" is no identifier.
CollectiveOp = Enum("CollectiveOp", {op: op for op in OPS}, type=str)
CollectiveDtype = Enum("CollectiveDtype", {d: d for d in DTYPES}, type=str)
CollectiveRedop = Enum("CollectiveRedop", {r: r for r in REDOPS}, type=str)
CollectiveSource = Enum("CollectiveSource", {s: s for s in ("builtin", "nccl-tests")}, type=str)
"""builtin: the suite's torch.distributed sweep; nccl-tests: the real binaries."""
