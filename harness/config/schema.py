"""The typed configuration tree: the dataclass schema Hydra composes into (harness/config/compose.py)
and validation checks (harness/config/validate.py). Each field's docstring sits under it (torchtitan
style)."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING

from .choices import (Attention, CheckpointPolicy, CollectiveDtype, CollectiveOp, CollectiveRedop,
                      CollectiveSource, Compile, CompileCache, CompileMode, ContainerRuntime, DataSource, Device,
                      Fabric, Fp8Recipe, GradientCollective, Kernels, LauncherKind, OptimizerImpl, Precision, RunKind)
from .tune_schema import TuneConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
GROUPS = ("platform", "workload", "zero", "collective", "suite")


@dataclass
class ContainerConfig:
    """The image every rank runs in. Recorded in the fingerprint with its digest."""
    runtime: ContainerRuntime = ContainerRuntime.none
    """none: the host's Python (the venv); apptainer: `apptainer exec --nv`; docker or podman:
    `run --gpus all --ipc=host --network=host`
    (the host's IPC namespace: the ranks of a node share its /dev/shm, as DeepSpeed's shared-memory
    collectives need, and its size, not the engine's 64 MB default)."""
    image: Optional[str] = None
    """Apptainer: a .sif path (or docker://... URI); docker/podman: an image reference."""
    binds: list[str] = field(default_factory=list)
    """Extra host paths to mount (`src[:dst]`); the repository and the output folder always are."""
    python: str = "python"
    """The interpreter inside the image."""
    options: list[str] = field(default_factory=list)
    """More arguments for `apptainer exec` / `docker run`, placed before the image."""


@dataclass
class SlurmConfig:
    """Where and how runs are submitted when platform.launcher=slurm (sbatch, srun + torchrun)."""
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    time_limit: Optional[str] = None
    """Slurm --time (e.g. 00:30:00). None: measure.timeout_s plus `startup_s`, in whole minutes."""
    startup_s: float = 300.0
    """Allowance for image start and rendezvous, added to measure.timeout_s in the job's --time."""
    constraint: Optional[str] = None
    exclusive: bool = False
    """--exclusive: whole nodes (no other job shares them)."""
    cpus_per_task: Optional[int] = None
    """CPUs for each node's task (torchrun and its ranks). None: on cpu platforms one per rank,
    on GPU platforms Slurm's default (whole nodes with exclusive)."""
    extra_args: list[str] = field(default_factory=list)
    """More #SBATCH options, each `--name[=value]`, e.g. --reservation=bench."""
    array_parallelism: Optional[int] = None
    """At most this many tasks of a sweep's job array at once (--array=...%N); None: no limit."""
    rdzv_port: int = 29500
    """torchrun's c10d rendezvous port on the job's first node (offset by the job id modulo 1000)."""
    poll_s: float = 2.0
    """How often the harness asks Slurm about its jobs."""
    queue_limit_s: Optional[float] = None
    """A job still pending this long while the harness waits (an array: with none of its tasks
    running) is cancelled and recorded as an error naming this limit and Slurm's pending reason.
    None: wait as long as it takes."""
    client_prefix: list[str] = field(default_factory=list)
    """The command the Slurm clients (sbatch, squeue, scontrol, scancel) run through when this host
    cannot reach slurmctld itself, e.g. [ssh, login01] or, for the emulated cluster,
    [python3, -m, testbed, exec, --name, default, --]. Empty: run them here."""


@dataclass
class PlatformConfig:
    name: str = MISSING
    """Platform name, `<fabric>-<gpu>` (roce-h100) or a single-node name (h200, cpu)."""
    description: str = ""
    """Free text: the system this platform stands for."""
    device: Device = Device.cuda
    """Where ranks compute: cuda (nccl backend) or cpu (gloo backend)."""
    gpus_per_node: int = MISSING
    """Ranks per node (GPUs per node; on the cpu platform, processes)."""
    nodes: int = 1
    """Number of nodes a run uses."""
    gpu_model: str = MISSING
    """Accelerator model as declared (never detected), e.g. A100-SXM4-80GB."""
    peak_tflops: dict[str, float] = field(default_factory=dict)
    """Declared peak dense TFLOP/s per device, keyed by dtype (fp32, bf16, fp16...). MFU uses it."""
    mem_per_device_gib: float = MISSING
    """Memory per device in GiB."""
    hbm_gbps: float = 0.0
    """Declared device-memory bandwidth per device, GB/s, as the datasheet states it (H100 SXM 3,350).
    The performance model's roofline takes params.hbm_fraction of it; 0: its own table by gpu_model
    (harness/model/params.py hbm_gbps), or no roofline for a GPU it does not know."""
    fabric: Fabric = Fabric.none
    """Inter-node fabric: ib, roce, tcp, or none (single node)."""
    intra_node_bw_gbps: float = 0.0
    """Intra-node link bandwidth per device and per direction, GB/s (1e9 bytes/s, as nccl-tests'
    busbw; NVIDIA quotes NVLink as the bidirectional total: halve it)."""
    inter_node_bw_gbps: float = 0.0
    """Inter-node bandwidth per node and per direction, GB/s (1e9 bytes/s): the NICs' line rate
    summed (8 x 200 Gb/s = 200 GB/s)."""
    rails: int = 0
    """NICs (rails) per node; 0: one per GPU, rail-aligned (a DGX). The node's NICs together are
    inter_node_bw_gbps; the rails set NCCL's channels in the performance model (2 per rail)."""
    nccl_env: dict[str, str] = field(default_factory=dict)
    """Default NCCL_* environment for every rank."""
    cpu_threads: int = 1
    """OMP_NUM_THREADS of each rank on a cpu platform (its ranks share the host's cores)."""
    host_threads: Optional[int] = None
    """CPU threads of each rank on a GPU platform: torch's intra-op pool, which DeepSpeedCPUAdam and the
    host's fp32 -> bf16 cast share under ZeRO-3's optimizer offload (benchmarks/training/train.py
    rank_threads; the performance model's offload time uses it). None: the rank's share of the cores it
    may run on (usable // ranks on the node: 16 on a one-GPU 16-core node, 14 on a DGX H100). Set it where
    that share is wrong: a job given fewer cores than its affinity shows, or cores kept for data loading."""
    shared_host: bool = False
    """Every node runs on this one machine (the emulated cluster, testbed/): all ranks of every node
    share its cores, so the performance model slows a rank's computation by ranks x cpu_threads /
    cores where that exceeds 1 (harness/model/calibration.py)."""
    launcher: LauncherKind = LauncherKind.local
    """How ranks are started: local processes (one node), or Slurm jobs (sbatch; srun + torchrun)."""
    container: ContainerConfig = field(default_factory=ContainerConfig)
    """The image the ranks run in (runtime none: the host's environment)."""
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    """Partition, account, QoS, time limit... used when launcher=slurm."""

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def dist_backend(self) -> str:
        return "gloo" if self.device == Device.cpu else "nccl"


@dataclass
class TeacherConfig:
    """The frozen teacher of a distillation workload. Shape fields left None are the student's."""
    checkpoint: Optional[str] = None
    """Local weights: a Hugging Face folder (config.json + *.safetensors) or one .safetensors file.
    None: random initialisation. Never downloaded; checked against the shape before launch."""
    precision: Precision = Precision.bf16
    """Teacher dtype: a replica per rank under ZeRO 0-2, sharded by ZeRO-3 under stage 3."""
    hidden_size: Optional[int] = None
    intermediate_size: Optional[int] = None
    num_layers: Optional[int] = None
    num_heads: Optional[int] = None
    num_kv_heads: Optional[int] = None
    tie_embeddings: Optional[bool] = None
    rope_theta: Optional[float] = None
    rms_norm_eps: Optional[float] = None


TEACHER_SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                        "tie_embeddings", "rope_theta", "rms_norm_eps")


