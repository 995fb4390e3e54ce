"""References are per machine: a run on other hardware than its reference's is "not comparable",
naming both machines, instead of a regression or improvement; the same machine, or a reference
whose machine is unknown, is judged as before."""
from __future__ import annotations

import pytest
from test_compare import ENV, record, reference

from harness.verdict.compare import VERDICTS, compare, machine_of
from harness.report.verdicts import verdict_table
from unit_helpers import typed


def cpu_env(model: str, cpus: int = 2) -> dict:
    return {**ENV, "gpu_model": None, "gpu_count": 0, "cpu_model": model,
            "machine": {"cpu": {"model": model, "logical_cpus": cpus, "mem_total_gib": 23.4,
                                "load_avg_1_5_15": [0.1, 0.1, 0.1]}, "gpus": []}}


def gpu_env(name: str, count: int) -> dict:
    return {**ENV, "machine": {"cpu": {"model": "AMD EPYC 9654", "logical_cpus": 192},
                               "gpus": [{"name": name, "uuid": f"GPU-{i}"} for i in range(count)]}}


def test_the_machine_is_what_speed_rests_on_and_unknown_when_the_fingerprint_does_not_say():
    assert machine_of(cpu_env("AMD EPYC 7763 64-Core Processor")) == "AMD EPYC 7763 64-Core Processor (2 CPUs)"
    assert machine_of(gpu_env("NVIDIA H100 80GB HBM3", 8)) == "8 x NVIDIA H100 80GB HBM3"
    assert machine_of(cpu_env("x86_64")) is None            # the architecture is not a model
    assert machine_of(ENV) is None and machine_of(None) is None   # references from before the machine was read


def _verdicts(ref_env: dict, run_env: dict, factor: float = 0.5) -> list:
    ref = reference([100.0, 101.0, 99.0], env=ref_env)
    runs = [record(i, env=run_env, samples_per_s=(v * factor, "samples/s")) for i, v in enumerate([100.0, 99.5, 100.5])]
    return [v for v in compare(typed(runs), [ref]) if v.metric == "samples_per_s"]


def test_another_cpu_is_not_comparable_and_names_both_machines():
    (v,) = _verdicts(cpu_env("Intel Xeon Platinum 8480+", 112), cpu_env("AMD EPYC"))
    assert v.verdict == "not comparable" and "not comparable" in VERDICTS
    assert v.reason == ("not comparable: reference taken on Intel Xeon Platinum 8480+ (112 CPUs), "
                        "this run on AMD EPYC (2 CPUs)")
    assert v.value == pytest.approx(50.0) and v.environment_diff == {}
    table = verdict_table(_verdicts(cpu_env("Intel Xeon Platinum 8480+", 112), cpu_env("AMD EPYC")) * 3)
    assert table.count("reference taken on Intel Xeon") == 1   # one line for the machine pair, not one per row


@pytest.mark.parametrize("ref_env,run_env", [
    (gpu_env("NVIDIA A100-SXM4-80GB", 8), gpu_env("NVIDIA H100 80GB HBM3", 8)),   # another GPU model
    (gpu_env("NVIDIA H100 80GB HBM3", 8), gpu_env("NVIDIA H100 80GB HBM3", 4)),   # another GPU count
    (cpu_env("AMD EPYC", 64), cpu_env("AMD EPYC", 2)),                            # fewer usable cores
])
def test_other_gpus_or_cores_are_not_comparable(ref_env, run_env):
    assert [v.verdict for v in _verdicts(ref_env, run_env)] == ["not comparable"]


@pytest.mark.parametrize("ref_env", [cpu_env("AMD EPYC"), ENV, cpu_env("x86_64")],
                         ids=["same machine", "reference without a machine", "reference naming only x86_64"])
def test_the_same_or_an_unknown_machine_is_judged_as_before(ref_env):
    assert [v.verdict for v in _verdicts(ref_env, cpu_env("AMD EPYC"))] == ["regression"]
    assert [v.verdict for v in _verdicts(ref_env, cpu_env("AMD EPYC"), factor=1.0)] == ["pass"]
