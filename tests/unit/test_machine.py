"""The machine in the fingerprint (issue 14): read from the system, never from the platform file;
the declared GPU checked against the detected one."""
from __future__ import annotations

import pytest

from benchmarks.node import machine as m
from harness.hardware import GPU_NAMES, hardware_mismatches

# nvidia-smi --query-gpu=name,uuid,memory.total,clocks.max.sm,clocks.sm,power.limit,ecc.mode.current,pci.bus_id
# --format=csv,noheader,nounits on an H100 SXM node (two of its GPUs)
H100_QUERY = """NVIDIA H100 80GB HBM3, GPU-5f3e2a1b-0c9d-4e8f-a7b6-1234567890ab, 81559, 1980, 1755, 700.00, Enabled, 00000000:18:00.0
NVIDIA H100 80GB HBM3, GPU-6a4f3b2c-1d0e-5f9a-b8c7-234567890abc, 81559, 1980, 345, 700.00, Enabled, 00000000:2A:00.0
"""
TOPO = """\tGPU0\tGPU1\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV18\tPIX\tSYS\t0-55\t0
GPU1\tNV18\t X \tSYS\tPIX\t0-55\t0
NIC0\tPIX\tSYS\t X \tSYS
NIC1\tSYS\tPIX\tSYS\t X

Legend:
  X    = Self
"""


def test_gpu_query_rows_become_typed_gpus():
    gpus = m.parse_gpu_query(H100_QUERY + "garbage line\n")
    assert len(gpus) == 2
    g = gpus[0]
    assert g["name"] == "NVIDIA H100 80GB HBM3" and g["uuid"].startswith("GPU-5f3e")
    assert (g["memory_mib"], g["sm_clock_max_mhz"], g["sm_clock_mhz"], g["power_limit_w"]) == (81559, 1980, 1755, 700)
    assert g["ecc"] == "Enabled" and g["pci_bus_id"] == "00000000:18:00.0"
    assert m.parse_gpu_query("NVIDIA A100, GPU-x, 40960, [N/A], N/A, [Not Supported], [N/A], 0:1:0")[0]["ecc"] is None


def test_topology_summary_counts_gpu_and_nic_links():
    t = m.parse_topology(TOPO)
    assert t["gpu_gpu"] == {"NV18": 2}
    assert t["gpu_nic"] == {"PIX": 2, "SYS": 2}
    assert t["matrix"][0].split() == ["GPU0", "GPU1", "NIC0", "NIC1", "CPU", "Affinity", "NUMA", "Affinity"]


def test_cpu_model_is_the_model_name_not_the_architecture():
    info = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7763 64-Core Processor\n"
    assert m.cpu_model(info) == "AMD EPYC 7763 64-Core Processor"
    assert m.cpu_model("processor : 0\n") is None
    assert m.mem_total_gib("MemTotal:       24683124 kB\n") == pytest.approx(23.54, abs=0.01)


def test_ib_ports_with_their_rates_from_sysfs(tmp_path):
    port = tmp_path / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "rate").write_text("400 Gb/sec (4X NDR)\n")
    (port / "state").write_text("4: ACTIVE\n")
    (port / "link_layer").write_text("InfiniBand\n")
    assert m.ib_ports(tmp_path) == [{"name": "mlx5_0/1", "kind": "ib", "link_layer": "InfiniBand",
                                     "rate_gbps": 400.0, "state": "4: ACTIVE"}]
    assert m.ib_ports(tmp_path / "absent") == []


def test_nics_are_the_namespaces_interfaces_then_the_ib_ports(tmp_path, monkeypatch):
    monkeypatch.setattr(m, "interfaces", lambda sys_net: [{"name": "eth0", "kind": "veth", "rate_gbps": 0.25}])
    port = tmp_path / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    assert [(n["name"], n["rate_gbps"]) for n in m.nics(sys_ib=tmp_path)] == [("eth0", 0.25), ("mlx5_0/1", 200.0)]


def test_this_machine_is_read_without_a_gpu():
    box = m.machine()
    assert box["cpu"]["logical_cpus"] >= 1 and box["cpu"]["mem_total_gib"] > 0
    assert box["cpu"]["model"] not in ("x86_64", "aarch64")
    assert isinstance(box["nics"], list)


def _env(name, memory_mib=81559, count=1):
    return {"gpu_model": name, "gpu_count": count, "host": "gpu1",
            "machine": {"gpus": [{"name": name, "memory_mib": memory_mib}] * count}}


def test_the_declared_gpu_matches_what_h100_and_h200_report(composed):
    h100, h200 = composed(["platform=h100"]).platform, composed(["platform=h200"]).platform
    assert hardware_mismatches(h100, _env("NVIDIA H100 80GB HBM3")) == []
    assert hardware_mismatches(h200, _env("NVIDIA H200", 143771)) == []
    assert hardware_mismatches(composed(["platform=cpu"]).platform, {"gpu_model": None}) == []
    assert hardware_mismatches(h100, {"gpu_model": None}) is None        # nothing detected to compare


@pytest.mark.parametrize("platform,env,words", [
    ("h100", _env("NVIDIA H100 PCIe"), "declares H100-SXM5-80GB (bf16 peak 989.4 TFLOP/s, used for MFU), the ranks ran on 'NVIDIA H100 PCIe'"),
    ("h200", _env("NVIDIA H200 NVL", 143771), "the ranks ran on 'NVIDIA H200 NVL'"),
    ("h200", _env("NVIDIA H200", 81559), "declares 140 GiB per GPU, the detected GPU has 79.6 GiB"),
    ("roce-h100", _env("NVIDIA H100 80GB HBM3", count=4), "declares 8 GPUs per node, 4 detected on gpu1"),
])
def test_other_hardware_than_declared_is_named(composed, platform, env, words):
    problems = hardware_mismatches(composed([f"platform={platform}"]).platform, env)
    assert any(words in p for p in problems), problems


def test_every_shipped_gpu_platform_declares_a_model_the_check_knows(composed):
    from unit_helpers import options
    for name in options("platform"):
        p = composed([f"platform={name}"]).platform
        assert p.device.value == "cpu" or p.gpu_model in GPU_NAMES, name


@pytest.mark.parametrize("local_rank,reports", [(None, True), ("0", True), ("1", False), ("7", False)])
def test_the_first_rank_on_each_node_reports_its_machine(monkeypatch, local_rank, reports):
    from benchmarks.node.environment import first_on_node, node_view

    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert first_on_node() is reports
    view = node_view()
    assert view["host"] and view["machine"]["cpu"]["logical_cpus"] >= 1 and isinstance(view["machine"]["nics"], list)


@pytest.mark.parametrize("boots,rank,paces", [
    (["a", "a", "b", "b"], 0, True), (["a", "a", "b", "b"], 1, False),   # two nodes: each node's first rank
    (["a", "a", "b", "b"], 2, True), (["a", "a", "a", "a"], 2, False),   # the emulated cluster: one box, one pulse
])
def test_one_rank_on_each_kernel_reads_the_pulses(monkeypatch, boots, rank, paces):
    import torch.distributed as dist

    import benchmarks.node.environment as environment

    monkeypatch.setattr(dist, "get_world_size", lambda: len(boots))
    monkeypatch.setattr(dist, "all_gather_object", lambda out, _mine: out.__setitem__(slice(None), boots))
    monkeypatch.setattr(environment, "read_stripped", lambda _path: boots[rank])
    assert environment.first_on_kernel(rank) is paces
    monkeypatch.setattr(environment, "read_stripped", lambda _path: None)   # unreadable: as first_on_node
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert environment.first_on_kernel(rank) is True