@dataclass
class DistillConfig:
    """Knowledge distillation: loss = (1 - alpha) x CE + alpha x T^2 x KL(teacher || student),
    averaged over the valid (label != -100) tokens; the teacher runs in eval mode, no gradients."""
    alpha: float = 0.5
    """Weight of the distillation term, in [0, 1]."""
    temperature: float = 2.0
    """Softmax temperature T of both distributions in the KL term (> 0)."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)


@dataclass
class WorkloadConfig:
    name: str = MISSING
    """Workload name, `<model>-<size>[-kd]`."""
    vocab_size: int = MISSING
    hidden_size: int = MISSING
    intermediate_size: int = MISSING
    """SwiGLU feed-forward width."""
    num_layers: int = MISSING
    num_heads: int = MISSING
    num_kv_heads: int = MISSING
    """Key/value heads (grouped-query attention when below num_heads)."""
    tie_embeddings: bool = False
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    seq_len: int = MISSING
    """Tokens per sample."""
    precision: Precision = Precision.bf16
    samples_per_step: int = MISSING
    """C = micro_batch_size x grad_acc_steps: samples per data-parallel rank per optimizer step."""
    micro_batch_size: int = MISSING
    """Samples per rank per forward/backward micro-step."""
    grad_acc_steps: int = 0
    """Micro-steps per optimizer step; 0 derives it as samples_per_step / micro_batch_size."""
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    optimizer: OptimizerImpl = OptimizerImpl.torch
    """AdamW from torch (client optimizer, fused on CUDA) or DeepSpeed's own (JIT-compiled)."""
    activation_checkpointing: bool = False
    checkpoint_every_n_layers: int = 1
    """With activation_checkpointing: checkpoint decoder layer i where i % n == 0, ceil(L / n) of the L
    layers (transformers' activation_checkpointing_enable(every_n_layers=n); torchtitan's layer-level
    selective AC, YaFSDP's num-ckpt-layers); the others keep their activations. 1: every layer."""
    checkpoint_policy: CheckpointPolicy = CheckpointPolicy.full
    """What a checkpointed layer keeps: full (its input; everything recomputed) or selective
    (torchtitan's op-level policy: attention's and every other matmul's outputs)."""
    grad_accum_dtype: Optional[Precision] = None
    """The dtype gradients accumulate in over the micro-steps (DeepSpeed's data_types.grad_accum_dtype,
    always written into the generated JSON). None: see `grad_accum_precision` (fp32 under ZeRO-2/3
    in bf16/fp16; the model's dtype under ZeRO-0/1, where DeepSpeed has no fp32 path of the same
    optimiser)."""
    distill: Optional[DistillConfig] = None
    """Set for the `-kd` workloads: a frozen teacher and the distillation loss."""
    compile: Compile = Compile.none
    """none (eager, the paper's stack), torch (DeepSpeed's engine.compile: torch.compile with
    Inductor, every ZeRO stage) or deepcompile (DeepSpeed's DeepCompile, ZeRO 1-3 on CUDA).
    Compilation happens in the warm-up, which grows until a step compiles nothing new
    (measure.compile_warmup_max); its seconds, recompilations and graph breaks are recorded."""
    compile_mode: CompileMode = CompileMode["default"]
    """torch.compile's mode: default, reduce-overhead (CUDA graphs), max-autotune,
    max-autotune-no-cudagraphs. Only with compile set."""
    kernels: Kernels = Kernels.eager
    """eager (transformers' modules) or liger (Liger Kernel's RMSNorm, RoPE, SwiGLU and fused linear
    cross-entropy; a GPU only)."""
    attention: Attention = Attention.auto
    """The SDPA backend: auto (PyTorch's choice), flash, efficient, cudnn or math. The record holds
    the one that ran (environment.stack.attention_used)."""
    fp8_recipe: Fp8Recipe = Fp8Recipe.tensorwise
    """With precision fp8: torchao's float8 scaling recipe, tensorwise or rowwise."""


