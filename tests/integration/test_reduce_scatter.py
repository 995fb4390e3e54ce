"""The reduce-scatter gradient reduction (benchmarks/reduce_scatter/install.py) against DeepSpeed's own, on
two gloo ranks with a small LLaMA, ZeRO-1 and ZeRO-2, gradient accumulation 2 (ZeRO-2 also 1 and
3), fp32 (and bf16: with bf16 gradients for ZeRO-1 and 2, with fp32 gradient accumulation for
ZeRO-2).

One pair of rank processes trains every configuration twice from the same seeded weights and
batches, once with DeepSpeed's reduction and once with the reduce-scatter installed: per-step
losses, global gradient norms and the updated parameters must agree (on 2 ranks they are in fact
bit-identical). ZeRO-1 takes the balanced windows at the accumulation boundary, ZeRO-2 the
balanced bucket shards (reduce-scatter of every bucket in equal shards each micro-step, one
all-to-all at the boundary); one case of each keeps the padded per-bucket path on purpose. The
buckets are small (several per backward, one parameter larger than a bucket, one bucket straddling
the two partitions, so the buckets' shards and DeepSpeed's partitions really differ), and so are
the ZeRO-1 windows (reduce_bucket_size // 2 elements of each partition: several per group). The
comm tracer of the micro-step instrument records what was issued. The CLI tests run the real
harness with `zero.gradient_collective=reduce_scatter`.
"""
from __future__ import annotations

import logging
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO, run_bench

pytestmark = pytest.mark.integration

WORLD_SIZE = 2
SEQ_LEN, MICRO_BATCH, GRAD_ACC, STEPS = 32, 2, 2, 3
BUCKET_NUMEL = 20_000   # ~8 buckets per backward; the 32768-element embedding bypasses the bucket
SMALL_OP_BYTES = 64     # all_reduces of gradient norms / overflow flags, not of gradients
RTOL, ATOL = 1e-5, 1e-6


@dataclass(frozen=True)
class Case:
    stage: int
    overlap_comm: bool
    contiguous_gradients: bool
    extra: tuple[tuple[str, Any], ...] = ()
    """More DeepSpeed config: (dotted key, value)."""
    two_groups: bool = False
    """Two optimizer parameter groups (matrices with weight decay, vectors without), as the suite's."""
    per_bucket: bool = False
    """install(balanced=False): the padded per-bucket path."""
    grad_acc: int = GRAD_ACC
    checkpointing: bool = False
    """transformers' activation checkpointing (backward recomputes each layer)."""
    odd_model: bool = False
    """model_spec(odd=True): parameter sizes of 2 mod 4, so that buckets need padding to 2N."""

    @property
    def name(self) -> str:
        extra = "".join(f"-{k.removeprefix('zero_optimization.')}={v}" for k, v in self.extra)
        return (f"z{self.stage}-overlap={int(self.overlap_comm)}-contig={int(self.contiguous_gradients)}"
                f"{extra}{'-2groups' if self.two_groups else ''}{'-per_bucket' if self.per_bucket else ''}"
                f"{f'-ga={self.grad_acc}' if self.grad_acc != GRAD_ACC else ''}{'-ckpt' if self.checkpointing else ''}"
                f"{'-odd' if self.odd_model else ''}")

    @property
    def path(self) -> str:
        """The path install must choose: balanced windows for ZeRO-1, balanced bucket shards for
        ZeRO-2, unless told otherwise."""
        if self.per_bucket:
            return "per_bucket"
        return "balanced_windows" if self.stage == 1 else "balanced_buckets"


