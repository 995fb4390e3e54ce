"""Weight decay under ZeRO-3 (issue 14): deepspeed.zero.Init replaces every parameter by an empty
1-D partition, so grouping by `p.ndim` put every parameter in the no-decay group and ZeRO-3 trained
another optimiser than ZeRO 0-2. A real zero.Init on one gloo rank, in its own process."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

from .conftest import REPO

SCRIPT = """
import json, os, sys
import torch, deepspeed
from benchmarks.node.ops import preload
preload()
deepspeed.init_distributed(dist_backend="gloo")
from benchmarks.training.train import decay_groups
cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": int(sys.argv[1])}}
with deepspeed.zero.Init(config_dict_or_path=cfg, enabled=sys.argv[1] == "3"):
    model = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
decay, rest = decay_groups(model.parameters())
print(json.dumps({"decay": len(decay), "rest": len(rest), "ndim": [p.ndim for p in model.parameters()]}))
"""


def _groups(stage: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_RANK": "0", "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(stage)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_zero3_partitions_get_the_same_weight_decay_groups_as_zero2():
    z2, z3 = _groups(2), _groups(3)
    assert z3["ndim"] == [1, 1, 1, 1, 1]                 # every ZeRO-3 parameter is an empty 1-D partition
    assert z2["ndim"] == [2, 2, 1, 1, 1]
    assert (z3["decay"], z3["rest"]) == (z2["decay"], z2["rest"]) == (2, 3)   # embedding + Linear weight decay
