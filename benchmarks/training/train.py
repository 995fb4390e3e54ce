"""LLaMA pretraining benchmark under DeepSpeed ZeRO; runs on every rank.

    python -m benchmarks.training.train --run-dir RUN_DIR     (RANK, WORLD_SIZE, MASTER_* in the environment)

Reads RUN_DIR/spec.json, trains for warm-up + measured steps, writes events (see events.py).
Order of steps: warm-up (excluded from figures), throughput mode (nothing wrapped, device
synchronised only at optimizer-step boundaries), then profile mode (every collective serialised
and timed, see instrument.py). A failure is reported as an event with its status before exiting.
"""
from __future__ import annotations

import contextlib
import os
import resource
import socket
import sys
import time
from pathlib import Path
from typing import Iterator, NoReturn, Sequence

from contract import events as ev
from contract.spec import HOST_THREADS_VAR, SPEC_FILE, TrainSpec

from benchmarks.training import arrivals
from benchmarks.training.checkpoint_policy import selective_context
from benchmarks.node.environment import announce, first_on_kernel
from benchmarks.failure import run_rank
from benchmarks.training.instrument import CommTracer, MicrostepClock
from benchmarks.node.machine import LoadWindow, usable_cpus
from benchmarks.node.ops import preload
from benchmarks.node.probe import Pulses
from benchmarks.reduce_scatter.install import install
from benchmarks.training.stack import CompileWatch, attention_context, attention_probe, compile_engine, prepare_model


def synchronizer(device: str):
    import torch

    if device == "cuda":
        return torch.cuda.synchronize
    return lambda: None


CLEAR_REFS, PROC_STATUS = Path("/proc/self/clear_refs"), Path("/proc/self/status")


def reset_peak_mem(device: str) -> bool:
    """Start the peak-memory count afresh, once the model, optimizer and teacher are built: the
    run's peak is what training holds, not a build-time transient (ZeRO 0-2 models, and the
    teacher's replica, are built in fp32 and then cast: for 8B a 32 GB transient on the GPU).
    On the cpu device Linux resets the process's peak RSS (VmHWM) when '5' is written to
    /proc/self/clear_refs. False where the count cannot be reset (then it runs from start)."""
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        return True
    try:
        CLEAR_REFS.write_text("5")
        return _vm_hwm_bytes() is not None
    except OSError:
        return False


def _vm_hwm_bytes() -> int | None:
    try:
        for line in PROC_STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def peak_mem_gib(device: str, since_reset: bool = False) -> tuple[float, str]:
    """(peak GiB, its source): since `reset_peak_mem` when `since_reset`, else since start."""
    import torch

    since = " since setup" if since_reset else ""
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30, f"torch.cuda.max_memory_allocated{since}"
    hwm = _vm_hwm_bytes() if since_reset else None
    if hwm is not None:
        return hwm / 2**30, f"peak RSS (VmHWM){since}"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30, "ru_maxrss"


def decay_groups(params) -> tuple[list, list]:
    """(matrices, the rest): weight decay applies to parameters of 2 or more dimensions. Judged on
    the parameter's real shape: under ZeRO-3, deepspeed.zero.Init has replaced every parameter by
    an empty 1-D partition and keeps the shape in `ds_shape` (judging `p.ndim` there put every
    parameter in the no-decay group, so ZeRO-3 trained another optimiser than ZeRO 0-2)."""
    decay, no_decay = [], []
    for p in params:
        (decay if len(getattr(p, "ds_shape", p.shape)) >= 2 else no_decay).append(p)
    return decay, no_decay