CASES = [Case(stage, overlap, contiguous) for stage in (1, 2) for overlap in (False, True)
         for contiguous in (False, True)] + [
    # DeepSpeed's reduce_scatter=false path averages with gradient_predivide_factor / postscale
    Case(2, False, True, (("zero_optimization.reduce_scatter", False), ("gradient_predivide_factor", 4.0))),
    Case(2, False, True, (("zero_optimization.reduce_scatter", False), ("prescale_gradients", True))),
    # DeepSpeed's per-destination dist.reduce instead of the whole-bucket all-reduce
    Case(1, False, True, (("zero_optimization.use_multi_rank_bucket_allreduce", False),)),
    # bf16 parameters, fp32 gradient accumulation: DeepSpeed's fp32 partition buffer
    *[Case(2, False, contiguous, (("bf16.enabled", True), ("data_types.grad_accum_dtype", "fp32")))
      for contiguous in (True, False)],
    # ZeRO-1's balanced windows: predivide / postscale averaging, bf16 gradients, DeepSpeed's
    # round-robin flat layout, two parameter groups; and its per-bucket path kept on request
    Case(1, False, True, (("zero_optimization.reduce_scatter", False), ("gradient_predivide_factor", 4.0))),
    Case(1, False, False, (("bf16.enabled", True),)),
    Case(1, True, True, (("bf16.enabled", True),)),
    Case(1, False, True, (("bf16.enabled", True), ("communication_data_type", "fp32"))),
    Case(1, True, True, (("zero_optimization.round_robin_gradients", True),)),
    Case(1, True, False, two_groups=True),
    Case(1, False, True, two_groups=True),
    Case(1, False, True, per_bucket=True),
    # ZeRO-2's balanced bucket shards: accumulation over 3 micro-steps and over 1 (every backward a
    # boundary), bf16 gradients (and fp32 communication), DeepSpeed's round-robin flat layout, two
    # parameter groups, activation checkpointing; and its padded per-bucket path kept on request
    Case(2, True, True, grad_acc=3),
    Case(2, False, False, grad_acc=3),
    Case(2, False, True, grad_acc=1),
    Case(2, True, True, (("bf16.enabled", True),)),
    Case(2, False, True, (("bf16.enabled", True), ("communication_data_type", "fp32"))),
    Case(2, True, True, (("zero_optimization.round_robin_gradients", True),)),
    Case(2, True, False, two_groups=True),
    Case(2, False, True, two_groups=True),
    Case(2, True, True, checkpointing=True),
    Case(2, True, True, odd_model=True),
    Case(2, False, False, grad_acc=3, odd_model=True),
    Case(2, False, True, per_bucket=True),
]


def model_spec(odd: bool = False):
    from contract.spec import ModelSpec

    if odd:  # norms of 70 and MLP matrices of 70 x 171 elements: 2 mod 4
        return ModelSpec(vocab_size=512, hidden_size=70, intermediate_size=171, num_layers=2,
                         num_heads=5, num_kv_heads=1, max_position_embeddings=SEQ_LEN)
    return ModelSpec(vocab_size=512, hidden_size=64, intermediate_size=172, num_layers=2,
                     num_heads=4, num_kv_heads=2, max_position_embeddings=SEQ_LEN)


def ds_config(case: Case) -> dict:
    config = {"train_micro_batch_size_per_gpu": MICRO_BATCH, "gradient_accumulation_steps": case.grad_acc,
              "train_batch_size": MICRO_BATCH * case.grad_acc * WORLD_SIZE, "gradient_clipping": 1.0,
              "steps_per_print": 10**9, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": case.stage, "overlap_comm": case.overlap_comm,
                                    "contiguous_gradients": case.contiguous_gradients,
                                    "reduce_bucket_size": BUCKET_NUMEL}}
    for dotted, value in case.extra:
        *parents, leaf = dotted.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return config


