"""GPU machine state from `nvidia-smi -q`: the parser against real outputs posted publicly
(tests/data/nvidia_smi/, SOURCES.md there says whose and what each shows), the words of
state_differences / state_problems, and tiny synthetic texts for the old and new key spellings."""
from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.node import gpu_state
DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia_smi"
A100 = "a100_sxm4_525.60.13_busy.txt"
H100_TWO = "h100_535.183.01_two_gpus.txt"
H100_BRAKE = "h100_535.161.08_hw_power_brake.txt"
CAPPED = "power_capped_595.71.05.txt"
A10G_X8 = "a10g_535.247.01_pcie_x8.txt"
V100_X2 = "v100_sxm2_418.67_pcie_x2.txt"


def _gpus(name: str) -> list[dict]:
    return gpu_state.parse_query((DATA / name).read_text())


# What each fixture's text shows, GPU by GPU (read off the files; only the keys listed are checked).
EXPECTED = {
    A100: [dict(name="NVIDIA A100-SXM4-80GB", bus_id="00000000:0B:00.0", persistence_mode="Enabled",
                mig_mode_current="Disabled", sm_clock_mhz=1410, sm_clock_max_mhz=1410, graphics_clock_mhz=1410,
                mem_clock_mhz=1593, power_draw_w=87.12, power_limit_w=400.0, power_limit_default_w=400.0,
                power_limit_max_w=400.0, throttle_reasons_active=[], ecc_mode_current="Enabled",
                ecc_volatile_uncorrected=0, pcie_gen_current=4, pcie_gen_max=4, pcie_gen_host_max=4,
                pcie_width_current=16, pcie_width_max=16, temperature_c=30, gpu_util_pct=100)],
    H100_TWO: [dict(name="NVIDIA H100 80GB HBM3", bus_id="00000000:53:00.0", sm_clock_mhz=345,
                    sm_clock_max_mhz=1980, power_draw_w=71.97, power_limit_w=700.0, power_limit_default_w=700.0,
                    throttle_reasons_active=["Idle"], ecc_volatile_uncorrected=0, pcie_gen_current=5,
                    pcie_gen_max=5, pcie_gen_host_max=None, pcie_width_current=16, temperature_c=36),
               dict(bus_id="00000000:75:00.0", sm_clock_mhz=1980, power_draw_w=118.01, temperature_c=39,
                    throttle_reasons_active=["SW Power Cap", "HW Power Brake Slowdown", "SW Thermal Slowdown"])],
    H100_BRAKE: [dict(name="NVIDIA H100 80GB HBM3", bus_id="00000000:19:00.0", sm_clock_mhz=86,
                      sm_clock_max_mhz=1980, graphics_clock_mhz=86, mem_clock_mhz=2619, power_draw_w=67.74,
                      power_limit_w=700.0, throttle_reasons_active=["HW Slowdown", "HW Power Brake Slowdown"],
                      pcie_gen_current=5, pcie_gen_host_max=5, temperature_c=29, gpu_util_pct=0)],
    CAPPED: [dict(name=None, bus_id="00000000:06:00.0", power_draw_w=78.83, power_limit_w=500.0,
                       power_limit_default_w=700.0, power_limit_max_w=700.0, throttle_reasons_active=None,
                       sm_clock_mhz=None, pcie_width_current=None, ecc_volatile_uncorrected=None)],
    A10G_X8: [dict(name="NVIDIA A10G", bus_id="00000000:00:1E.0", persistence_mode="Disabled",
                   mig_mode_current=None, sm_clock_mhz=1710, sm_clock_max_mhz=1710, mem_clock_mhz=6250,
                   power_draw_w=60.3, power_limit_w=300.0, throttle_reasons_active=[], ecc_mode_current="Enabled",
                   ecc_volatile_uncorrected=0, pcie_gen_current=4, pcie_gen_max=4, pcie_gen_host_max=None,
                   pcie_width_current=8, pcie_width_max=16, temperature_c=27, gpu_util_pct=0)],
    V100_X2: [dict(name="Tesla V100-SXM2-32GB", bus_id="00000004:04:00.0", persistence_mode="Enabled",
                   mig_mode_current=None, sm_clock_mhz=135, sm_clock_max_mhz=1530, power_draw_w=39.78,
                   power_limit_w=300.0, power_limit_default_w=300.0, throttle_reasons_active=["Idle"],
                   ecc_mode_current="Enabled", ecc_volatile_uncorrected=0, pcie_gen_current=3, pcie_gen_max=3,
                   pcie_width_current=2, pcie_width_max=16, temperature_c=38)],
}

