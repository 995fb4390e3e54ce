"""benchmarks/reduce_scatter/install.py without ranks: what it refuses (and how the run records it), where
it takes the balanced ZeRO-1 windows and the balanced ZeRO-2 bucket shards, the bucket layout it
packs for the per-bucket reduce-scatter, the window layout of ZeRO-1's balanced path and the shard
plan of ZeRO-2's (each with a reduction simulated over N ranks)."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from types import SimpleNamespace

import pytest
import unit_helpers  # noqa: F401  (repository root on sys.path)

from benchmarks.failure import classify_failure
from benchmarks.reduce_scatter.install import install
from benchmarks.reduce_scatter.common import (OPTION, VERIFIED_DEEPSPEED, GradientCollectiveError,
                                              balanced_zero1_blockers, balanced_zero2_blockers, check_supported)
from benchmarks.reduce_scatter.layout import (Piece, Segment, ShardSegment, Window, accumulator_elements,
                                              balanced_bucket_elements, boundary_all_to_all_elements,
                                              bucket_shard_numel, padded_bucket_elements, plan_bucket_shards,
                                              plan_layout, plan_windows, split_param, window_numel)
from contract.spec import TrainSpec


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

def fake_zero_optimizer(stage=1, grad_accum_attribute=False, compact=False, comm_dtypes=1, other_group=False,
                        accum_dtype="fp32", dtype="fp32"):
    """The attributes of DeepSpeedZeroOptimizer that balanced_zero1/2_blockers read (`compact`: True,
    False, or per group)."""
    dp = object()
    per_group = compact if isinstance(compact, (list, tuple)) else [compact, compact]
    return SimpleNamespace(partition_gradients=stage == 2, use_grad_accum_attribute=grad_accum_attribute,
                           bit16_groups=[[], []], _use_compact_grad_partition_buffer=lambda i: per_group[i],
                           ipg_buckets={f"dtype{k}": None for k in range(comm_dtypes)}, dp_process_group=dp,
                           real_dp_process_group=[dp, object() if other_group else dp],
                           gradient_accumulation_dtype=accum_dtype, dtype=dtype)


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


def test_zero2_takes_the_balanced_bucket_shards_where_verified():
    assert balanced_zero2_blockers(FakeEngine(2, fake_zero_optimizer(stage=2))) == []
    # bf16 parameters with DeepSpeed's fp32 partition buffer
    assert balanced_zero2_blockers(FakeEngine(2, fake_zero_optimizer(stage=2, compact=True, dtype="bf16"))) == []


@pytest.mark.parametrize("engine, why", [
    (FakeEngine(1, fake_zero_optimizer(stage=1)), "ZeRO-1 does not partition gradients"),
    (FakeEngine(2, fake_zero_optimizer(stage=2), managed=False), "managed_gradient_accumulation=false"),
    (FakeEngine(2, fake_zero_optimizer(stage=2, grad_accum_attribute=True)), "gradients accumulate in grad_accum"),
    (FakeEngine(2, fake_zero_optimizer(stage=2, compact=[True, False])), "fp32 partition buffer in some"),
    (FakeEngine(2, fake_zero_optimizer(stage=2, accum_dtype="bf16")), "accumulation dtype bf16 differs"),
    (FakeEngine(2, fake_zero_optimizer(stage=2, comm_dtypes=2)), "2 communication dtypes"),
    (FakeEngine(2, fake_zero_optimizer(stage=2, other_group=True)), "reduced over another process group"),
], ids=["zero1", "unmanaged", "grad_accum", "mixed-buffer", "accum-dtype", "autocast", "process-group"])
def test_zero2_elsewhere_the_per_bucket_path_stays_with_the_reason(engine, why):
    (blocker,) = balanced_zero2_blockers(engine)
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


# --- ZeRO-2's balanced bucket shards ---------------------------------------------------------------

def test_the_layout_module_imports_no_torch():
    """The controller-side performance model imports it."""
    code = ("import sys; import benchmarks.reduce_scatter.layout as m; "
            "assert 'torch' not in sys.modules, 'torch imported'; print(m.balanced_bucket_elements(5, 2))")
    out = subprocess.run([sys.executable, "-c", code], cwd=unit_helpers.REPO_ROOT, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "8"


@pytest.mark.parametrize("bucket, n, align, expected", [
    (20_000, 2, 2, 20_000),           # already a multiple of 2N
    (11_071, 2, 2, 11_072),
    (1, 16, 2, 32),                   # at most N x align - 1 padding
    (0, 4, 2, 0),
    (500_000_000, 16, 2, 500_000_000),
    (32_768, 3, 2, 32_772),
    (10, 4, 1, 12),
])
def test_balanced_bucket_elements(bucket, n, align, expected):
    assert balanced_bucket_elements(bucket, n, align) == expected
    assert bucket_shard_numel(bucket, n, align) * n == expected
    assert 0 <= expected - bucket < n * align


def test_padded_bucket_elements_is_the_per_bucket_layouts_input():
    """The old per-bucket figure from spans equals plan_layout's for the same bucket."""
    rng = random.Random(3)
    for _ in range(50):
        n = rng.randint(1, 5)
        sizes, starts, p = _random_group(rng, n)
        order = list(range(len(sizes)))[::-1]            # backward order
        spans = [(0, starts[i], sizes[i]) for i in order]
        pieces, offset = [], 0
        for index, i in enumerate(order):
            touched = [(d, max(0, d * p - starts[i])) for d in range(n)
                       if d * p < starts[i] + sizes[i] and starts[i] < (d + 1) * p]
            pieces += split_param(index, offset, sizes[i], touched)
            offset += sizes[i]
        assert padded_bucket_elements(spans, [p], n) == plan_layout(pieces, n).padded_numel


