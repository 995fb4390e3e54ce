"""Whom a profiled collective waited for. A call timed on its own (benchmarks/training/instrument.py) lasts from
its rank's arrival until the data has moved; if a peer reached the same call later, the first part of it was spent
waiting for that peer (rank skew: a rank still computing, a straggler), not moving data. Each rank stamps its
profiled calls with their entry and exit on its host's monotonic clock (time.perf_counter); after the last profiled
step the first rank gathers every rank's stamps of every profiled step and matches them call by call: the ranks of
one data-parallel group issue the same collectives in the same order, so the i-th call of each is one collective.
Once, not after each step: a gather is a barrier, and one between two profiled steps would line the ranks up at the
second's start, hiding the lag a straggler carries out of one step into the next (its work after the step's last
collective) and shortening the second step by it. Measured on llama-tiny ZeRO-3, ga 4, two profiled steps, rank 1
sleeping 0.15 s after each micro-step: gathered after each step, the second step lasted 0.99 s against the first's
1.14 and its first micro-step waited 0.004 s for a peer; gathered once, 1.17 and 1.16 s, every micro-step ~0.15.
For each of the first rank's calls that gives `peer_wait_s`, the latest arrival among the ranks of the call's
process group (every rank for the default group; a ZeRO++ or MiCS subgroup's own) minus its own, at most the call's
time: harness/held_up.py counts it as waiting for a peer, and looks at the rest of the call for the host's stalls.
For each rank it gives how often it came last to a call of its group and by how much it held the others back (its
arrival minus the next latest), which names a straggler. Where the ranks span hosts, the same for each host (its
arrival at a call the latest of its ranks', held back against the next latest host): a slow node, whose ranks all
come late together, holds the others back by its lag while each of its ranks leads the next latest, its own
neighbour, by nothing (a node of two ranks 0.15 s late read 0.001 s held back per rank, 0.15 s for the node).

Clocks: ranks on one kernel (/proc's boot_id) in one time namespace read the same CLOCK_MONOTONIC. A time namespace
may offset it (`unshare --time --monotonic`; the emulated cluster's nodes with a clock skew, testbed/network.py), so
the clock a rank reads is its boot_id and its time namespace together (clock_id). A rank on another clock is put on
the first rank's by the median, over the step's calls, of the difference of their exits: a collective completes on
every rank within about a message's latency of the others, while an arrival may lag by a compute phase, so the median
of the exits is the clocks' offset to about that latency. Measured on the emulated cluster with node2's clock 1234 s
ahead (`make cluster-up CLOCK_SKEW=1234`; llama-tiny ZeRO-1, two ranks a node, 1 Gbit/s, node2's ranks sleeping
0.15 s a micro-step; 2026-12-06, three runs): the 12 offsets estimated were 1234 s to within 0.0-2.8 ms (median
0.3 ms), and node2 was named as on one clock (43-44 % held back; 43 % there). Read as one clock, as before the time
namespace was part of it, node2 held the others back 12,341 s of two 1.4 s steps and every call waited 100 % for a
peer.

Nothing is told apart where the ranks' calls do not match (point-to-point sends, a rank that issued more): the step
then says why, and its calls carry no peer_wait_s."""
from __future__ import annotations

import os
import socket
import statistics
from pathlib import Path
from typing import Any, Optional

from benchmarks.node.network import read_stripped

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
TIME_NAMESPACE = "/proc/self/ns/time"


def clock_id() -> Optional[str]:
    """Which CLOCK_MONOTONIC this process reads: its kernel's (boot_id) as its time namespace offsets it; None where
    the boot_id cannot be read (then no two ranks are taken to share a clock)."""
    boot = read_stripped(BOOT_ID)
    if boot is None:
        return None
    try:
        return f"{boot} {os.readlink(TIME_NAMESPACE)}"
    except OSError:          # a kernel without time namespaces (before 5.6): one monotonic clock per boot
        return boot


Stamp = tuple[float, float, Optional[tuple[int, ...]]]


def call_log(rank: int, calls: list[tuple[str, int]], stamps: list[Stamp]) -> dict[str, Any]:
    """One rank's profiled calls of a step: [(op, bytes)] with their [(entry, exit, group)] in the same order, each
    call [op, bytes, entry, exit, g]: g the index of its process group's ranks in `groups`, -1 for every rank."""
    groups: dict[tuple[int, ...], int] = {}
    out = [[op, nbytes, entry, leave, -1 if group is None else groups.setdefault(group, len(groups))]
           for (op, nbytes), (entry, leave, group) in zip(calls, stamps)]
    return {"rank": rank, "host": socket.gethostname(), "clock": clock_id(), "calls": out,
            "groups": [list(g) for g in groups]}


def _group(log: dict[str, Any], call: list) -> Optional[tuple[int, ...]]:
    """The ranks a rank's call waits for; None for every rank."""
    return tuple(log["groups"][call[4]]) if len(call) > 4 and call[4] >= 0 else None


def unmatched(logs: list[dict[str, Any]]) -> Optional[str]:
    """Why the ranks' calls cannot be matched one to one, or None when they can."""
    first = logs[0]
    for log in logs[1:]:
        if len(log["calls"]) != len(first["calls"]):
            return (f"rank {log['rank']} issued {len(log['calls'])} profiled calls, rank {first['rank']} "
                    f"{len(first['calls'])}")
        for i, (a, b) in enumerate(zip(first["calls"], log["calls"])):
            if a[:2] != b[:2]:
                return (f"call {i}: rank {first['rank']} issued {a[0]} of {a[1]} bytes, rank {log['rank']} "
                        f"{b[0]} of {b[1]} bytes")
    return None


