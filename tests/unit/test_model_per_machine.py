"""The model calibrated on the machine at hand: cpu.json holds the training references of four 2-core EPYCs (AVX2
only, AVX-512, and a Zen 4 and a Zen 5 of the AVX-512 one's name and ISA class), whose llama-tiny runs differ by
1.2-3.2x, so with no record of its own `model` (and tune's model-first
step) calibrates on the entries of the machine that will run (harness/model/calibration.py of_machine,
harness/verdict/cross_machine.py this_machine), and pools them, saying so, only where that machine has none."""
from __future__ import annotations

import pytest

import harness.__main__ as cli
from harness.model.calibration import calibrate, of_machine
from harness.model.perfmodel import predict
from harness.verdict.cross_machine import this_machine
from harness.verdict.references import load_references
from unit_helpers import REPO_ROOT

SHIPPED = REPO_ROOT / "reference_results" / "cpu.json"
AVX2, AVX512 = "AMD EPYC (2 CPUs, AVX2)", "AMD EPYC (2 CPUs, AVX512 +avx512_bf16)"
ZEN5 = "AMD EPYC (2 CPUs, AVX512 +avx512_bf16; family 26 model 2)"
ZEN4 = "AMD EPYC (2 CPUs, AVX512 +avx512_bf16; family 25 model 17)"
MEASURED = {AVX2: 24.0, AVX512: 29.4, ZEN4: 35.7, ZEN5: 46.9}   # ZeRO-1 mb 2 x ga 4, samples/s: each machine's reference (medians of 3)


def samples_per_s(cfg, machine):
    return predict(cfg, calibrate([], cfg, load_references([SHIPPED]), machine=machine)).samples_per_s


@pytest.mark.parametrize("machine", [AVX2, AVX512, ZEN4, ZEN5])
def test_each_epyc_is_predicted_from_its_own_entries(tiny_cfg, machine):
    cal = calibrate([], tiny_cfg, load_references([SHIPPED]), machine=machine)
    assert f"entries of this machine, {machine} (one of the table's 4)" in cal.efficiency_source
    assert predict(tiny_cfg, cal).samples_per_s == pytest.approx(MEASURED[machine], rel=0.03)


def test_another_machine_gets_all_pooled_and_is_told_so(tiny_cfg):
    pooled = samples_per_s(tiny_cfg, None)
    assert MEASURED[AVX2] < pooled < MEASURED[ZEN5]
    cal = calibrate([], tiny_cfg, load_references([SHIPPED]), machine="Intel Xeon (2 CPUs, AVX512 +amx_bf16)")
    assert (f"pooled over 4 machines ({AVX2}; {AVX512}; {ZEN4}; {ZEN5}): none is this one, Intel Xeon (2 CPUs, AVX512 "
            "+amx_bf16)" in cal.efficiency_source)
    assert predict(tiny_cfg, cal).samples_per_s == pytest.approx(pooled)


def test_another_kind_under_the_avx512_boxs_name_takes_that_boxs_entries_kept_without_a_kind(tiny_cfg):
    """A Zen 4 (family 25) reads the AVX-512 box's name and ISA class; that box's entries keep no kind, so they
    may be its, and the Zen 5's, of another kind, are not. So it was calibrated before its own entries
    (2026-12-07), which it takes now: 35.7 samples/s measured where the unnamed box's gave 29.4."""
    before = [r for r in load_references([SHIPPED]) if r.machine() != ZEN4]
    cal = calibrate([], tiny_cfg, before, machine=ZEN4)
    assert f"entries of this machine, {ZEN4} (one of the table's 3)" in cal.efficiency_source
    assert predict(tiny_cfg, cal).samples_per_s == pytest.approx(MEASURED[AVX512], rel=0.03)
    assert samples_per_s(tiny_cfg, ZEN4) == pytest.approx(MEASURED[ZEN4], rel=0.03)


def test_a_stage_takes_its_own_machines_entries_too(composed):
    """ZeRO-3 mb 2: 11.2 samples/s measured on the AVX2 box, 16.2 on the AVX-512 one, 19.8 on the Zen 4, 26.4 on the
    Zen 5."""
    cfg = composed(["platform=cpu", "workload=llama-tiny", "zero=stage3"])
    assert samples_per_s(cfg, AVX2) == pytest.approx(11.2, rel=0.05)
    assert samples_per_s(cfg, AVX512) == pytest.approx(16.2, rel=0.05)
    assert samples_per_s(cfg, ZEN4) == pytest.approx(19.8, rel=0.05)
    assert samples_per_s(cfg, ZEN5) == pytest.approx(26.4, rel=0.05)


def test_one_machines_table_is_as_before():
    refs = [r for r in load_references([SHIPPED]) if r.machine() == AVX2]
    assert of_machine(refs, AVX512) == (refs, "")


def test_this_machine_is_named_as_its_records_would_be():
    name = this_machine("cpu", "cpu")
    assert name and name.endswith(")") and " CPUs, " in name     # 'AMD EPYC (2 CPUs, AVX512 +avx512_bf16)'
    assert this_machine("h100", "cuda") is None                   # a GPU table is the GPU's own
    assert this_machine("cpu-cluster", "cpu", "slurm") is None     # ranks on nodes this process does not see


@pytest.mark.parametrize("machine, words", [(AVX512, f"of this machine, {AVX512}"),
                                            ("Some CPU (2 CPUs, AVX2)", "none is this one, Some CPU (2 CPUs, AVX2)")])
def test_the_model_command_names_the_machine_it_calibrated_on(monkeypatch, capsys, machine, words):
    monkeypatch.setattr(cli, "this_machine", lambda *a: machine)
    assert cli.main(["model", "platform=cpu"]) == 0
    out = capsys.readouterr().out
    assert words in " ".join(out.split())
