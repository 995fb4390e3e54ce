"""N nodes on one machine, made of network namespaces (../shared/MULTINODE_NOTES.md has the facts).

    tb-<name>-sw      the switch: a router namespace that forwards between the node links
    tb-<name>-node<K> node K: `eth0` = 10.213.0.K/24, a veth whose other end is `v<K>` in the switch

Each veth is created directly between the two namespaces, so the root namespace gets no interface
and none of its interfaces, routes or sysctls are touched. The switch answers ARP for the nodes
(proxy_arp, proxy_delay 0) and holds a /32 route per node. A link is shaped on both ends
(`tc qdisc ... tbf`: a full-duplex NIC of that rate); `burst` stays >= 64 KiB or GSO packets drop.

A process enters node K through `prefix(K)`: `nsenter --net` into the node's namespace, then
`unshare --uts --mount` for its hostname (`node<K>`) and a hosts file naming every node, bind-mounted
over /etc/hosts in its private mount namespace. Not `ip netns exec`: that remounts /sys, which hides
/sys/fs/cgroup (slurmd then exits). So /sys/class/net inside a node still shows the root namespace;
read a node's interfaces over netlink (`ip`, `tc`) or ethtool.

The nodes share one kernel, so one CLOCK_MONOTONIC, unlike machines. With `clock_skew_s` node K's processes also
enter a time namespace (`unshare --time --monotonic/--boottime`) whose monotonic and boot clocks run
(K - 1) x clock_skew_s ahead, as two machines' clocks differ: what a cross-node measure that compares monotonic
stamps (benchmarks/training/arrivals.py) must detect and correct. The wall clock (CLOCK_REALTIME) is not offset.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .system import Unavailable, find_binary, pid_alive

SUBNET = "10.213.0"
SWITCH_ADDRESS = f"{SUBNET}.254"
MAX_NODES = 253
TBF_BURST, TBF_LATENCY = "512kb", "50ms"
LINK_RE = re.compile(r"^(\d+(?:\.\d+)?)(kbit|mbit|gbit)$")
UNITS_GBIT = {"kbit": 1e-6, "mbit": 1e-3, "gbit": 1.0}
TCP_PAYLOAD_FRACTION = 1448 / 1514
"""TCP payload per full frame at MTU 1500 with timestamps (1448 B) over what tbf counts on a veth
(the 1514 B Ethernet frame): the most any TCP transport (gloo) can carry on a shaped link."""
MAX_SHAPED_GBPS = 2.0
"""Above about 2 Gbit/s the two cores, not the link, limit gloo here (MULTINODE_NOTES.md)."""
NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,11}$")
MAX_CLOCK_SKEW_S = 86400


def link_gbps(link: str) -> float | None:
    """'1gbit' -> 1.0, '250mbit' -> 0.25, 'none' -> None (unshaped); ValueError names what is valid."""
    if link == "none":
        return None
    m = LINK_RE.match(link)
    if not m:
        raise ValueError(f"link rate {link!r} is not valid: give a tc rate such as 1gbit, 250mbit or "
                         "500000kbit, or none for an unshaped link")
    gbps = float(m.group(1)) * UNITS_GBIT[m.group(2)]
    if not 0 < gbps <= MAX_SHAPED_GBPS:
        raise ValueError(f"link rate {link!r} = {gbps:g} Gbit/s: shape between 1kbit and "
                         f"{MAX_SHAPED_GBPS:g}gbit (above that the CPU, not the link, limits the "
                         "transfers on this machine), or none")
    return gbps


def payload_gbps(link: str) -> float | None:
    """What a TCP stream can carry on the link (Gbit/s): the rate x 1448/1514."""
    gbps = link_gbps(link)
    return None if gbps is None else gbps * TCP_PAYLOAD_FRACTION


def _ip(*args: str, check: bool = True, timeout_s: float = 20) -> subprocess.CompletedProcess:
    argv = [find_binary(args[0]) or args[0], *args[1:]]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise Unavailable(f"`{' '.join(argv)}` did not finish in {timeout_s:g} s") from e
    if check and proc.returncode != 0:
        raise Unavailable(f"`{' '.join(argv)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


def netns_exists(ns: str) -> bool:
    return Path("/run/netns", ns).exists()


@dataclass
class Network:
    name: str
    num_nodes: int
    link: str
    hosts_file: Path
    clock_skew_s: int = 0

    def __post_init__(self) -> None:
        if not NAME_RE.match(self.name):
            raise ValueError(f"cluster name {self.name!r}: 1-12 lowercase letters/digits, starting with a letter")
        if not 1 <= self.num_nodes <= MAX_NODES:
            raise ValueError(f"nodes={self.num_nodes}: between 1 and {MAX_NODES}")
        link_gbps(self.link)
        if not (isinstance(self.clock_skew_s, int) and 0 <= self.clock_skew_s <= MAX_CLOCK_SKEW_S):
            raise ValueError(f"clock skew {self.clock_skew_s!r} s: whole seconds from 0 to {MAX_CLOCK_SKEW_S} "
                             "(unshare --monotonic takes whole seconds)")

    # -- names ---------------------------------------------------------------------------------
    @property
    def switch(self) -> str:
        return f"tb-{self.name}-sw"

    def ns(self, k: int) -> str:
        return f"tb-{self.name}-node{k}"

    @staticmethod
    def hostname(k: int) -> str:
        return f"node{k}"

    @staticmethod
    def address(k: int) -> str:
        return f"{SUBNET}.{k}"

    @property
    def namespaces(self) -> list[str]:
        return [self.ns(k) for k in range(1, self.num_nodes + 1)] + [self.switch]

    def clock_offset_s(self, k: int) -> int:
        """How far node K's monotonic clock runs ahead of node 1's."""
        return (k - 1) * self.clock_skew_s

    def prefix(self, k: int) -> list[str]:
        """argv prefix that runs a command on node K (its network, hostname, /etc/hosts and, with a clock skew,
        its own monotonic clock)."""
        offset = self.clock_offset_s(k)
        clock = ["--time", "--monotonic", str(offset), "--boottime", str(offset)] if offset else []
        return [find_binary("nsenter") or "nsenter", f"--net=/run/netns/{self.ns(k)}", "--",
                find_binary("unshare") or "unshare", "--uts", "--mount", "--propagation", "slave", *clock, "--",
                "/bin/sh", "-c", 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"',
                "testbed", self.hostname(k), str(self.hosts_file)]

    # -- life cycle ----------------------------------------------------------------------------
    def create(self) -> None:
        """Namespaces, links, addresses, routes, shaping and the hosts file. On failure, whatever
        was made is removed before the error goes on."""
        try:
            self._create()
        except BaseException:
            self.destroy()
            raise

    def _create(self) -> None:
        for ns in self.namespaces:
            if netns_exists(ns):
                raise Unavailable(f"network namespace {ns} already exists: another cluster named "
                                  f"{self.name!r} is up (`python -m testbed down --name {self.name}`)")
        self.hosts_file.write_text("127.0.0.1 localhost\n" + "".join(
            f"{self.address(k)} {self.hostname(k)}\n" for k in range(1, self.num_nodes + 1)))
        sw = self.switch
        _ip("ip", "netns", "add", sw)
        _ip("ip", "-n", sw, "link", "set", "lo", "up")
        self._sysctl(sw, "net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
                     "net.ipv4.conf.default.rp_filter=0")
        for k in range(1, self.num_nodes + 1):
            node, port = self.ns(k), f"v{k}"
            _ip("ip", "netns", "add", node)
            _ip("ip", "link", "add", port, "netns", sw, "type", "veth", "peer", "name", "eth0", "netns", node)
            _ip("ip", "-n", node, "link", "set", "lo", "up")
            _ip("ip", "-n", node, "addr", "add", f"{self.address(k)}/24", "dev", "eth0")
            _ip("ip", "-n", node, "link", "set", "eth0", "up")
            _ip("ip", "-n", sw, "addr", "add", f"{SWITCH_ADDRESS}/32", "dev", port)
            _ip("ip", "-n", sw, "link", "set", port, "up")
            _ip("ip", "-n", sw, "route", "add", f"{self.address(k)}/32", "dev", port)
            self._sysctl(sw, f"net.ipv4.conf.{port}.proxy_arp=1", f"net.ipv4.neigh.{port}.proxy_delay=0",
                         f"net.ipv4.conf.{port}.rp_filter=0")
        self.shape(self.link)

    def shape(self, link: str) -> None:
        """Set every node link to this rate on both ends (`none`: unshaped)."""
        link_gbps(link)
        for k in range(1, self.num_nodes + 1):
            for ns, dev in ((self.ns(k), "eth0"), (self.switch, f"v{k}")):
                if link == "none":
                    _ip("tc", "-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
                else:
                    _ip("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", link,
                        "burst", TBF_BURST, "latency", TBF_LATENCY)
        self.link = link

    def pids(self) -> list[int]:
        """Every process inside the cluster's namespaces."""
        found: set[int] = set()
        for ns in self.namespaces:
            if netns_exists(ns):
                out = _ip("ip", "netns", "pids", ns, check=False).stdout
                found |= {int(p) for p in out.split() if p.isdigit()}
        return sorted(found)

    def kill_all(self, grace_s: float = 5.0) -> list[int]:
        """Stop every process left in the namespaces (ranks, job steps): SIGTERM, then SIGKILL."""
        pids = self.pids()
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            for pid in self.pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and any(pid_alive(p) for p in self.pids()):
                time.sleep(0.1)
        return pids

    def destroy(self) -> None:
        """Remove the namespaces (their veths go with them) and the hosts file; idempotent."""
        self.kill_all()
        for ns in self.namespaces:
            if netns_exists(ns):
                _ip("ip", "netns", "del", ns, check=False)
        self.hosts_file.unlink(missing_ok=True)

    @staticmethod
    def _sysctl(ns: str, *settings: str) -> None:
        _ip("nsenter", f"--net=/run/netns/{ns}", "--", find_binary("sysctl") or "sysctl", "-q", "-w", *settings)
