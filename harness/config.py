"""The typed configuration tree: dataclass schema, Hydra composition, validation.

This is the only module that touches Hydra/OmegaConf. Everything downstream receives a
validated ``BenchConfig``. Each field's docstring sits under it (torchtitan style); every check
names the field, the bad value and what would be valid, and runs before anything launches.
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import warnings
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING

from .errors import ConfigError
from .nccl_env import normalise_nccl_env, validate_nccl_env

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"
GROUPS = ("platform", "workload", "zero", "collective", "suite")


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


@dataclass
class ContainerConfig:
    """The image every rank runs in. Recorded in the fingerprint with its digest."""
    runtime: ContainerRuntime = ContainerRuntime.none
    """none: the host's Python (the venv); apptainer: `apptainer exec --nv`; docker or podman:
    `run --gpus all --ipc=host --network=host --shm-size=...`."""
    image: Optional[str] = None
    """Apptainer: a .sif path (or docker://... URI); docker/podman: an image reference."""
    binds: list[str] = field(default_factory=list)
    """Extra host paths to mount (`src[:dst]`); the repository and the output folder always are."""
    shm_size: str = "16g"
    """/dev/shm of docker/podman containers (their 64 MB default is smaller than DeepSpeed's
    shared-memory buffer)."""
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
    fabric: Fabric = Fabric.none
    """Inter-node fabric: ib, roce, tcp, or none (single node)."""
    intra_node_bw_gbps: float = 0.0
    """Intra-node link bandwidth per device and per direction, GB/s (1e9 bytes/s, as nccl-tests'
    busbw; NVIDIA quotes NVLink as the bidirectional total: halve it)."""
    inter_node_bw_gbps: float = 0.0
    """Inter-node bandwidth per node and per direction, GB/s (1e9 bytes/s): the NICs' line rate
    summed (8 x 200 Gb/s = 200 GB/s)."""
    nccl_env: dict[str, str] = field(default_factory=dict)
    """Default NCCL_* environment for every rank."""
    cpu_threads: int = 1
    """OMP_NUM_THREADS of each rank on a cpu platform (its ranks share the host's cores)."""
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
    grad_accum_dtype: Optional[Precision] = None
    """The dtype gradients accumulate in over the micro-steps (DeepSpeed's data_types.grad_accum_dtype,
    always written into the generated JSON). None: see `grad_accum_precision` (fp32 under ZeRO-2/3
    in bf16/fp16; the model's dtype under ZeRO-0/1, where DeepSpeed has no fp32 path of the same
    optimiser)."""
    distill: Optional[DistillConfig] = None
    """Set for the `-kd` workloads: a frozen teacher and the distillation loss."""


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
    with real reduce-scatters (benchmarks/reduce_scatter.py; verified DeepSpeed versions only):
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
    ops: list[str] = field(default_factory=lambda: ["all_reduce", "all_gather", "reduce_scatter"])
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
    dtype: str = "float32"
    """float32, float16, bfloat16, float64, int32, int64, int8, uint8 (nccl-tests -d)."""
    redop: str = "sum"
    """sum, prod, max, min, avg (nccl-tests -o); avg needs NCCL."""
    root: int = 0
    """Root rank of broadcast and reduce."""
    check: bool = True
    """Check every size's result (the #wrong columns; nccl-tests -c)."""
    in_place: bool = True
    """Also measure in-place where the op allows it."""
    source: str = "builtin"
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
    inject_delay_s: float = 0.0
    """Sleep added to every micro-step: a deliberate slowdown to check that regression detection
    (compare, nightly) catches it. 0 in every real run."""


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


@dataclass
class BenchConfig:
    platform: PlatformConfig = MISSING
    workload: WorkloadConfig = MISSING
    zero: ZeroConfig = MISSING
    collective: CollectiveConfig = MISSING
    suite: SuiteConfig = MISSING
    kind: RunKind = RunKind.training
    """What a run of the composed config is (a suite run's kind sets it)."""
    nccl_env: dict[str, str] = field(default_factory=dict)
    """NCCL variables for this run, over the platform's nccl_env; checked against harness/nccl_env.py."""
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


def register_configs() -> None:
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="bench_schema", node=BenchConfig)
    cs.store(group="platform", name="platform_schema", node=PlatformConfig)
    cs.store(group="workload", name="workload_schema", node=WorkloadConfig)
    cs.store(group="zero", name="zero_schema", node=ZeroConfig)
    cs.store(group="collective", name="collective_schema", node=CollectiveConfig)
    cs.store(group="suite", name="suite_schema", node=SuiteConfig)


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def compose(overrides: list[str]) -> BenchConfig:
    """Compose conf/ with Hydra overrides and return a validated BenchConfig."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            node = hydra_compose(config_name="config", overrides=list(overrides))
        obj = OmegaConf.to_object(node)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(_hydra_message(exc, overrides)) from None
    finally:
        GlobalHydra.instance().clear()
    assert isinstance(obj, BenchConfig)
    validate(obj)
    return obj


def _hydra_message(exc: Exception, overrides: list[str]) -> str:
    msg = str(exc).strip()
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause).strip() and str(cause).strip() not in msg:
        msg += "\n  " + str(cause).strip().splitlines()[0]
    msg = msg.split("\nConfig search path:")[0]
    for group in GROUPS:
        if f"'{group}'" in msg or f"{group}/" in msg:
            msg += f"\n  valid {group} options: {', '.join(group_options(group))}"
            break
    return f"invalid configuration ({' '.join(overrides) or 'no overrides'}):\n  {msg}"


def _check(ok: bool, field_name: str, value: Any, valid: str) -> None:
    if not ok:
        raise ConfigError(f"{field_name}={value!r} is invalid: {valid}")


def grad_accum_precision(precision: Precision, stage: int, explicit: Optional[Precision] = None) -> Precision:
    """The dtype gradients accumulate in. An explicit choice wins. Unset: fp32 under ZeRO-2/3 with a
    bf16/fp16 model (DeepSpeed keeps fp32 gradient partitions, same optimiser, same bf16
    communication); the model's dtype under ZeRO-0 (DeepSpeed 0.19.8 cannot accumulate in fp32
    without ZeRO: NotImplementedError) and ZeRO-1 (an fp32 accumulation there replaces DeepSpeed's
    ZeRO-1 optimiser by its BF16_Optimizer: full fp32 gradients on every rank and an fp32
    all-reduce, another workload; ask for it with workload.grad_accum_dtype=fp32)."""
    if explicit is not None:
        return Precision(explicit)
    if precision != Precision.fp32 and stage in (2, 3):
        return Precision.fp32
    return precision


def validate_grad_accum(w: WorkloadConfig, z: ZeroConfig) -> None:
    if w.grad_accum_dtype is None:
        return
    a, field_name = Precision(w.grad_accum_dtype), "workload.grad_accum_dtype"
    _check(a in (Precision.fp32, w.precision), field_name, a.value,
           f"DeepSpeed accumulates a {w.precision.value} model's gradients in "
           + " or ".join(sorted({"fp32", w.precision.value})))
    _check(a == w.precision or z.stage != 0, field_name, a.value,
           f"DeepSpeed 0.19.8 has no fp32 accumulation of a {w.precision.value} model without ZeRO "
           "(NotImplementedError); use zero.stage >= 1 or leave it unset")
    _check(not (a != w.precision and z.stage == 1 and z.gradient_collective == GradientCollective.reduce_scatter),
           field_name, a.value, "fp32 accumulation under ZeRO-1 runs DeepSpeed's BF16_Optimizer, which "
           "zero.gradient_collective=reduce_scatter cannot replace; use all_reduce or leave it unset")


def validate(cfg: BenchConfig) -> None:
    """Check every cross-field rule; fill derived fields (grad_acc_steps). Raises ConfigError."""
    p, w, z, m, d = cfg.platform, cfg.workload, cfg.zero, cfg.measure, cfg.data
    _check(p.gpus_per_node >= 1, "platform.gpus_per_node", p.gpus_per_node, "must be >= 1")
    _check(p.nodes >= 1, "platform.nodes", p.nodes, "must be >= 1")
    _check(1 <= p.cpu_threads <= 1024, "platform.cpu_threads", p.cpu_threads, "threads per rank in [1, 1024]")
    _check(p.mem_per_device_gib > 0, "platform.mem_per_device_gib", p.mem_per_device_gib, "must be > 0")
    if p.device == Device.cpu:
        _check(w.precision != Precision.fp16, "workload.precision", "fp16",
               "fp16 needs a GPU; use fp32 or bf16 on the cpu device")
    dtype = w.precision.value
    _check(p.peak_tflops.get(dtype, 0) > 0, "platform.peak_tflops", dict(p.peak_tflops),
           f"needs a positive entry for the workload's precision '{dtype}' (MFU is never guessed)")
    p.nccl_env = normalise_nccl_env(p.nccl_env, field="platform.nccl_env")
    validate_nccl_env(p.nccl_env, "platform.nccl_env")
    cfg.nccl_env = normalise_nccl_env(cfg.nccl_env, field="nccl_env")
    validate_nccl_env(cfg.nccl_env, "nccl_env")
    validate_nccl_env({**p.nccl_env, **cfg.nccl_env}, "nccl_env (over platform.nccl_env)")
    if p.device == Device.cpu and cfg.nccl_env:
        warnings.warn(f"nccl_env {sorted(cfg.nccl_env)} has no effect on the cpu platform (gloo); "
                      "it is recorded only", stacklevel=2)
    _check(p.launcher != LauncherKind.local or p.nodes == 1, "platform.nodes", p.nodes,
           "the local launcher runs one node; use nodes=1 or platform.launcher=slurm")
    validate_container(p.container)
    validate_slurm(p.slurm)

    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "seq_len", "samples_per_step", "micro_batch_size"):
        _check(getattr(w, name) >= 1, f"workload.{name}", getattr(w, name), "must be >= 1")
    _check(w.hidden_size % w.num_heads == 0, "workload.num_heads", w.num_heads,
           f"must divide hidden_size={w.hidden_size}")
    _check(w.num_heads % w.num_kv_heads == 0, "workload.num_kv_heads", w.num_kv_heads,
           f"must divide num_heads={w.num_heads}")
    _check(w.samples_per_step % w.micro_batch_size == 0, "workload.micro_batch_size",
           w.micro_batch_size, f"must divide samples_per_step (C) = {w.samples_per_step}; valid: "
           f"{[b for b in range(1, w.samples_per_step + 1) if w.samples_per_step % b == 0]}")
    derived = w.samples_per_step // w.micro_batch_size
    if w.grad_acc_steps == 0:
        w.grad_acc_steps = derived
    _check(w.grad_acc_steps == derived, "workload.grad_acc_steps", w.grad_acc_steps,
           f"micro_batch_size x grad_acc_steps must equal samples_per_step (C) = "
           f"{w.samples_per_step}; with micro_batch_size={w.micro_batch_size} it must be {derived}")
    for name in ("lr", "eps"):
        _check(getattr(w, name) > 0, f"workload.{name}", getattr(w, name), "must be > 0")
    _check(all(0 <= b < 1 for b in w.betas), "workload.betas", list(w.betas), "each in [0, 1)")
    _check(w.weight_decay >= 0, "workload.weight_decay", w.weight_decay, "must be >= 0")
    _check(w.grad_clip >= 0, "workload.grad_clip", w.grad_clip, "must be >= 0 (0 disables)")
    _check(w.name.endswith("-kd") == (w.distill is not None), "workload.name", w.name,
           "a distillation workload (workload.distill set) is named <model>-<size>-kd, and only it")
    if w.distill is not None:
        validate_distill(w, p)

    _check(z.stage in (0, 1, 2, 3), "zero.stage", z.stage, "valid stages: 0, 1, 2, 3")
    if z.gradient_collective == GradientCollective.reduce_scatter:
        _check(z.stage in (1, 2), "zero.gradient_collective", z.gradient_collective.value,
               f"reduce_scatter replaces the ZeRO-1/2 gradient all-reduce; zero.stage={z.stage} "
               f"{'has no partitioned gradients' if z.stage == 0 else 'already reduce-scatters'}; "
               "use all_reduce")
    validate_grad_accum(w, z)
    for name in ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                 "stage3_max_live_parameters"):
        v = getattr(z, name)
        _check(v is None or v >= 1, f"zero.{name}", v, "must be >= 1 elements (or unset)")
    for name in ("stage3_param_persistence_threshold", "stage3_max_reuse_distance"):
        v = getattr(z, name)
        _check(v is None or v >= 0, f"zero.{name}", v, "must be >= 0 (or unset)")

    _check(m.warmup_steps >= 0, "measure.warmup_steps", m.warmup_steps, "must be >= 0")
    _check(m.steps >= 1, "measure.steps", m.steps, "must be >= 1")
    _check(m.profile_steps >= 0, "measure.profile_steps", m.profile_steps, "must be >= 0")
    _check(0 <= m.inject_delay_s < 60, "measure.inject_delay_s", m.inject_delay_s, "seconds in [0, 60)")
    if m.inject_delay_s:
        warnings.warn(f"measure.inject_delay_s={m.inject_delay_s}: every micro-step is slowed on purpose",
                      stacklevel=2)
    _check(math.isfinite(m.timeout_s) and m.timeout_s > 0, "measure.timeout_s", m.timeout_s,
           "must be a positive number of seconds")

    _check(cfg.history in ("auto", "none") or "://" in cfg.history, "history", cfg.history,
           "auto, none, or an SQLAlchemy URL (sqlite:///path/history.sqlite)")
    if d.source == DataSource.corpus:
        for name in ("corpus_path", "tokenizer_path"):
            path = getattr(d, name)
            _check(path is not None and Path(path).exists(), f"data.{name}", path,
                   "data.source=corpus needs an existing local file")
    if cfg.deepspeed_config is not None:
        _check(Path(cfg.deepspeed_config).is_file(), "deepspeed_config", cfg.deepspeed_config,
               "must be an existing DeepSpeed JSON file")
    validate_collective(cfg)
    validate_tune(cfg)
    names = [r.name for r in cfg.suite.runs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    _check(not dupes, "suite.runs", dupes, "run names must be unique within a suite")


def validate_tune(cfg: BenchConfig) -> None:
    t, c = cfg.tune, cfg.workload.samples_per_step
    _check(bool(t.steps) and set(t.steps) <= {1, 2, 3} and len(set(t.steps)) == len(t.steps),
           "tune.steps", list(t.steps), "a non-empty list of distinct steps from 1, 2, 3")
    _check(t.budget >= 0, "tune.budget", t.budget, "must be >= 0 (0: automatic)")
    _check(t.grid_max >= 1, "tune.grid_max", t.grid_max, "must be >= 1")
    _check(bool(t.stages) and set(t.stages) <= {0, 1, 2, 3}, "tune.stages", list(t.stages),
           "a non-empty list of ZeRO stages from 0, 1, 2, 3")
    bad = [b for b in t.micro_batch_sizes if b < 1 or c % b]
    _check(not bad, "tune.micro_batch_sizes", list(t.micro_batch_sizes),
           f"each must divide C = workload.samples_per_step = {c}; {bad} do not")
    for name in ("bucket_sizes", "prefetch_bucket_sizes"):
        values = getattr(t, name)
        _check(all(v >= 1 for v in values), f"tune.{name}", list(values), "elements, each >= 1")
    for var, values in t.nccl_space.items():
        _check(bool(values), f"tune.nccl_space.{var}", values, "a non-empty list of values")
        for v in values:
            validate_nccl_env(normalise_nccl_env({var: v}, field="tune.nccl_space"), "tune.nccl_space")
    _check(t.loss_tolerance is None or t.loss_tolerance > 0, "tune.loss_tolerance", t.loss_tolerance,
           "must be > 0 (or null: by precision)")
    _check(t.collective_iters >= 1, "tune.collective_iters", t.collective_iters, "must be >= 1")
    _check(t.confirm_repeats >= 2, "tune.confirm_repeats", t.confirm_repeats,
           "must be >= 2 (one sample a side cannot judge noise)")


SCRIPT_SAFE = re.compile(r"^[A-Za-z0-9_.,:@+%=/-]+$")
"""What a Slurm option value may hold: it goes into a batch script, so no spaces, quotes or newlines."""


def validate_container(c: ContainerConfig) -> None:
    if c.runtime == ContainerRuntime.none:
        _check(c.image is None, "platform.container.image", c.image,
               "set platform.container.runtime (apptainer, docker or podman) to run in an image")
        return
    _check(bool(c.image) and SCRIPT_SAFE.match(c.image) is not None, "platform.container.image", c.image,
           f"runtime {c.runtime.value} needs an image (a .sif path or an image reference, no spaces)")
    _check(re.fullmatch(r"[0-9]+[kmgKMG]?", c.shm_size) is not None, "platform.container.shm_size",
           c.shm_size, "a size such as 16g or 8192m")
    for b in c.binds:
        _check(bool(b) and SCRIPT_SAFE.match(b) is not None and b.split(":")[0].startswith("/"),
               "platform.container.binds", b, "absolute host paths `src[:dst]`, no spaces")


def validate_slurm(s: SlurmConfig) -> None:
    for name in ("partition", "account", "qos", "time_limit", "constraint"):
        v = getattr(s, name)
        _check(v is None or SCRIPT_SAFE.match(v) is not None, f"platform.slurm.{name}", v,
               "letters, digits and _.,:@+%=/- only (it goes into the batch script)")
    if s.time_limit is not None:
        _check(re.fullmatch(r"(\d+-)?\d+(:\d{1,2}){0,2}", s.time_limit) is not None,
               "platform.slurm.time_limit", s.time_limit, "Slurm's format: minutes, MM:SS, HH:MM:SS or D-HH:MM:SS")
    for a in s.extra_args:
        _check(a.startswith("--") and SCRIPT_SAFE.match(a) is not None, "platform.slurm.extra_args", a,
               "each an sbatch option `--name[=value]` with no spaces")
    _check(s.cpus_per_task is None or s.cpus_per_task >= 1, "platform.slurm.cpus_per_task", s.cpus_per_task,
           "must be >= 1 (or unset)")
    _check(s.array_parallelism is None or s.array_parallelism >= 1, "platform.slurm.array_parallelism",
           s.array_parallelism, "must be >= 1 (or unset: no limit)")
    _check(1024 <= s.rdzv_port <= 64535, "platform.slurm.rdzv_port", s.rdzv_port, "a port in 1024..64535")
    _check(s.startup_s >= 0, "platform.slurm.startup_s", s.startup_s, "must be >= 0")
    _check(s.poll_s > 0, "platform.slurm.poll_s", s.poll_s, "must be > 0")
    _check(s.queue_limit_s is None or s.queue_limit_s > 0, "platform.slurm.queue_limit_s", s.queue_limit_s,
           "must be > 0 seconds (or null: no limit)")
    for word in s.client_prefix:
        _check(bool(word) and "\n" not in word and "\0" not in word, "platform.slurm.client_prefix", word,
               "each a non-empty argument with no newline (an argv, never run through a shell)")


def validate_distill(w: WorkloadConfig, p: PlatformConfig) -> None:
    """The distillation settings and the teacher: its shape, and its checkpoint if one is named."""
    from .teacher import teacher_workload, validate_checkpoint

    d = w.distill
    assert d is not None
    _check(0 <= d.alpha <= 1, "workload.distill.alpha", d.alpha, "must be in [0, 1]")
    _check(math.isfinite(d.temperature) and d.temperature > 0, "workload.distill.temperature",
           d.temperature, "must be a positive number")
    if p.device == Device.cpu:
        _check(d.teacher.precision != Precision.fp16, "workload.distill.teacher.precision", "fp16",
               "fp16 needs a GPU; use bf16 or fp32 on the cpu device")
    t = teacher_workload(w)
    for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
        _check(getattr(t, name) >= 1, f"workload.distill.teacher.{name}", getattr(t, name), "must be >= 1")
    _check(t.hidden_size % t.num_heads == 0, "workload.distill.teacher.num_heads", t.num_heads,
           f"must divide the teacher's hidden_size={t.hidden_size}")
    _check(t.num_heads % t.num_kv_heads == 0, "workload.distill.teacher.num_kv_heads", t.num_kv_heads,
           f"must divide the teacher's num_heads={t.num_heads}")
    validate_checkpoint(d.teacher.checkpoint, t)


TORCH_DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8")
REDOPS = ("sum", "prod", "max", "min", "avg")
COLLECTIVE_SOURCES = ("builtin", "nccl-tests")


def validate_collective(cfg: BenchConfig) -> None:
    from .collectives import OPS

    c = cfg.collective
    unknown = [op for op in c.ops if op not in OPS]
    _check(not unknown and bool(c.ops), "collective.ops", list(c.ops), f"valid collectives: {', '.join(OPS)}")
    _check(c.min_bytes >= 1, "collective.min_bytes", c.min_bytes, "must be >= 1 byte")
    _check(c.min_bytes <= c.max_bytes, "collective.min_bytes", c.min_bytes,
           f"must not exceed collective.max_bytes={c.max_bytes}")
    _check(c.step_bytes >= 0, "collective.step_bytes", c.step_bytes, "must be >= 0 (0: use step_factor)")
    _check(c.step_bytes > 0 or c.step_factor > 1, "collective.step_factor", c.step_factor,
           "must be > 1 when step_bytes is 0")
    _check(c.iters >= 1, "collective.iters", c.iters, "must be >= 1")
    _check(c.warmup_iters >= 0, "collective.warmup_iters", c.warmup_iters, "must be >= 0")
    _check(c.dtype in TORCH_DTYPES, "collective.dtype", c.dtype, f"valid: {', '.join(TORCH_DTYPES)}")
    _check(c.redop in REDOPS, "collective.redop", c.redop, f"valid: {', '.join(REDOPS)}")
    _check(c.source in COLLECTIVE_SOURCES, "collective.source", c.source,
           f"valid: {', '.join(COLLECTIVE_SOURCES)}")
    _check(0 <= c.root < cfg.platform.world_size, "collective.root", c.root,
           f"must be a rank in 0..{cfg.platform.world_size - 1}")
    if cfg.kind == RunKind.collective:
        if cfg.platform.world_size == 1 and c.source == "builtin":  # a smoke run: no bus bandwidth
            _check(c.check, "collective.check", c.check,
                   "a one-rank collective sweep is a smoke run (no bus bandwidth can be measured): "
                   "its correctness check is what it measures; set collective.check=true")
            _check(cfg.platform.device != Device.cpu or "sendrecv" not in c.ops, "collective.ops",
                   list(c.ops), "gloo cannot send to its own rank: a one-rank sweep on the cpu device "
                   "cannot run sendrecv; drop it from collective.ops")
        if cfg.platform.device == Device.cpu:
            _check(c.redop != "avg", "collective.redop", "avg", "gloo has no avg; valid: sum, prod, max, min")
            _check(c.source == "builtin", "collective.source", c.source,
                   "nccl-tests needs GPUs; the cpu platform runs the builtin sweep")


def to_dict(cfg: Any) -> Any:
    """A JSON-able dict of a config dataclass (enums as their values)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=_enum_value))


def _enum_value(obj: Any) -> Any:
    if isinstance(obj, Enum):
        return obj.value
    raise TypeError(f"not JSON serialisable: {obj!r}")
