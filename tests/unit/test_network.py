"""Each node's interfaces and link rates, read from the system (issue 15): netlink, tc, ethtool and
sysfs outputs captured in tests/data/network/ (README.md there says how)."""
from __future__ import annotations

import json
import time

import pytest

from benchmarks.node import network as net
from harness.config.schema import REPO_ROOT

DATA = REPO_ROOT / "tests" / "data" / "network"


def _text(name: str) -> str:
    return (DATA / name).read_text()


def test_netlink_links_have_their_kind_state_mtu_and_bridge_and_no_loopback():
    links = {link["name"]: link for link in net.parse_links(_text("ip_link.json"))}
    assert sorted(links) == ["br0", "eth0", "eth1", "vethc0ffee"]
    assert {n: link["kind"] for n, link in links.items()} == {"br0": "bridge", "eth0": "veth", "eth1": "veth",
                                                              "vethc0ffee": "veth"}
    assert (links["eth0"]["state"], links["eth0"]["mtu"], links["eth0"]["ifindex"]) == ("up", 1500, 2)
    assert links["eth1"]["mtu"] == 9000 and links["eth1"]["state"] == "down"
    assert links["vethc0ffee"]["master"] == "br0" and links["eth0"]["master"] is None
    assert net.parse_links(_text("ip_link_physical.json"))[0]["kind"] == "physical"   # a NIC on a bus
    assert net.parse_links("not json") is None


@pytest.mark.parametrize("text,gbps", [
    ("250Mbit", 0.25), ("2Gbit", 2.0), ("1gbit", 1.0), ("100Kbit", 0.0001), ("8000bit", 8e-6),
    ("1Gibit", 1.073742), ("125000000bps", 1.0), ("0bit", None), ("fast", None), ("", None),
])
def test_tc_rates_become_gbit_per_s(text, gbps):
    assert net.rate_gbps(text) == gbps


def test_the_shaping_rate_comes_from_the_root_qdisc():
    roots = net.parse_root_qdiscs(_text("tc_qdisc.json"))
    assert {dev: q["kind"] for dev, q in roots.items()} == {"lo": "noqueue", "eth0": "tbf", "br0": "noqueue",
                                                            "eth1": "htb"}
    assert net.shaping_gbps(roots["eth0"]) == 0.25                                  # tbf rate 250mbit
    assert net.shaping_gbps(roots["eth1"], _text("tc_class_htb.txt")) == 2.0       # the root class's ceil
    assert net.shaping_gbps(roots["eth1"], "") is None                              # htb without classes
    assert net.shaping_gbps(roots["br0"]) is None
    assert net.shaping_gbps({"kind": "tbf", "options": {"rate": "1Gbit"}}) == 1.0     # an older iproute2
    assert net.shaping_gbps({"kind": "cake", "options": {"bandwidth": 62500000}}) == 0.5


def test_ethtool_speed_or_none_when_unknown():
    assert net.parse_ethtool_speed(_text("ethtool_veth.txt")) == 10.0
    assert net.parse_ethtool_speed(_text("ethtool_unknown.txt")) is None
    assert net.parse_ethtool_speed("\tSpeed: 400000Mb/s\n") == 400.0


def _fake_system(monkeypatch, calls: list, *, ip: bool = True):
    """The captured namespace as the commands would show it; each command run is recorded."""
    outputs = {("ip", "-j", "-d", "link", "show"): _text("ip_link.json") if ip else None,
               ("tc", "-j", "qdisc", "show"): _text("tc_qdisc.json"),
               ("tc", "class", "show", "dev", "eth1"): _text("tc_class_htb.txt")}

    def run(cmd):
        calls.append(cmd)
        if cmd[0] == "ethtool":
            return _text("ethtool_veth.txt")
        return outputs.get(tuple(cmd))
    monkeypatch.setattr(net, "run_quiet", run)


