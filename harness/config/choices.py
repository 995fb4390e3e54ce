"""The choices a configuration field takes: each a str Enum, so YAML and overrides carry its value."""
from __future__ import annotations

from enum import Enum

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


class CheckpointPolicy(str, Enum):
    full = "full"
    """Recompute every op of a checkpointed layer; it keeps only its input."""
    selective = "selective"
    """torchtitan's op-level selective AC: keep the outputs of attention and of every other matmul
    (the 1st, 3rd, ... of each layer), recompute the rest (benchmarks/checkpoint_policy.py)."""


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
