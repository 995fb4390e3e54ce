"""Knowledge distillation end to end on two gloo ranks: llama-tiny-kd under ZeRO-2 (a teacher
replica per rank) and ZeRO-3 (the teacher sharded and gathered in its own forward phase).

The checkpoint runs load, as teacher, the very weights the student starts from: at the first
optimizer step (before any update) the KL term must then vanish under both placements, which
shows that the checkpoint reached every parameter of a replica and of a sharded teacher alike.
"""
from __future__ import annotations

import math

import pytest

from harness.record import validate_record

from .conftest import run_bench

pytestmark = pytest.mark.integration

ZERO3_KNOBS = ["zero.stage3_param_persistence_threshold=0", "zero.stage3_max_reuse_distance=0"]


def teacher_ops(ms: dict) -> list[dict]:
    return [c for c in ms["collectives"] if c["phase"] == "teacher"]


def check_loss_parts(rec: dict) -> None:
    alpha = rec["config"]["workload"]["distill"]["alpha"]
    t = rec["config"]["workload"]["distill"]["temperature"]
    for s in rec["steps"]:
        assert s["loss"] == pytest.approx((1 - alpha) * s["ce_loss"] + alpha * t * t * s["kl_loss"], rel=1e-5)


@pytest.fixture(scope="module")
def checkpoint_runs(tmp_path_factory):
    """ZeRO-2 and ZeRO-3 runs whose fp32 teacher is loaded from a checkpoint of the student's
    own initial weights (the suite's seeded, placement-independent initialisation)."""
    from benchmarks.training.model import build_model, initialise
    from harness.config.compose import compose
    from harness.plan import model_spec

    base = tmp_path_factory.mktemp("kd")
    cfg = compose(["workload=llama-tiny-kd"])
    model = build_model(model_spec(cfg.workload))
    initialise(model, cfg.measure.seed, zero3=False)
    model.save_pretrained(base / "teacher")
    run = run_bench(base / "out", "-m", "zero=stage2,stage3", "suite=single", "workload=llama-tiny-kd",
                    f"workload.distill.teacher.checkpoint={base / 'teacher'}",
                    "workload.distill.teacher.precision=fp32", "measure.warmup_steps=1", "measure.steps=1",
                    "measure.profile_steps=1", *ZERO3_KNOBS)
    assert run.returncode == 0, run.stderr[-3000:]
    by_stage = {r["config"]["zero"]["stage"]: r for r in run.records().values()}
    assert sorted(by_stage) == [2, 3]
    return by_stage


def test_both_placements_give_valid_records_with_the_teacher_accounted(checkpoint_runs):
    for stage, rec in checkpoint_runs.items():
        assert validate_record(rec) == [], stage
        assert rec["status"] == "ok", rec["reason"]
        assert rec["benchmark"] == "llama-tiny-kd"
        n = rec["flops"]["teacher"]["num_params"]
        assert n == rec["flops"]["num_params"] == 4_999_424
        per_rank = rec["metrics"]["teacher_mem_gib"]["value"] * 2**30
        expected = 4 * n if stage == 2 else 4 * n / 2  # fp32: a whole replica, or half of it
        assert per_rank == pytest.approx(expected, rel=0.01), stage
        assert rec["metrics"]["mfu_with_teacher_pct"]["value"] > rec["metrics"]["mfu_pct"]["value"] > 0
        check_loss_parts(rec)


def test_a_teacher_loaded_from_the_students_weights_has_no_kl_at_the_first_step(checkpoint_runs):
    for stage, rec in checkpoint_runs.items():
        first = rec["steps"][0]
        assert first["kl_loss"] < 1e-5, stage
        assert first["ce_loss"] > 8  # an untrained model on a 4096-token vocabulary (ln 4096 = 8.3)
        assert rec["steps"][-1]["kl_loss"] > first["kl_loss"]  # the student moves away from it


def test_replica_and_sharded_teacher_give_the_same_losses(checkpoint_runs):
    """Same seed, same data, same student init and teacher: ZeRO-2 and ZeRO-3 agree step by step."""
    z2, z3 = checkpoint_runs[2]["steps"], checkpoint_runs[3]["steps"]
    assert [s["index"] for s in z2] == [s["index"] for s in z3]
    for a, b in zip(z2, z3):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
        assert a["ce_loss"] == pytest.approx(b["ce_loss"], rel=1e-5)


def test_a_replica_teacher_runs_its_forward_without_communicating(checkpoint_runs):
    rec = checkpoint_runs[2]
    for step in rec["microsteps"]:
        for ms in step:
            assert ms["phase_s"]["teacher"] > 0
            assert teacher_ops(ms) == []
            assert set(ms["phase_s"]) >= {"teacher", "forward", "backward"}
            assert sum(ms["phase_s"].values()) == pytest.approx(ms["total_s"], rel=1e-6)


def test_a_sharded_teacher_gathers_all_its_parameters_in_its_own_phase(checkpoint_runs):
    rec = checkpoint_runs[3]
    n = rec["flops"]["teacher"]["num_params"]
    for step in rec["microsteps"]:
        for ms in step:
            ops = teacher_ops(ms)
            assert ops and {c["op"] for c in ops} == {"all_gather"}, ms["index"]
            assert sum(c["bytes"] for c in ops) >= 4 * n * 0.9  # (nearly) every fp32 teacher parameter
            student = sum(c["bytes"] for c in ms["collectives"] if c["phase"] == "forward" and c["op"] == "all_gather")
            assert 4 * n * 0.9 <= student <= 4 * n * 1.1, "the student's forward gathers the student only"
            assert ms["phase_s"]["teacher"] >= sum(c["time_s"] for c in ops)


def test_the_default_suite_distils_from_a_random_bf16_teacher_sharded_by_zero3(default_suite):
    (rec,) = [r for r in default_suite.records().values() if r["benchmark"] == "llama-tiny-kd"]
    assert rec["status"] == "ok", rec["reason"]
    assert rec["config"]["zero"]["stage"] == 3
    assert rec["config"]["workload"]["distill"]["teacher"]["checkpoint"] is None
    assert rec["flops"]["teacher"]["dtype"] == "bf16"
    n = rec["flops"]["teacher"]["num_params"]
    assert rec["metrics"]["teacher_mem_gib"]["value"] * 2**30 == pytest.approx(2 * n / 2, rel=0.01)
    assert rec["steps"][0]["kl_loss"] > 1e-3  # a teacher of its own, not the student
    assert all(math.isfinite(s["loss"]) for s in rec["steps"])
    check_loss_parts(rec)
    for step in rec["microsteps"]:
        for ms in step:
            assert sum(c["bytes"] for c in teacher_ops(ms)) >= 2 * n * 0.9  # bf16 teacher, gathered