def clock_offsets(logs: list[dict[str, Any]]) -> list[float]:
    """Each rank's clock minus the first rank's: 0 on the first rank's clock (clock_id), else the median exit
    difference."""
    first = logs[0]
    out = []
    for log in logs:
        same = log["clock"] is not None and log["clock"] == first["clock"]
        out.append(0.0 if same or not log["calls"] else
                   statistics.median(b[3] - a[3] for a, b in zip(first["calls"], log["calls"])))
    return out


def arrivals(logs: list[dict[str, Any]]) -> dict[str, Any]:
    """From every rank's call_log of one profiled step (in rank order, the first rank's first): the first rank's
    `peer_wait_s` per call, and per rank how many calls it came last to and how long it held the others back, and per
    host (`hosts`, where they are more than one) the same; {"unmatched": why} where the calls cannot be matched."""
    why = unmatched(logs) if len(logs) > 1 else "a single rank"
    if why:
        return {"unmatched": why}
    offsets = clock_offsets(logs)
    hosts = list(dict.fromkeys(log["host"] for log in logs))
    host_of = [hosts.index(log["host"]) for log in logs]
    waits = []
    last_calls, held_back = [0] * len(logs), [0.0] * len(logs)
    host_calls, host_held = [0] * len(hosts), [0.0] * len(hosts)
    for i, mine in enumerate(logs[0]["calls"]):
        arrived = [log["calls"][i][2] - off for log, off in zip(logs, offsets)]
        together: dict[Optional[tuple[int, ...]], list[int]] = {}   # the ranks of each process group at this call
        for place, log in enumerate(logs):
            together.setdefault(_group(log, log["calls"][i]), []).append(place)
        peers = together[_group(logs[0], mine)]
        waits.append(min(max(max(arrived[p] for p in peers) - arrived[0], 0.0), mine[3] - mine[2]))
        for places in together.values():
            _credit_latest({p: arrived[p] for p in places}, last_calls, held_back)
            by_host: dict[int, float] = {}          # each host's arrival: its latest rank's
            for p in places:
                by_host[host_of[p]] = max(by_host.get(host_of[p], arrived[p]), arrived[p])
            _credit_latest(by_host, host_calls, host_held)
    out: dict[str, Any] = {
        "peer_wait_s": waits, "calls": len(waits),
        "ranks": [{"rank": log["rank"], "host": log["host"], "last_calls": n, "held_back_s": s}
                  for log, n, s in zip(logs, last_calls, held_back)]}
    if len(hosts) > 1:
        out["hosts"] = [{"host": h, "ranks": [log["rank"] for log in logs if log["host"] == h], "last_calls": n,
                         "held_back_s": s} for h, n, s in zip(hosts, host_calls, host_held)]
    if any(offsets):
        out["clock_offset_s"] = {str(log["rank"]): off for log, off in zip(logs, offsets) if off}
    return out


def _credit_latest(arrived: dict[int, float], last_calls: list[int], held_back: list[float]) -> None:
    """Of two or more arrivals at one call ({who: when}), the latest's lead over the next latest, to the latest."""
    if len(arrived) < 2:
        return
    order = sorted(arrived, key=arrived.__getitem__)
    lag = arrived[order[-1]] - arrived[order[-2]]
    if lag > 0:
        last_calls[order[-1]] += 1
        held_back[order[-1]] += lag


def gather(rank: int, world_size: int,
           steps: list[tuple[int, list[tuple[str, int]], list[Stamp]]]) -> Optional[list[dict[str, Any]]]:
    """Every rank joins once, with each profiled step's (index, calls, stamps): the first rank gets
    [{"index": index, **arrivals()}] of each step, the others None."""
    import torch.distributed as dist

    mine = {"rank": rank, "steps": [(index, call_log(rank, calls, stamps)) for index, calls, stamps in steps]}
    everyone: Optional[list] = [None] * world_size if rank == 0 else None
    dist.gather_object(mine, everyone, dst=0)
    if not everyone:
        return None
    ranks = sorted(everyone, key=lambda r: r["rank"])
    return [{"index": index, **arrivals([r["steps"][k][1] for r in ranks])}
            for k, (index, _) in enumerate(ranks[0]["steps"])]


def annotate(microsteps: list[dict[str, Any]], found: dict[str, Any]) -> None:
    """Write each call's peer_wait_s into the first rank's micro-steps (their collectives in the order issued)."""
    if "peer_wait_s" not in found:
        return
    waits = iter(found["peer_wait_s"])
    for m in microsteps:
        for c in m["collectives"]:
            c["peer_wait_s"] = next(waits)


def into_steps(steps: list[dict[str, Any]], found: list[dict[str, Any]]) -> None:
    """Write gather()'s findings into the first rank's steps (TRAIN_STEP values), matched by index: each step's
    `arrivals` (calls, ranks, clock offsets, or why unmatched) and each of its calls' peer_wait_s."""
    by_index = {s["index"]: s for s in steps}
    for one in found:
        step = by_index.get(one["index"])
        if step is None or "microsteps" not in step:
            continue
        annotate(step["microsteps"], one)
        step["arrivals"] = {k: v for k, v in one.items() if k not in ("peer_wait_s", "index")}
