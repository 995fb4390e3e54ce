"""Checkpointing some layers and some ops on the real runner: ZeRO-3 (DeepSpeed's parameter hooks
fire again in the recompute) with every other layer checkpointed under the selective policy trains
to the same losses, step by step, as without checkpointing, and the record says what ran."""
from __future__ import annotations

import pytest

from .conftest import run_bench

STEPS = ("measure.warmup_steps=1", "measure.steps=2", "measure.profile_steps=0", "suite=single", "zero=stage3")


def test_zero3_with_selective_checkpointing_of_every_other_layer_trains_as_without(tmp_path):
    plain = run_bench(tmp_path / "plain", *STEPS)
    ckpt = run_bench(tmp_path / "ckpt", *STEPS, "workload.activation_checkpointing=true",
                     "workload.checkpoint_every_n_layers=2", "workload.checkpoint_policy=selective")
    assert plain.returncode == 0 and ckpt.returncode == 0, ckpt.stderr[-3000:]
    (a,), (b,) = plain.records().values(), ckpt.records().values()
    assert b["status"] == "ok"
    w = b["config"]["workload"]
    assert (w["activation_checkpointing"], w["checkpoint_every_n_layers"], w["checkpoint_policy"]) == (True, 2, "selective")
    assert [s["loss"] for s in b["steps"]] == pytest.approx([s["loss"] for s in a["steps"]], rel=1e-5)
