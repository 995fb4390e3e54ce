"""Every record carries the machine it ran on, read from the system (issue 14; issue 16 uses the
same builder): the CPU's model name (not 'x86_64'), cores, memory, load; GPUs, topology and NICs
where they exist; and the declared-vs-detected hardware check. Each node's interfaces and link
rates are those of its own network namespace (issue 15)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from benchmarks.node.machine import cpu_model

from .conftest import REPO


def test_every_record_carries_the_machine_read_from_the_system(default_suite):
    records = list(default_suite.records().values())
    assert records
    for rec in records:
        env = rec["environment"]
        box = env["machine"]
        assert box["cpu"]["model"] == cpu_model() and env["cpu_model"] == cpu_model(), rec["run_id"]
        assert box["cpu"]["logical_cpus"] >= 1 and box["cpu"]["mem_total_gib"] > 0
        assert len(box["cpu"]["load_avg_1_5_15"]) == 3
        assert isinstance(box["nics"], list) and box["gpus"] is None       # no nvidia-smi here
        assert env["gpu_count"] == 0 and env["hardware_mismatch"] == []     # cpu: no GPU declared
        assert env["nodes"] == [{"host": env["host"], "machine": box}]          # one node: rank 0's
        assert set(env["links"]) == {f"{env['host']}/{n['name']}" for n in box["nics"]
                                     if n["rate_gbps"] is not None and not n.get("master")}
        load = env["load"]   # how busy the machine was while this run measured (issue 16)
        assert load["window_s"] > 0 and load["run_cpus"] > 0 and 0 <= load["other_cpus"] <= load["busy_cpus"] + 0.01
        assert load["kernels"] == 1 and load["hosts"] == [env["host"]] and len(load["load_avg_after"]) == 3
        # the machine's pace, the first rank's pulses before and after (per core, as the probe's fp32 and triad):
        # a training run's, and a collective sweep's on this one cpu host (gloo moves its bytes through its memory)
        assert load["pulse_fp32"] > 0 and load["pulse_triad"] > 0, (rec["run_id"], load)
        if rec["kind"] == "training":   # and every rank's own device read at once (harness/nodes.py pulse_devices)
            devices = load["pulse_devices"]
            assert devices["devices"] == env["world_size"], (rec["run_id"], devices)
            assert 0 < devices["slowest"] <= devices["fastest"], (rec["run_id"], devices)
        # and its exchange latency, a ping-pong between two processes on two CPUs (benchmarks/node/exchange.py;
        # 37-57 us on the 2-core Zen 5 VM)
        assert 0 < load["pulse_exchange_us"] < 5000, (rec["run_id"], load)
        assert env["settings"]["measure.steps"] == rec["config"]["measure"]["steps"]


# --- a throwaway node: its own network namespace, a veth shaped with tbf ----------------------

def _require_netns() -> None:
    """Root and iproute2, or skip; in CI (CI=true, as root) a missing one is a failure."""
    missing = [tool for tool in ("ip", "tc", "nsenter") if shutil.which(tool) is None]
    reason = ("needs root for `ip netns add`" if os.geteuid() != 0
              else f"needs {', '.join(missing)}" if missing else None)
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the namespace test cannot run: {reason}", pytrace=False)
        pytest.skip(reason)


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def shaped_node():
    """A namespace "node" whose eth0 is a veth to a second namespace, shaped to 250 Mbit/s; both
    namespaces have unique names and are deleted whatever happens. The root namespace's interfaces
    are never touched (the veth is created directly in the two namespaces)."""
    _require_netns()
    tag = uuid.uuid4().hex[:8]
    node, peer = f"suite-fp-node-{tag}", f"suite-fp-peer-{tag}"
    made = []
    try:
        for ns in (node, peer):
            _sh("ip", "netns", "add", ns)
            made.append(ns)
        _sh("ip", "link", "add", "eth0", "netns", node, "type", "veth", "peer", "name", "eth0", "netns", peer)
        for ns in (node, peer):
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
        _sh("tc", "-n", node, "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "250mbit", "burst", "512kb",
            "latency", "50ms")
        yield node
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


READ_NICS = "import json; from benchmarks.node.machine import nics; print(json.dumps(nics()))"


@pytest.mark.parametrize("entry", ["nsenter", "ip netns exec", "nsenter, no ip"])
def test_a_node_reads_its_own_shaped_link_not_the_root_namespaces(shaped_node, entry, tmp_path):
    """nsenter --net keeps the root namespace's /sys/class/net (the test bed enters nodes so);
    `ip netns exec` remounts it; without `ip` the names come from if_nameindex(3)."""
    env = dict(os.environ)
    if entry == "ip netns exec":
        prefix = ["ip", "netns", "exec", shaped_node]
    else:
        prefix = [shutil.which("nsenter"), f"--net=/run/netns/{shaped_node}", "--"]
    if entry == "nsenter, no ip":
        bin_dir = tmp_path / "bin"   # tc and ethtool, but no ip
        bin_dir.mkdir()
        for tool in ("tc", "ethtool"):
            if shutil.which(tool):
                (bin_dir / tool).symlink_to(shutil.which(tool))
        env["PATH"] = str(bin_dir)
    out = subprocess.run(prefix + [sys.executable, "-c", READ_NICS], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    nics = [n for n in json.loads(out) if n["kind"] != "ib"]
    assert [n["name"] for n in nics] == ["eth0"], nics          # the node's own, no lo, no root interface
    eth0 = nics[0]
    assert (eth0["qdisc"], eth0["shaping_gbps"], eth0["rate_gbps"]) == ("tbf", 0.25, 0.25), eth0
    assert eth0["speed_gbps"] in (10.0, None)                   # a veth says 10 Gbit/s; None without ethtool
    assert eth0["state"] in ("up", "lowerlayerdown", None)
