"""The nodes of a run: each node's machine as the first rank on it read it (rank 0's in its
ENVIRONMENT event, every other node's in a NODE event of its own rank's event log), and the flat
summary of their link rates that comparisons read (`environment.nodes`, `environment.links`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from benchmarks import events as ev

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
