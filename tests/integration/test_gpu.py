"""The GPU path (nccl backend, CUDA memory, bf16, fused AdamW): runs only where CUDA is present."""
from __future__ import annotations

import pytest

from harness.record import validate_record

from .conftest import run_bench

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.integration, pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
# the one-GPU platform of the device present (its declared model is checked against it)
PLATFORM = "platform=h100" if torch.cuda.is_available() and "H100" in torch.cuda.get_device_name(0) else "platform=h200"


def test_llama_440m_on_one_gpu(tmp_path):
    run = run_bench(tmp_path / "out", PLATFORM, "suite=single", "workload=llama-440m",
                    "zero=stage2", "workload.samples_per_step=32", "workload.micro_batch_size=16",
                    "measure.warmup_steps=2", "measure.steps=5", "measure.profile_steps=1")
    assert run.returncode == 0, run.stderr[-3000:]
    (rec,) = run.records().values()
    assert rec["status"] == "ok", rec["reason"]
    assert validate_record(rec) == []
    env = rec["environment"]
    assert env["cuda"] and env["nccl"] and env["gpu_model"] and env["gpu_count"] >= 1
    assert env["hardware_mismatch"] == [], env["hardware_mismatch"]
    gpu = env["machine"]["gpus"][0]
    assert gpu["uuid"].startswith("GPU-") and gpu["memory_mib"] > 0 and gpu["sm_clock_max_mhz"] > 0
    assert rec["metrics"]["peak_mem_gib"]["source"] == "torch.cuda.max_memory_allocated since setup"
    assert 0 < rec["metrics"]["mfu_pct"]["value"] < 100
    assert rec["flops"]["num_params"] == 439_927_808


@pytest.mark.parametrize("stage", [2, 3])
def test_distillation_on_one_gpu(tmp_path, stage):
    """llama-tiny-kd in bf16 on CUDA: a bf16 teacher replica (ZeRO-2) or a ZeRO-3 teacher engine."""
    run = run_bench(tmp_path / "out", PLATFORM, "suite=single", "workload=llama-tiny-kd",
                    "workload.precision=bf16", f"zero=stage{stage}", "measure.warmup_steps=1",
                    "measure.steps=3", "measure.profile_steps=1")
    assert run.returncode == 0, run.stderr[-3000:]
    (rec,) = run.records().values()
    assert rec["status"] == "ok", rec["reason"]
    assert validate_record(rec) == []
    assert rec["metrics"]["mfu_with_teacher_pct"]["value"] > rec["metrics"]["mfu_pct"]["value"] > 0
    assert rec["metrics"]["teacher_mem_gib"]["value"] * 2**30 == pytest.approx(2 * 4_999_424, rel=0.01)
    assert all(ms["phase_s"]["teacher"] > 0 for step in rec["microsteps"] for ms in step)
