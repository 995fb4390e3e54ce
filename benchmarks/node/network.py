"""Each network interface as this process's network namespace sees it, with its link rate read from
the system (never from the platform file): name, kind (physical, veth, bridge, bond, ...), state,
MTU, the link speed (sysfs `speed`, or ethtool's `Speed:`), the rate shaping on it (the root qdisc:
tbf rate, htb root ceiling, cake bandwidth; egress only) and the effective `rate_gbps`, the lower
of the two.

Interfaces come from netlink (`ip -j -d link show`), which follows the process's network namespace.
/sys/class/net need not: a process put into a namespace with `nsenter --net` (not `ip netns exec`)
still sees the root namespace's sysfs, so a sysfs value is read only for an interface whose sysfs
entry is provably this one (same ifindex and hardware address); else ethtool (an ioctl on a socket
of this namespace) gives the speed. Without `ip`, the names come from if_nameindex(3) (netlink
too). Anything unreadable is None, never a guess; every command has a timeout. No torch.
"""
from __future__ import annotations

import fcntl
import json
import re
import socket
import struct
import subprocess
from pathlib import Path
from typing import Any, Optional

CMD_TIMEOUT_S = 5.0
MAX_ETHTOOL_CALLS = 32
"""ethtool runs only for interfaces whose sysfs is not this namespace's; at most this many."""
SYS_NET = Path("/sys/class/net")
SHAPERS = ("tbf", "htb", "hfsc", "cake", "cbq")
"""Root qdiscs that cap a link's rate (others, e.g. pfifo_fast, fq_codel, mq, noqueue, do not)."""
SIOCGIFHWADDR = 0x8927
UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
IEC_UNITS = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def run_quiet(cmd: list[str], timeout_s: Optional[float] = None) -> Optional[str]:
    """The command's stdout; None if it is missing, fails or runs past timeout_s (CMD_TIMEOUT_S)."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s or CMD_TIMEOUT_S, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


def read_stripped(path: Path) -> Optional[str]:
    """The file's text, stripped; None if unreadable."""
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _json(text: Optional[str]) -> Optional[list]:
    try:
        data = json.loads(text) if text else None
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, list) else None


def parse_links(text: str) -> Optional[list[dict[str, Any]]]:
    """`ip -j -d link show` -> [{ifindex, name, kind, state, mtu, master, address}], loopback left
    out. kind: the netlink link kind (veth, bridge, bond, vlan, ...), 'physical' for a device on a
    bus (parentbus), else None."""
    entries = _json(text)
    if entries is None:
        return None
    out = []
    for e in entries:
        if not isinstance(e, dict) or e.get("link_type") == "loopback" or e.get("ifname") in (None, "lo"):
            continue
        kind = (e.get("linkinfo") or {}).get("info_kind") or ("physical" if e.get("parentbus") else None)
        state = e.get("operstate")
        out.append({"ifindex": e.get("ifindex"), "name": e["ifname"], "kind": kind,
                    "state": state.lower() if isinstance(state, str) else None, "mtu": e.get("mtu"),
                    "master": e.get("master"), "address": e.get("address")})
    return out


def rate_gbps(text: str) -> Optional[float]:
    """A tc rate ('250Mbit', '2Gbit', '1Gibit', '125000000bps' = bytes/s) in Gbit/s."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?)(i?)(bit|bps)\s*", text or "", re.I)
    if not m:
        return None
    prefix, iec = m.group(2).lower(), m.group(3)
    scale = IEC_UNITS[prefix] if iec and prefix else UNITS[prefix]
    bits = float(m.group(1)) * scale * (8 if m.group(4).lower() == "bps" else 1)
    return round(bits / 1e9, 6) if bits > 0 else None


def parse_root_qdiscs(text: str) -> Optional[dict[str, dict[str, Any]]]:
    """`tc -j qdisc show` (every device) -> {dev: the root qdisc {kind, options}}."""
    entries = _json(text)
    if entries is None:
        return None
    return {e["dev"]: e for e in entries if isinstance(e, dict) and e.get("root") and "dev" in e}


def _bytes_rate_gbps(value: Any) -> Optional[float]:
    """A rate as tc's JSON gives it: bytes/s as a number, or a text rate (older iproute2)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return round(value * 8 / 1e9, 6)
    return rate_gbps(value) if isinstance(value, str) else None


def parse_htb_ceiling(text: str) -> Optional[float]:
    """`tc class show dev X` (text: iproute2's JSON for htb classes is broken) -> the highest ceil
    of the root htb classes (the most the link lets through), in Gbit/s; None without one."""
    ceils = []
    for line in text.splitlines():
        m = re.match(r"\s*class htb \S+ root .*?\bceil (\S+)", line)
        if m and rate_gbps(m.group(1)) is not None:
            ceils.append(rate_gbps(m.group(1)))
    return max(ceils) if ceils else None


