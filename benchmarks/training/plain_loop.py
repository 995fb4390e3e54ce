"""A plain DeepSpeed training loop: the baseline `make perf` measures the harness against.

    python -m benchmarks.training.plain_loop --spec RUN_DIR/spec.json --out result.json   (ranks' env as train.py)

It builds everything exactly as benchmarks/training/train.py does (same spec, same `setup`: process group,
model, client optimizer, DeepSpeed engine; same batches; same memory readout), then runs the
warm-up and measured optimizer steps timed with perf_counter, and nothing else: no events, no
loss readout, no instrumentation, no controller polling. Rank 0 writes the figures as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from contract.spec import TrainSpec

from benchmarks.training.stack import CompileWatch, attention_context
from benchmarks.training.train import (grow_warmup, limit_cpu_memory, make_batches, peak_mem_gib, reset_peak_mem, setup, synchronizer,
                    warmup_plan)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, type=Path, help="a TrainSpec JSON (spec.json)")
    parser.add_argument("--out", required=True, type=Path, help="JSON file rank 0 writes")
    args = parser.parse_args(argv)
    spec = TrainSpec.load(args.spec)
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))

    import torch

    limit_cpu_memory(spec.cpu_mem_limit_gib)
    engine, device, _, stack = setup(spec)
    pass_steps = stack.get("pass_steps", ())   # DeepCompile's: the warm-up reaches past them, as the harness's does
    batches = make_batches(spec, rank, world_size, device)
    since_reset = reset_peak_mem(spec.device)  # as benchmarks.training.train counts it
    sync = synchronizer(spec.device)
    step_times = []
    plan = warmup_plan(spec, pass_steps)[:-spec.profile_steps or None]   # throughput steps only; the same warm-up rule
    # a compiled run's bare loop loads what its harness run compiled (harness/gpu_check.py plain_loop)
    watch, index = CompileWatch(spec.stack.compile != "none", "its harness run's caches"), 0
    while index < len(plan):
        sync()
        start = time.perf_counter()
        for _ in range(spec.grad_acc_steps):
            tokens = next(batches)
            with attention_context(spec.stack.attention):
                loss = engine(input_ids=tokens, labels=tokens).loss
                engine.backward(loss)
            engine.step()
        sync()
        step_times.append(time.perf_counter() - start)
        if plan[index][1]:
            grow_warmup(plan, index, watch.compiled_since_last()[0], spec, pass_steps)
        index += 1
    warmup = sum(1 for _, w in plan if w)

    peak, source = peak_mem_gib(spec.device, since_reset)
    everyone = [None] * world_size
    torch.distributed.all_gather_object(everyone, {"rank": rank, "peak_mem_gib": peak,
                                                   "mem_source": source})
    if rank == 0:
        measured = step_times[warmup:]
        global_batch = spec.micro_batch_size * spec.grad_acc_steps * world_size
        result = {"warmup_step_times_s": step_times[:warmup],
                  "step_times_s": measured,
                  "step_time_s": statistics.median(measured),
                  "samples_per_s": global_batch / statistics.median(measured),
                  "ranks": everyone, "compile_cache": watch.summary().get("cache")}
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
