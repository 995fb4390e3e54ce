"""The GPU path (nccl backend, CUDA memory, bf16, fused AdamW): runs only where CUDA is present."""
from __future__ import annotations

import json

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


def test_gpu_checks_distillation_run_beside_its_twin(tmp_path):
    """gpu-check's kd run (llama-440m from a TinyLlama-1.1B-shaped teacher, ZeRO-1, mb 128 x ga 8) and z1, its
    twin without a teacher (suite gpu-check-kd, as tests/gpu/kd_8b_node.sh runs it; about 75 s on an H100):
    gpu-check.md sets both MFUs beside the twin's, and the teacher's memory beside the memory model's."""
    from harness.config.compose import compose
    from harness.config.teacher import teacher_workload
    from harness.gpu_check import gpu_check
    from harness.model.flops import forward_flops_per_token, llama_param_count, training_flops_per_token

    out = tmp_path / "out"
    assert gpu_check(["suite=gpu-check-kd", f"out={out}", "history=none"]) == 0
    s = json.loads((out / "gpu-check.json").read_text())
    assert [t["status"] for t in s["training"]] == ["ok", "ok"]
    (d,) = s["distillation"]
    assert d["twin"] == "z1" and d["twin_mfu_pct"] > d["mfu_pct"] > 0     # the teacher's forward takes the student's time
    w = compose(["workload=llama-440m-kd"]).workload
    t = teacher_workload(w)
    student = training_flops_per_token(w, llama_param_count(w)).flops_per_token
    teacher = forward_flops_per_token(t, llama_param_count(t)).flops_per_token
    assert d["mfu_with_teacher_pct"] / d["mfu_pct"] == pytest.approx((student + teacher) / student, rel=1e-3)
    assert d["teacher_mem_gib"] * 2**30 == pytest.approx(2 * 1_100_048_384, rel=0.01)   # a bf16 replica
    assert d["added_peak_gib"] is not None and d["predicted_teacher_gib"] > d["teacher_mem_gib"]  # + its logits
    assert "| kd | z1 |" in (out / "gpu-check.md").read_text()


def test_zero3_with_the_optimizer_partly_offloaded_as_the_8b_suites_run_it(tmp_path):
    """The 8B suites' path (conf/suite/gpu-8b-*.yaml) at tiny size: ZeRO-3 with half of the optimizer's sub-groups
    on the host (DeepSpeedCPUAdam there, torch AdamW on the GPU for the rest, pinned buffers) and a ZeRO-3
    teacher engine that takes the student's ZeRO section, offload included."""
    ds = tmp_path / "offload.json"
    ds.write_text(json.dumps({"zero_optimization": {"sub_group_size": 1_000_000, "offload_optimizer": {
        "device": "cpu", "pin_memory": True, "ratio": 0.5}}}))
    run = run_bench(tmp_path / "out", PLATFORM, "suite=single", "workload=llama-tiny-kd", "workload.precision=bf16",
                    "zero=stage3", "workload.optimizer=deepspeed", f"deepspeed_config={ds}", "measure.warmup_steps=1",
                    "measure.steps=2", "measure.profile_steps=1")
    assert run.returncode == 0, run.stderr[-3000:]
    (rec,) = run.records().values()
    assert rec["status"] == "ok", rec["reason"]
    assert validate_record(rec) == []
    assert rec["config"]["deepspeed"]["zero_optimization"]["offload_optimizer"]["ratio"] == 0.5
    assert rec["metrics"]["mfu_with_teacher_pct"]["value"] > rec["metrics"]["mfu_pct"]["value"] > 0


FP8 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.parametrize("variant,needs", [
    (["workload.kernels=liger"], "liger_kernel"),
    (["workload.attention=flash"], None),
    (["workload.compile=torch"], "triton"),
    pytest.param(["workload.precision=fp8", "workload.compile=torch"], "torchao",
                 marks=pytest.mark.skipif(not FP8, reason="FP8 needs a GPU of compute capability 8.9+")),
])
def test_each_stack_variant_trains_like_eager_at_the_same_seed(tmp_path, variant, needs):
    """Liger's kernels, flash attention, a compiled model and FP8 against eager, on the GPU, losses step
    by step within each variant's stated tolerance (harness/tune/parity.py stack_parity)."""
    if needs:
        pytest.importorskip(needs, reason=f"{needs} is in the GPU lock (requirements-gpu.lock), not here")
    from harness.record import ResultRecord
    from harness.tune.parity import stack_parity
    common = [PLATFORM, "workload=llama-440m", "workload.num_layers=4", "zero=stage1", "workload.samples_per_step=32",
              "workload.micro_batch_size=16", "measure.warmup_steps=2", "measure.steps=3", "measure.profile_steps=0"]
    run = run_bench(tmp_path / "out", "suite=single", *common)
    assert run.returncode == 0, run.stderr[-3000:]
    eager = run.records()
    run2 = run_bench(tmp_path / "variant", "suite=single", *common, *variant)
    assert run2.returncode == 0, run2.stderr[-3000:]
    records = [ResultRecord.from_dict(r) for r in [*eager.values(), *run2.records().values()]]
    (p,) = stack_parity(records)
    assert p.parity.ok, p.line()
    stack = p.variant.environment["stack"]
    if "workload.attention=flash" in variant:
        assert stack["attention_used"] == ["flash"]
    if "workload.compile=torch" in variant:
        assert p.variant.metrics["compile_s"]["value"] > 0
