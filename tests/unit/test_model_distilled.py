"""A distilled run with no measurement of its own is calibrated on its student alone (harness/model/calibration.py
student_twin): the teacher's forward runs at the student's efficiency. Measured on one H200 (2026-12-04,
reference_results/sources/gpu-runs/2026-12-04-h200/gpu-check-kd): llama-440m ZeRO-1 mb 128 x ga 8 at 1.272 s a
step alone, 2.295 s distilled from a TinyLlama-1.1B-shaped teacher (MFU with the teacher 26.4 %, alone 25.8 %);
the roofline said 1.924 (-16 %)."""
from __future__ import annotations

import pytest

from harness.model.calibration import calibrate, student_twin
from harness.model.perfmodel import executed_flops_per_step, predict
from harness.verdict.references import load_references
from unit_helpers import REPO_ROOT

H200 = REPO_ROOT / "reference_results" / "h200.json"
Z1 = ["platform=h200", "zero=stage1", "workload.samples_per_step=1024", "workload.micro_batch_size=128"]


def test_the_student_alone_calibrates_its_distilled_run_over_both_models_flops(composed):
    kd, alone = composed([*Z1, "workload=llama-440m-kd"]), composed([*Z1, "workload=llama-440m"])
    refs = [r for r in load_references([H200]) if r.benchmark == "llama-440m"]     # the kd entry left out
    student = student_twin(kd)
    assert student.workload.name == "llama-440m" and student.workload.distill is None
    cal = calibrate([], kd, refs)
    assert "of llama-440m alone, the teacher's forward taken at its efficiency" in cal.efficiency_source
    p_alone, p_kd = predict(alone, calibrate([], alone, refs)), predict(kd, cal)
    assert p_kd.compute_s == pytest.approx(p_alone.compute_s * executed_flops_per_step(kd) / executed_flops_per_step(alone))
    assert p_kd.optimizer_s == p_alone.optimizer_s > 0  # the student's optimizer: the teacher has none
    assert p_kd.step_time_s == pytest.approx(2.295, rel=0.03)     # measured; the roofline's 1.924 was -16 %


def test_a_distilled_run_with_entries_of_its_own_and_a_run_without_a_teacher_keep_theirs(composed):
    kd, alone = composed([*Z1, "workload=llama-440m-kd"]), composed([*Z1, "workload=llama-440m"])
    refs = load_references([H200])
    assert "alone" not in calibrate([], kd, refs).efficiency_source            # the kd entry of 2026-12-04
    assert predict(kd, calibrate([], kd, refs)).step_time_s == pytest.approx(2.295, rel=0.01)
    assert student_twin(alone) is None and "alone" not in calibrate([], alone, refs).efficiency_source
    assert calibrate([], kd, []).efficiency_source.startswith("uncalibrated")   # nothing of either: the roofline's
    assert "roofline" in predict(kd, calibrate([], kd, [])).efficiency_source