def test_shard_plan_of_a_worked_example():
    """2 ranks, one group of P = 10 (flat 20 elements). Bucket 0 holds [10, 16) then [0, 10) of the
    flat group (backward order), 16 elements: shards of 8. Rank 0's shard: flat [10, 16) (rank 1's
    partition) and [0, 2) (its own); rank 1's: flat [2, 10) (rank 0's). Bucket 1 holds [16, 20):
    padded to 4, shards of 2, both in rank 1's partition."""
    plan = plan_bucket_shards([[(0, 10, 6), (0, 0, 10)], [(0, 16, 4)]], [10], 2)
    assert plan.shard_numel == (8, 2) and plan.bucket_numel == (16, 4)
    assert plan.segments == (
        ShardSegment(0, 0, 6, 2, 0, 0, 0), ShardSegment(0, 0, 0, 6, 0, 1, 0), ShardSegment(0, 1, 0, 2, 0, 1, 6),
        ShardSegment(1, 0, 0, 8, 0, 0, 2), ShardSegment(1, 1, 0, 2, 0, 1, 8))
    assert plan.send_numel == ((2, 8), (8, 2))
    assert [plan.accumulator_numel(r) for r in range(2)] == [10, 10]
    assert plan.accumulator_runs(0) == [[(6, 0, 2), (0, 2, 6)], [(0, 8, 2)]]
    # runs contiguous in the output and in the partition are merged: here each rank's whole partition
    assert plan.receive_runs(1) == [(0, 0, 0, 10)]
    assert plan.receive_runs(0) == [(0, 0, 0, 10)]
    # three buckets in backward order (flat [16, 20) [12, 16) | [8, 12) [4, 8) | [0, 4)): rank 0's
    # accumulator holds flat [8, 10) [0, 2) for itself, then [16, 20) [10, 12) for rank 1; its shard
    # of bucket 1 (flat [8, 12)) goes to both; rank 1 receives flat [16, 20), then [10, 16) in one run
    plan = plan_bucket_shards([[(0, 16, 4), (0, 12, 4)], [(0, 8, 4), (0, 4, 4)], [(0, 0, 4)]], [10], 2)
    assert plan.shard_numel == (4, 4, 2)
    assert plan.accumulator_runs(0) == [[(0, 4, 4)], [(0, 0, 2), (2, 8, 2)], [(0, 2, 2)]]
    assert plan.accumulator_runs(1) == [[(0, 6, 4)], [(0, 0, 4)], [(0, 4, 2)]]
    assert plan.receive_runs(0) == [(0, 0, 8, 2), (2, 0, 0, 2), (4, 0, 4, 4), (8, 0, 2, 2)]
    assert plan.receive_runs(1) == [(0, 0, 6, 4), (4, 0, 0, 6)]
    assert boundary_all_to_all_elements([[(0, 10, 6), (0, 0, 10)], [(0, 16, 4)]], [10], 2) == [8, 8]
    assert accumulator_elements([16, 4], 2) == 10


