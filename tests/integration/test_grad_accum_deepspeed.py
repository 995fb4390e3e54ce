"""DeepSpeed does with the generated data_types what the suite claims (issue 14): a real engine on
one gloo rank, built from harness.plan.deepspeed_config, for a bf16 model under each ZeRO stage."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from .conftest import REPO

SCRIPT = """
import json, sys
import torch, deepspeed
from harness.config.compose import compose
from harness.plan import deepspeed_config
from benchmarks.training.train import make_optimizer
from contract.spec import OptimizerSpec
from benchmarks.node.ops import preload
preload()
deepspeed.init_distributed(dist_backend="gloo")
stage, extra = int(sys.argv[1]), sys.argv[2:]
cfg = compose(["platform=cpu", "platform.gpus_per_node=1", "workload=llama-tiny", "workload.precision=bf16",
               f"zero=stage{stage}", *extra])
ds = deepspeed_config(cfg)
with deepspeed.zero.Init(config_dict_or_path=ds, enabled=stage == 3):
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 1))
if stage != 3:
    model = model.to(torch.bfloat16)
class Spec: optimizer, device = OptimizerSpec(), "cpu"
engine, *_ = deepspeed.initialize(model=model, optimizer=make_optimizer(Spec, model), config=ds)
for _ in range(ds["gradient_accumulation_steps"]):
    loss = engine(torch.randn(ds["train_micro_batch_size_per_gpu"], 16, dtype=torch.bfloat16)).float().pow(2).mean()
    engine.backward(loss)
    engine.step()
opt = engine.optimizer
accum = getattr(opt, "gradient_accumulation_dtype", getattr(opt, "grad_acc_dtype", None))
print(json.dumps({"json": ds["data_types"]["grad_accum_dtype"], "optimizer": type(opt).__name__,
                  "accum": str(accum), "steps": engine.global_steps}), flush=True)
# out at once, as a rank does (benchmarks/failure.py run_rank): left to the interpreter's teardown, DeepSpeed's gloo
# groups sometimes end in std::terminate after the answer was printed (SIGABRT, seen in CI for ZeRO-1 on 2026-12-06)
import os
os._exit(0)
"""


def _engine(stage: int, *extra: str) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_RANK": "0", "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(stage), *extra], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("stage,optimizer,accum", [
    (1, "DeepSpeedZeroOptimizer", "torch.bfloat16"),
    (2, "DeepSpeedZeroOptimizer", "torch.float32"),
    (3, "DeepSpeedZeroOptimizer_Stage3", "torch.float32")])
def test_deepspeed_accumulates_in_the_dtype_the_suite_wrote(stage, optimizer, accum):
    out = _engine(stage)
    assert out["json"] == {"torch.bfloat16": "bf16", "torch.float32": "fp32"}[accum]
    assert (out["optimizer"], out["accum"], out["steps"]) == (optimizer, accum, 1)


def test_fp32_accumulation_under_zero_1_runs_deepspeeds_bf16_optimizer():
    out = _engine(1, "workload.grad_accum_dtype=fp32")
    assert (out["json"], out["optimizer"], out["accum"], out["steps"]) == ("fp32", "BF16_Optimizer", "torch.float32", 1)
