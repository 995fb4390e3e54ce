"""The `tune` part of the typed configuration tree (BenchConfig.tune, harness/config/schema.py): the
three-step search's space, strategy, budget and confirmation. Each field's docstring sits under it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .choices import Compile, Kernels, SearchStrategy


def _default_nccl_space() -> dict[str, list[str]]:
    return {"NCCL_ALGO": ["Ring", "Tree"], "NCCL_PROTO": ["LL", "LL128", "Simple"]}


@dataclass
class TuneConfig:
    """`python -m harness tune`: the three-step search (NCCL, then batch split x ZeRO stage, then
    DeepSpeed's communication knobs), each step starting from the previous step's best."""
    steps: list[int] = field(default_factory=lambda: [1, 2, 3])
    """Which steps run: 1 NCCL variables on a standalone all-reduce, 2 (micro-batch, grad-acc) at
    fixed C x ZeRO stage, 3 overlap_comm, gradient collective, bucket sizes, contiguous_gradients."""
    strategy: SearchStrategy = SearchStrategy.auto
    """grid: every point of a step's space; bayes: Optuna's TPE, seeded, within the budget; auto:
    grid when a step has at most grid_max points, bayes otherwise."""
    budget: int = 0
    """Most trials a step may run (runs reused from an interrupted tune count). 0: the whole space
    for grid, a quarter of it (at least 3) for bayes."""
    grid_max: int = 8
    """auto uses grid up to this many points in a step's space."""
    stages: list[int] = field(default_factory=lambda: [1, 2, 3])
    """ZeRO stages step 2 tries."""
    micro_batch_sizes: list[int] = field(default_factory=list)
    """Micro-batch sizes step 2 tries, each dividing C (workload.samples_per_step); empty: every divisor."""
    checkpointing: list[str] = field(default_factory=list)
    """Activation-checkpointing choices step 2 also tries, each with every split and stage: none, full,
    selective, every_<n> (full, every n-th layer), selective_every_<n>; empty: the workload's own only."""
    compile: list[Compile] = field(default_factory=list)
    """workload.compile (none, torch, deepcompile) x kernels (eager, liger) choices step 2 also tries; what the
    platform or stage refuses (Liger off GPUs, DeepCompile under ZeRO-0) is left out; empty: the workload's own."""
    kernels: list[Kernels] = field(default_factory=list)
    nccl_space: dict[str, list[str]] = field(default_factory=_default_nccl_space)
    """Step 1: the values tried per NCCL variable (the cartesian product; each checked like nccl_env)."""
    bucket_sizes: list[int] = field(default_factory=list)
    """Step 3: reduce/allgather bucket sizes in elements; empty: 1/64, 1/16 and 1/4 of the model's
    parameters (clipped to 1e5..1e9)."""
    prefetch_bucket_sizes: list[int] = field(default_factory=list)
    """Step 3 under ZeRO-3: stage3_prefetch_bucket_size values; empty: the bucket sizes."""
    skip_predicted_oom: bool = True
    """Do not run configurations the performance model predicts to run out of memory."""
    loss_tolerance: Optional[float] = None
    """Loss parity: the largest relative difference allowed between a trial's and the default
    configuration's loss at any of the first steps (same seed, same data). None: 1e-3 for fp32
    workloads, 3e-2 for bf16/fp16."""
    seed: int = 0
    """Seed of the Bayesian sampler."""
    install_preset: bool = True
    """Also write the best configuration as conf/suite/tuned-<platform>-<workload>.yaml (for make bench)."""
    collective_iters: int = 10
    """Timed iterations per size of step 1's all-reduce sweeps."""
    confirm_repeats: int = 3
    """After the search, the winner and the default configuration are re-measured this many times
    each, interleaved (default, winner, default, winner, ...); the winner is kept only when the 95%
    bootstrap interval of its gain over the default lies above zero (harness/tune/confirm.py)."""
