"""benchmarks/reduce_scatter.py without ranks: what it refuses (and how the run records it), where
it takes the balanced ZeRO-1 windows, the bucket layout it packs for the per-bucket reduce-scatter
and the window layout of the balanced one (with a reduction simulated over N ranks)."""
from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

import unit_helpers  # noqa: F401  (repository root on sys.path)
from benchmarks.failure import classify_failure
from benchmarks.reduce_scatter import (OPTION, VERIFIED_DEEPSPEED, GradientCollectiveError, Piece, Segment,
                                       Window, balanced_zero1_blockers, check_supported, install, plan_layout,
                                       plan_windows, split_param, window_numel)
from benchmarks.spec import TrainSpec


class FakeEngine:
    def __init__(self, stage: int, optimizer=None, pipeline_parallelism=False, managed=True):
        self.stage = stage
        self.optimizer = optimizer
        self.pipeline_parallelism = pipeline_parallelism
        self.managed = managed

    def zero_optimization_stage(self) -> int:
        return self.stage

    def managed_gradient_accumulation(self) -> bool:
        return self.managed


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


# --- where the balanced ZeRO-1 windows apply --------------------------------------------------------

def fake_zero_optimizer(stage=1, grad_accum_attribute=False, compact=False, comm_dtypes=1, other_group=False):
    """The attributes of DeepSpeedZeroOptimizer that balanced_zero1_blockers reads."""
    dp = object()
    return SimpleNamespace(partition_gradients=stage == 2, use_grad_accum_attribute=grad_accum_attribute,
                           bit16_groups=[[], []], _use_compact_grad_partition_buffer=lambda i: compact,
                           ipg_buckets={f"dtype{k}": None for k in range(comm_dtypes)}, dp_process_group=dp,
                           real_dp_process_group=[dp, object() if other_group else dp])


def test_zero1_takes_the_balanced_windows_where_verified():
    assert balanced_zero1_blockers(FakeEngine(1, fake_zero_optimizer())) == []


@pytest.mark.parametrize("engine, why", [
    (FakeEngine(2, fake_zero_optimizer(stage=2)), "ZeRO-2 reduces on every micro-step, before all gradients"),
    (FakeEngine(1, fake_zero_optimizer(), pipeline_parallelism=True), "pipeline parallelism"),
    (FakeEngine(1, fake_zero_optimizer(), managed=False), "managed_gradient_accumulation=false"),
    (FakeEngine(1, fake_zero_optimizer(grad_accum_attribute=True)), "gradients accumulate outside param.grad"),
    (FakeEngine(1, fake_zero_optimizer(compact=True)), "gradients accumulate outside param.grad"),
    (FakeEngine(1, fake_zero_optimizer(comm_dtypes=2)), "2 communication dtypes"),
    (FakeEngine(1, fake_zero_optimizer(other_group=True)), "reduced over another process group"),
], ids=["zero2", "pipeline", "unmanaged", "grad_accum", "fp32-buffer", "autocast", "process-group"])
def test_elsewhere_the_per_bucket_path_stays_with_the_reason(engine, why):
    (blocker,) = balanced_zero1_blockers(engine)
    assert why in blocker


# --- the balanced window layout ---------------------------------------------------------------------

@pytest.mark.parametrize("partition, bucket, n, expected", [
    (78_240, 20_000, 2, 10_000),          # the integration test's group: 8 windows
    (78_240, 10**9, 2, 78_240),           # a bucket larger than N partitions: one window, the partition
    (100, 21, 2, 10),                     # bucket // N rounded down to the alignment (2)
    (100, 3, 4, 2),                       # never below the alignment
    (501_907_072, 500_000_000, 16, 31_250_000),   # llama-8b, bf16, 16 ranks, DeepSpeed's default bucket
    (0, 100, 2, 0),                       # an empty partition
])
def test_window_numel(partition, bucket, n, expected):
    assert window_numel(partition, bucket, n) == expected
    assert expected == 0 or n * expected <= max(bucket, n * 2)   # N chunks fit a bucket


def test_windows_of_a_worked_example():
    """P = 6 on 2 ranks, W = 4: parameter 0 is [0, 10) of the flat group (straddling), parameter 1
    [10, 12). Window 0: rank 0's [0, 4) and rank 1's [6, 10); window 1: [4, 6) and [10, 12)."""
    windows = plan_windows([(0, 0, 10), (1, 10, 2)], partition_numel=6, world_size=2, window=4)
    assert windows == [
        Window(0, 4, 2, (Segment(0, 0, 0, 0, 4), Segment(1, 0, 6, 0, 4))),
        Window(4, 2, 2, (Segment(0, 0, 4, 0, 2), Segment(1, 1, 0, 0, 2))),
    ]
    assert [(w.real_numel, w.padded_numel) for w in windows] == [(8, 8), (4, 4)]


