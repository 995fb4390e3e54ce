"""A minimal torch.distributed loop: the baseline `make perf` holds the built-in sweep against.

    python -m benchmarks.comm.plain_collective --spec RUN_DIR/spec.json --out result.json  (ranks' env)

For each size of the spec: one buffer, `warmup_iters` all-reduces, then `iters` timed back to back;
the slowest rank's average. Nothing else: no check, no events, no in-place pass.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from contract.spec import CollectiveSpec

from benchmarks.comm.collectives import DTYPES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    spec = CollectiveSpec.load(args.spec)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cuda = spec.device == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    dist.init_process_group(backend=spec.dist_backend)
    dtype = DTYPES[spec.dtype]
    times_us = {}
    for size in spec.sizes:
        buf = torch.ones(size // torch.empty((), dtype=dtype).element_size(), dtype=dtype, device=device)
        for _ in range(spec.warmup_iters):
            dist.all_reduce(buf)
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(spec.iters):
            dist.all_reduce(buf)
        if cuda:
            torch.cuda.synchronize()
        t = torch.tensor([(time.perf_counter() - start) / spec.iters], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times_us[size] = float(t.item()) * 1e6
    if dist.get_rank() == 0:
        args.out.write_text(json.dumps({"time_us": times_us}, indent=2) + "\n", encoding="utf-8")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