def make_optimizer(spec: TrainSpec, model):
    import torch

    if spec.optimizer.impl == "deepspeed":
        return None  # DeepSpeed builds it from the "optimizer" section of its config
    decay, no_decay = decay_groups(model.parameters())
    groups = [{"params": decay, "weight_decay": spec.optimizer.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=spec.optimizer.lr, betas=spec.optimizer.betas,
                             eps=spec.optimizer.eps, fused=spec.device == "cuda")


def _emit_hyperparameters(log: ev.EventLog, spec: TrainSpec, world_size: int) -> None:
    log.emit(ev.SUBMISSION_BENCHMARK, spec.benchmark)
    log.emit(ev.SUBMISSION_PLATFORM, spec.platform)
    log.emit(ev.SEED, spec.seed)
    log.emit(ev.GLOBAL_BATCH_SIZE, spec.micro_batch_size * spec.grad_acc_steps * world_size)
    log.emit(ev.MICRO_BATCH_SIZE, spec.micro_batch_size)
    log.emit(ev.GRADIENT_ACCUMULATION_STEPS, spec.grad_acc_steps)
    log.emit(ev.MAX_SEQUENCE_LENGTH, spec.seq_len)
    log.emit(ev.OPT_NAME, "adamw")
    log.emit(ev.OPT_BASE_LR, spec.optimizer.lr)
    log.emit(ev.OPT_ADAMW_BETA_1, spec.optimizer.betas[0])
    log.emit(ev.OPT_ADAMW_BETA_2, spec.optimizer.betas[1])
    log.emit(ev.OPT_ADAMW_EPSILON, spec.optimizer.eps)
    log.emit(ev.OPT_ADAMW_WEIGHT_DECAY, spec.optimizer.weight_decay)
    log.emit(ev.OPT_GRADIENT_CLIP_NORM, spec.optimizer.grad_clip)


def make_batches(spec: TrainSpec, rank: int, world_size: int, device) -> Iterator:
    from benchmarks.training import data

    if spec.data.source == "corpus":
        batches = data.corpus_batches(spec.data, spec.model.vocab_size, spec.micro_batch_size,
                                      spec.seq_len, rank, world_size)
    else:
        batches = data.synthetic_batches(spec.model.vocab_size, spec.micro_batch_size,
                                         spec.grad_acc_steps, spec.seq_len, spec.seed, rank)
    return data.cycle(batches, device)


def limit_cpu_memory(limit_gib: float | None) -> None:
    """Make the cpu platform's declared memory per rank real: allocations past it fail at once
    (recorded as oom) instead of the kernel's OOM killer taking a rank after minutes of paging."""
    if limit_gib is None:
        return
    limit = int(limit_gib * 2**30)
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))


def rank_threads(device: str, environ: dict[str, str] | None = None, usable: int | None = None) -> int:
    """CPU threads of a rank: torch's intra-op pool, whose OpenMP runtime DeepSpeed's CPU ops share
    (DeepSpeedCPUAdam under optimizer offload; the fp32 -> bf16 cast of each updated parameter
    sub-group, which torch makes on the host before copying it to the GPU).
    cpu: the platform's cpu_threads, set by the harness as OMP_NUM_THREADS (the ranks share the host).
    cuda: platform.host_threads where set (the harness passes it as HOST_THREADS_VAR), else the rank's share
    of the cores it may run on, usable // LOCAL_WORLD_SIZE (at least 1).
    OMP_NUM_THREADS is not the suite's there: unset on one rank, torchrun's 1 for several; a rank held
    to one thread stepped an offloaded sub-group at a sixteenth of a 16-core node's rate."""
    environ = os.environ if environ is None else environ
    if device != "cuda":
        return max(1, int(environ.get("OMP_NUM_THREADS", "1")))
    if environ.get(HOST_THREADS_VAR):
        return max(1, int(environ[HOST_THREADS_VAR]))
    if usable is None:
        usable = usable_cpus() or os.cpu_count() or 1
    return max(1, usable // max(1, int(environ.get("LOCAL_WORLD_SIZE", "1"))))


def setup(spec: TrainSpec):
    """Process group, device, model and DeepSpeed engine, exactly as every benchmark builds them.
    Then the stack (benchmarks/training/stack.py): Liger's kernels and FP8 linears before DeepSpeed wraps the
    model, the compilation after. Returns (engine, device, num_params, what the stack did)."""
    import deepspeed
    import torch

    from benchmarks.training.model import DTYPES, build_model, initialise

    torch.set_num_threads(rank_threads(spec.device))
    preload()  # DeepSpeed's ops as built at install time: no JIT build, no lock file (benchmarks/node/ops.py)
    deepspeed.init_distributed(dist_backend=spec.dist_backend)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if spec.device == "cuda" else torch.device("cpu")
    if spec.device == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(spec.seed)
    zero3 = spec.deepspeed.get("zero_optimization", {}).get("stage", 0) == 3
    with deepspeed.zero.Init(config_dict_or_path=spec.deepspeed, enabled=zero3):
        model = build_model(spec.model, device=device)
    initialise(model, spec.seed, zero3)
    enable_checkpointing(model, spec)
    num_params = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    if spec.precision != "fp32" and not zero3:
        model = model.to(DTYPES[spec.precision])
    stack = prepare_model(model, spec)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=make_optimizer(spec, model),
                                           model_parameters=None if spec.optimizer.impl == "torch"
                                           else model.parameters(), config=spec.deepspeed)
    if spec.gradient_collective == "reduce_scatter":
        install(engine)
    elif spec.gradient_collective != "all_reduce":
        raise ValueError(f"gradient_collective={spec.gradient_collective!r}: all_reduce or reduce_scatter")
    stack.update(compile_engine(engine, spec))
    return engine, device, num_params, stack


