"""A distilled run with no measurement of its own is calibrated on its student alone (harness/model/calibration.py
student_twin, carried_to_teacher): the student's measured efficiency x the roofline's ratio with the teacher's
forward and the distillation loss (params.distill_loss_bytes). Measured on one H200 (2026-12-04,
reference_results/sources/gpu-runs/2026-12-04-h200/gpu-check-kd): llama-440m ZeRO-1 mb 128 x ga 8 at 1.272 s a
step alone, 2.295 s distilled from a TinyLlama-1.1B-shaped teacher (MFU with the teacher 26.4 %, alone 25.8 %);
its profiled micro-step: the teacher's forward 86.7 ms, the student's forward and backward 43.5 ms over the
student alone's (the loss). The roofline without the loss said 1.924 (-16 %)."""
from __future__ import annotations

import dataclasses

import pytest

from harness.model.calibration import calibrate, carried_to_teacher, student_twin
from harness.model.calibration_types import Calibration
from harness.model.params import PARAMS
from harness.model.perfmodel import predict
from harness.verdict.references import load_references
from unit_helpers import REPO_ROOT

H200 = REPO_ROOT / "reference_results" / "h200.json"
Z1 = ["platform=h200", "zero=stage1", "workload.samples_per_step=1024", "workload.micro_batch_size=128"]


def test_the_student_alone_calibrates_its_distilled_run_by_the_rooflines_ratio(composed):
    kd, alone = composed([*Z1, "workload=llama-440m-kd"]), composed([*Z1, "workload=llama-440m"])
    refs = [r for r in load_references([H200]) if r.benchmark == "llama-440m"]     # the kd entry left out
    student = student_twin(kd)
    assert student.workload.name == "llama-440m" and student.workload.distill is None
    cal = calibrate([], kd, refs)
    assert "of llama-440m alone, x the roofline's ratio with its teacher's forward and the distillation loss" \
        in cal.efficiency_source
    p_alone, p_kd = predict(alone, calibrate([], alone, refs)), predict(kd, cal)
    roof_kd, roof_alone = (predict(c, Calibration()) for c in (kd, alone))    # nothing measured: the rooflines
    assert p_kd.compute_s / p_alone.compute_s == pytest.approx(roof_kd.compute_s / roof_alone.compute_s)
    assert p_kd.optimizer_s == p_alone.optimizer_s > 0  # the student's optimizer: the teacher has none
    # the measured 2.295 s: the student's references read its step 1.7 % slower than that day's 1.272 s, and the
    # roofline's teacher forward is 7 % over the measured 86.7 ms a micro-step
    assert p_kd.step_time_s == pytest.approx(2.295, rel=0.06)


def test_the_roofline_carries_the_teacher_and_the_loss_measured_apart(composed):
    """Per micro-step on the H200 (the profiled phases): the roofline's share of the teacher's forward and the loss
    (the distilled micro-step less the student's) against the measured 86.7 + 43.5 ms; without the loss term the
    distilled run came out 16 % fast."""
    kd, alone = composed([*Z1, "workload=llama-440m-kd"]), composed([*Z1, "workload=llama-440m"])
    ga = kd.workload.grad_acc_steps
    extra = (predict(kd, Calibration()).compute_s - predict(alone, Calibration()).compute_s) / ga
    assert extra == pytest.approx(0.0867 + 0.0435, rel=0.05)       # 136.1 ms: the teacher 92.5 against 86.7
    without = predict(kd, Calibration(), params=dataclasses.replace(PARAMS, distill_loss_bytes=0.0))
    assert (predict(kd, Calibration()).compute_s - without.compute_s) / ga == pytest.approx(0.0435, rel=0.01)
    on_cpu = composed(["workload=llama-tiny-kd"])                 # no roofline: the teacher at the student's efficiency
    assert "the distillation loss not counted" in carried_to_teacher(
        Calibration({8: 0.2}, 0.2, "measured"), on_cpu, student_twin(on_cpu)).efficiency_source


def test_a_distilled_run_with_entries_of_its_own_and_a_run_without_a_teacher_keep_theirs(composed):
    kd, alone = composed([*Z1, "workload=llama-440m-kd"]), composed([*Z1, "workload=llama-440m"])
    refs = load_references([H200])
    assert "alone" not in calibrate([], kd, refs).efficiency_source            # the kd entry of 2026-12-04
    assert predict(kd, calibrate([], kd, refs)).step_time_s == pytest.approx(2.295, rel=0.01)
    assert student_twin(alone) is None and "alone" not in calibrate([], alone, refs).efficiency_source
    assert calibrate([], kd, []).efficiency_source.startswith("uncalibrated")   # nothing of either: the roofline's
    assert "roofline" in predict(kd, calibrate([], kd, [])).efficiency_source