def shaping_gbps(qdisc: dict[str, Any], classes: Optional[str] = None) -> Optional[float]:
    """The rate a root qdisc caps its link to, in Gbit/s (None: not a shaper, or unreadable)."""
    kind, options = qdisc.get("kind"), qdisc.get("options") or {}
    if kind == "tbf":
        return _bytes_rate_gbps(options.get("rate"))
    if kind == "cake":
        return _bytes_rate_gbps(options.get("bandwidth"))
    if kind == "htb" and classes is not None:
        return parse_htb_ceiling(classes)
    return None


def parse_ethtool_speed(text: str) -> Optional[float]:
    """ethtool's 'Speed: 10000Mb/s' -> 10.0 Gbit/s ('Unknown!' -> None)."""
    m = re.search(r"^\s*Speed:\s*(\d+)\s*Mb/s", text or "", re.M)
    return int(m.group(1)) / 1000 if m and int(m.group(1)) > 0 else None


def _hwaddr(name: str) -> Optional[str]:
    """The interface's hardware address through an ioctl on a socket of this namespace."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            data = fcntl.ioctl(s.fileno(), SIOCGIFHWADDR, struct.pack("256s", name.encode()[:15]))
    except OSError:
        return None
    return ":".join(f"{b:02x}" for b in data[18:24])


def sysfs_is_ours(link: dict[str, Any], sys_net: Path = SYS_NET) -> bool:
    """Whether /sys/class/net/<name> is this interface, not a namesake in another namespace."""
    d = sys_net / link["name"]
    return (link.get("ifindex") is not None and link.get("address") is not None
            and read_stripped(d / "ifindex") == str(link["ifindex"]) and read_stripped(d / "address") == link["address"])


def _from_sysfs(name: str, sys_net: Path) -> dict[str, Any]:
    """What sysfs says of an interface it is known to show (the fallback without `ip`)."""
    d = sys_net / name
    kind = ("physical" if (d / "device").exists() else "bridge" if (d / "bridge").is_dir()
            else "bond" if (d / "bonding").is_dir() else None)
    mtu = read_stripped(d / "mtu")
    master = Path(_read_link(d / "master")).name if (d / "master").exists() else None
    return {"kind": kind, "state": read_stripped(d / "operstate"), "mtu": int(mtu) if mtu and mtu.isdigit() else None,
            "master": master}


def _read_link(path: Path) -> str:
    try:
        return str(path.readlink())
    except OSError:
        return ""


def _sysfs_speed_gbps(name: str, sys_net: Path) -> Optional[float]:
    speed = read_stripped(sys_net / name / "speed")
    try:
        mbps = int(speed) if speed is not None else None
    except ValueError:
        return None
    return mbps / 1000 if mbps and mbps > 0 else None


def list_links(sys_net: Path = SYS_NET) -> list[dict[str, Any]]:
    """The namespace's interfaces (no loopback): from `ip`, else if_nameindex(3) plus sysfs where
    sysfs is this namespace's."""
    links = parse_links(run_quiet(["ip", "-j", "-d", "link", "show"]) or "")
    if links is not None:
        return links
    try:
        names = socket.if_nameindex()
    except OSError:
        return []
    out = []
    for index, name in names:
        if name == "lo":
            continue
        link = {"ifindex": index, "name": name, "kind": None, "state": None, "mtu": None, "master": None,
                "address": _hwaddr(name)}
        if sysfs_is_ours(link, sys_net):
            link.update(_from_sysfs(name, sys_net))
        out.append(link)
    return out


def interfaces(sys_net: Path = SYS_NET) -> list[dict[str, Any]]:
    """Every non-loopback interface of this network namespace:
    {name, kind, state, mtu, master, speed_gbps, qdisc, shaping_gbps, rate_gbps}."""
    qdiscs = parse_root_qdiscs(run_quiet(["tc", "-j", "qdisc", "show"]) or "")
    ethtool_calls = 0
    out = []
    for link in list_links(sys_net):
        name = link["name"]
        if sysfs_is_ours(link, sys_net):
            speed = _sysfs_speed_gbps(name, sys_net)
            if link["kind"] is None and (sys_net / name / "device").exists():
                link["kind"] = "physical"
        elif ethtool_calls < MAX_ETHTOOL_CALLS:
            ethtool_calls += 1
            speed = parse_ethtool_speed(run_quiet(["ethtool", name]) or "")
        else:
            speed = None
        qdisc = (qdiscs or {}).get(name)
        kind = qdisc.get("kind") if qdisc else None
        shaped = None
        if kind in SHAPERS:
            classes = run_quiet(["tc", "class", "show", "dev", name]) if kind == "htb" else None
            shaped = shaping_gbps(qdisc, classes)
        rates = [r for r in (speed, shaped) if r is not None]
        out.append({"name": name, "kind": link["kind"], "state": link["state"], "mtu": link["mtu"],
                    "master": link["master"], "speed_gbps": speed, "qdisc": kind, "shaping_gbps": shaped,
                    "rate_gbps": min(rates) if rates else None})
    return sorted(out, key=lambda i: i["name"])