@dataclass
class ZeroConfig:
    stage: int = MISSING
    """ZeRO stage 0-3."""
    overlap_comm: Optional[bool] = None
    """None leaves DeepSpeed's default (false for 1/2, true for 3). Fields set to None are not emitted."""
    reduce_scatter: Optional[bool] = None
    """DeepSpeed's flag; note it does not issue a reduce-scatter collective for ZeRO-1/2."""
    gradient_collective: GradientCollective = GradientCollective.all_reduce
    """The suite's option for ZeRO-1/2 gradient reduction: all_reduce is DeepSpeed's own path (an
    all-reduce of each bucket, whatever `reduce_scatter` says); reduce_scatter replaces it at run time
    with real reduce-scatters (benchmarks/reduce_scatter/install.py; verified DeepSpeed versions only):
    under ZeRO-1, equal windows of every rank's partition at the accumulation boundary ((N-1)/N of
    the gradient bytes per rank); under ZeRO-2, one per bucket, padded to N x the bucket's largest
    rank share. ZeRO-3 always reduce-scatters."""
    contiguous_gradients: Optional[bool] = None
    reduce_bucket_size: Optional[int] = None
    """Elements per gradient bucket."""
    allgather_bucket_size: Optional[int] = None
    """Elements per parameter all-gather bucket (ZeRO-1/2)."""
    stage3_prefetch_bucket_size: Optional[int] = None
    stage3_param_persistence_threshold: Optional[int] = None
    """Parameters smaller than this stay resident under ZeRO-3 (never all-gathered)."""
    stage3_max_live_parameters: Optional[int] = None
    stage3_max_reuse_distance: Optional[int] = None
    """Parameters reused within this many elements are not released between forward and backward."""


