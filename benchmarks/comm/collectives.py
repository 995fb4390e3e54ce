"""Built-in collective sweep on torch.distributed with nccl-tests semantics; runs on every rank.

    python -m benchmarks.comm.collectives --run-dir RUN_DIR     (RANK, WORLD_SIZE, MASTER_* in the env)

For each op and size (RUN_DIR/spec.json): warm-up iterations, then timed iterations launched back
to back with the device synchronised once at the end; the time of a size is the slowest rank's
average per iteration (max over ranks, outside the timed region). Then, if asked, one more call
on known inputs and a count of wrong elements (summed over ranks), as nccl-tests' #wrong.
The check is memory-bounded: inputs are written and results compared CHECK_WINDOW elements at a
time, each window's expected values computed from the positions it covers (expected_values).
On one rank (a smoke run, no bus bandwidth) the same loop runs every op once through the backend.

Sizes are nccl-tests' "size": the full buffer (an all-gather's output, a reduce-scatter's
input); "count" is nccl-tests' per-call element count (the per-rank chunk for all_gather,
reduce_scatter and all_to_all). torch's broadcast and reduce take one buffer per rank: the
out-of-place variant passes separate receive buffers (the root its send buffer), the in-place
variant the send buffers themselves.
"""
from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import NoReturn, Optional

import torch
import torch.distributed as dist

from contract import events as ev
from contract.collectives import DTYPES as VOCABULARY_DTYPES
from contract.collectives import NCCL_TYPES, SMALL_BYTES, call_figures
from contract.spec import SPEC_FILE, CollectiveSpec

from benchmarks.node.environment import announce, bind_rank, first_of, kernel_peers
from benchmarks.failure import run_rank
from benchmarks.node.machine import LoadWindow
from benchmarks.node.probe import Pulses

DTYPES = {name: getattr(torch, name) for name in VOCABULARY_DTYPES}
# nccl-tests' type names, for the printed/recorded `dtype` column
NCCL_TYPE_NAMES = {name: NCCL_TYPES[name] for name in VOCABULARY_DTYPES}
REDOPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
          "min": dist.ReduceOp.MIN, "avg": dist.ReduceOp.AVG}
CHUNKED = ("all_gather", "reduce_scatter", "all_to_all")
NO_IN_PLACE = ("all_to_all", "sendrecv")
CHECK_WINDOW = 1 << 22
"""Elements filled and compared at a time by the correctness check (float64 expected values: a
few windows in memory, whatever the message size and the number of ranks)."""


def nccl_count(op: str, size_bytes: int, elem_bytes: int, num_ranks: int) -> int:
    total = size_bytes // elem_bytes
    return total // num_ranks if op in CHUNKED else total


def input_values(rank: int, num: int, redop: str, offset: int = 0) -> torch.Tensor:
    """Small exact integers (as float64), distinct per rank and position: sums, products, max and
    min of a few ranks stay exact in every dtype, including int8 and half."""
    idx = torch.arange(offset, offset + num, dtype=torch.float64)
    if redop == "prod":
        return (idx + rank) % 2 + 1
    return ((rank + 1) * (idx % 5 + 1)) % 7 + 1


def _fold(acc: torch.Tensor, values: torch.Tensor, redop: str) -> torch.Tensor:
    if redop in ("sum", "avg"):
        return acc.add_(values)
    if redop == "prod":
        return acc.mul_(values)
    return torch.maximum(acc, values, out=acc) if redop == "max" else torch.minimum(acc, values, out=acc)


def reduced_values(n: int, num: int, redop: str, offset: int = 0) -> torch.Tensor:
    """The reduction over the n ranks' inputs at positions [offset, offset + num), one rank's
    inputs at a time (two windows in memory, not n); the inputs are small exact integers, so the
    order of the reduction changes nothing."""
    acc = input_values(0, num, redop, offset)
    for q in range(1, n):
        acc = _fold(acc, input_values(q, num, redop, offset), redop)
    return acc / n if redop == "avg" else acc


def windows(total: int):
    """(start, num) of consecutive CHECK_WINDOW-element windows covering [0, total)."""
    window = CHECK_WINDOW   # read at call time (tests shrink it)
    for start in range(0, total, window):
        yield start, min(window, total - start)


def _pieces(start: int, num: int, chunk: int):
    """Positions [start, start + num) of a buffer of equal chunks as (chunk q, from its element j,
    k elements)."""
    pos, end = start, start + num
    while pos < end:
        q, j = divmod(pos, chunk)
        k = min(chunk - j, end - pos)
        yield q, j, k
        pos += k