def enable_checkpointing(model, spec: TrainSpec) -> list[bool]:
    """Activation checkpointing as the spec asks (transformers' non-reentrant torch.utils.checkpoint
    of each chosen decoder layer's forward, every n-th layer from the first; with policy selective,
    benchmarks/training/checkpoint_policy.py chooses what it keeps); returns each decoder layer's flag, in
    order (harness/model/flops.checkpointed_layers counts the True ones)."""
    if spec.activation_checkpointing:
        kwargs = {"use_reentrant": False}
        if spec.checkpoint_policy == "selective":
            kwargs["context_fn"] = selective_context
        n = spec.checkpoint_every_n_layers
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs, every_n_layers=n)
        else:  # transformers before 5.23 (a GPU node's own 5.17): the old name, every layer; then every n-th
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
            for i, layer in enumerate(model.model.layers):
                layer.gradient_checkpointing = i % n == 0
    return [bool(layer.gradient_checkpointing) for layer in model.model.layers]


def setup_teacher(spec: TrainSpec, device):
    """The distillation teacher (None without one), placed by the student's ZeRO stage."""
    if spec.distill is None:
        return None
    from benchmarks.training.distill import build_teacher

    return build_teacher(spec.distill, spec.deepspeed, device, spec.seed)


def planned_warmup(spec: TrainSpec, pass_steps: Sequence[int] = ()) -> int:
    """Warm-up steps before any growth: the stack's (StackSpec.planned_warmup), reaching past the last step at
    which DeepCompile recompiles with new passes (stack.deepcompile_pass_steps), so none falls in the measured ones."""
    return max(spec.stack.planned_warmup(spec.warmup_steps), max(pass_steps, default=-1) + 1)


def probes_attention(spec: TrainSpec) -> bool:
    """Whether the run reads which SDPA kernel ran: a stack away from eager with PyTorch's own choice."""
    st = spec.stack
    return st.compile != "none" or st.kernels != "eager" or st.attention != "auto" or spec.precision == "fp8"


def warmup_plan(spec: TrainSpec, pass_steps: Sequence[int] = ()) -> list[tuple[str, bool]]:
    """Warm-up (planned_warmup), measured and profiled steps in order."""
    return ([("throughput", True)] * planned_warmup(spec, pass_steps) + [("throughput", False)] * spec.steps
            + [("profile", False)] * spec.profile_steps)


def grow_warmup(plan: list[tuple[str, bool]], index: int, compiled: int, spec: TrainSpec,
                pass_steps: Sequence[int] = ()) -> bool:
    """After warm-up step `index`: one more warm-up step when it was the last one, it compiled
    something and fewer than compile_warmup_max were added beyond the planned ones so far. True when one was added."""
    added = sum(1 for _, w in plan if w) - planned_warmup(spec, pass_steps)
    last = index + 1 >= len(plan) or not plan[index + 1][1]
    if compiled and last and added < spec.stack.compile_warmup_max:
        plan.insert(index + 1, ("throughput", True))
        return True
    return False


