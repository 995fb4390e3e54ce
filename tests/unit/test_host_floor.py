"""The host floor's fit (tests/perf/host_floor.py): the committed H200 records give exactly what
harness/model/params.py carries, so the figures a compiled stack's records give (conf/suite/gpu-compile-host.yaml)
go into params.py the same way."""
from __future__ import annotations

import pytest

from harness.model.params import PARAMS
from tests.perf.host_floor import H200_FLOOR, Point, against_eager, fit, main, point, points


def test_the_h200_records_give_params_eager_floor():
    fits = {(f.stack, f.stage_class, f.micro_batch_size): f for f in fit(points(list(H200_FLOOR)))}
    assert set(fits) == {("eager", "replicated", 8), ("eager", "sharded", 8)}
    for cls in ("replicated", "sharded"):
        f = fits[("eager", cls, 8)]
        assert [p.modules for p in f.points] == [57, 111, 219]
        assert f.host_s_per_module == pytest.approx(PARAMS.host_s_per_module[cls], rel=0.01)
        assert f.host_base_s == pytest.approx(PARAMS.host_base_s[cls], abs=0.05e-3)
    assert fits[("eager", "replicated", 8)].max_residual_s < 1.5e-3 and fits[("eager", "sharded", 8)].max_residual_s < 20e-3


def test_each_stack_is_set_against_eagers_floor_of_its_class_and_micro_batch():
    eager = [Point("eager", "replicated", 8, m, 0.010 + 0.0003 * m, f"e{m}") for m in (57, 219)]
    compiled = [Point("compile", "replicated", 8, m, 0.005 + 0.0001 * m, f"c{m}") for m in (57, 219)]
    lone = [Point("deepcompile", "sharded", 8, 219, 0.1, "dc")]            # one layer count: no line
    fits = fit(eager + compiled + lone)
    assert [(f.stack, f.stage_class) for f in fits] == [("compile", "replicated"), ("eager", "replicated")]
    (ratio,) = against_eager(fits).values()
    assert ratio == pytest.approx((0.005 + 0.0001 * 138) / (0.010 + 0.0003 * 138))


def test_only_ok_gpu_training_runs_with_profiled_micro_steps_are_points():
    steps = [[{"total_s": 0.03}, {"total_s": 0.05}, {"total_s": 0.9}], [{"total_s": 0.04}, {"total_s": 0.06}, {"total_s": 0.8}]]
    rec = {"kind": "training", "status": "ok", "name": "z3", "microsteps": steps,
           "config": {"platform": {"device": "cuda"}, "zero": {"stage": 3},
                      "workload": {"num_layers": 6, "micro_batch_size": 8, "compile": "deepcompile"}}}
    p = point(rec)
    assert (p.stack, p.stage_class, p.modules, p.micro_step_s) == ("deepcompile", "sharded", 57, pytest.approx(0.045))
    assert point({**rec, "status": "oom"}) is None
    assert point({**rec, "config": {**rec["config"], "platform": {"device": "cpu"}}}) is None
    assert point({**rec, "microsteps": [[{"total_s": 0.9}]]}) is None      # the optimizer's micro-step alone


def test_the_script_prints_the_lines_and_says_when_there_is_none(tmp_path, capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "eager        sharded       8     1.91     1.560" in out
    assert main([str(tmp_path)]) == 1 and "no group" in capsys.readouterr().out
