"""The host's exchange latency: a one-byte TCP ping-pong over loopback between this process and a child, each pinned
to its own CPU, the round trip timed. It is what a small gloo collective between two ranks of one host waits on
(a send, the peer's wake-up, its reply) without gloo, so a change in gloo does not move it while a slow spell of the
host does: on the 2-core Zen 5 VM its lower quartile read 37-41 us most of the time and 49-56 us through the spells
in which gloo's small all_reduce read 1.4-1.8x its usual lower quartile (tests/perf/exchange_spells.py).

    python -m benchmarks.node.exchange [ROUND_TRIPS]       # prints {p25_us, median_us, p90_us, n, cpus}
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from typing import Any, Collection, Optional

ROUND_TRIPS = 2000
"""About 0.1 s at 40-50 us a round trip."""


def _pinned(cpu: Optional[int]) -> None:
    if cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})


def _echo(port: int, cpu: Optional[int], n: int) -> None:
    """The child: connect, then send back every byte received, n times."""
    _pinned(cpu)
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(n):
            s.sendall(s.recv(1))


def two_cpus(allowed: Optional[Collection[int]] = None) -> tuple[Optional[int], Optional[int]]:
    """The first two of `allowed` (default: the CPUs this thread may use; a rank bound to one CPU passes the set it
    had before: benchmarks/node/environment.py bind_rank binds the sweep's ranks to them in that order); None, None
    where there are fewer than two or no affinity to read."""
    if allowed is None and not hasattr(os, "sched_getaffinity"):
        return None, None
    cpus = sorted(os.sched_getaffinity(0) if allowed is None else allowed)
    return (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)


def exchange(n: int = ROUND_TRIPS, allowed: Optional[Collection[int]] = None) -> dict[str, Any]:
    """n round trips with a child process on the second of the `allowed` CPUs, this thread on the first (two_cpus);
    the quartiles of their times in microseconds."""
    mine, theirs = two_cpus(allowed)
    restore = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None   # this thread's, put back after
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        child = subprocess.Popen([sys.executable, "-c", "from benchmarks.node.exchange import _echo; "
                                  f"_echo({server.getsockname()[1]}, {theirs}, {n})"],
                                 cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        try:
            _pinned(mine)
            conn, _ = server.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                times = []
                for _ in range(n):
                    start = time.perf_counter()
                    conn.sendall(b"x")
                    conn.recv(1)
                    times.append((time.perf_counter() - start) * 1e6)
        finally:
            child.wait(timeout=30)
            if restore is not None:
                os.sched_setaffinity(0, restore)
    times.sort()
    return {"p25_us": times[len(times) // 4], "median_us": times[len(times) // 2],
            "p90_us": times[len(times) * 9 // 10], "n": n, "cpus": [mine, theirs]}


if __name__ == "__main__":
    print(json.dumps(exchange(int(sys.argv[1]) if len(sys.argv) > 1 else ROUND_TRIPS)))
