"""The probe's GPU tolerances and the pace rule's GPU noise hold the GPU nodes' own records (issue 39
item 5): every probe figure of one GPU model across its benches, and every training run's pace
against its own bench's probe, lie inside what harness/probe.py sets, with room."""
from __future__ import annotations

from harness.pace import MEMORY_PACE_NOISE_PCT
from harness.probe import PACE_NOISE_PCT, TOLERANCE_PCT
from tests.perf.gpu_noise import GPU_RUNS, main, noise


def test_the_records_hold_two_gpu_models_with_probes_and_paced_runs():
    models = noise([GPU_RUNS])
    assert {"NVIDIA H200", "NVIDIA H100 80GB HBM3"} <= set(models)
    assert sum(len(m.paces) for m in models.values()) >= 9
    assert all(len(v) >= 2 for m in models.values() for v in m.probes.values())


def test_the_gpu_tolerances_lie_above_every_spread_the_records_show():
    for m in noise([GPU_RUNS]).values():
        for figure in m.probes:
            kind = "triad" if figure == "triad" else "matmul"
            assert m.spread_pct(figure) < TOLERANCE_PCT["cuda"][kind], (m.gpu, figure, m.spread_pct(figure))
        assert m.pace_pct() < PACE_NOISE_PCT["cuda"], (m.gpu, m.pace_pct())
        assert m.pace_pct(memory=True) < MEMORY_PACE_NOISE_PCT["cuda"], (m.gpu, m.pace_pct(memory=True))   # 0 until
        # a GPU node's records carry a memory pulse (load.pulse_triad): then they hold the figure set without them


def test_an_h100_and_an_h200_stay_apart_by_the_triad():
    models = noise([GPU_RUNS])
    h100, h200 = models["NVIDIA H100 80GB HBM3"].probes["triad"], models["NVIDIA H200"].probes["triad"]
    assert min(h200) / max(h100) - 1 > TOLERANCE_PCT["cuda"]["triad"] / 100


def test_the_script_prints_each_model(capsys):
    assert main([str(GPU_RUNS)]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H100 80GB HBM3" in out and "pace (pulse / its bench's probe fp32)" in out
