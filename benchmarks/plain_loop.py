"""A plain DeepSpeed training loop: the baseline that `make perf` compares the harness against.

    python -m benchmarks.plain_loop --spec RUN_DIR/spec.json --out FILE
                                    (RANK, WORLD_SIZE, MASTER_* in the environment)

Same TrainSpec, model (model.py), data (data.py), client optimizer and DeepSpeed config as
benchmarks/train.py, but none of the harness's machinery: no events, no MLLOG, no loss readout,
no instrumentation, no profile mode. Each optimizer step (ga micro-steps of forward,
engine.backward, engine.step) is timed with time.perf_counter (the device is synchronised at the
step boundaries only, as train.py does in throughput mode). Rank 0 writes the figures as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import deepspeed
import torch

from .data import corpus_batches, cycle, synthetic_batches
from .model import DTYPES, build_model
from .spec import TrainSpec


def peak_mem_gib(device: str) -> tuple[float, str]:
    """Measured the way train.py measures it."""
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30, "torch.cuda.max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30, "ru_maxrss"


def make_optimizer(spec: TrainSpec, model):
    """The client optimizer of train.py: torch AdamW, no weight decay on 1-d parameters."""
    if spec.optimizer.impl == "deepspeed":
        return None  # DeepSpeed builds it from its config's "optimizer" section
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": spec.optimizer.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=spec.optimizer.lr, betas=spec.optimizer.betas,
                             eps=spec.optimizer.eps, fused=spec.device == "cuda")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, type=Path, help="a TrainSpec JSON (spec.json)")
    parser.add_argument("--out", required=True, type=Path, help="JSON file rank 0 writes")
    args = parser.parse_args(argv)
    spec = TrainSpec.load(args.spec)
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))

    deepspeed.init_distributed(dist_backend=spec.dist_backend)
    if spec.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        sync = torch.cuda.synchronize
    else:
        device = torch.device("cpu")
        sync = lambda: None  # noqa: E731

    torch.manual_seed(spec.seed)
    zero3 = spec.deepspeed.get("zero_optimization", {}).get("stage", 0) == 3
    with deepspeed.zero.Init(config_dict_or_path=spec.deepspeed, enabled=zero3):
        model = build_model(spec.model, device=device)
    if spec.activation_checkpointing:
        model.gradient_checkpointing_enable()
    if spec.precision != "fp32" and not zero3:
        model = model.to(DTYPES[spec.precision])
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=make_optimizer(spec, model),
        model_parameters=None if spec.optimizer.impl == "torch" else model.parameters(),
        config=spec.deepspeed)

    if spec.data.source == "corpus":
        batches = corpus_batches(spec.data, spec.model.vocab_size, spec.micro_batch_size,
                                 spec.seq_len, rank, world_size)
    else:
        batches = synthetic_batches(spec.model.vocab_size, spec.micro_batch_size, spec.seq_len,
                                    spec.seed, rank, num_batches=max(2, spec.grad_acc_steps))
    batches = cycle(batches, device)

    step_times = []
    for _ in range(spec.warmup_steps + spec.steps):
        sync()
        start = time.perf_counter()
        for _ in range(spec.grad_acc_steps):
            tokens = next(batches)
            loss = engine(input_ids=tokens, labels=tokens).loss
            engine.backward(loss)
            engine.step()
        sync()
        step_times.append(time.perf_counter() - start)

    peak, source = peak_mem_gib(spec.device)
    everyone = [None] * world_size
    torch.distributed.all_gather_object(everyone, {"rank": rank, "peak_mem_gib": peak,
                                                   "mem_source": source})
    if rank == 0:
        measured = step_times[spec.warmup_steps:]
        global_batch = spec.micro_batch_size * spec.grad_acc_steps * world_size
        result = {"warmup_step_times_s": step_times[:spec.warmup_steps],
                  "step_times_s": measured,
                  "step_time_s": statistics.median(measured),
                  "samples_per_s": global_batch / statistics.median(measured),
                  "ranks": everyone}
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