def train(case: Case, collective: str, rank: int) -> dict:
    """STEPS optimizer steps from the seeded model; what the comparison and the checks need."""
    import deepspeed
    import deepspeed.comm.comm as ds_comm
    import torch

    from benchmarks.training.instrument import CommTracer, MicrostepClock
    from benchmarks.training.model import build_model, initialise
    from benchmarks.reduce_scatter.install import OPTION, install

    torch.manual_seed(0)
    model = build_model(model_spec(case.odd_model))
    initialise(model, seed=1234, zero3=False)
    if dict(case.extra).get("bf16.enabled"):
        model = model.to(torch.bfloat16)
    if case.checkpointing:
        model.gradient_checkpointing_enable()
        model.train()
    model_params = list(model.parameters())
    groups = ([{"params": [p for p in model_params if p.ndim >= 2]},
               {"params": [p for p in model_params if p.ndim < 2], "weight_decay": 0.0}]
              if case.two_groups else model_params)
    optimizer = torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.1)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(case))
    messages = []
    if collective == "reduce_scatter":
        handler = logging.Handler()
        handler.emit = lambda record: messages.append(record.getMessage())
        deepspeed.utils.logger.addHandler(handler)
        try:
            stats = install(engine, balanced=not case.per_bucket)
        finally:
            deepspeed.utils.logger.removeHandler(handler)
    else:
        stats = None
    opt = engine.optimizer
    layout = {"flat_numel": [int(t.numel()) for t in opt.bit16_groups_flat],
              "partition_size": [int(p) for p in opt.partition_size]}
    gen = torch.Generator().manual_seed(100 + rank)
    batches = [torch.randint(0, 512, (MICRO_BATCH, SEQ_LEN), generator=gen) for _ in range(case.grad_acc)]
    tracer = CommTracer(ds_comm.cdb, lambda: None)
    losses, norms, steps = [], [], []
    for _ in range(STEPS):
        clock = MicrostepClock(tracer)
        tracer.install()
        step_losses = []
        for i, tokens in enumerate(batches):
            clock.begin(i)
            loss = engine(input_ids=tokens, labels=tokens).loss
            clock.phase("backward")
            engine.backward(loss)
            if i == case.grad_acc - 1:
                clock.phase("step")
            engine.step()
            clock.end()
            step_losses.append(loss.item())
        tracer.uninstall()
        losses.append(sum(step_losses) / len(step_losses))
        norms.append(float(engine.get_global_grad_norm()))
        steps.append([[(c.op, c.api, c.bytes, c.phase) for c in ms.collectives] for ms in clock.microsteps])
    params = {name: p.detach().clone() for name, p in engine.module.named_parameters()}
    engine.destroy()
    return {"losses": losses, "grad_norms": norms, "params": params, "microsteps": steps,
            "grad_numel": sum(p.numel() for p in params.values()), "layout": layout,
            "install_log": [m for m in messages if m.startswith(OPTION)],
            "stats": asdict(stats) if stats else None}


def change_the_bucket_layout() -> str:
    """ZeRO-2's balanced path, a second micro-step whose buckets differ from the first one's
    (reduce_bucket_size halved in between): what it raises (both ranks raise at the same bucket,
    before its collective)."""
    import deepspeed
    import torch

    from benchmarks.training.model import build_model, initialise
    from benchmarks.reduce_scatter.install import install

    torch.manual_seed(0)
    model = build_model(model_spec())
    initialise(model, seed=1234, zero3=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(Case(2, False, True)))
    install(engine)
    tokens = torch.randint(0, 512, (MICRO_BATCH, SEQ_LEN), generator=torch.Generator().manual_seed(7))
    try:
        engine.backward(engine(input_ids=tokens, labels=tokens).loss)
        engine.step()
        engine.optimizer.reduce_bucket_size = BUCKET_NUMEL // 2
        engine.backward(engine(input_ids=tokens, labels=tokens).loss)
    except RuntimeError as e:
        return str(e)
    finally:
        try:
            engine.destroy()
        except Exception:  # noqa: BLE001 - the engine was left mid-backward on purpose
            pass
    return "nothing raised"


