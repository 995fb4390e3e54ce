"""The GPU path (nccl backend, CUDA memory, bf16, fused AdamW): runs only where CUDA is present."""
from __future__ import annotations

import pytest

from harness.record import validate_record

from .conftest import run_bench

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.integration, pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_llama_440m_on_one_gpu(tmp_path):
    run = run_bench(tmp_path / "out", "platform=h200", "suite=single", "workload=llama-440m",
                    "zero=stage2", "workload.samples_per_step=32", "workload.micro_batch_size=16",
                    "measure.warmup_steps=2", "measure.steps=5", "measure.profile_steps=1")
    assert run.returncode == 0, run.stderr[-3000:]
    (rec,) = run.records().values()
    assert rec["status"] == "ok", rec["reason"]
    assert validate_record(rec) == []
    env = rec["environment"]
    assert env["cuda"] and env["nccl"] and env["gpu_model"] and env["gpu_count"] == 1
    assert rec["metrics"]["peak_mem_gib"]["source"] == "torch.cuda.max_memory_allocated"
    assert 0 < rec["metrics"]["mfu_pct"]["value"] < 100
    assert rec["flops"]["num_params"] == 439_927_808