def test_alignment_padding_and_left_out_parameters_are_zeros_in_the_input():
    # 7 elements on 2 ranks: DeepSpeed pads the flat group to 8 (P = 4); parameter 1 not pending
    windows = plan_windows([(0, 0, 3), (2, 5, 2)], partition_numel=4, world_size=2, window=4)
    (w,) = windows
    assert w.segments == (Segment(0, 0, 0, 0, 3), Segment(1, 2, 0, 1, 2))
    assert (w.real_numel, w.padded_numel) == (5, 8)


def test_windows_without_any_span_are_skipped():
    windows = plan_windows([(0, 11, 2)], partition_numel=10, world_size=2, window=4)
    assert [(w.offset, w.numel) for w in windows] == [(0, 4)]   # rank 1's [1, 3): window 0 of 3
    assert plan_windows([], 10, 2, 4) == []


@pytest.mark.parametrize("spans, why", [
    ([(0, 0, 5), (1, 4, 2)], "parameters 0 and 1 overlap"),
    ([(0, 7, 2)], r"elements \[7, 9\) outside the flat group of 2 x 4"),
])
def test_bad_spans_are_refused(spans, why):
    with pytest.raises(ValueError, match=why):
        plan_windows(spans, partition_numel=4, world_size=2, window=4)


@pytest.mark.parametrize("window", [0, 5])
def test_a_window_outside_the_partition_is_refused(window):
    with pytest.raises(ValueError, match="need 1 <= window <= partition"):
        plan_windows([(0, 0, 1)], partition_numel=4, world_size=2, window=window)


def _random_group(rng, n):
    """Random parameter sizes, the flat group padded to 2N, P = its N-th."""
    sizes = [rng.randint(1, 40) for _ in range(rng.randint(1, 12))]
    total = sum(sizes)
    flat = -(-total // (2 * n)) * 2 * n
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return sizes, starts, flat // n


@pytest.mark.parametrize("seed", range(40))
def test_simulated_reduction_leaves_each_rank_its_partition_summed_over_ranks(seed):
    """N ranks with different gradients: packing each window as [chunk_0 | ... | chunk_N-1], summing
    the inputs (the reduce-scatter) and writing chunk `me` back gives every rank exactly the sum of
    its partition's elements over the ranks; each element is sent once per rank, padding as zeros;
    the inputs total N x P per window set (no padding beyond the alignment)."""
    rng = random.Random(seed)
    n = rng.randint(1, 5)
    sizes, starts, p = _random_group(rng, n)
    w = window_numel(p, rng.randint(1, 3 * n * p), n)
    grads = [[[rng.randint(-99, 99) for _ in range(size)] for size in sizes] for _ in range(n)]
    windows = plan_windows([(i, start, size) for i, (start, size) in enumerate(zip(starts, sizes))], p, n, w)
    assert sum(win.padded_numel for win in windows) == n * p
    assert sum(win.real_numel for win in windows) == sum(sizes)
    assert [win.offset for win in windows] == list(range(0, p, w))
    reduced = [[list(g) for g in rank_grads] for rank_grads in grads]   # each rank's param.grad
    for win in windows:
        inputs = []
        for rank in range(n):
            packed = [0] * win.padded_numel
            for s in win.segments:
                pos = s.chunk * win.numel + s.chunk_offset
                packed[pos:pos + s.numel] = grads[rank][s.param][s.param_offset:s.param_offset + s.numel]
            inputs.append(packed)
        total = [sum(col) for col in zip(*inputs)]
        for me in range(n):
            out = total[me * win.numel:(me + 1) * win.numel]
            for s in win.segments:
                if s.chunk == me:
                    reduced[me][s.param][s.param_offset:s.param_offset + s.numel] = \
                        out[s.chunk_offset:s.chunk_offset + s.numel]
    for me in range(n):
        lo, hi = me * p, (me + 1) * p
        for i, (start, size) in enumerate(zip(starts, sizes)):
            for e in range(size):
                expected = sum(grads[r][i][e] for r in range(n)) if lo <= start + e < hi else grads[me][i][e]
                assert reduced[me][i][e] == expected, (me, i, e)
