"""The nodes of a run: each node's machine as the first rank on it read it (rank 0's in its
ENVIRONMENT event, every other node's in a NODE event of its own rank's event log), and the flat
summary of their link rates that comparisons read (`environment.nodes`, `environment.links`).
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Optional

from contract import events as ev

BRIDGE_PORT_KINDS = ("veth", "tun")
"""A veth or tap enslaved to a bridge is a container's or VM's port: it comes and goes with them and
is no link of the node, so it is not in `links`."""


def node_views(run_dir: Path, rank0_env: Optional[dict[str, Any]]) -> list[dict[str, Any]]:
    """[{host, machine}] sorted by host: one per node (rank 0's own view for its node)."""
    views: dict[str, Any] = {}
    for path in sorted(Path(run_dir).glob("events.rank*.jsonl")):
        for e in ev.read_events(path):
            value = e.get("value")
            if e.get("key") == ev.NODE and isinstance(value, dict) and value.get("host"):
                views.setdefault(value["host"], value.get("machine"))
    if rank0_env and rank0_env.get("host") and rank0_env.get("machine") is not None:
        views[rank0_env["host"]] = rank0_env["machine"]
    return [{"host": host, "machine": machine} for host, machine in sorted(views.items())]


def links(nodes: list[dict[str, Any]]) -> dict[str, float]:
    """{"<host>/<interface>": rate_gbps} over every node's interfaces and InfiniBand ports that
    have a rate (loopback is never listed; a container's bridge port is left out)."""
    out: dict[str, float] = {}
    for node in nodes:
        nics = (node.get("machine") or {}).get("nics") or []
        for nic in nics:
            rate = nic.get("rate_gbps")
            if not isinstance(rate, (int, float)) or rate <= 0 or (nic.get("master") and nic.get("kind") in BRIDGE_PORT_KINDS):
                continue
            out[f"{node['host']}/{nic['name']}"] = rate
    return dict(sorted(out.items()))


def load_during(windows: list[dict[str, Any]], before: Optional[list[float]] = None) -> Optional[dict[str, Any]]:
    """How busy the machines were while the run measured (each rank's LOAD window): per kernel
    (boot_id; the emulated cluster's nodes share one), the machine's busy CPUs (the median over the
    ranks that read it), this run's ranks' own CPUs (their sum), the other work (the difference),
    on a virtual machine the CPUs' worth its hypervisor took (steal, the median; None where no rank
    read it: a record from before) and the CPUs' worth of time the ranks were ready to run and waited
    for a CPU (wait_cpus, their sum; None unless every rank read it); the record keeps the busiest
    kernel's figures (other work and steal together), the 1-minute load averages before and after, the
    hosts, and the slowest node's pace (pulse_fp32, pulse_of), memory pace (pulse_triad) and, on cpu, exchange
    latency (pulse_exchange_us); every rank's own device's pace, read all at once, its slowest and fastest
    (pulse_devices); and the same figures over the timed step at the run's median (at_median), the
    busiest kernel's, where the ranks kept their steps. None when no rank reported (a failed run, a record from
    before)."""
    windows = [w for w in windows or [] if isinstance(w, dict)]
    if not windows:
        return None
    kernels: dict[str, list[dict[str, Any]]] = {}
    for w in windows:
        kernels.setdefault(_kernel(w), []).append(w)
    figures, medians = [], []
    for ranks in kernels.values():
        if (f := kernel_figures(ranks)) is not None:
            figures.append(f)
        if (m := at_median(ranks)) is not None:
            medians.append(m)
    first = min(windows, key=lambda w: w.get("rank", 0))
    worst = max(figures, key=_taken) if figures else {}
    paces = [p for p in (pulse_of(w) for w in windows) if p is not None]
    memory = [p for p in (pulse_of(w, "triad") for w in windows) if p is not None]
    exchange = [p for p in (pulse_of(w, "exchange") for w in windows) if p is not None]
    devices = pulse_devices(windows)
    return {"window_s": first.get("wall_s"),
            **{k: worst.get(k) for k in ("busy_cpus", "run_cpus", "other_cpus", "steal_cpus", "wait_cpus")},
            "load_avg_before": before, "load_avg_after": first.get("load_avg_1_5_15"),
            "kernels": len(kernels), "hosts": sorted({str(w.get("host")) for w in windows}),
            "pulse_fp32": round(min(paces), 3) if paces else None,
            "pulse_triad": round(min(memory), 3) if memory else None,
            **({"pulse_exchange_us": round(max(exchange), 2)} if exchange else {}),
            **({"pulse_devices": devices} if devices else {}),
            **({"at_median": max(medians, key=_taken)} if medians else {})}


def _kernel(window: dict[str, Any]) -> str:
    """The machine a rank's window was read on: its kernel (boot_id; the emulated cluster's nodes share one), else
    its host."""
    return window.get("boot_id") or window.get("host") or "?"


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _taken(f: dict[str, Any]) -> float:
    return f["other_cpus"] + (f["steal_cpus"] or 0.0)


def kernel_figures(ranks: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """One kernel's load from its ranks' windows (or one step of them): the machine's busy CPUs (the median over
    the ranks that read it), the ranks' own (their sum), the other work (the difference), the steal (the median)
    and the ranks' wait for a CPU (their sum, where every rank read it); None where a rank lacks its own CPUs."""
    busy = [w["busy_cpus"] for w in ranks if _num(w.get("busy_cpus"))]
    own = [w["own_cpus"] for w in ranks if _num(w.get("own_cpus"))]
    steal = [w["steal_cpus"] for w in ranks if _num(w.get("steal_cpus"))]
    wait = [w["wait_cpus"] for w in ranks if _num(w.get("wait_cpus"))]
    if not busy or len(own) != len(ranks):
        return None
    b = statistics.median(busy)
    return {"busy_cpus": round(b, 2), "run_cpus": round(sum(own), 2), "other_cpus": round(max(b - sum(own), 0.0), 2),
            "steal_cpus": round(statistics.median(steal), 2) if steal else None,
            "wait_cpus": round(sum(wait), 2) if len(wait) == len(ranks) else None}


def at_median(ranks: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """One kernel's load over the timed step (two steps, of an even count) the run's median step time, and its
    samples/s, is taken from (LoadWindow's `steps`, marked by every rank around each timed step; a step's time the
    median over the ranks), its figures as kernel_figures reads a window, averaged over those steps' time. A run's
    window also holds its warm-up and profiled steps and every other timed step: beside a neighbour's spell of a
    few seconds, the steps it covered, the median among them, moved more than the window's share said. The median
    step alone, not the middle half of the steps: on 8 default-cpu benches beside a CPU burner in spells, the
    middle half read like the window (36 regressions unexplained either way), the median step alone explained 5
    of them and moved no verdict of the quiet benches (tests/perf/windowed_share.py). None where a rank kept no
    steps (collectives, a record from before) or the ranks' counts differ."""
    steps = [w.get("steps") for w in ranks]
    if not steps or not all(isinstance(x, dict) and isinstance(x.get("wall_s"), list) for x in steps):
        return None
    n = len(steps[0]["wall_s"])
    keys = ("wall_s", "busy_cpus", "own_cpus", "steal_cpus", "wait_cpus")
    if n == 0 or any(len(x.get(k) or [None] * n) != n for x in steps for k in keys):
        return None
    walls = [statistics.median(x["wall_s"][i] for x in steps if _num(x["wall_s"][i])) if
             any(_num(x["wall_s"][i]) for x in steps) else 0.0 for i in range(n)]
    order = sorted(range(n), key=walls.__getitem__)
    chosen = [i for i in order[(n - 1) // 2:n // 2 + 1] if walls[i] > 0]
    each = [(walls[i], kernel_figures([{k: (x.get(k) or [None] * n)[i] for k in keys} for x in steps]))
            for i in chosen]
    each = [(t, f) for t, f in each if f is not None]
    if not each:
        return None
    total = sum(t for t, _ in each)

    def mean(key: str) -> Optional[float]:
        got = [(t, f[key]) for t, f in each if _num(f[key])]
        return round(sum(t * v for t, v in got) / sum(t for t, _ in got), 2) if len(got) == len(each) else None

    return {"steps": len(each), "of": n, "wall_s": round(total, 3),
            **{k: mean(k) for k in ("busy_cpus", "run_cpus", "other_cpus", "steal_cpus", "wait_cpus")}}


def pulse_devices(windows: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """Every rank's own device's fp32 pace, read by all the ranks at once (benchmarks/node/probe.py
    Pulses.own_start: as the steps load them), each the better of before and after (pulse_of): {slowest (GFLOP/s,
    per core on cpu), its rank and host, fastest (the fastest on the slowest's machine, the kernel whose first rank
    read its pulse alone), devices (how many read one), paced (the slowest machine's pace counting its devices:
    its pulse alone times its slowest device's over its fastest, where its first rank read one)}; None where no
    rank read one (collectives, a record from before). A step waits for every device (harness/pace.py)."""
    read = [(p, w) for w in windows if (p := pulse_of(w, "own")) is not None]
    if not read:
        return None
    kernels: dict[str, list[tuple[float, dict[str, Any]]]] = {}
    for p, w in read:
        kernels.setdefault(_kernel(w), []).append((p, w))
    paced = []
    for k, ranks in kernels.items():
        alone = [x for x in (pulse_of(w) for w in windows if _kernel(w) == k)
                 if x is not None]
        if alone:
            paced.append(max(alone) * min(p for p, _ in ranks) / max(p for p, _ in ranks))
    slow, w = min(read, key=lambda x: x[0])
    fastest = max(p for p, _ in kernels[_kernel(w)])
    return {"slowest": round(slow, 3), "fastest": round(fastest, 3), "rank": w.get("rank"), "host": str(w.get("host")),
            "devices": len(read), **({"paced": round(min(paced), 3)} if paced else {})}


def pulse_of(window: dict[str, Any], figure: str = "fp32") -> Optional[float]:
    """The machine's fp32 matmul pace over one rank's window (benchmarks/node/probe.py pulse; its memory
    pace, the triad's GB/s, with figure="triad": pulse_triad; on cpu its exchange latency in us, with
    figure="exchange": pulse_exchange, of which the slower is kept, below): the better
    of the pulses right before and right after it (a rate is lowered by interference, never raised:
    on a quiet 2-core EPYC one of a ZeRO-3 run's two pulses read 0.78x the probe, the better one
    0.93-1.11x, docs/measurement.md), either alone when the other failed; None for a rank that read
    none (not the first on its node, or a record from before). So a run counts as paced slower only
    when the machine was slow at both ends."""
    p = window.get("pulse_own" if figure == "own" else "pulse")
    p = p.get(figure) if figure in ("triad", "exchange") and isinstance(p, dict) else p
    figures = [p.get(k) for k in ("before", "after")] if isinstance(p, dict) else []
    figures = [x for x in figures if isinstance(x, (int, float)) and x > 0]
    # a rate's better (the higher), so that a run is paced slower only when slow at both ends; the exchange
    # latency's worse (also the higher): a slow spell of the host lasts 5-15 s, and one at either end of the run
    # is the one it ran in (tests/perf/exchange_spells.py)
    return max(figures) if figures else None