def rank_main(rank: int, port: int, out_dir: str, cases: list[Case], layout_check: bool = True) -> None:
    """One rank (torch.multiprocessing, spawned): every case with both reductions, in order; then
    (layout_check) a ZeRO-2 bucket layout that changes between micro-steps."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE),
                      LOCAL_WORLD_SIZE=str(WORLD_SIZE), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    # as the harness's rank environment; DeepSpeed's ops as built at install time (no JIT, no lock)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    import deepspeed
    import torch

    from benchmarks.node.ops import preload

    torch.set_num_threads(1)
    preload()
    deepspeed.init_distributed(dist_backend="gloo")
    results = {}
    for case in cases:
        for collective in ("all_reduce", "reduce_scatter"):
            started = time.perf_counter()
            results[(case, collective)] = train(case, collective, rank)
            results[(case, collective)]["wall_s"] = time.perf_counter() - started
    if layout_check:
        results["layout_change"] = change_the_bucket_layout()
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    # out at once, as a rank does (benchmarks/failure.py run_rank): left to the interpreter's teardown, DeepSpeed's
    # gloo groups sometimes end in std::terminate after the results were saved (SIGABRT: a failed spawn here)
    os._exit(0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(out_dir: Path, cases: list[Case], timeout_s: float = 900, layout_check: bool = True) -> list[dict]:
    import torch
    import torch.multiprocessing as mp

    ctx = mp.start_processes(rank_main, args=(free_port(), str(out_dir), cases, layout_check), nprocs=WORLD_SIZE,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=2):
            if time.monotonic() > deadline:
                raise AssertionError(f"rank processes still running after {timeout_s} s")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=False) for r in range(WORLD_SIZE)]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    started = time.perf_counter()
    results = run_ranks(tmp_path_factory.mktemp("reduce_scatter"), CASES)
    print(f"\n{len(CASES)} cases x 2 reductions on {WORLD_SIZE} ranks: {time.perf_counter() - started:.1f} s")
    return results


def max_diffs(a: dict, b: dict) -> dict[str, float]:
    """Largest absolute differences of per-step loss and gradient norm, and of the parameters
    (absolute and relative), between two runs."""
    params = [(a["params"][k].float(), b["params"][k].float()) for k in b["params"]]
    return {"loss": max(abs(x - y) for x, y in zip(a["losses"], b["losses"])),
            "grad_norm": max(abs(x - y) for x, y in zip(a["grad_norms"], b["grad_norms"])),
            "param": max(float((x - y).abs().max()) for x, y in params),
            "param_rel": max(float(((x - y).abs() / y.abs().clamp_min(1e-12)).max()) for x, y in params)}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_reduce_scatter_trains_exactly_like_deepspeeds_reduction(ranks, case):
    import torch

    for rank, results in enumerate(ranks):
        ref, rs = results[(case, "all_reduce")], results[(case, "reduce_scatter")]
        torch.testing.assert_close(rs["losses"], ref["losses"], rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(rs["grad_norms"], ref["grad_norms"], rtol=RTOL, atol=ATOL)
        assert set(rs["params"]) == set(ref["params"])
        for name, value in ref["params"].items():
            torch.testing.assert_close(rs["params"][name], value, rtol=RTOL, atol=ATOL, msg=name)
        assert ref["losses"][0] != ref["losses"][-1]  # it did train
        d = max_diffs(rs, ref)
        print(f"{case.name} rank {rank}: max |d loss| {d['loss']:.3g}, |d grad norm| {d['grad_norm']:.3g}, "
              f"|d param| {d['param']:.3g} (rel {d['param_rel']:.3g}); all_reduce {ref['wall_s']:.2f} s, "
              f"reduce_scatter {rs['wall_s']:.2f} s")
    # ranks hold the same (all-gathered) parameters
    for k, v in ranks[0][(case, "reduce_scatter")]["params"].items():
        torch.testing.assert_close(ranks[1][(case, "reduce_scatter")]["params"][k], v, rtol=0, atol=0)


def reductions(microstep: list[tuple]) -> dict[str, list[int]]:
    """op -> bytes of each gradient collective of one micro-step (the reductions and ZeRO-2's
    boundary all-to-all), excluding the small scalar reductions."""
    ops: dict[str, list[int]] = {}
    for op, _api, nbytes, _phase in microstep:
        if op in ("all_reduce", "reduce", "reduce_scatter", "all_to_all") and nbytes > SMALL_OP_BYTES:
            ops.setdefault(op, []).append(nbytes)
    return ops


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_gradient_collective_is_a_reduce_scatter(ranks, case):
    from benchmarks.reduce_scatter.layout import balanced_bucket_elements, plan_bucket_shards

    accumulators = []
    for rank, results in enumerate(ranks):
        ref, rs = results[(case, "all_reduce")], results[(case, "reduce_scatter")]
        numel = rs["grad_numel"]
        stats = rs["stats"]
        assert stats["path"] == case.path
        ga = case.grad_acc
        reducing = range(ga) if case.stage == 2 else [ga - 1]
        for step_ref, step_rs in zip(ref["microsteps"], rs["microsteps"]):
            assert len(step_rs) == ga
            for i, (ms_ref, ms_rs) in enumerate(zip(step_ref, step_rs)):
                got_ref, got_rs = reductions(ms_ref), reductions(ms_rs)
                if i not in reducing:
                    assert got_ref == {} and got_rs == {}, (i, got_ref, got_rs)
                    continue
                # DeepSpeed's own path: every gradient element all-reduced (or reduced) once, in
                # the communication dtype
                ref_bytes = sum(sum(b) for b in got_ref.values())
                assert set(got_ref) <= {"all_reduce", "reduce"}
                elem = ref_bytes // numel
                assert elem in (2, 4) and ref_bytes == elem * numel
                # this one: only reduce-scatters, several, covering every gradient element once
                # (and ZeRO-2's balanced path one all-to-all at the accumulation boundary)
                boundary = i == ga - 1
                extra = {"all_to_all"} if case.path == "balanced_buckets" and boundary else set()
                assert set(got_rs) == {"reduce_scatter"} | extra, got_rs
                assert len(got_rs["reduce_scatter"]) > 3
                assert all(n % (WORLD_SIZE * elem) == 0 for n in got_rs["reduce_scatter"])
                if case.path == "balanced_windows":
                    # one per window of every parameter group: N x W elements (the last of a group
                    # N x the rest of the partition), never more than a bucket; in all exactly the
                    # flat groups, i.e. the gradient padded to DeepSpeed's alignment only
                    layout = rs["layout"]
                    expected = [WORLD_SIZE * min(w, p - o) * elem
                                for p, w in zip(layout["partition_size"], stats["window_numel"])
                                for o in range(0, p, w)]
                    assert list(stats["window_numel"]) == [min(p, BUCKET_NUMEL // WORLD_SIZE)
                                                          for p in layout["partition_size"]]
                    assert got_rs["reduce_scatter"] == expected
                    assert max(got_rs["reduce_scatter"]) <= BUCKET_NUMEL * elem
                    assert sum(got_rs["reduce_scatter"]) == sum(layout["flat_numel"]) * elem
                    assert 0 <= sum(layout["flat_numel"]) - numel < 2 * WORLD_SIZE * len(layout["flat_numel"])
                elif case.path == "balanced_buckets":
                    # one per bucket of the backward, every micro-step: the bucket itself, padded
                    # to a multiple of 2N elements only, whatever partitions it lies in; in all the
                    # gradient (+ < 2N per bucket)
                    buckets = [sum(n for _, _, n in spans) for spans in stats["bucket_spans"]]
                    assert sum(buckets) == numel and len(buckets) > 3
                    assert got_rs["reduce_scatter"] == [elem * balanced_bucket_elements(b, WORLD_SIZE)
                                                        for b in buckets]
                    assert 0 <= sum(got_rs["reduce_scatter"]) - ref_bytes < elem * 2 * WORLD_SIZE * len(buckets)
                    if boundary:
                        # the accumulator, in DeepSpeed's gradient accumulation dtype
                        (a2a,) = got_rs["all_to_all"]
                        assert a2a // stats["accumulator_numel"] in (2, 4)
                        assert a2a % stats["accumulator_numel"] == 0
                else:
                    # padded to equal chunks: at most 2x for 2 ranks
                    assert ref_bytes <= sum(got_rs["reduce_scatter"]) <= 2 * ref_bytes
        reductions_run = STEPS * len(reducing)
        assert stats["real_numel"] == numel * reductions_run
        traced = sum(sum(reductions(ms).get("reduce_scatter", [])) for step in rs["microsteps"] for ms in step)
        assert traced == stats["padded_numel"] * elem
        if case.path == "balanced_windows":
            assert stats["padded_numel"] == sum(rs["layout"]["flat_numel"]) * reductions_run
            assert stats["num_straddling"] == 0
        elif case.path == "balanced_buckets":
            assert stats["num_all_to_all"] == STEPS
            assert stats["all_to_all_numel"] == STEPS * stats["accumulator_numel"]
            plan = plan_bucket_shards(stats["bucket_spans"], rs["layout"]["partition_size"], WORLD_SIZE)
            assert stats["accumulator_numel"] == plan.accumulator_numel(rank)
            # a bucket straddles the partition boundary: the shards and the partitions differ
            assert any(len({s.dst for s in plan.segments if s.bucket == k}) > 1 for k in range(len(buckets)))
            accumulators.append(stats["accumulator_numel"])
            if case.odd_model:   # some buckets were padded (to a multiple of 2N), none by more
                assert 0 < stats["padded_numel"] - stats["real_numel"] < reductions_run * len(buckets) * 2 * WORLD_SIZE
        else:
            assert stats["num_straddling"] >= reductions_run  # a bucket straddles the partition boundary
    if accumulators:  # every gradient element is in exactly one rank's accumulator
        assert sum(accumulators) == numel
    last = {c: reductions(ranks[0][(case, c)]["microsteps"][-1][-1]) for c in ("all_reduce", "reduce_scatter")}
    print(f"{case.name}, {numel} gradient elements, last micro-step: "
          + "; ".join(f"{op} x{len(b)} = {sum(b)} B" for ops in last.values() for op, b in ops.items())
          + f"; padded/real elements {stats['padded_numel'] / stats['real_numel']:.3f}")


def test_rank_0_logs_the_path_it_chose(ranks):
    for case in CASES:
        (line,) = ranks[0][(case, "reduce_scatter")]["install_log"]
        assert not ranks[1][(case, "reduce_scatter")]["install_log"]
        if case.path == "balanced_windows":
            assert f"ZeRO-1 gradients reduced at the accumulation boundary in balanced windows over the " \
                   f"{WORLD_SIZE} partitions" in line, line
        elif case.path == "balanced_buckets":
            assert f"ZeRO-2 gradients reduce-scattered bucket by bucket in {WORLD_SIZE} equal shards of each " \
                   "bucket" in line and "one all-to-all at the accumulation boundary" in line, line
        else:
            what = "balanced windows" if case.stage == 1 else "balanced bucket shards"
            assert "one reduce-scatter per bucket" in line, line
            assert f"{what} not used: install(balanced=False)" in line, line


def test_a_changed_bucket_layout_fails_loudly(ranks):
    for results in ranks:
        message = results["layout_change"]
        assert message.startswith("zero.gradient_collective=reduce_scatter: ZeRO-2's bucket layout changed "
                                  "between micro-steps: bucket 1 of this backward holds "), message
        assert "every micro-step must fill the same buckets in the same order" in message


# ZeRO-1's per-bucket reduce-scatter inputs (elements) for this model and bucket size, 2 ranks,
# counted by hand in tests/unit/test_perfmodel.py (HAND_COUNTED): N x each bucket's largest share
PER_BUCKET_ZERO1 = [65_536, 24_576, 22_016, 22_016, 22_336, 30_208, 22_016, 22_400, 65_536]


def test_zero1_balanced_windows_move_the_aligned_gradient_not_the_padded_buckets(ranks):
    """The same ZeRO-1 configuration per bucket and in balanced windows: the per-bucket input is
    padded to N x the largest share of each bucket (as counted by hand), the windows' input is the
    gradient itself (156,480 elements: a multiple of 2N, no alignment padding), in windows of
    N x reduce_bucket_size // N elements."""
    balanced, per_bucket = Case(1, False, True), Case(1, False, True, per_bucket=True)
    got = {case: reductions(ranks[0][(case, "reduce_scatter")]["microsteps"][-1][-1])["reduce_scatter"]
           for case in (balanced, per_bucket)}
    numel = ranks[0][(balanced, "reduce_scatter")]["grad_numel"]
    assert numel == 156_480
    assert got[per_bucket] == [4 * m for m in PER_BUCKET_ZERO1]
    assert got[balanced] == [4 * BUCKET_NUMEL] * 7 + [4 * (156_480 - 7 * BUCKET_NUMEL)]
    assert sum(got[balanced]) == 4 * numel < sum(got[per_bucket])
    print(f"ZeRO-1, fp32, {numel} gradient elements, {WORLD_SIZE} ranks, reduce_bucket_size {BUCKET_NUMEL}: "
          f"reduce-scatter input per optimizer step {sum(got[per_bucket])} B per bucket ({len(got[per_bucket])} "
          f"collectives), {sum(got[balanced])} B in balanced windows ({len(got[balanced])} collectives)")


