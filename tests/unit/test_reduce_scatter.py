"""benchmarks/reduce_scatter.py without ranks: what it refuses (and how the run records it), and the
bucket layout it packs for the reduce-scatter."""
from __future__ import annotations

import json

import pytest

import unit_helpers  # noqa: F401  (repository root on sys.path)
from benchmarks.failure import classify_failure
from benchmarks.reduce_scatter import (OPTION, VERIFIED_DEEPSPEED, GradientCollectiveError, Piece,
                                       check_supported, install, plan_layout, split_param)
from benchmarks.spec import TrainSpec


class FakeEngine:
    def __init__(self, stage: int, optimizer=None):
        self.stage = stage
        self.optimizer = optimizer

    def zero_optimization_stage(self) -> int:
        return self.stage


def test_an_unverified_deepspeed_is_refused_naming_both_versions_and_the_option(monkeypatch):
    import deepspeed

    monkeypatch.setattr(deepspeed, "__version__", "0.19.9")
    with pytest.raises(GradientCollectiveError) as refused:
        install(FakeEngine(stage=2))
    message = str(refused.value)
    assert "DeepSpeed 0.19.9" in message
    assert "verified: 0.19.8" in message
    assert OPTION in message and OPTION == "zero.gradient_collective=reduce_scatter"
    assert "zero.gradient_collective=all_reduce" in message
    # a run records it as an error (not an OOM) with this message as the reason
    assert classify_failure(refused.value) == "error"


def test_the_verified_version_is_the_installed_one():
    import deepspeed

    assert VERIFIED_DEEPSPEED == ("0.19.8",)
    assert deepspeed.__version__ in VERIFIED_DEEPSPEED


@pytest.mark.parametrize("stage, why", [(0, "ZeRO stage 0 has no partitioned gradients"),
                                        (3, "ZeRO stage 3 reduce-scatters its gradients natively")])
def test_stages_0_and_3_are_refused(stage, why):
    with pytest.raises(GradientCollectiveError, match=why):
        check_supported(FakeEngine(stage))


def test_an_optimizer_other_than_deepspeeds_zero_1_2_is_refused():
    import torch

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    with pytest.raises(GradientCollectiveError, match="torch.optim.sgd.SGD, not DeepSpeedZeroOptimizer"):
        check_supported(FakeEngine(2, opt))


def test_old_spec_files_load_with_deepspeeds_own_reduction():
    spec = {"run_id": "r", "benchmark": "b", "platform": "cpu", "device": "cpu", "dist_backend": "gloo",
            "model": {"vocab_size": 8, "hidden_size": 4, "intermediate_size": 8, "num_layers": 1,
                      "num_heads": 1, "num_kv_heads": 1, "max_position_embeddings": 8},
            "seq_len": 8, "micro_batch_size": 1, "grad_acc_steps": 1, "precision": "fp32",
            "optimizer": {"betas": [0.9, 0.95]}, "deepspeed": {}, "warmup_steps": 0, "steps": 1,
            "profile_steps": 0, "seed": 0, "data": {}}
    assert TrainSpec.from_dict(spec).gradient_collective == "all_reduce"
    spec["gradient_collective"] = "reduce_scatter"
    loaded = TrainSpec.from_dict(spec)
    assert loaded.gradient_collective == "reduce_scatter"
    assert json.loads(loaded.to_json())["gradient_collective"] == "reduce_scatter"


@pytest.mark.parametrize("starts, numel, expected", [
    # wholly in one partition
    ([(1, 0)], 10, [Piece(1, 3, 0, 100, 10)]),
    # straddling: partition 0 from element 0, partition 1 from element 4 (order of the input ignored)
    ([(1, 4), (0, 0)], 10, [Piece(0, 3, 0, 100, 4), Piece(1, 3, 4, 104, 6)]),
    # three partitions
    ([(0, 0), (1, 2), (2, 7)], 9, [Piece(0, 3, 0, 100, 2), Piece(1, 3, 2, 102, 5), Piece(2, 3, 7, 107, 2)]),
])
def test_a_parameter_splits_at_the_partition_offsets(starts, numel, expected):
    assert split_param(3, 100, numel, starts) == expected


def test_layout_packs_each_destination_in_bucket_order_and_pads_to_the_longest():
    # a bucket in backward order: rank 1's parameter, one straddling 1|0, rank 0's parameter
    pieces = [Piece(1, 0, 0, 0, 5), Piece(1, 1, 0, 5, 3), Piece(0, 1, 3, 8, 4), Piece(0, 2, 0, 12, 2)]
    layout = plan_layout(pieces, world_size=2)
    assert layout.dst_numel == (6, 8)
    assert layout.chunk_numel == 8
    assert layout.chunk_offsets == (0, 5, 0, 4)
    assert (layout.real_numel, layout.padded_numel) == (14, 16)


def test_layout_of_a_bucket_in_one_partition_is_padded_n_times():
    layout = plan_layout([Piece(2, 0, 0, 0, 10)], world_size=4)
    assert layout.dst_numel == (0, 0, 10, 0) and layout.padded_numel == 40


def test_layout_refuses_a_rank_outside_the_group():
    with pytest.raises(ValueError, match="rank 2 outside the group of 2"):
        plan_layout([Piece(2, 0, 0, 0, 1)], world_size=2)