def expected_values(op: str, redop: str, rank: int, n: int, chunk: int, root: int, start: int,
                    num: int) -> torch.Tensor:
    """What positions [start, start + num) of `rank`'s result buffer must hold after `op` over n
    ranks whose inputs are input_values (chunk: the per-rank chunk of the full buffer), as float64;
    only what those positions need is computed (reduce_scatter: this rank's chunk, all_to_all:
    chunk `rank` of each peer, all_gather: each peer's own positions). Pure: no process group."""
    if op in ("all_reduce", "reduce"):
        return reduced_values(n, num, redop, start)
    if op == "reduce_scatter":
        return reduced_values(n, num, redop, rank * chunk + start)
    if op in ("all_gather", "all_to_all"):
        parts = [input_values(q, k, redop, (q if op == "all_gather" else rank) * chunk + j)
                 for q, j, k in _pieces(start, num, chunk)]
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.float64)
    if op == "broadcast":
        return input_values(root, num, redop, start)
    if op == "sendrecv":
        return input_values((rank - 1) % n, num, redop, start)
    raise ValueError(f"unknown collective {op!r}")


def count_wrong(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> int:
    a, e = actual.detach().to("cpu", torch.float64), expected.to(torch.float64)
    if dtype.is_floating_point:
        rtol = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(dtype, 1e-5)
        ok = torch.isclose(a, e, rtol=rtol, atol=0.0)
    else:
        ok = a == e.to(dtype).to(torch.float64)  # integer avg truncates as the dtype does
    return int((~ok).sum())


class Case:
    """Buffers and the call for one (op, size, placement); `check()` counts wrong elements here."""

    def __init__(self, op: str, size_bytes: int, spec: CollectiveSpec, in_place: bool,
                 rank: int, n: int, device: torch.device):
        self.op, self.spec, self.rank, self.n, self.in_place = op, spec, rank, n, in_place
        self.dtype = DTYPES[spec.dtype]
        elem = torch.empty((), dtype=self.dtype).element_size()
        self.total = size_bytes // elem
        self.chunk = self.total // n
        self.device = device
        self.redop = REDOPS[spec.redop]
        send_num = self.chunk if op == "all_gather" else self.total
        self.send = torch.empty(send_num, dtype=self.dtype, device=device)
        recv_num = self.chunk if op == "reduce_scatter" else self.total
        self.recv = torch.empty(recv_num, dtype=self.dtype, device=device)
        if in_place and op == "all_gather":      # input is this rank's slice of the output
            self.send = self.recv.narrow(0, rank * self.chunk, self.chunk)
        if in_place and op == "reduce_scatter":  # output is this rank's slice of the input
            self.recv = self.send.narrow(0, rank * self.chunk, self.chunk)
        self.fill()

    def fill(self) -> None:
        """This rank's input_values into the send buffer, a window at a time."""
        offset = self.rank * self.chunk if self.op == "all_gather" else 0
        for start, num in windows(self.send.numel()):
            values = input_values(self.rank, num, self.spec.redop, offset + start)
            self.send.narrow(0, start, num).copy_(values.to(self.dtype))
        if self.op in ("all_reduce", "broadcast", "reduce") and not self.in_place:
            self.recv.copy_(self.send)

    def call(self) -> None:
        op, s = self.op, self.spec
        if op == "all_reduce":
            dist.all_reduce(self.send if self.in_place else self.recv, op=self.redop)
        elif op == "all_gather":
            dist.all_gather_into_tensor(self.recv, self.send)
        elif op == "reduce_scatter":
            dist.reduce_scatter_tensor(self.recv, self.send, op=self.redop)
        elif op == "all_to_all":
            dist.all_to_all_single(self.recv, self.send)
        elif op == "broadcast":
            buf = self.send if (self.in_place or self.rank == s.root) else self.recv
            dist.broadcast(buf, src=s.root)
        elif op == "reduce":
            dist.reduce(self.send if self.in_place else self.recv, dst=s.root, op=self.redop)
        elif op == "sendrecv":
            peer_to, peer_from = (self.rank + 1) % self.n, (self.rank - 1) % self.n
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, self.send, peer_to),
                                           dist.P2POp(dist.irecv, self.recv, peer_from)])
            for req in reqs:
                req.wait()
        else:
            raise ValueError(f"unknown collective {op!r}")

    def result(self) -> Optional[torch.Tensor]:
        """The buffer holding this rank's result (None where nccl-tests checks nothing)."""
        if self.op == "reduce" and self.rank != self.spec.root:
            return None
        if self.op == "broadcast" and self.rank == self.spec.root and not self.in_place:
            return self.send
        if self.in_place and self.op in ("all_reduce", "broadcast", "reduce"):
            return self.send
        return self.recv

    def expected(self, start: int = 0, num: Optional[int] = None) -> torch.Tensor:
        """The float64 values positions [start, start + num) of result() must hold (default: all)."""
        if num is None:
            num = (self.chunk if self.op == "reduce_scatter" else self.total) - start
        return expected_values(self.op, self.spec.redop, self.rank, self.n, self.chunk, self.spec.root,
                               start, num)

    def count_wrong(self) -> int:
        """Wrong elements of result() (0 where nccl-tests checks nothing), compared a window at a
        time: never more than CHECK_WINDOW expected values (and as many of the result's, on the
        host) at once."""
        out = self.result()
        if out is None:
            return 0
        wrong = 0
        for start, num in windows(out.numel()):
            wrong += count_wrong(out.narrow(0, start, num), self.expected(start, num), self.dtype)
        return wrong

    def check(self) -> int:
        self.fill()
        self.call()
        synchronize(self.device)
        return self.count_wrong()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def slowest(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def total_over_ranks(value: int, device: torch.device) -> int:
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return int(t.item())


def iterations(size: int, spec: CollectiveSpec) -> int:
    """Timed iterations at `size`: spec.small_iters up to SMALL_BYTES where set, else spec.iters."""
    return spec.small_iters if spec.small_iters and size <= SMALL_BYTES else spec.iters


def time_case(case: Case, spec: CollectiveSpec, size: int) -> tuple[float, dict[str, float]]:
    """(average, figures of the calls) in microseconds on the slowest rank. The average is nccl-tests' (the
    iterations back to back, timed together). The figures (contract/collectives.py call_figures: median_us, p25_us,
    stalled_pct, each the slowest rank's) are of each call timed on its own, taken only where a call returns when it
    is done (gloo on cpu), so that no synchronisation is added between calls: none on a GPU."""
    for _ in range(spec.warmup_iters):
        case.call()
    synchronize(case.device)
    dist.barrier()
    iters, calls = iterations(size, spec), []
    per_call = case.device.type == "cpu"
    start = time.perf_counter()
    for _ in range(iters):
        case.call()
        if per_call:
            calls.append(time.perf_counter())
    synchronize(case.device)
    elapsed = (time.perf_counter() - start) / iters
    figures = call_figures([(b - a) * 1e6 for a, b in zip([start] + calls, calls)]) if per_call else {}
    return slowest(elapsed, case.device) * 1e6, {k: slowest(v, case.device) for k, v in figures.items()}


def measure(op: str, size: int, spec: CollectiveSpec, in_place: bool, rank: int, n: int,
            device: torch.device) -> dict:
    case = Case(op, size, spec, in_place, rank, n, device)
    time_us, figures = time_case(case, spec, size)
    wrong = total_over_ranks(case.check(), device) if spec.check else None
    return {"time_us": time_us, "num_wrong": wrong, **figures}


def run(spec: CollectiveSpec, log: ev.EventLog, rank: int, n: int, run_dir: Path) -> None:
    announce(log, rank, n, run_dir, spec.device)  # the probe, then the ranks' view
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if spec.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group(backend=spec.dist_backend, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend=spec.dist_backend)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    # on cpu, each rank's threads on its own CPUs (collective.bind_ranks): the ranks no longer share a CPU nor land
    # on the CPUs differently from one sweep to the next; a call is held up as often (docs/collectives.md)
    peers = kernel_peers(rank) if spec.device == "cpu" else None   # gathered once, for the binding and the pulses
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None   # before binding: the pulses'
    cpus = bind_rank(peers) if spec.bind_ranks and spec.device == "cpu" else None
    # on cpu, the machine's pace before and after the sweep (benchmarks/node/probe.py Pulses), read by the first rank
    # on each machine while the others wait: gloo on one host moves its bytes through the host's memory on its
    # CPUs, so a night the box's memory or CPUs ran slower is known as such (harness/pace.py one_cpu_host). A
    # GPU's busbw is its links', which no pulse reads.
    pulses = Pulses(spec.device, allowed) if spec.device == "cpu" and first_of(peers) else None
    if pulses:
        pulses.start()
    dist.barrier()
    if rank == 0:
        log.emit(ev.RUN_START)
    window = LoadWindow()
    elem = torch.empty((), dtype=DTYPES[spec.dtype]).element_size()
    for op in spec.ops:
        for size in spec.sizes:
            oop = measure(op, size, spec, False, rank, n, device)
            ip = (measure(op, size, spec, True, rank, n, device)
                  if spec.in_place and op not in NO_IN_PLACE else None)
            if rank == 0:
                log.emit(ev.COLLECTIVE_ROW, {
                    "op": op, "size_bytes": size, "count": nccl_count(op, size, elem, n),
                    "dtype": NCCL_TYPE_NAMES[spec.dtype],
                    "redop": spec.redop if op in ("all_reduce", "reduce_scatter", "reduce") else "none",
                    "root": spec.root if op in ("broadcast", "reduce") else -1,
                    "out_of_place": oop, "in_place": ip, "num_ranks": n})
    load = window.close()
    if pulses:
        load["pulse"] = pulses.window()
    everyone: list = [None] * n
    dist.all_gather_object(everyone, {"rank": rank, "host": socket.gethostname(), **load,
                                      **({"cpus": cpus} if cpus is not None else {})})
    if rank == 0:
        log.emit(ev.LOAD, everyone)
        log.emit(ev.RUN_STOP, status="success")
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> NoReturn:
    run_rank(argv, __doc__.splitlines()[0],
             lambda run_dir, log, rank, n: run(CollectiveSpec.load(run_dir / SPEC_FILE), log, rank, n, run_dir))


if __name__ == "__main__":
    sys.exit(main())