def _sysfs(root, name, ifindex, address, speed):
    d = root / name
    d.mkdir(parents=True)
    for key, value in (("ifindex", ifindex), ("address", address), ("speed", speed), ("mtu", "1500"),
                       ("operstate", "up")):
        (d / key).write_text(f"{value}\n")


def test_in_a_namespace_entered_with_nsenter_sysfs_is_not_read_for_its_namesakes(tmp_path, monkeypatch):
    # /sys/class/net shows the root namespace: an eth0 at 100 Gbit/s, another ifindex and address
    _sysfs(tmp_path, "eth0", 2, "02:fc:00:00:00:01", "100000")
    calls: list = []
    _fake_system(monkeypatch, calls)
    ifaces = {i["name"]: i for i in net.interfaces(tmp_path)}
    assert ifaces["eth0"] == {"name": "eth0", "kind": "veth", "state": "up", "mtu": 1500, "master": None,
                              "speed_gbps": 10.0, "qdisc": "tbf", "shaping_gbps": 0.25, "rate_gbps": 0.25}
    assert ifaces["eth1"]["rate_gbps"] == 2.0 and ifaces["eth1"]["qdisc"] == "htb"
    assert ifaces["br0"]["speed_gbps"] == 10.0 and ifaces["br0"]["shaping_gbps"] is None
    assert ["ethtool", "eth0"] in calls


def test_sysfs_that_is_this_namespaces_gives_the_speed_without_ethtool(tmp_path, monkeypatch):
    _sysfs(tmp_path, "eth0", 2, "4a:e7:cc:0a:52:8d", "1000")      # the same ifindex and address
    calls: list = []
    _fake_system(monkeypatch, calls)
    eth0 = next(i for i in net.interfaces(tmp_path) if i["name"] == "eth0")
    assert (eth0["speed_gbps"], eth0["shaping_gbps"], eth0["rate_gbps"]) == (1.0, 0.25, 0.25)
    assert ["ethtool", "eth0"] not in calls


def test_without_ip_the_names_come_from_if_nameindex_and_sysfs_only_where_it_is_ours(tmp_path, monkeypatch):
    _sysfs(tmp_path, "eth0", 2, "4a:e7:cc:0a:52:8d", "25000")
    _sysfs(tmp_path, "eth1", 3, "02:fc:00:00:00:01", "100000")   # a namesake: ifindex 5 here
    (tmp_path / "eth0" / "device").mkdir()
    calls: list = []
    _fake_system(monkeypatch, calls, ip=False)
    monkeypatch.setattr(net.socket, "if_nameindex", lambda: [(1, "lo"), (2, "eth0"), (5, "eth1")])
    monkeypatch.setattr(net, "_hwaddr", {"eth0": "4a:e7:cc:0a:52:8d", "eth1": "6e:07:1a:76:bb:af"}.get)
    ifaces = {i["name"]: i for i in net.interfaces(tmp_path)}
    assert sorted(ifaces) == ["eth0", "eth1"]
    assert ifaces["eth0"]["kind"] == "physical" and ifaces["eth0"]["mtu"] == 1500
    assert (ifaces["eth0"]["speed_gbps"], ifaces["eth0"]["rate_gbps"]) == (25.0, 0.25)
    assert (ifaces["eth1"]["kind"], ifaces["eth1"]["mtu"], ifaces["eth1"]["speed_gbps"]) == (None, None, 10.0)


def test_a_command_that_hangs_is_cut_off_and_read_as_unknown(monkeypatch):
    monkeypatch.setattr(net, "CMD_TIMEOUT_S", 0.3)
    start = time.monotonic()
    assert net.run_quiet(["sleep", "10"]) is None
    assert time.monotonic() - start < 5
    assert net.run_quiet(["/nonexistent/ip"]) is None


def test_this_namespace_is_read_without_a_guess():
    ifaces = net.interfaces()
    assert all(i["name"] != "lo" for i in ifaces)
    for i in ifaces:
        rates = [r for r in (i["speed_gbps"], i["shaping_gbps"]) if r is not None]
        assert i["rate_gbps"] == (min(rates) if rates else None), json.dumps(i)
