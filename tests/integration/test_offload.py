"""ZeRO-3 with the optimizer partly offloaded to the host, as the 8B suites run it (conf/suite/gpu-8b-*.yaml,
docs/workloads.md "The 8B shapes on one GPU node"), on two gloo ranks with llama-tiny-kd: DeepSpeedCPUAdam
on half of the optimizer's sub-groups (its cpu_adam op built before launch), the rest stepped where the
model lives, and a ZeRO-3 teacher engine that takes the student's ZeRO section, offload included. On a
GPU, tests/integration/test_gpu.py runs the same configuration."""
from __future__ import annotations

import json
import math

import pytest

from harness.record import validate_record

from .conftest import run_bench

pytestmark = pytest.mark.integration


def test_zero3_with_half_the_optimizer_offloaded_trains_the_distillation_workload(tmp_path):
    ds = tmp_path / "offload.json"
    ds.write_text(json.dumps({"zero_optimization": {"sub_group_size": 1_000_000, "offload_optimizer": {
        "device": "cpu", "pin_memory": True, "ratio": 0.5}}}))
    run = run_bench(tmp_path / "out", "platform=cpu", "suite=single", "workload=llama-tiny-kd", "zero=stage3",
                    "workload.optimizer=deepspeed", f"deepspeed_config={ds}", "measure.warmup_steps=1",
                    "measure.steps=2", "measure.profile_steps=1")
    assert run.returncode == 0, run.stderr[-3000:]
    (rec,) = run.records().values()
    assert rec["status"] == "ok", rec["reason"]
    assert validate_record(rec) == []
    assert rec["config"]["deepspeed"]["zero_optimization"]["offload_optimizer"] == {
        "device": "cpu", "pin_memory": True, "ratio": 0.5}
    assert rec["config"]["deepspeed"]["optimizer"]["type"] == "AdamW"          # DeepSpeedCPUAdam under offload
    assert all(math.isfinite(s["loss"]) for s in rec["steps"])
    assert rec["metrics"]["mfu_with_teacher_pct"]["value"] > rec["metrics"]["mfu_pct"]["value"] > 0
    assert all(ms["phase_s"]["teacher"] > 0 for step in rec["microsteps"] for ms in step)