def run(spec: TrainSpec, log: ev.EventLog, rank: int, world_size: int, run_dir: Path) -> None:
    import deepspeed.comm.comm as ds_comm
    import torch

    from benchmarks.training.distill import distillation_loss

    announce(log, rank, world_size, run_dir, spec.device)  # the probe, then the ranks' view
    if rank == 0:
        _emit_hyperparameters(log, spec, world_size)
    engine, device, num_params, stack = setup(spec)
    teacher = setup_teacher(spec, device)
    if rank == 0:
        log.emit(ev.NUM_PARAMS, num_params)
        if teacher:
            log.emit(ev.TEACHER, {**teacher.summary(), "alpha": spec.distill.alpha,
                                  "temperature": spec.distill.temperature})
    batches = make_batches(spec, rank, world_size, device)
    # the machine's pace right before and right after the measured part, read by the first rank on
    # each machine (kernel) while the others wait (a barrier here, the all-gather below): the run's own figure
    # of how fast this machine was, which a comparison holds against the reference's (harness/pace.py).
    # Before the peak-memory reset, so that its operands (3 x 256 MiB on a GPU) are no part of the peak. First every
    # rank's own device at once (load.pulse_devices: the pace with every device busy, as the steps load them).
    paced = first_on_kernel(rank)
    pulses = Pulses(spec.device)
    torch.distributed.barrier()
    pulses.own_start()
    torch.distributed.barrier()
    if paced:
        pulses.start()
    torch.distributed.barrier()
    since_reset = reset_peak_mem(spec.device)
    sync = synchronizer(spec.device)
    tracer = CommTracer(ds_comm.cdb, sync)
    ga = spec.grad_acc_steps

    def forward(tokens, clock: MicrostepClock | None):
        """The micro-step's loss: the model's own causal-LM loss, or the distillation loss after
        the teacher's forward (a phase of its own in the breakdown)."""
        if teacher is None:
            return engine(input_ids=tokens, labels=tokens).loss, None
        teacher_logits = teacher.logits(tokens)
        if clock:
            clock.phase("forward")
        out = distillation_loss(engine(input_ids=tokens).logits, teacher_logits, tokens,
                                spec.distill.alpha, spec.distill.temperature)
        return out.loss, torch.stack([out.ce.detach(), out.kl.detach()])

    def optimizer_step(clock: MicrostepClock | None, probe: dict | None = None) -> tuple[float, list[float] | None]:
        losses, parts = [], []
        for i in range(ga):
            if clock:
                clock.begin(i, "teacher" if teacher else "forward")
            tokens = next(batches)
            with attention_context(spec.stack.attention), (
                    attention_probe(probe) if probe is not None and i == 0 else contextlib.nullcontext()):
                loss, loss_parts = forward(tokens, clock)
                if clock:
                    clock.phase("backward")
                engine.backward(loss)
            if clock and i == ga - 1:
                clock.phase("step")
            engine.step()
            if spec.inject_delay_s and (spec.inject_delay_ranks is None or rank in spec.inject_delay_ranks):
                time.sleep(spec.inject_delay_s)
            if clock:
                clock.end()
            losses.append(loss.detach())
            if loss_parts is not None:
                parts.append(loss_parts)
            del loss  # nothing of this micro-step's graph may live on into the next
        mean_parts = torch.stack(parts).float().mean(0).tolist() if parts else None
        return float(torch.stack(losses).float().mean()), mean_parts

    if rank == 0:
        log.emit(ev.RUN_START)
    window = LoadWindow()
    watch = CompileWatch(spec.stack.compile != "none", spec.stack.compile_cache)
    pass_steps = stack.get("pass_steps", ())
    plan = warmup_plan(spec, pass_steps)
    peak, index, warmup_times, found = None, 0, [], {}
    profiled: list = []   # each profiled step's (index, calls, stamps) on this rank
    while index < len(plan):
        mode, warmup = plan[index]
        if mode == "profile" and peak is None:
            peak = peak_mem_gib(spec.device, since_reset)  # memory as the throughput steps left it
        clock = MicrostepClock(tracer) if mode == "profile" else None
        if clock:
            tracer.install()
        # which SDPA kernel ran: read on the last warm-up step (compiled by then; read again if one is added),
        # for a run of the stack away from eager/auto only: torch.profiler's pass left the measured steps of an
        # eager llama-tiny-kd ZeRO-3 run on cpu ~10-15 % slower after it (2.35-2.58 s against 2.69-2.85 s)
        probe = (found if warmup and probes_attention(spec) and (index + 1 >= len(plan) or not plan[index + 1][1])
                 else None)
        sync()
        timed = mode == "throughput" and not warmup   # the steps the run's median is taken over
        if timed:
            window.step_start()
        start = time.perf_counter()
        loss, loss_parts = optimizer_step(clock, probe)
        sync()
        step_time_s = time.perf_counter() - start
        if timed:
            window.step_end()
        tracer.uninstall()
        if clock and world_size > 1:
            profiled.append((index, *clock.calls()))
        compiled, recompiled = watch.compiled_since_last()
        if warmup:
            warmup_times.append(step_time_s)
            grow_warmup(plan, index, compiled, spec, pass_steps)
        if rank == 0:
            value = {"index": index, "mode": mode, "warmup": warmup, "step_time_s": step_time_s,
                     "loss": loss}
            if watch.enabled:
                value["frames_compiled"] = compiled
                if recompiled:
                    value["frames_recompiled"] = recompiled   # of them, Dynamo's (counted in compile_watch)
            if loss_parts is not None:
                value["ce_loss"], value["kl_loss"] = loss_parts
            if clock:
                value["microsteps"] = [m.to_dict() for m in clock.microsteps]
            log.emit(ev.TRAIN_STEP, value)
        index += 1
    if profiled:   # whom each profiled call waited for: every rank's stamps, gathered once after the last (arrivals.py)
        came = arrivals.gather(rank, world_size, profiled)
        if rank == 0:
            log.emit(ev.ARRIVALS, came)
    if rank == 0:
        log.emit(ev.STACK, {**stack, "attention": spec.stack.attention, "host_threads": torch.get_num_threads(),
                            "attention_used": found.get("attention_used", ["not read"] if probes_attention(spec)
                                                        else ["not read (eager, auto)"]),
                            **({"attention_from": found["attention_from"]} if "attention_from" in found else {}),
                            "warmup_steps_run": len(warmup_times), "compile_watch": watch.summary()})

    peak_gib, source = peak or peak_mem_gib(spec.device, since_reset)
    load = window.close()
    torch.distributed.barrier()
    load["pulse_own"] = pulses.own_window()   # every rank at once, outside the window
    torch.distributed.barrier()
    if paced:
        load["pulse"] = pulses.window()
    mine = {"rank": rank, "host": socket.gethostname(), "peak_mem_gib": peak_gib, "mem_source": source,
            "load": load}
    everyone = [None] * world_size
    torch.distributed.all_gather_object(everyone, mine)
    if rank == 0:
        log.emit(ev.LOAD, [{"rank": m["rank"], "host": m["host"], **m.pop("load")} for m in everyone])
        log.emit(ev.RANK_SUMMARY, everyone)
        log.emit(ev.RUN_STOP, status="success")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def main(argv: list[str] | None = None) -> NoReturn:
    def body(run_dir: Path, log: ev.EventLog, rank: int, world_size: int) -> None:
        spec = TrainSpec.load(run_dir / SPEC_FILE)
        limit_cpu_memory(spec.cpu_mem_limit_gib)
        run(spec, log, rank, world_size, run_dir)

    run_rank(argv, __doc__.splitlines()[0], body)


if __name__ == "__main__":
    sys.exit(main())