def test_zero2_balanced_bucket_shards_move_the_bucket_not_the_padded_shares(ranks):
    """The same ZeRO-2 configuration (fp32, gradient accumulation 2) per bucket and in balanced
    bucket shards, as the micro-step instrument recorded them: the per-bucket input of every
    micro-step is each bucket padded to N x its largest share of one partition (the old path's
    figure, padded_bucket_elements, from the balanced run's own bucket layout); the balanced input
    is each bucket padded to 2N elements only, i.e. the gradient itself (156,480 elements); and the
    boundary's all-to-all input is each rank's accumulator, the gradient split between the ranks."""
    from benchmarks.reduce_scatter.layout import (balanced_bucket_elements, boundary_all_to_all_elements,
                                                  padded_bucket_elements, plan_bucket_shards)

    balanced, per_bucket = Case(2, False, True), Case(2, False, True, per_bucket=True)
    sent = []
    for rank, results in enumerate(ranks):
        rs = results[(balanced, "reduce_scatter")]
        stats, numel = rs["stats"], rs["grad_numel"]
        partitions = rs["layout"]["partition_size"]
        assert numel == 156_480
        step = {case: results[(case, "reduce_scatter")]["microsteps"][-1] for case in (balanced, per_bucket)}
        first = {case: reductions(ms[0]) for case, ms in step.items()}          # a micro-step inside the step
        last = {case: reductions(ms[-1]) for case, ms in step.items()}          # the boundary
        spans = stats["bucket_spans"]
        old = [4 * padded_bucket_elements(s, partitions, WORLD_SIZE) for s in spans]
        new = [4 * balanced_bucket_elements(sum(n for _, _, n in s), WORLD_SIZE) for s in spans]
        for got in (first, last):
            assert got[per_bucket] == {"reduce_scatter": old}
            assert got[balanced]["reduce_scatter"] == new
        assert last[balanced]["all_to_all"] == [4 * stats["accumulator_numel"]]
        assert "all_to_all" not in first[balanced]
        assert sum(new) == 4 * numel < sum(old)
        plan = plan_bucket_shards(spans, partitions, WORLD_SIZE)
        assert stats["accumulator_numel"] == plan.accumulator_numel(rank)
        sent.append(boundary_all_to_all_elements(spans, partitions, WORLD_SIZE)[rank])
        if rank == 0:
            print(f"ZeRO-2, fp32, {numel} gradient elements, {WORLD_SIZE} ranks, reduce_bucket_size {BUCKET_NUMEL}, "
                  f"{len(spans)} buckets: reduce-scatter input per micro-step {sum(old)} B per bucket padded "
                  f"({sum(old) / (4 * numel):.3f}x the gradient), {sum(new)} B in balanced shards "
                  f"({sum(new) / (4 * numel):.3f}x); boundary all-to-all input per rank "
                  f"{[4 * plan.accumulator_numel(r) for r in range(WORLD_SIZE)]} B, of which sent to the "
                  f"other rank {[4 * e for e in boundary_all_to_all_elements(spans, partitions, WORLD_SIZE)]} B")
    assert 0 < sum(sent) <= numel


