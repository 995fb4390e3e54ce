"""harness.config.split.with_split: a configuration at another split and ZeRO stage, validated."""
from __future__ import annotations

import copy
import dataclasses
import warnings

import pytest
from unit_helpers import typed

from harness.config.choices import GradientCollective
from harness.config.schema import ZeroConfig
from harness.config.split import with_split
from harness.config.validate import validate
from harness.errors import ConfigError
from harness.model.calibration_inputs import record_variant


def test_split_of_c_keeps_everything_else(tiny_cfg):
    before = copy.deepcopy(tiny_cfg)
    out = with_split(tiny_cfg, 3, 4)
    assert tiny_cfg == before
    w = out.workload
    assert (out.zero.stage, w.micro_batch_size, w.grad_acc_steps, w.samples_per_step) == (3, 4, 2, 8)
    assert dataclasses.replace(out.zero, stage=before.zero.stage) == before.zero
    assert dataclasses.replace(w, micro_batch_size=2, grad_acc_steps=4) == before.workload


@pytest.mark.parametrize("mb", [3, 16, 0, -2])
def test_micro_batch_that_does_not_divide_c_is_refused(tiny_cfg, mb):
    with pytest.raises(ConfigError, match="workload.micro_batch_size"):
        with_split(tiny_cfg, 2, mb)


def test_invalid_stage_and_knobs_are_refused(tiny_cfg):
    with pytest.raises(ConfigError, match="zero.stage=4"):
        with_split(tiny_cfg, 4, 2)
    rs = ZeroConfig(gradient_collective=GradientCollective.reduce_scatter)
    assert with_split(tiny_cfg, 2, 2, 4, zero=rs).zero.gradient_collective == GradientCollective.reduce_scatter
    with pytest.raises(ConfigError, match="zero.gradient_collective"):
        with_split(tiny_cfg, 3, 2, 4, zero=rs)
    with pytest.raises(ConfigError, match="zero.reduce_bucket_size"):
        with_split(tiny_cfg, 2, 2, zero=ZeroConfig(reduce_bucket_size=0))


def test_measured_split_has_its_own_c_knobs_and_checkpointing(tiny_cfg):
    cfg = dataclasses.replace(tiny_cfg, tune=dataclasses.replace(tiny_cfg.tune, micro_batch_sizes=[2, 8]))
    out = with_split(cfg, 1, 4, 3, activation_checkpointing=True, zero=ZeroConfig(overlap_comm=True))
    w = out.workload
    assert (w.micro_batch_size, w.grad_acc_steps, w.samples_per_step, w.activation_checkpointing) == (4, 3, 12, True)
    assert out.zero == ZeroConfig(stage=1, overlap_comm=True)
    assert out.tune.micro_batch_sizes == [2, 8]  # the base's search space, kept as it is
    assert with_split(tiny_cfg, 1, 2, 4).workload.activation_checkpointing is False
    with pytest.raises(ConfigError, match="workload.grad_acc_steps=0"):
        with_split(tiny_cfg, 1, 2, 0)


def test_a_split_refuses_an_unknown_checkpoint_policy_by_name(tiny_cfg):
    with pytest.raises(ConfigError, match="workload.checkpoint_policy='some' is invalid: valid: full, selective"):
        with_split(tiny_cfg, 1, 2, 4, activation_checkpointing=True, checkpoint_policy="some")


def test_record_variant_refuses_an_invalid_record(tiny_cfg):
    (rec,) = typed([{"config": {"workload": {"micro_batch_size": 2, "grad_acc_steps": 4}, "zero": {"stage": 7}}}])
    with pytest.raises(ConfigError, match="zero.stage=7"):
        record_variant(rec, tiny_cfg)


def test_base_warnings_are_not_repeated_per_split(tiny_cfg):
    cfg = dataclasses.replace(tiny_cfg, nccl_env={"NCCL_ALGO": "Ring"})
    with pytest.warns(UserWarning, match="no effect on the cpu platform"):
        validate(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for mb in (1, 2, 4, 8):
            with_split(cfg, 2, mb)
