"""nccl-tests semantics of the built-in sweep: bandwidth formulas, sizes, expected results."""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch.distributed as dist

import benchmarks.comm.collectives as bc
from benchmarks.comm.collectives import Case, count_wrong, expected_values, input_values, nccl_count
from benchmarks.node.environment import bind_rank, cpu_share, kernel_peers
from contract.collectives import OPS, SMALL_BYTES
from contract.spec import CollectiveSpec
from harness.collectives import Placement, Row, avg_busbw_gbps, busbw_factor, format_table, sizes


def reduce_values(values: list[torch.Tensor], redop: str) -> torch.Tensor:
    """The reduction of whole buffers as the check computed it before windowing: the reference."""
    stacked = torch.stack(values)
    if redop in ("sum", "avg"):
        out = stacked.sum(0)
        return out / len(values) if redop == "avg" else out
    return {"prod": stacked.prod, "max": lambda d: stacked.max(d).values,
            "min": lambda d: stacked.min(d).values}[redop](0)
from harness.config.compose import compose
from harness.errors import ConfigError


@pytest.mark.parametrize("op,n,factor", [
    ("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75), ("all_reduce", 16, 1.875),
    ("all_gather", 8, 0.875), ("reduce_scatter", 4, 0.75), ("all_to_all", 2, 0.5),
    ("broadcast", 8, 1.0), ("reduce", 8, 1.0), ("sendrecv", 8, 1.0),
])
def test_busbw_factor_is_nccl_tests(op, n, factor):
    assert busbw_factor(op, n) == pytest.approx(factor)


def test_unknown_op_has_no_factor():
    with pytest.raises(ValueError, match="valid: all_reduce"):
        busbw_factor("allreduce", 8)


def test_placement_bandwidths():
    # 1 GB in 10 ms on 8 ranks: algbw 100 GB/s, all-reduce busbw 175 GB/s (GB = 1e9 B)
    p = Placement.measured("all_reduce", 10**9, 10_000.0, 8, 0)
    assert p.algbw_gbps == pytest.approx(100.0)
    assert p.busbw_gbps == pytest.approx(175.0)


def test_avg_busbw_counts_every_placement():
    a = Placement(1.0, 1.0, 2.0, 0)
    b = Placement(1.0, 1.0, 4.0, 0)
    rows = [Row(8, 2, "float", "sum", -1, a, b), Row(16, 4, "float", "sum", -1, b, None)]
    assert avg_busbw_gbps(rows) == pytest.approx((2 + 4 + 4) / 3)
    table = format_table("all_reduce", rows, 2)
    assert "# Avg bus bandwidth" in table and "# Out of bounds values : 0 OK" in table


@pytest.mark.parametrize("args,expected", [
    ((1024, 8192, 2.0, 0, 4, 2), [1024, 2048, 4096, 8192]),
    ((1000, 5000, 2.0, 0, 4, 2), [1000, 2000, 4000]),          # multiples of 4 B x 2 ranks
    ((8, 64, 2.0, 0, 4, 8), [32, 64]),                          # never below one element a rank
    ((1024, 4096, 2.0, 1024, 4, 2), [1024, 2048, 3072, 4096]),  # a step instead of a factor
])
def test_sizes(args, expected):
    assert sizes(*args) == expected


@pytest.mark.parametrize("op,count", [("all_reduce", 256), ("all_gather", 128), ("reduce_scatter", 128),
                                      ("all_to_all", 128), ("broadcast", 256), ("sendrecv", 256)])
def test_count_column_is_nccl_tests_per_call_count(op, count):
    assert nccl_count(op, 1024, 4, 2) == count


def spec(redop: str = "sum", dtype: str = "float32") -> CollectiveSpec:
    return CollectiveSpec(run_id="x", platform="cpu", device="cpu", dist_backend="gloo", ops=[],
                          sizes=[], dtype=dtype, redop=redop, root=1, warmup_iters=0, iters=1,
                          check=True, in_place=False)


def simulate(op: str, cases: list[Case], redop: str) -> list[torch.Tensor]:
    """What each rank must hold after the collective, computed from the ranks' real input buffers."""
    n, chunk = len(cases), cases[0].chunk
    sends = [c.send.to(torch.float64) for c in cases]
    if op == "all_reduce":
        return [reduce_values(sends, redop)] * n
    if op == "reduce_scatter":
        full = reduce_values(sends, redop)
        return [full[r * chunk:(r + 1) * chunk] for r in range(n)]
    if op == "all_gather":
        return [torch.cat(sends)] * n
    if op == "all_to_all":
        return [torch.cat([sends[q][r * chunk:(r + 1) * chunk] for q in range(n)]) for r in range(n)]
    if op == "broadcast":
        return [sends[1]] * n
    if op == "reduce":
        return [reduce_values(sends, redop)] * n
    return [sends[(r - 1) % n] for r in range(n)]  # sendrecv


@pytest.mark.parametrize("redop", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("op", OPS)
def test_expected_results_match_the_collectives_semantics(op, redop):
    n = 3
    cases = [Case(op, 4 * 3 * 40, spec(redop), False, r, n, torch.device("cpu")) for r in range(n)]
    for case, truth in zip(cases, simulate(op, cases, redop)):
        assert torch.equal(case.expected(), truth)


def whole_buffer_expected(op: str, redop: str, rank: int, n: int, total: int, root: int) -> torch.Tensor:
    """The check's expected values as they were before windowing (issue 14): every rank's whole
    input, in float64, on every rank. The reference the windowed check must equal."""
    chunk = total // n
    full = [input_values(q, total, redop) for q in range(n)]
    if op in ("all_reduce", "reduce"):
        return reduce_values(full, redop)
    if op == "reduce_scatter":
        return reduce_values(full, redop)[rank * chunk:(rank + 1) * chunk]
    if op == "all_gather":
        return torch.cat([input_values(q, chunk, redop, q * chunk) for q in range(n)])
    if op == "all_to_all":
        return torch.cat([full[q][rank * chunk:(rank + 1) * chunk] for q in range(n)])
    if op == "broadcast":
        return full[root]
    return full[(rank - 1) % n]  # sendrecv


@pytest.mark.parametrize("n", [1, 2, 3, 8])
@pytest.mark.parametrize("redop", ["sum", "prod", "max", "min", "avg"])
@pytest.mark.parametrize("op", OPS)
def test_windowed_expected_values_equal_the_whole_buffer_ones(op, redop, n):
    chunk = 10
    total, root = n * chunk, n - 1
    for rank in range(n):
        truth = whole_buffer_expected(op, redop, rank, n, total, root)
        for window in (1, 7, chunk, 3 * chunk + 1, total):  # windows across chunk boundaries too
            got = torch.cat([expected_values(op, redop, rank, n, chunk, root, start, min(window, truth.numel() - start))
                             for start in range(0, truth.numel(), window)])
            assert torch.equal(got, truth), (rank, window)


@pytest.mark.parametrize("dtype,redop", [("int32", "avg"), ("float16", "sum"), ("bfloat16", "prod"),
                                         ("int8", "max"), ("uint8", "min"), ("float32", "avg")])
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_to_all", "all_gather"])
def test_the_windowed_check_counts_the_same_wrong_elements(monkeypatch, op, dtype, redop):
    """Same tolerances, same integer avg truncation, same count as one whole-buffer comparison."""
    n, rank = 3, 1
    case = Case(op, 3 * 40 * torch.empty((), dtype=getattr(torch, dtype)).element_size(),
                spec(redop, dtype), False, rank, n, torch.device("cpu"))
    truth = whole_buffer_expected(op, redop, rank, n, case.total, 1)
    out = case.result()
    out.copy_(truth.to(case.dtype))      # what a correct collective leaves (integer avg truncated)
    assert case.count_wrong() == 0
    out[[0, 5, 17, out.numel() - 1]] += 3  # four wrong elements, in different windows
    whole = count_wrong(out, truth, case.dtype)
    assert whole == 4
    monkeypatch.setattr(bc, "CHECK_WINDOW", 4)
    assert case.count_wrong() == whole


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("op", OPS)
def test_the_check_of_a_large_case_never_materialises_more_than_a_window(monkeypatch, op, in_place):
    """8 ranks, a buffer of 40 windows: filling the input and checking the result ask input_values
    (the single source of expected values) for at most one window at a time, never the buffer."""
    n, rank, window = 8, 3, 1000
    real_input_values = bc.input_values
    asked: list[int] = []

    def recording(q: int, num: int, redop: str, offset: int = 0) -> torch.Tensor:
        asked.append(num)
        return real_input_values(q, num, redop, offset)

    monkeypatch.setattr(bc, "CHECK_WINDOW", window, raising=False)  # without one: fails on the bound
    monkeypatch.setattr(bc, "input_values", recording)
    s = spec("sum")
    s.root = rank  # reduce: this rank holds the result
    case = Case(op, 4 * n * 5 * window, s, in_place, rank, n, torch.device("cpu"))  # float32, 40 windows

    def collective():  # what the collective leaves on this rank, from the pre-windowing reference
        out = case.result()
        out.copy_(whole_buffer_expected(op, "sum", rank, n, case.total, s.root).to(case.dtype))

    monkeypatch.setattr(case, "call", collective)
    assert case.check() == 0
    assert asked and max(asked) <= window, f"asked for {max(asked)} elements at once (window {window})"
    assert case.total == 40 * window


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8"])
def test_inputs_are_exact_in_small_dtypes(dtype):
    values = input_values(7, 1000, "sum")
    case_dtype = getattr(torch, dtype)
    assert torch.equal(values.to(case_dtype).to(torch.float64), values)
    assert reduce_values([input_values(r, 1000, "sum") for r in range(8)], "sum").max() <= 127


def test_count_wrong_counts_mismatches():
    expected = torch.arange(10, dtype=torch.float64)
    actual = expected.clone().to(torch.float32)
    actual[3] += 1
    actual[7] = float("nan")
    assert count_wrong(actual, expected, torch.float32) == 2
    assert count_wrong(expected.to(torch.float32), expected, torch.float32) == 0


@pytest.mark.parametrize("overrides,fragment", [
    (["collective.ops=[all_reduce,allreduce]"], "collective.ops"),
    (["collective.min_bytes=4096", "collective.max_bytes=1024"], "must not exceed collective.max_bytes=1024"),
    (["collective.step_factor=1.0"], "collective.step_factor"),
    (["collective.dtype=float8"], "collective.dtype"),
    (["collective.redop=mean"], "collective.redop"),
    (["collective.root=5"], "collective.root"),
    (["kind=collective", "collective.redop=avg"], "gloo has no avg"),
    (["kind=collective", "collective.source=nccl-tests"], "nccl-tests needs GPUs"),
    # one rank: a smoke run, allowed, but not without its check, nor sendrecv on gloo, nor root 1
    (["kind=collective", "platform=h100", "collective=smoke", "collective.check=false"],
     "a one-rank collective sweep is a smoke run"),
    (["kind=collective", "platform.gpus_per_node=1", "collective=smoke"], "gloo cannot send to its own rank"),
    (["kind=collective", "platform.gpus_per_node=1", "collective.root=1"], "must be a rank in 0..0"),
    (["kind=collective", "platform.gpus_per_node=1", "collective.redop=avg"], "gloo has no avg"),
])
def test_bad_collective_values_are_named(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    assert fragment in str(err.value)


@pytest.mark.parametrize("overrides", [
    ["platform=h100", "collective=smoke"],                  # nccl, one GPU: every op, sendrecv too
    ["platform=h200", "collective=all"],
    ["platform.gpus_per_node=1", "collective=smoke", "collective.ops=[all_reduce,all_to_all,reduce]"],
    ["platform.gpus_per_node=1"],                          # cpu, default ops
    ["collective.check=false"],                             # two ranks: no check is still a sweep
])
def test_a_one_rank_sweep_is_allowed_as_a_smoke_run(overrides):
    cfg = compose(["kind=collective", *overrides])
    assert cfg.kind.value == "collective"


def test_multirun_expands_sweeps_in_hydra_order_and_names_each_combination():
    from harness.multirun import expand, labels

    jobs = expand(["suite=single", "+nccl_env.NCCL_ALGO=Ring,Tree", "zero=stage1,stage2"], multirun=True)
    assert jobs == [["suite=single", "+nccl_env.NCCL_ALGO=Ring", "zero=stage1"],
                    ["suite=single", "+nccl_env.NCCL_ALGO=Ring", "zero=stage2"],
                    ["suite=single", "+nccl_env.NCCL_ALGO=Tree", "zero=stage1"],
                    ["suite=single", "+nccl_env.NCCL_ALGO=Tree", "zero=stage2"]]
    assert labels(jobs)[1] == "NCCL_ALGO=Ring,zero=stage2"
    assert expand(["x=range(1,4)"], multirun=True) == [["x=1"], ["x=2"], ["x=3"]]


def test_a_sweep_without_multirun_is_refused():
    from harness.errors import HarnessError
    from harness.multirun import expand

    with pytest.raises(HarnessError, match="add -m"):
        expand(["zero=stage1,stage2"], multirun=False)


def test_the_small_sizes_take_their_own_iterations_and_each_call_is_timed_on_cpu(monkeypatch):
    """collective.small_iters: the sizes up to 64 KiB run that many timed calls (0: iters), each timed on its own
    where it blocks (cpu): time_case returns nccl-tests' average and the median call (one gloo rank here)."""
    s = dataclasses.replace(spec(), iters=3, small_iters=7, warmup_iters=1)
    assert [bc.iterations(n, s) for n in (8, SMALL_BYTES, SMALL_BYTES + 1)] == [7, 7, 3]
    assert bc.iterations(8, dataclasses.replace(s, small_iters=0)) == 3
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        calls = []
        for size, expected in ((1024, 1 + 7), (1 << 20, 1 + 3)):
            case = Case("all_reduce", size, s, False, 0, 1, torch.device("cpu"))
            real = case.call
            monkeypatch.setattr(case, "call", lambda: calls.append(1) or real())
            avg, figures = bc.time_case(case, s, size)
            assert len(calls) == expected and avg > 0, (size, avg, figures)
            assert 0 < figures["p25_us"] <= figures["median_us"] and 0 <= figures["stalled_pct"] <= 100, figures
            calls.clear()
        # collective.bind_ranks: one rank alone on its kernel takes every CPU it may use, each of its threads bound
        allowed = os.sched_getaffinity(0)
        try:
            assert bind_rank(kernel_peers(0)) == sorted(allowed)
            assert all(os.sched_getaffinity(int(t)) == allowed for t in os.listdir("/proc/self/task"))
        finally:
            os.sched_setaffinity(0, allowed)
    finally:
        dist.destroy_process_group()


def test_the_ranks_on_one_kernel_split_its_cpus_in_order_and_none_is_left_without():
    assert [cpu_share({0, 1}, place, 2) for place in (0, 1)] == [[0], [1]]
    assert [cpu_share(set(range(16)), place, 3) for place in range(3)] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9],
                                                                           [10, 11, 12, 13, 14]]
    assert cpu_share({4, 2}, 1, 2) == [4]          # a restricted set (a container, a Slurm step): its CPUs in order
    assert cpu_share({0, 1}, 0, 4) is None and cpu_share({0, 1}, 2, 2) is None    # fewer CPUs than ranks: unbound


def test_a_negative_small_iters_is_refused():
    with pytest.raises(ConfigError) as err:
        compose(["kind=collective", "collective.small_iters=-1"])
    assert "collective.small_iters" in str(err.value) and "must be >= 0" in str(err.value)


def test_a_refused_binding_gives_every_thread_its_cpus_back(monkeypatch):
    """bind_rank where the kernel refuses a thread's new CPUs (EINVAL, EPERM): nothing stays bound, None is returned;
    a thread that ended meanwhile (ESRCH) is passed over."""
    import benchmarks.node.environment as env

    allowed, calls = os.sched_getaffinity(0), []

    def refuse_second(tid, cpus):
        calls.append(set(cpus))
        if len(calls) == 2:
            raise PermissionError("refused")
    monkeypatch.setattr(env.os, "sched_setaffinity", refuse_second)
    assert env.bind_rank((0, 1)) is None and calls[-1] == allowed

    def gone(tid, cpus):
        raise ProcessLookupError("ended")
    monkeypatch.setattr(env.os, "sched_setaffinity", gone)
    assert env.bind_rank((0, 1)) == sorted(allowed)