# --- the real CLI ------------------------------------------------------------------------------

@pytest.mark.parametrize("stage", [1, 2])
def test_cli_records_reduce_scatter_in_the_reducing_microsteps(tmp_path, stage):
    run = run_bench(tmp_path / "out", "suite=single", f"zero=stage{stage}",
                    "zero.gradient_collective=reduce_scatter", "measure.warmup_steps=0",
                    "measure.steps=1", "measure.profile_steps=1")
    assert run.returncode == 0, run.stderr[-3000:]
    (rec,) = run.records().values()
    assert rec["status"] == "ok", rec["reason"]
    assert rec["config"]["zero"]["gradient_collective"] == "reduce_scatter"
    num_params = rec["flops"]["num_params"]
    ga = rec["config"]["workload"]["grad_acc_steps"]
    (step,) = rec["microsteps"]  # the one profiled optimizer step
    assert len(step) == ga > 1
    ranks = rec["environment"]["num_ranks"]
    for ms in step:
        reduce_scatter = [c for c in ms["collectives"] if c["op"] == "reduce_scatter"]
        all_to_all = [c for c in ms["collectives"] if c["op"] == "all_to_all"]
        big_all_reduce = [c for c in ms["collectives"] if c["op"] == "all_reduce" and c["bytes"] > SMALL_OP_BYTES]
        assert not big_all_reduce, big_all_reduce
        if stage == 2 or ms["index"] == ga - 1:
            assert reduce_scatter and all(c["phase"] == "backward" for c in reduce_scatter)
            assert sum(c["bytes"] for c in reduce_scatter) >= 4 * num_params  # every fp32 gradient
            if stage == 1:  # balanced windows: padded only to DeepSpeed's alignment (2N per group)
                assert sum(c["bytes"] for c in reduce_scatter) < 4 * (num_params + 2 * 2 * ranks)
                assert not all_to_all
            else:  # balanced bucket shards: each bucket padded to 2N only; the all-to-all at the boundary
                assert sum(c["bytes"] for c in reduce_scatter) < 4 * (num_params + len(reduce_scatter) * 2 * ranks)
                assert [c["phase"] for c in all_to_all] == (["backward"] if ms["index"] == ga - 1 else [])
        else:  # ZeRO-1 reduces only at the accumulation boundary
            assert ms["collectives"] == [], ms