@dataclass
class CollectiveConfig:
    name: str = MISSING
    ops: list[CollectiveOp] = field(
        default_factory=lambda: [CollectiveOp.all_reduce, CollectiveOp.all_gather, CollectiveOp.reduce_scatter])
    """Collectives to sweep: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, sendrecv."""
    min_bytes: int = 1024
    """Smallest message (nccl-tests -b), bytes of the full buffer."""
    max_bytes: int = 1 << 20
    """Largest message (nccl-tests -e)."""
    step_factor: float = 2.0
    """Size multiplier between rows (nccl-tests -f); used when step_bytes is 0."""
    step_bytes: int = 0
    """Fixed size increment (nccl-tests -i); 0 uses step_factor."""
    warmup_iters: int = 5
    """Untimed iterations per size (nccl-tests -w)."""
    iters: int = 20
    """Timed iterations per size (nccl-tests -n); time = slowest rank's average."""
    small_iters: int = 0
    """Timed iterations per size up to 64 KiB (harness/collectives.py SMALL_BYTES, the latency-bound sizes); 0:
    iters. Where each call blocks (gloo on cpu), each is timed too and their median kept beside the average
    (median_us; small_median_us): a small call's time there is heavy-tailed, its median needs tens of calls."""
    bind_ranks: bool = False
    """On cpu, bind each rank's threads (its own and gloo's) to its own equal share of the CPUs it may use, the ranks
    that share a kernel splitting them in order (2 ranks on 2 CPUs: one each); none where there are fewer CPUs than
    ranks. No effect on a GPU. Unbound, gloo's event loop thread of one rank spins while a worker it waits for sits
    behind it on the same CPU until the scheduler's tick, and the ranks' threads land on the CPUs differently from
    one sweep to the next: on the 2-core Zen 5 box bound, the small calls unheld are 2-3x faster and the small sizes'
    median no longer flips to the held-up mode (docs/collectives.md). Part of a sweep's reference key where the ranks
    were bound (environment.rank_cpus): an unbound sweep's references judge no bound sweep. cpu-short sets it."""
    dtype: CollectiveDtype = CollectiveDtype.float32
    """float32, float16, bfloat16, float64, int32, int64, int8, uint8 (nccl-tests -d)."""
    redop: CollectiveRedop = CollectiveRedop.sum
    """sum, prod, max, min, avg (nccl-tests -o); avg needs NCCL."""
    root: int = 0
    """Root rank of broadcast and reduce."""
    check: bool = True
    """Check every size's result (the #wrong columns; nccl-tests -c)."""
    in_place: bool = True
    """Also measure in-place where the op allows it."""
    source: CollectiveSource = CollectiveSource.builtin
    """builtin: torch.distributed sweep (gloo on CPU, nccl on GPU); nccl-tests: the real binaries."""
    nccl_tests_dir: Optional[str] = None
    """Folder of the nccl-tests binaries (all_reduce_perf ...); None looks on PATH."""


@dataclass
class DataConfig:
    source: DataSource = DataSource.synthetic
    """synthetic: seeded random tokens; corpus: a local text/JSON corpus through `datasets`."""
    corpus_path: Optional[str] = None
    """Local file(s) (.txt, .json, .jsonl, .parquet) when source=corpus."""
    tokenizer_path: Optional[str] = None
    """Local tokenizer.json (Hugging Face tokenizers format) when source=corpus."""
    text_field: str = "text"
    """Column holding the text in JSON/parquet corpora."""


@dataclass
class MeasureConfig:
    warmup_steps: int = 2
    """Optimizer steps run first and excluded from every figure."""
    steps: int = 5
    """Measured optimizer steps in throughput mode (no per-op instrumentation)."""
    profile_steps: int = 2
    """Optimizer steps measured in profile mode (each collective serialised and timed)."""
    timeout_s: float = 900.0
    """Wall-clock limit of one run, launch to exit; past it the run is killed and recorded as timeout."""
    seed: int = 1234
    compile_warmup_max: int = 4
    """With workload.compile: warm-up steps added, at most, past warmup_steps while the last one still
    compiled something (a first compile, a recompilation); the measured steps start after the first
    warm-up step that compiled nothing, so no figure holds compile time."""
    compile_cache: CompileCache = CompileCache.cold
    """With workload.compile: cold (the run's ranks compile into empty Inductor and Triton caches in the run
    folder, shared, removed after the launch) or warm (the caches as they are: a repeat loads its graphs).
    compile_s depends on it: llama-tiny ZeRO-1 on 2 cores compiled in 23.6 s cold, 3.7 s warm; the record
    holds the caches' hits and misses (environment.stack.compile_watch.cache)."""
    inject_delay_s: float = 0.0
    """Sleep added to every micro-step: a deliberate slowdown to check that regression detection
    (compare, nightly) catches it. 0 in every real run."""
    inject_delay_rank: Optional[int] = None
    """With inject_delay_s: only this rank sleeps (a straggler the others wait for, which the record's arrivals
    name: benchmarks/training/arrivals.py); unset: every rank."""
    inject_delay_node: Optional[int] = None
    """With inject_delay_s: only the ranks of this node sleep, the node-th block of platform.gpus_per_node ranks
    (torchrun starts a node's ranks as one block; the record names the host it landed on): a slow node, whose
    ranks come late together. Not with inject_delay_rank."""