def test_a_span_outside_its_flat_group_is_refused():
    with pytest.raises(ValueError, match=r"elements \[18, 22\) outside the flat group of 2 x 10"):
        plan_bucket_shards([[(0, 18, 4)]], [10], 2)


def _random_buckets(rng, n, groups):
    """Parameters of `groups` random groups (each padded to 2N, P its N-th) filled into buckets in
    backward order: (buckets as spans, partition sizes, parameter sizes)."""
    partition, params = [], []
    for g in range(groups):
        sizes, starts, p = _random_group(rng, n)
        partition.append(p)
        params += [(g, start, size) for start, size in zip(starts, sizes)]
    limit = rng.randint(1, 60)
    buckets, bucket, filled = [], [], 0
    for span in params[::-1]:
        if bucket and filled + span[2] > limit:
            buckets.append(bucket)
            bucket, filled = [], 0
        bucket.append(span)
        filled += span[2]
    buckets.append(bucket)
    return buckets, partition


@pytest.mark.parametrize("seed", range(40))
def test_simulated_bucket_shards_leave_each_rank_its_partition_summed_over_ranks_and_micro_steps(seed):
    """N ranks, several micro-steps with different gradients: each bucket padded to
    balanced_bucket_elements and summed over the ranks (the reduce-scatter), rank r keeping shard r;
    each rank adds its shards into its accumulator by accumulator_runs; then the all-to-all
    (chunk d of every accumulator to rank d, in source order) and receive_runs: every rank holds
    exactly its partitions' elements summed over ranks and micro-steps, zeros elsewhere."""
    rng = random.Random(seed)
    n = rng.randint(1, 5)
    buckets, partition = _random_buckets(rng, n, rng.randint(1, 2))
    plan = plan_bucket_shards(buckets, partition, n)
    numel = sum(size for b in buckets for _, _, size in b)
    assert sum(plan.accumulator_numel(r) for r in range(n)) == numel
    assert sum(plan.accumulator_numel(r) for r in range(n)) <= n * accumulator_elements(plan.bucket_numel, n)
    flat = {g: [0] * (n * p) for g, p in enumerate(partition)}    # expected sums
    accumulators = [[0] * plan.accumulator_numel(r) for r in range(n)]
    for step in range(rng.randint(1, 3)):
        grads = [{(g, start): [rng.randint(-99, 99) for _ in range(size)] for b in buckets for g, start, size in b}
                 for _ in range(n)]
        for k, bucket in enumerate(buckets):
            inputs = [sum((grads[r][(g, start)] for g, start, _ in bucket), []) for r in range(n)]
            padded = balanced_bucket_elements(len(inputs[0]), n)
            total = [sum(col) for col in zip(*[x + [0] * (padded - len(x)) for x in inputs])]
            s = plan.shard_numel[k]
            for r in range(n):
                shard = total[r * s:(r + 1) * s]
                for shard_offset, acc_offset, run in plan.accumulator_runs(r)[k]:
                    for e in range(run):
                        accumulators[r][acc_offset + e] += shard[shard_offset + e]
        for r in range(n):
            for (g, start), values in grads[r].items():
                for e, v in enumerate(values):
                    flat[g][start + e] += v
    send = plan.send_numel
    for me in range(n):
        received = []
        for src in range(n):
            chunk_start = sum(send[src][:me])
            received += accumulators[src][chunk_start:chunk_start + send[src][me]]
        assert len(received) == sum(row[me] for row in send)
        mine = {g: [0] * p for g, p in enumerate(partition)}
        for offset, g, dst_offset, run in plan.receive_runs(me):
            mine[g][dst_offset:dst_offset + run] = received[offset:offset + run]
        for g, p in enumerate(partition):
            assert mine[g] == flat[g][me * p:(me + 1) * p], (me, g)
    sent = boundary_all_to_all_elements(buckets, partition, n)
    assert sent == [plan.accumulator_numel(r) - send[r][r] for r in range(n)]