def test_cli_records_a_refusal_as_the_runs_error(tmp_path):
    """Optimizer offload (from a user DeepSpeed file) is a configuration this reduction was not
    verified with: the ranks refuse it, and the run ends in error with the refusal as its reason."""
    user = tmp_path / "ds.json"
    user.write_text('{"zero_optimization": {"offload_optimizer": {"device": "cpu"}}, "zero_force_ds_cpu_optimizer": false}')
    run = run_bench(tmp_path / "out", "suite=single", "zero=stage1", f"deepspeed_config={user}",
                    "zero.gradient_collective=reduce_scatter",
                    "measure.warmup_steps=0", "measure.steps=1", "measure.profile_steps=0")
    assert run.returncode == 3, run.stderr[-3000:]
    (rec,) = run.records().values()
    assert rec["status"] == "error"
    assert "GradientCollectiveError: zero.gradient_collective=reduce_scatter refused" in rec["reason"]
    assert "not verified with optimizer offload" in rec["reason"]


def test_bf16_zero1_with_fp32_accumulation_is_refused_before_launch(tmp_path):
    """bf16 ZeRO-1 with fp32 accumulation is DeepSpeed's BF16_Optimizer, which this reduction cannot
    replace: refused by name before anything runs, whether asked for in the suite's config or
    through a user DeepSpeed file."""
    user = tmp_path / "ds.json"
    user.write_text('{"data_types": {"grad_accum_dtype": "fp32"}}')
    for how in ("workload.grad_accum_dtype=fp32", f"deepspeed_config={user}"):
        run = run_bench(tmp_path / how.split("=")[0], "suite=single", "zero=stage1", "workload.precision=bf16",
                        how, "zero.gradient_collective=reduce_scatter")
        assert run.returncode == 2 and "workload.grad_accum_dtype" in run.stderr, run.stderr[-3000:]
        assert run.records() == {}