@dataclass
class SuiteRun:
    name: str = MISSING
    """Run name within the suite (part of the run id)."""
    kind: RunKind = RunKind.training
    """training: the workload under DeepSpeed; collective: the `collective` group's sweep."""
    overrides: list[str] = field(default_factory=list)
    """Hydra overrides applied on top of the command line's for this run."""


@dataclass
class SuiteConfig:
    name: str = MISSING
    description: str = ""
    runs: list[SuiteRun] = field(default_factory=list)
    """The runs one `bench` makes, in order. Empty: one run of the composed config."""


@dataclass
class BenchConfig:
    platform: PlatformConfig = MISSING
    workload: WorkloadConfig = MISSING
    zero: ZeroConfig = MISSING
    collective: CollectiveConfig = MISSING
    suite: SuiteConfig = MISSING
    only: list[str] = field(default_factory=list)
    """Which of the suite's runs a bench makes, by name (only=[z1-mb4-ga2,z2-mb4-ga2]); empty: every
    run. Each keeps the run id it has in the whole suite, so the records of a part are the whole's."""
    kind: RunKind = RunKind.training
    """What a run of the composed config is (a suite run's kind sets it)."""
    nccl_env: dict[str, str] = field(default_factory=dict)
    """NCCL variables for this run, over the platform's nccl_env; checked against harness/config/nccl_env.py."""
    data: DataConfig = field(default_factory=DataConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    """Settings of the `tune` command (ignored by bench)."""
    deepspeed_config: Optional[str] = None
    """Path to a user DeepSpeed JSON merged over the generated one (conflicts are errors)."""
    out: Optional[str] = None
    """Output folder; default results/<timestamp>-<platform>."""
    history: str = "auto"
    """Where bench keeps its runs by machine, the baseline of a machine with no reference of its own:
    auto (history.sqlite beside the output folder: results/history.sqlite by default), an
    SQLAlchemy URL, or none."""
    confirm_regressions: int = 2
    """Runs more of each run whose first records read a regression (against reference_results/ or this
    machine's baseline), after the suite's other runs; its verdicts are then those of all its runs (their
    median). 0: a regression of one run is reported as read. Only `bench` (and gpu-check) run them: the nightly
    repeats every run, tune confirms its winner (harness/verdict/confirmation.py)."""


def delayed_ranks(cfg: "BenchConfig") -> Optional[list[int]]:
    """The ranks measure.inject_delay_s slows: the one of inject_delay_rank, the block of inject_delay_node's, or
    None for every rank."""
    m, per = cfg.measure, cfg.platform.gpus_per_node
    if m.inject_delay_rank is not None:
        return [m.inject_delay_rank]
    if m.inject_delay_node is not None:
        return list(range(m.inject_delay_node * per, (m.inject_delay_node + 1) * per))
    return None


def grad_accum_precision(precision: Precision, stage: int, explicit: Optional[Precision] = None) -> Precision:
    """The dtype gradients accumulate in. An explicit choice wins. Unset: fp32 under ZeRO-2/3 with a
    bf16/fp16 model (DeepSpeed keeps fp32 gradient partitions, same optimiser, same bf16
    communication); the model's dtype under ZeRO-0 (DeepSpeed 0.19.8 cannot accumulate in fp32
    without ZeRO: NotImplementedError) and ZeRO-1 (an fp32 accumulation there replaces DeepSpeed's
    ZeRO-1 optimiser by its BF16_Optimizer: full fp32 gradients on every rank and an fp32
    all-reduce, another workload; ask for it with workload.grad_accum_dtype=fp32)."""
    if explicit is not None:
        return Precision(explicit)
    if precision == Precision.fp8:   # bf16 weights and gradients; only the linear layers' matmuls run in FP8
        precision = Precision.bf16
    if precision != Precision.fp32 and stage in (2, 3):
        return Precision.fp32
    return precision


def to_dict(cfg: Any) -> Any:
    """A JSON-able dict of a config dataclass (enums as their values)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=_enum_value))


def _enum_value(obj: Any) -> Any:
    if isinstance(obj, Enum):
        return obj.value
    raise TypeError(f"not JSON serialisable: {obj!r}")