PROBLEMS = {
    A100: [],
    H100_TWO: ["GPU 1: throttled: SW Power Cap, HW Power Brake Slowdown, SW Thermal Slowdown "
               "(SM clock 1980 of max 1980 MHz)"],
    H100_BRAKE: ["throttled: HW Slowdown, HW Power Brake Slowdown (SM clock 86 of max 1980 MHz)"],
    CAPPED: ["GPU power limit 500 W, below its default 700 W"],
    A10G_X8: ["PCIe link Gen4 x8, below its max Gen4 x16"],
    V100_X2: ["PCIe link Gen3 x2, below its max Gen3 x16"],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_real_output_parses_to_the_figures_its_text_shows(name):
    gpus = _gpus(name)
    assert len(gpus) == len(EXPECTED[name])
    for gpu, expected in zip(gpus, EXPECTED[name]):
        assert set(gpu) == set(gpu_state.KEYS)
        assert {k: gpu[k] for k in expected} == expected


def test_the_fixtures_are_all_there():
    assert sorted(p.name for p in DATA.glob("*.txt")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_state_problems_of_each_real_output(name):
    assert gpu_state.state_problems(_gpus(name)) == PROBLEMS[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_state_does_not_differ_from_itself(name):
    assert gpu_state.state_differences(_gpus(name), _gpus(name)) == []


def test_a_power_capped_gpu_is_told_by_its_power_limit():
    healthy = _gpus(H100_TWO)[:1]
    assert gpu_state.state_differences(healthy, _gpus(CAPPED)) == [
        "GPU power limit 500 vs 700 W (capped below its default 700 W)"]


def test_a_throttled_gpu_is_told_by_its_clock_and_reasons():
    healthy = _gpus(H100_TWO)[:1]
    assert gpu_state.state_differences(healthy, _gpus(H100_BRAKE)) == [
        "SM clock 86 vs 345 MHz; throttled now: HW Slowdown, HW Power Brake Slowdown"]
    assert gpu_state.state_differences(_gpus(H100_BRAKE), healthy) == [
        "SM clock 345 vs 86 MHz; throttled in the reference: HW Slowdown, HW Power Brake Slowdown"]


def test_a_narrow_pcie_link_is_told_by_the_link():
    differences = gpu_state.state_differences(_gpus(A100), _gpus(A10G_X8))
    assert "PCIe link Gen4 x8 vs Gen4 x16 (trained below its max Gen4 x16)" in differences
    assert "GPU model NVIDIA A10G vs NVIDIA A100-SXM4-80GB" in differences
    # an idle GPU on either side: its link generation says nothing, the width still does
    assert "PCIe link x8 vs x16 (trained below its max x16)" in gpu_state.state_differences(
        _gpus(H100_TWO)[:1], _gpus(A10G_X8))


def test_gpus_are_compared_one_by_one_and_by_count():
    two = _gpus(H100_TWO)
    assert gpu_state.state_differences(two, two[::-1]) == [
        "GPU 0: SM clock 1980 vs 345 MHz; throttled now: SW Power Cap, HW Power Brake Slowdown, SW Thermal Slowdown",
        "GPU 1: SM clock 345 vs 1980 MHz; throttled in the reference: SW Power Cap, HW Power Brake Slowdown, "
        "SW Thermal Slowdown"]
    assert gpu_state.state_differences(two, two[:1]) == ["GPU count 1 vs 2"]


OLD = """
==============NVSMI LOG==============
Attached GPUs                       : 1
GPU 0000:03:00.0
    Product Name                    : Tesla K80
    Persistence Mode                : Disabled
    PCI
        Bus Id                      : 0000:03:00.0
        GPU Link Info
            PCIe Generation
                Max                 : 3
                Current             : 1
            Link Width
                Max                 : 16x
                Current             : 16x
    Clocks Throttle Reasons
        Idle                        : Active
        SW Power Cap                : Not Active
    Utilization
        Gpu                         : 0 %
    Ecc Mode
        Current                     : Enabled
    ECC Errors
        Volatile
            Single Bit            
                Device Memory       : 5
                Total               : 5
            Double Bit            
                Device Memory       : 2
                Register File       : 1
                Total               : 3
        Aggregate
            Double Bit            
                Total               : 40
    Retired Pages
        Double Bit ECC              : 7
    Power Readings
        Power Draw                  : 25.50 W
        Power Limit                 : 149.00 W
        Default Power Limit         : 149.00 W
        Enforced Power Limit        : 120.00 W
        Max Power Limit             : 175.00 W
    Clocks
        SM                          : 324 MHz
    Max Clocks
        SM                          : 875 MHz
"""
"""Synthetic (not a captured output): the pre-Ampere spellings."""

NEW = """
GPU 00000000:18:00.0
    Product Name                                   : NVIDIA H100 PCIe
    MIG Mode
        Current                                    : Enabled
    PCI
        GPU Link Info
            PCIe Generation
                Max                                : 4
                Current                            : 4
                Device Current                     : 4
                Device Max                         : 5
                Host Max                           : 4
            Link Width
                Max                                : 16x
                Current                            : 16x
    Clocks Event Reasons
        Idle                                       : Not Active
        SW Power Cap                               : Not Active
        HW Slowdown                                : Not Active
            HW Thermal Slowdown                    : Not Active
        SW Thermal Slowdown                        : Active
    Clocks Event Reasons Counters
        SW Power Capping                           : 123 us
    Utilization
        Gpu                                        : 97 %
    ECC Mode
        Current                                    : Enabled
    ECC Errors
        Volatile
            SRAM Correctable                       : 9
            SRAM Uncorrectable Parity              : 1
            SRAM Uncorrectable SEC-DED             : 0
            DRAM Correctable                       : 4
            DRAM Uncorrectable                     : 2
    GPU Power Readings
        Average Power Draw                         : 301.20 W
        Instantaneous Power Draw                   : 305.00 W
        Current Power Limit                        : 310.00 W
        Requested Power Limit                      : 350.00 W
        Default Power Limit                        : 350.00 W
        Max Power Limit                            : 350.00 W
    Module Power Readings
        Current Power Limit                        : N/A
    Clocks
        SM                                         : 1410 MHz
    Max Clocks
        SM                                         : 1755 MHz
    Temperature
        GPU Current Temp                           : 84 C
"""
"""Synthetic: the 535+ spellings (Clocks Event Reasons, GPU Power Readings, SRAM/DRAM ECC)."""


def test_old_spellings_enforced_limit_double_bit_total_and_an_idle_gen_downshift():
    (gpu,) = gpu_state.parse_query(OLD)
    assert (gpu["name"], gpu["bus_id"], gpu["persistence_mode"], gpu["mig_mode_current"]) == (
        "Tesla K80", "0000:03:00.0", "Disabled", None)
    assert (gpu["power_draw_w"], gpu["power_limit_w"], gpu["power_limit_default_w"], gpu["power_limit_max_w"]) == (
        25.5, 120.0, 149.0, 175.0)
    assert gpu["ecc_volatile_uncorrected"] == 3 and gpu["ecc_mode_current"] == "Enabled"
    assert gpu["throttle_reasons_active"] == ["Idle"]
    assert (gpu["pcie_gen_current"], gpu["pcie_gen_max"], gpu["pcie_width_current"]) == (1, 3, 16)
    # idle at Gen1 of Gen3: not a problem; the enforced limit below the default and the errors are
    assert gpu_state.state_problems([gpu]) == ["GPU power limit 120 W, below its default 149 W",
                                               "3 volatile uncorrected ECC errors"]


def test_new_spellings_average_draw_current_limit_sram_dram_ecc_and_a_busy_gen_downshift():
    (gpu,) = gpu_state.parse_query(NEW)
    assert (gpu["power_draw_w"], gpu["power_limit_w"], gpu["power_limit_default_w"]) == (301.2, 310.0, 350.0)
    assert gpu["ecc_volatile_uncorrected"] == 3 and gpu["mig_mode_current"] == "Enabled"
    assert gpu["throttle_reasons_active"] == ["SW Thermal Slowdown"]        # the counters are not reasons
    assert (gpu["pcie_gen_current"], gpu["pcie_gen_max"], gpu["pcie_gen_host_max"]) == (4, 5, 4)
    assert (gpu["sm_clock_mhz"], gpu["sm_clock_max_mhz"], gpu["temperature_c"], gpu["gpu_util_pct"]) == (
        1410, 1755, 84, 97)
    assert gpu_state.state_problems([gpu]) == [
        "GPU power limit 310 W, below its default 350 W",
        "throttled: SW Thermal Slowdown (SM clock 1410 of max 1755 MHz)",
        "PCIe link Gen4 x16, below its max Gen5 x16 (the host allows Gen4)",
        "3 volatile uncorrected ECC errors"]


def test_double_bit_without_a_total_sums_its_parts():
    text = OLD.replace("                Total               : 3\n", "")
    assert gpu_state.parse_query(text)[0]["ecc_volatile_uncorrected"] == 3


def test_old_and_new_spellings_compare_field_by_field():
    (old,), (new,) = gpu_state.parse_query(OLD), gpu_state.parse_query(NEW)
    assert gpu_state.state_differences([old], [new]) == [
        "GPU model NVIDIA H100 PCIe vs Tesla K80",
        "GPU power limit 310 vs 120 W (capped below its default 350 W)",
        "SM clock 1410 vs 324 MHz; throttled now: SW Thermal Slowdown"]


@pytest.mark.parametrize("text", [
    "", "   \n\n", "no colon here", "Key : Value\n  Other : 1", "\x00\x01 binary :\n\t\tGPU",
    "GPU 00000000:01:00.0 : not a section", "    GPU 00000000:01:00.0\n  : :\n::::\n        SM : fast MHz",
])
def test_malformed_or_empty_text_gives_no_gpus_or_unknowns_never_an_error(text):
    gpus = gpu_state.parse_query(text)
    assert all(g["sm_clock_mhz"] is None and g["name"] is None for g in gpus)
    assert gpu_state.state_problems(gpus) == [] and gpu_state.state_differences(gpus, gpus) == []


def test_query_is_none_without_nvidia_smi_and_parses_its_output(monkeypatch):
    calls = []
    monkeypatch.setattr(gpu_state, "run_quiet", lambda cmd, timeout_s=None: calls.append((cmd, timeout_s)))
    assert gpu_state.query() is None
    assert calls == [(["nvidia-smi", "-q"], 20.0)]
    monkeypatch.setattr(gpu_state, "run_quiet", lambda cmd, timeout_s=None: (DATA / A100).read_text())
    assert [g["name"] for g in gpu_state.query()] == ["NVIDIA A100-SXM4-80GB"]
