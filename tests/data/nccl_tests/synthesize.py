"""Writes the synthesized nccl-tests outputs of this folder (see README.md for each file's source).

    python tests/data/nccl_tests/synthesize.py --write

Run by hand only (the tests never regenerate their data). Each file reproduces nccl-tests' own
printf formats and arithmetic, ported line by line from the source files named in README.md:
sizes and counts from <op>.cu GetCollByteCount, algbw/busbw from <op>.cu GetBw, the time, bandwidth
and #wrong/error formats from common.cu BenchTime (old, v2.13) or util.cu getFloatStr (v2.17+), the
"Avg bus bandwidth" as the mean of the unrounded busbw of every placement (common.cu run()). Only the
times are invented (a latency + size/bandwidth model with seeded jitter); every other printed number
follows from them exactly as nccl-tests computes it. This file does not import the harness, so the
busbw check in tests/unit/test_nccl_tests.py compares two independent codings of nccl-tests' rules.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TYPE_BYTES = {"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int32": 4, "int8": 1}


# --- nccl-tests arithmetic (src/<op>.cu) --------------------------------------------------------

def coll_counts(op: str, size: int, ts: int, n: int, align16: bool) -> tuple[int, int, int]:
    """(sendcount, recvcount, paramcount) as <op>.cu GetCollByteCount computes them; align16: the
    v2.17+ rounding of a rank's chunk to 16 bytes (`& -(16/eltSize)`)."""
    count = size // ts
    mask = -(16 // ts) if align16 else -1
    if op in ("all_reduce", "broadcast", "reduce", "sendrecv"):
        return count, count, count
    if op == "all_gather":
        base = (count // n) & mask
        return base, base * n, base
    if op == "reduce_scatter":
        base = (count // n) & mask
        return base * n, base, base
    if op == "all_to_all":
        base = (count // n) & mask
        return base * n, base * n, base
    raise ValueError(op)


def get_bw(op: str, count: int, ts: int, sec: float, n: int) -> tuple[float, float]:
    """<op>.cu GetBw: (algBw, busBw) in GB/s, in the same floating-point order as the C code."""
    if op in ("all_gather", "reduce_scatter"):
        base = float(count * ts * n) / 1.0E9 / sec
        return base, base * (float(n - 1) / float(n))
    if op == "all_to_all":
        base = float(count * n * ts) / 1.0E9 / sec
        return base, base * (float(n - 1) / float(n))
    base = float(count * ts) / 1.0E9 / sec
    if op == "all_reduce":
        return base, base * (float(2 * (n - 1)) / float(n))
    return base, base  # broadcast, reduce, sendrecv: factor 1


# --- printf formats ---------------------------------------------------------------------------

def time_old(us: float) -> str:  # common.cu BenchTime before v2.13 (strict >)
    return "%7.0f" % us if us > 10000.0 else "%7.1f" % us if us > 100.0 else "%7.2f" % us


def time_213(us: float) -> str:  # common.cu BenchTime v2.13 (>=)
    return "%7.0f" % us if us >= 10000.0 else "%7.1f" % us if us >= 100.0 else "%7.2f" % us


def float_str(value: float, width: int) -> str:  # util.cu getFloatStr (v2.17+)
    power, val = 0, 1
    while value >= val:
        power += 1
        val *= 10
    if power < width - 2:
        return "%*.2f" % (width, value)
    if power < width - 1:
        return "%*.1f" % (width, value)
    if power < width + 1:
        return "%*.0f" % (width, value)
    if width >= 7:
        return "%*.1e" % (width, value)
    return "%*.0e" % (width, value)


def body(layout: str, us: float, alg: float, bus: float, check: bool, wrong) -> str:
    """One placement's columns: BenchTime (old, v2.13) or util.cu writeBenchmarkLineBody (v2.17)."""
    if layout == "old":
        err = "%5.0e" % wrong if check else "%5s" % "N/A"
        return "  %7s  %6.2f  %6.2f  %s" % (time_old(us), alg, bus, err)
    if layout == "v213":
        err = "%5g" % wrong if check else "%5s" % "N/A"
        return "  %7s  %6.2f  %6.2f  %s" % (time_213(us), alg, bus, err)
    err = "  %6g" % wrong if check else "    N/A"
    return "  %7s  %6s  %6s%s" % (float_str(us, 7), float_str(alg, 6), float_str(bus, 6), err)


# --- headers ----------------------------------------------------------------------------------

def old_header(prefix: list[str]) -> list[str]:
    """Per-op print_header() of nccl-tests before v2.13 (type %8s; prefix: the op's extra columns)."""
    fmt_pre = "# %10s  %12s  %8s" + "".join("  %6s" for _ in prefix)
    blanks = ("", "", "") + tuple("" for _ in prefix)
    cols = "  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s"
    return [
        (fmt_pre + "            out-of-place                       in-place          ") % blanks,
        (fmt_pre + cols) % (("size", "count", "type") + tuple(prefix) + ("time", "algbw", "busbw", "error") * 2),
        (fmt_pre + cols) % (("(B)", "(elements)", "") + tuple("" for _ in prefix)
                            + ("(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "")),
    ]


def v213_header() -> list[str]:  # common.cu run(), v2.13
    return [
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          " % (("",) * 5),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s" % (
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
            "time", "algbw", "busbw", "#wrong"),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s" % (
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""),
    ]


def v217_header(timestamps: bool) -> list[str]:  # util.cu writeResultHeader
    ts_lbl, ts_pad, ts_fmt = ("timestamp", 19, "%Y-%m-%d %H:%M:%S") if timestamps else ("", 0, "")
    return [
        "#",
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          " % (("",) * 5),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s" % (
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
            "time", "algbw", "busbw", "#wrong", ts_pad, ts_lbl),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s" % (
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
            "", ts_pad, ts_fmt),
    ]


# --- one run ----------------------------------------------------------------------------------

class Run:
    """A simulated sweep: sizes, per-size times (the only invented numbers) and everything derived."""

    def __init__(self, op: str, layout: str, n: int, dtype: str, sizes: list[int], lat_us: float,
                 peak_gbps: float, seed: int, check: bool = True, redop: str = "sum", root: int = -1,
                 wrong: dict | None = None, error_values: dict | None = None):
        self.op, self.layout, self.n, self.dtype, self.check = op, layout, n, dtype, check
        self.redop, self.root = redop, root
        ts = TYPE_BYTES[dtype]
        rng = random.Random(seed)
        self.rows = []  # dicts with the unrounded values
        busbws = []
        self.oob = 0
        for i, size in enumerate(sizes):
            send, recv, param = coll_counts(op, size, ts, n, align16=(layout == "v217"))
            printed_size = max(send, recv) * ts
            row = {"size": printed_size, "count": param, "places": []}
            for place in range(2):
                if printed_size == 0:
                    us = rng.uniform(0.12, 0.2)
                else:
                    us = (lat_us + printed_size / (peak_gbps * 1e3)) * rng.uniform(0.97, 1.05)
                alg, bus = get_bw(op, param, ts, us * 1e-6, n)
                in_place = place == 1
                report = check and not (op == "all_to_all" and in_place and layout != "old")
                w = (wrong or {}).get((i, place), 0)
                if layout == "old":
                    w = (error_values or {}).get((i, place), 0.0)
                elif report and w:
                    self.oob += 1
                row["places"].append({"us": us, "alg": alg, "bus": bus, "report": report, "wrong": w})
                busbws.append(bus)
            self.rows.append(row)
        self.avg = sum(busbws) / len(busbws)

    def row_lines(self, timestamps: list[str] | None = None) -> list[str]:
        out = []
        for k, r in enumerate(self.rows):
            if self.layout == "old":
                pre = "%12d  %12d  %8s" % (r["size"], r["count"], self.dtype)
                if self.op in ("all_reduce", "reduce_scatter", "reduce"):
                    pre += "  %6s" % self.redop
                if self.op == "all_to_all":
                    pre += "  %6s" % ""  # alltoall.cu passes opName ""
                if self.op in ("broadcast", "reduce"):
                    pre += "  %6i" % self.root
            else:
                pre = "%12d  %12d  %8s  %6s  %6s" % (r["size"], r["count"], self.dtype, self.redop,
                                                     "%6i" % self.root)
            line = pre + "".join(body(self.layout, p["us"], p["alg"], p["bus"], p["report"], p["wrong"])
                                 for p in r["places"])
            if timestamps:
                line += "%21s" % timestamps[k]
            out.append(line)
        return out


def rank_lines(layout: str, hosts: list[tuple[str, int]], per_proc: int, gpu: str, bus_ids: list[int],
               base_pid: int) -> list[str]:
    lines = []
    rank = 0
    for p, (host, _) in enumerate(hosts):
        pid = base_pid + 7 * p
        for d in range(per_proc):
            bus = bus_ids[d % len(bus_ids)]
            if layout == "old":
                lines.append("#   Rank %2d Pid %6d on %10s device %2d [0x%02x] %s" % (rank, pid, host, d, bus, gpu))
            elif layout == "v213":
                lines.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s"
                             % (rank, 0, pid, host, d, bus, gpu))
            else:
                lines.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s"
                             % (rank, 0, pid, host, d, 0, bus, 0, gpu))
            rank += 1
    return lines


def geometric(lo: int, hi: int, factor: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def footer(avg: float, oob: int) -> list[str]:
    return ["# Out of bounds values : %d %s" % (oob, "FAILED" if oob else "OK"),
            "# Avg bus bandwidth    : %g " % avg, "#"]


def footer_217(avg: float, oob: int, prog: str) -> list[str]:
    return ["# %-20s : %d %s" % ("Out of bounds values", oob, "FAILED" if oob else "OK"),
            "# %-20s : %g %s" % ("Avg bus bandwidth", avg, ""), "#",
            "# Collective test concluded: %s" % prog, "#", ""]


def nthread_old(g, b, e, step, kind, w, n, check) -> str:
    return ("# nThread 1 nGpus %d minBytes %d maxBytes %d step: %d(%s) warmup iters: %d iters: %d "
            "validation: %d " % (g, b, e, step, kind, w, n, check))


def nthread_new(g, b, e, step, kind, w, n, check) -> str:
    return ("# nThread 1 nGpus %d minBytes %d maxBytes %d step: %d(%s) warmup iters: %d iters: %d "
            "agg iters: 1 validation: %d graph: 0" % (g, b, e, step, kind, w, n, check))


# --- the files --------------------------------------------------------------------------------

V100_BUS = [0x06, 0x07, 0x0a, 0x0b, 0x85, 0x86, 0x89, 0x8a]
H100_BUS = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb]
M = 1 << 20


def old_all_reduce() -> str:
    sizes = geometric(8, 128 * M, 4)
    errs = {(i, p): (1e-07 if i >= 9 else 0.0) for i in range(len(sizes)) for p in range(2)}
    run = Run("all_reduce", "old", 8, "float", sizes, 28.0, 120.0, seed=1, error_values=errs)
    lines = ["$ ./build/all_reduce_perf -b 8 -e 128M -f 4 -g 8",
             nthread_old(8, 8, 128 * M, 4, "factor", 5, 20, 1), "#", "# Using devices"]
    lines += rank_lines("old", [("dgx1-07", 8)], 8, "Tesla V100-SXM2-32GB", V100_BUS, 40112)
    lines += ["NCCL version 2.11.4+cuda11.4", "#"] + old_header(["redop"]) + run.row_lines()
    return "\n".join(lines + footer(run.avg, 0)) + "\n"


def old_all_gather() -> str:
    sizes = geometric(1 * M, 64 * M, 2)
    run = Run("all_gather", "old", 4, "float", sizes, 20.0, 60.0, seed=2)
    lines = [nthread_old(4, 1 * M, 64 * M, 2, "factor", 5, 20, 1), "#", "# Using devices"]
    lines += rank_lines("old", [("gpu-node3", 4)], 4, "Tesla V100-PCIE-16GB", V100_BUS[:4], 2210)
    lines += ["#"] + old_header([]) + run.row_lines()
    return "\n".join(lines + footer(run.avg, 0)) + "\n"


def old_broadcast() -> str:
    sizes = geometric(1 * M, 32 * M, 2)
    run = Run("broadcast", "old", 2, "float", sizes, 45.0, 11.0, seed=3, check=False, root=0)
    lines = ["$ mpirun -np 2 --host v100-a:1,v100-b:1 ./build/broadcast_perf -b 1M -e 32M -f 2 -g 1 -c 0",
             nthread_old(1, 1 * M, 32 * M, 2, "factor", 5, 20, 0), "#", "# Using devices"]
    lines += rank_lines("old", [("v100-a", 1), ("v100-b", 1)], 1, "Tesla V100-PCIE-16GB", [0x00], 14926)
    lines += ["", "v100-a:14926:14926 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]",
              "NCCL version 2.9.6+cuda11.2", "",
              "v100-b:14933:14933 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]"]
    lines += ["#"] + old_header(["root"]) + run.row_lines()
    return "\n".join(lines + footer(run.avg, 0)) + "\n"


def old_reduce_scatter() -> str:
    sizes = geometric(64 * 1024, 256 * M, 4)
    errs = {(i, p): (2e-03 if i >= 3 else 0.0) for i in range(len(sizes)) for p in range(2)}
    run = Run("reduce_scatter", "old", 8, "half", sizes, 30.0, 110.0, seed=4, error_values=errs)
    lines = ["$ ./build/reduce_scatter_perf -b 64K -e 256M -f 4 -g 8 -d half",
             nthread_old(8, 64 * 1024, 256 * M, 4, "factor", 5, 20, 1), "#", "# Using devices"]
    lines += rank_lines("old", [("dgx1-07", 8)], 8, "Tesla V100-SXM2-32GB", V100_BUS, 40377)
    lines += ["#"] + old_header(["redop"]) + run.row_lines()
    return "\n".join(lines + footer(run.avg, 0)) + "\n"


def cycles_run(op: str, layout: str, n: int, dtype: str, sizes: list[int], lat: float, peak: float,
               seeds: tuple[int, ...]) -> Run:
    """nccl-tests -N k (common.cu TimeTest repeats the sweep k times into one table, no header between): k
    sweeps, each its own jitter, their rows in order; the average over every placement of every cycle
    (BenchTime adds each to bw[0]), the out-of-bounds count of all."""
    runs = [Run(op, layout, n, dtype, sizes, lat, peak, seed=s) for s in seeds]
    run = runs[0]
    run.rows = [r for one in runs for r in one.rows]
    busbws = [p["bus"] for r in run.rows for p in r["places"]]
    run.avg, run.oob = sum(busbws) / len(busbws), sum(one.oob for one in runs)
    return run


def v213_file(cmd: str, op: str, sizes: list[int], seed: int, *, lat: float, peak: float, check=True,
              redop="sum", root=-1, wrong=None, b=8, e=0, step=2, nccl="2.18.5+cuda12.2",
              cycles: tuple[int, ...] = ()) -> str:
    """cycles: the seeds of a -N run's cycles (cycles_run), in place of `seed`."""
    run = (cycles_run(op, "v213", 8, "float", sizes, lat, peak, cycles) if cycles else
           Run(op, "v213", 8, "float", sizes, lat, peak, seed=seed, check=check, redop=redop, root=root,
               wrong=wrong))
    lines = ["$ " + cmd, nthread_new(8, b, e, step, "factor", 5, 20, int(check)), "#", "# Using devices"]
    lines += rank_lines("v213", [("h100-node-01", 8)], 8, "NVIDIA H100 80GB HBM3", H100_BUS, 1187)
    lines += ["NCCL version " + nccl, "#"] + v213_header() + run.row_lines()
    return "\n".join(lines + footer(run.avg, run.oob) + [""]) + "\n"  # PRINT("%s\n", ncclGetLastError)


def new_all_reduce() -> str:
    sizes = geometric(8, 1 << 30, 4)
    return v213_file("./build/all_reduce_perf -b 8 -e 1G -f 4 -g 8", "all_reduce", sizes, 5,
                     lat=14.0, peak=260.0, b=8, e=1 << 30, step=4)


def new_all_reduce_no_ll() -> str:
    """new_all_reduce's sweep (same seed, sizes, peak) with NCCL_PROTO=^LL: the LL protocol off, so the small
    messages go by LL128 and Simple and pay their latency (14 -> 20 us here, illustrative); the bandwidth-bound
    sizes, and so the average busbw, hardly move (132.8 -> 124.5 GB/s, within a 10 % tolerance)."""
    sizes = geometric(8, 1 << 30, 4)
    return v213_file("NCCL_PROTO=^LL ./build/all_reduce_perf -b 8 -e 1G -f 4 -g 8", "all_reduce", sizes, 5,
                     lat=20.0, peak=260.0, b=8, e=1 << 30, step=4)


def new_all_reduce_cycles() -> str:
    """new_all_reduce's sweep run with -N 3: three cycles (seeds 5, 6, 7) in one table, one footer."""
    sizes = geometric(8, 1 << 30, 4)
    return v213_file("./build/all_reduce_perf -b 8 -e 1G -f 4 -g 8 -N 3", "all_reduce", sizes, 5,
                     lat=14.0, peak=260.0, b=8, e=1 << 30, step=4, cycles=(5, 6, 7))


def new_broadcast() -> str:
    sizes = geometric(1024, 256 * M, 4)
    return v213_file("./build/broadcast_perf -b 1K -e 256M -f 4 -g 8 -c 0", "broadcast", sizes, 6,
                     lat=12.0, peak=350.0, check=False, redop="none", root=0, b=1024, e=256 * M, step=4)


def new_reduce_wrong() -> str:
    sizes = geometric(1 * M, 64 * M, 4)
    return v213_file("./build/reduce_perf -b 1M -e 64M -f 4 -g 8", "reduce", sizes, 7, lat=15.0,
                     peak=300.0, redop="sum", root=0, wrong={(2, 1): 1048576}, b=1 * M, e=64 * M, step=4)


def v217_lines(op: str, prog: str, run: Run, hosts, per_proc: int, gpu: str, args: tuple,
               timestamps: list[str] | None = None, json_path: str | None = None,
               headers=22703, library=22703, version="2.17.9") -> list[str]:
    g, b, e, step, w, n = args
    lines = ["# Writing JSON output to %s" % json_path] if json_path else []
    lines += ["# nccl-tests version %s nccl-headers=%d nccl-library=%d" % (version, headers, library),
              "# Collective test starting: %s" % prog,
              nthread_new(g, b, e, step, "factor", w, n, int(run.check)), "#", "# Using devices"]
    lines += rank_lines("v217", hosts, per_proc, gpu, H100_BUS, 5101)
    return lines + v217_header(bool(timestamps)) + run.row_lines(timestamps)


def new_all_gather() -> str:
    sizes = geometric(8, 256 * M, 2)
    run = Run("all_gather", "v217", 8, "float", sizes, 11.0, 380.0, seed=8, redop="none")
    lines = v217_lines("all_gather", "all_gather_perf", run, [("h100-node-02", 8)], 8,
                       "NVIDIA H100 80GB HBM3", (8, 8, 256 * M, 2, 1, 20))
    return "\n".join(lines + footer_217(run.avg, run.oob, "all_gather_perf")) + "\n"


def new_reduce_scatter_mpi() -> str:
    sizes = geometric(1 * M, 1 << 30, 4)
    run = Run("reduce_scatter", "v217", 16, "bfloat16", sizes, 40.0, 95.0, seed=9, redop="avg")
    lines = v217_lines("reduce_scatter", "reduce_scatter_perf", run,
                       [("node-a", 8), ("node-b", 8)], 8, "NVIDIA H100 80GB HBM3",
                       (8, 1 * M, 1 << 30, 4, 1, 20))
    lines += footer_217(run.avg, run.oob, "reduce_scatter_perf")
    tagged = ["[1,0]<stdout>:" + ln for ln in lines]
    cmd = ("$ mpirun -np 2 -H node-a:1,node-b:1 --tag-output ./build/reduce_scatter_perf "
           "-b 1M -e 1G -f 4 -g 8 -d bfloat16 -o avg")
    return "\n".join([cmd] + tagged) + "\n"


def new_sendrecv() -> str:
    sizes = geometric(1024, 64 * M, 4)
    run = Run("sendrecv", "v217", 8, "float", sizes, 9.0, 190.0, seed=10, redop="none")
    stamps = ["2025-07-14 10:21:%02d" % (7 + i) for i in range(len(sizes))]
    lines = v217_lines("sendrecv", "sendrecv_perf", run, [("h100-node-02", 8)], 8,
                       "NVIDIA H100 80GB HBM3", (8, 1024, 64 * M, 4, 1, 20), timestamps=stamps)
    return "\n".join(lines + footer_217(run.avg, run.oob, "sendrecv_perf")) + "\n"


def new_alltoall() -> str:
    sizes = geometric(1 * M, 512 * M, 2)
    run = Run("all_to_all", "v217", 8, "float", sizes, 25.0, 230.0, seed=11, redop="none")
    lines = v217_lines("all_to_all", "alltoall_perf", run, [("h100-node-02", 8)], 8,
                       "NVIDIA H100 80GB HBM3", (8, 1 * M, 512 * M, 2, 1, 20))
    return "\n".join(lines + footer_217(run.avg, run.oob, "alltoall_perf")) + "\n"


# --- outputs as pasted in issues: no binary name anywhere ------------------------------------

def unnamed_v213(op: str, hosts: list[tuple[str, int]], gpus_per_proc: int, gpu: str, sizes: list[int],
                 seed: int, *, lat: float, peak: float, redop: str = "sum", b: int, e: int, step: int,
                 nccl: str) -> str:
    """A v2.13 output from its "# nThread" line on (no shell line, no binary name): hosts are
    (name, GPUs) and each process drives gpus_per_proc of them (1: mpirun, one process per GPU)."""
    n = sum(count for _, count in hosts)
    run = Run(op, "v213", n, "float", sizes, lat, peak, seed=seed, redop=redop)
    lines = [nthread_new(gpus_per_proc, b, e, step, "factor", 5, 20, 1), "#", "# Using devices"]
    rank = 0
    for h, (host, count) in enumerate(hosts):
        for d in range(count):
            pid = 30211 + 97 * h + (d // gpus_per_proc)
            lines.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [0x%02x] %s"
                         % (rank, 0, pid, host, d, H100_BUS[d % len(H100_BUS)], gpu))
            rank += 1
    lines += ["NCCL version " + nccl, "#"] + v213_header() + run.row_lines()
    return "\n".join(lines + footer(run.avg, run.oob) + [""]) + "\n"


def unnamed_all_reduce_2node() -> str:
    return unnamed_v213("all_reduce", [("gpu-a01", 4), ("gpu-a02", 4)], 1, "NVIDIA A100-SXM4-80GB",
                        geometric(1 * M, 1 << 30, 4), 14, lat=60.0, peak=6.0, b=1 * M, e=1 << 30, step=4,
                        nccl="2.19.3+cuda12.3")


def unnamed_all_gather_1node() -> str:
    return unnamed_v213("all_gather", [("h100-node-07", 8)], 8, "NVIDIA H100 80GB HBM3",
                        geometric(1 * M, 512 * M, 2), 15, lat=16.0, peak=370.0, redop="none", b=1 * M,
                        e=512 * M, step=2, nccl="2.21.5+cuda12.4")


def unnamed_alltoall_2node() -> str:
    return unnamed_v213("all_to_all", [("node-17", 8), ("node-18", 8)], 8, "NVIDIA H100 80GB HBM3",
                        geometric(1 * M, 1 << 30, 4), 16, lat=45.0, peak=60.0, redop="none", b=1 * M,
                        e=1 << 30, step=4, nccl="2.21.5+cuda12.4")


def unnamed_broadcast_table() -> str:
    """Only the table and its footer, as most issue posts show it: an old-layout broadcast (root
    column) over 2 processes; no Rank lines, so the rank count is not printed either."""
    run = Run("broadcast", "old", 2, "float", geometric(8 * M, 256 * M, 2), 70.0, 9.5, seed=17, root=0)
    return "\n".join(["#"] + old_header(["root"]) + run.row_lines() + footer(run.avg, 0)) + "\n"


# --- -J JSON (util.cu) ------------------------------------------------------------------------

def jstr(s: str) -> str:  # util.cu sanitizeJson: escapes " \ / tab newline
    out = s.replace("\\", "\\\\").replace('"', '\\"').replace("/", "\\/").replace("\t", "\\t")
    return '"' + out.replace("\n", "\\n") + '"'


def jdouble(x: float) -> str:
    return "%f" % x


def json_run(run: Run, *, version: int, args: list[str], env: list[str], nccl_code: int, g: int,
             b: int, e: int, step: int, devices: list[tuple], start: str, end: str | None,
             fail_at: int | None = None, per_iter: bool = False) -> str:
    """The JSON util.cu writes: jsonOutputInit, writeDeviceReport, writeResultHeader, one object per
    row (preamble, out_of_place, in_place, terminator), writeResultFooter, writeErrors, finalize.
    fail_at: the row during whose in-place measurement the run failed; version 2's finalize then
    closes the open row, the results list and the document (util.cu jsonFinishCurrent)."""
    parts = ['{"version":%d' % version, '"start_time":%s' % jstr(start),
             '"args":[%s]' % ",".join(jstr(a) for a in args), '"env":[%s]' % ",".join(jstr(v) for v in env),
             '"nccl_version":%d' % nccl_code]
    cfg = ['"nthreads":1', '"ngpus":%d' % g, '"minimum_bytes":%d' % b, '"maximum_bytes":%d' % e,
           '"step_factor":%d' % step, '"warmup_iters":1', '"iterations":20', '"aggregated_iterations":1',
           '"validation":%d' % int(run.check), '"graph":0', '"blocking_collectives":"false"']
    if per_iter:
        cfg.append('"per_iter_timing":"false"')
    cfg.append('"parallel_init":"false"')
    devs = ['{"rank":%d,"group":0,"pid":%d,"hostname":%s,"device":%d,"device_hex":%s,"device_info":%s}'
            % (r, pid, jstr(h), d, jstr(hexid), jstr(info)) for r, pid, h, d, hexid, info in devices]
    cfg.append('"devices":[%s]' % ",".join(devs))
    parts.append('"config":{%s}' % ",".join(cfg))
    rows = []
    for k, r in enumerate(run.rows):
        fields = ['"size":%d' % r["size"], '"count":%d' % r["count"], '"type":%s' % jstr(run.dtype),
                  '"redop":%s' % jstr(run.redop), '"root":%s' % jstr("%6i" % run.root)]
        for name, p in zip(("out_of_place", "in_place"), r["places"]):
            if fail_at == k and name == "in_place":
                break
            wrong = jdouble(float(p["wrong"])) if p["report"] else "null"
            fields.append('"%s":{"time":%s,"alg_bw":%s,"bus_bw":%s,"nwrong":%s}'
                          % (name, jdouble(p["us"]), jdouble(p["alg"]), jdouble(p["bus"]), wrong))
        else:
            fields += ['"actual_iterations":20', '"experiment_name":""']
        rows.append("{" + ",".join(fields) + "}")
        if fail_at == k:
            break
    if fail_at is not None:
        parts.append('"results":[%s]' % ",".join(rows))
        return ",".join(parts) + "}"
    parts.append('"results":[%s]' % ",".join(rows))
    parts.append('"out_of_bounds":{"count":%d,"okay":%s}' % (run.oob, jstr("false" if run.oob else "true")))
    parts.append('"average_bus_bandwidth":{"bandwidth":%s,"okay":"unchecked"}' % jdouble(run.avg))
    parts.append('"errors":[""]')
    parts.append('"end_time":%s' % jstr(end))
    return ",".join(parts) + "}"


JSON_ENV = ["OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2", "NCCL_DEBUG=VERSION",
            "NCCL_IB_HCA=mlx5_0,mlx5_3", "NCCL_SOCKET_IFNAME=eth0", "CUDA_VISIBLE_DEVICES=0,1,2,3",
            "PATH=/usr/local/cuda/bin:/usr/bin:/bin", "HOME=/root"]


def json_all_reduce() -> tuple[str, str]:
    """all_reduce_perf -J over 2 processes x 4 GPUs (MPI): the JSON and the same run's stdout."""
    sizes = geometric(8, 128 * M, 4)
    run = Run("all_reduce", "v217", 8, "float", sizes, 24.0, 45.0, seed=12)
    args = ["./build/all_reduce_perf", "-b", "8", "-e", "128M", "-f", "4", "-g", "4", "-J", "ar.json"]
    devices = [(0, 5101, "node-a", 0, "0000:18:00", "NVIDIA H100 80GB HBM3"),
               (4, 5108, "node-b", 0, "0000:18:00", "NVIDIA H100 80GB HBM3")]
    text_json = json_run(run, version=1, args=args, env=JSON_ENV, nccl_code=22703, g=4, b=8,
                         e=128 * M, step=4, devices=devices, start="2025-07-14 10:21:07",
                         end="2025-07-14 10:21:19")
    lines = v217_lines("all_reduce", "all_reduce_perf", run, [("node-a", 4), ("node-b", 4)], 4,
                       "NVIDIA H100 80GB HBM3", (4, 8, 128 * M, 4, 1, 20), json_path="ar.json")
    lines += footer_217(run.avg, run.oob, "all_reduce_perf")
    return text_json + "\n", "\n".join(lines) + "\n"


def json_all_reduce_cycles() -> str:
    """json_all_reduce's run with -N 3: one "results" array of three cycles (seeds 12, 14, 16)."""
    sizes = geometric(8, 128 * M, 4)
    run = cycles_run("all_reduce", "v217", 8, "float", sizes, 24.0, 45.0, (12, 14, 16))
    args = ["./build/all_reduce_perf", "-b", "8", "-e", "128M", "-f", "4", "-g", "4", "-N", "3", "-J", "ar3.json"]
    devices = [(0, 5101, "node-a", 0, "0000:18:00", "NVIDIA H100 80GB HBM3"),
               (4, 5108, "node-b", 0, "0000:18:00", "NVIDIA H100 80GB HBM3")]
    return json_run(run, version=1, args=args, env=JSON_ENV, nccl_code=22703, g=4, b=8, e=128 * M, step=4,
                    devices=devices, start="2025-07-14 10:30:02", end="2025-07-14 10:30:37") + "\n"


def json_all_gather_failed() -> str:
    """JSON_FILE_VERSION 2 of a run that failed in the in-place half of its 6th row."""
    sizes = geometric(1 * M, 1 << 30, 2)
    run = Run("all_gather", "v217", 8, "bfloat16", sizes, 13.0, 370.0, seed=13, redop="none")
    args = ["/opt/nccl-tests/build/all_gather_perf", "-b", "1M", "-e", "1G", "-f", "2", "-g", "8",
            "-d", "bfloat16", "-J", "/tmp/ag.json"]
    devices = [(0, 7702, "h100-node-05", 0, "0000:18:00", "NVIDIA H100 80GB HBM3")]
    return json_run(run, version=2, args=args, env=["NCCL_DEBUG=WARN", "HOME=/root"], nccl_code=22803,
                    g=8, b=1 * M, e=1 << 30, step=2, devices=devices, start="2025-09-02 08:00:01",
                    end=None, fail_at=5, per_iter=True) + "\n"


FILES = {
    "old_all_reduce.txt": old_all_reduce,
    "old_all_gather.txt": old_all_gather,
    "old_broadcast_2proc.txt": old_broadcast,
    "old_reduce_scatter.txt": old_reduce_scatter,
    "new_all_reduce.txt": new_all_reduce,
    "new_all_reduce_no_ll.txt": new_all_reduce_no_ll,
    "new_all_reduce_cycles.txt": new_all_reduce_cycles,
    "json_all_reduce_cycles.json": json_all_reduce_cycles,
    "new_broadcast.txt": new_broadcast,
    "new_reduce_wrong.txt": new_reduce_wrong,
    "new_all_gather.txt": new_all_gather,
    "new_reduce_scatter_mpi.txt": new_reduce_scatter_mpi,
    "new_sendrecv_timestamps.txt": new_sendrecv,
    "new_alltoall.txt": new_alltoall,
    "json_all_gather_v2_failed.json": json_all_gather_failed,
    "unnamed_2node_8gpu.txt": unnamed_all_reduce_2node,
    "unnamed_1node_8gpu.txt": unnamed_all_gather_1node,
    "alltoall-16gpu.log": unnamed_alltoall_2node,
    "unnamed_table_2proc.txt": unnamed_broadcast_table,
}


def all_files() -> dict[str, str]:
    out = {name: fn() for name, fn in FILES.items()}
    out["json_all_reduce_v1.json"], out["json_all_reduce_v1.stdout.txt"] = json_all_reduce()
    # cut versions (see README.md)
    full = out["new_all_reduce.txt"]
    rows = [i for i, ln in enumerate(full.splitlines()) if ln[:1] == " " and ln.split()[0].isdigit()]
    lines = full.splitlines()
    cut_row = lines[rows[9]]
    out["cut_mid_row.txt"] = "\n".join(lines[:rows[9]]) + "\n" + cut_row[:len(cut_row) - 23]
    out["cut_before_footer.txt"] = "\n".join(lines[:rows[9] + 1]) + "\n"
    ag = out["new_all_gather.txt"].splitlines()
    agrows = [i for i, ln in enumerate(ag) if ln[:1] == " " and ln.split()[0].isdigit()]
    k = agrows[20]
    partial = ag[k][:ag[k].index("      -1") + 8 + 33]  # preamble + out-of-place body
    out["failed_mid_row.txt"] = "\n".join(ag[:k] + [
        partial + "h100-node-02: Test NCCL failure common.cu:1093 'unhandled cuda error (run with "
        "NCCL_DEBUG=INFO for details) / '",
        " .. h100-node-02 pid 5101: Test failure common.cu:401",
        " .. h100-node-02 pid 5101: Test failure common.cu:612"]) + "\n"
    js = out["json_all_reduce_v1.json"]
    pos = js.index('{"size":33554432')  # the run's 12th row
    out["json_all_reduce_v1_cut.json"] = js[:pos + 120]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the files (default: list them)")
    args = parser.parse_args(argv)
    for name, text in all_files().items():
        if args.write:
            (HERE / name).write_text(text, encoding="utf-8")
        print(f"{name}: {len(text.splitlines())} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
