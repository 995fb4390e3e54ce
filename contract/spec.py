"""The contract between the harness and a rank: one resolved TrainSpec per run, as JSON.

Pure dataclasses (no torch), so the harness can build and write them without importing torch.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

SPEC_FILE = "spec.json"
HOST_THREADS_VAR = "SUITE_HOST_THREADS"
"""platform.host_threads, as the harness passes it to a GPU rank (benchmarks/training/train.py rank_threads)."""


@dataclass
class ModelSpec:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    max_position_embeddings: int
    tie_embeddings: bool = False
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5


@dataclass
class OptimizerSpec:
    impl: str = "torch"          # torch | deepspeed
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0


@dataclass
class DataSpec:
    source: str = "synthetic"    # synthetic | corpus
    corpus_path: Optional[str] = None
    tokenizer_path: Optional[str] = None
    text_field: str = "text"


@dataclass
class DistillSpec:
    """A frozen teacher and the distillation loss (see benchmarks/training/distill.py)."""
    alpha: float
    temperature: float
    teacher: ModelSpec
    teacher_precision: str       # fp32 | bf16 | fp16
    teacher_checkpoint: Optional[str] = None
    """A .safetensors file or Hugging Face folder, checked by the harness before launch; None: random."""
    teacher_files: list[str] = field(default_factory=list)
    """The checkpoint's .safetensors files, as the harness resolved them (file, index shards or glob)."""


@dataclass
class StackSpec:
    """How the model is compiled, which kernels and attention backend it runs, FP8 (benchmarks/training/stack.py)."""
    compile: str = "none"        # none | torch | deepcompile
    compile_mode: str = "default"
    kernels: str = "eager"       # eager | liger
    attention: str = "auto"      # auto | flash | efficient | cudnn | math
    fp8_recipe: str = "tensorwise"
    compile_warmup_max: int = 4
    """Warm-up steps added at most while a step still compiles."""
    compile_cache: str = "cold"  # cold | warm: the compilers' on-disk caches a rank starts from

    def planned_warmup(self, warmup_steps: int) -> int:
        """Warm-up steps before any growth: the configured ones, at least 2 when compiling (the first
        compiles forward and backward; the second meets what the first optimizer step changed)."""
        return max(warmup_steps, 2) if self.compile != "none" else warmup_steps


@dataclass
class TrainSpec:
    run_id: str
    benchmark: str
    platform: str
    device: str                  # cpu | cuda
    dist_backend: str            # gloo | nccl
    model: ModelSpec
    seq_len: int
    micro_batch_size: int
    grad_acc_steps: int
    precision: str               # fp32 | bf16 | fp16 | fp8 (bf16 + torchao float8 linears)
    optimizer: OptimizerSpec
    deepspeed: dict[str, Any]
    warmup_steps: int
    steps: int
    profile_steps: int
    seed: int
    data: DataSpec = field(default_factory=DataSpec)
    activation_checkpointing: bool = False
    checkpoint_every_n_layers: int = 1
    """With activation_checkpointing: every n-th decoder layer is checkpointed (1: all). Older
    spec.json files lack it: 1."""
    checkpoint_policy: str = "full"
    """full | selective (torchtitan's op-level policy; benchmarks/training/checkpoint_policy.py)."""
    inject_delay_s: float = 0.0
    """Deliberate sleep per micro-step (regression-detection checks only)."""
    inject_delay_ranks: Optional[list[int]] = None
    """The only ranks that sleep inject_delay_s (a straggler rank, a slow node's ranks); None: every rank."""
    cpu_mem_limit_gib: Optional[float] = None
    """On the cpu device: the platform's declared memory per rank, enforced as RLIMIT_DATA."""
    distill: Optional[DistillSpec] = None
    gradient_collective: str = "all_reduce"
    """ZeRO-1/2 gradient reduction: all_reduce (DeepSpeed's own path) or reduce_scatter
    (benchmarks/reduce_scatter/install.py, applied after deepspeed.initialize). Older spec.json files lack
    it: all_reduce."""
    stack: StackSpec = field(default_factory=StackSpec)
    """Older spec.json files lack it: eager, as they ran."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainSpec":
        d = dict(d)
        d["model"] = ModelSpec(**d["model"])
        d["optimizer"] = OptimizerSpec(**{**d["optimizer"], "betas": tuple(d["optimizer"]["betas"])})
        d["data"] = DataSpec(**d["data"])
        d["stack"] = StackSpec(**d.get("stack", {}))
        if d.get("distill"):
            d["distill"] = DistillSpec(**{**d["distill"], "teacher": ModelSpec(**d["distill"]["teacher"])})
        return cls(**d)

    @classmethod
    def load(cls, path: Path) -> "TrainSpec":
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


@dataclass
class CollectiveSpec:
    """One built-in collective sweep: every op over the same list of sizes."""
    run_id: str
    platform: str
    device: str                  # cpu | cuda
    dist_backend: str            # gloo | nccl
    ops: list[str]
    sizes: list[int]             # bytes of the full buffer (nccl-tests' size), already rounded
    dtype: str                   # torch dtype name: float32, bfloat16, ...
    redop: str                   # sum | prod | max | min | avg
    root: int
    warmup_iters: int
    iters: int
    check: bool
    in_place: bool
    kind: str = "collective"
    small_iters: int = 0         # timed iterations per size up to SMALL_BYTES; 0: iters
    bind_ranks: bool = False     # on cpu, each rank's threads bound to its own share of the CPUs

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def load(cls, path: Path) -> "CollectiveSpec":
        return cls(**json.loads(Path(path).read_text(encoding="utf-8")))
