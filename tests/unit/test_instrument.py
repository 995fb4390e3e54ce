"""The per-micro-step instrument (benchmarks.training.instrument) over a fake comm backend: what it
records, how it times, and that its table of traced APIs matches DeepSpeed's real backend."""
from __future__ import annotations

import ast
import inspect
import json
import textwrap
import time

import pytest
import torch

from benchmarks.training.instrument import (GROUP_AT, PHASES, TRACED_APIS, CommTracer, MicrostepClock,
                                            message_bytes)

from unit_helpers import REPO_ROOT

OP_S = 0.01     # how long each fake collective takes
WAIT_S = 0.02   # how long an async work handle takes to complete in wait()


class Work:
    def __init__(self, backend):
        self.backend = backend

    def wait(self):
        time.sleep(WAIT_S)
        self.backend.waited += 1
        return True


class FakeBackend:
    """The three collectives ZeRO uses, with TorchBackend's parameter names and order."""

    def __init__(self):
        self.calls: list[str] = []
        self.waited = 0

    def _op(self, name, async_op):
        self.calls.append(name)
        if async_op:
            return Work(self)  # completes in wait()
        time.sleep(OP_S)
        return None

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        return self._op("all_reduce", async_op)

    def all_gather_into_tensor(self, output_tensor, input_tensor, group=None, async_op=False):
        return self._op("all_gather_into_tensor", async_op)

    def reduce_scatter_tensor(self, output_tensor, input_tensor, op=None, group=None, async_op=False):
        return self._op("reduce_scatter_tensor", async_op)


def f32(n):
    return torch.zeros(n, dtype=torch.float32)


def bf16(n):
    return torch.zeros(n, dtype=torch.bfloat16)


@pytest.fixture
def traced():
    backend = FakeBackend()
    syncs = []
    tracer = CommTracer(backend, lambda: syncs.append(1))
    tracer.install()
    yield backend, tracer, syncs
    tracer.uninstall()


# (api, args, kwargs, op recorded, bytes recorded, async)
CALLS = [
    pytest.param("all_reduce", (f32(10),), {}, "all_reduce", 40, False, id="all_reduce"),
    pytest.param("all_reduce", (), {"tensor": bf16(10), "async_op": True}, "all_reduce", 20, True,
                 id="all_reduce-kwargs-async"),
    pytest.param("all_gather_into_tensor", (bf16(8), bf16(4)), {}, "all_gather", 16, False,
                 id="all_gather-output-size"),
    pytest.param("all_gather_into_tensor", (), {"output_tensor": f32(6), "input_tensor": f32(3),
                                                "async_op": True}, "all_gather", 24, True,
                 id="all_gather-kwargs-async"),
    pytest.param("reduce_scatter_tensor", (f32(3), f32(6)), {}, "reduce_scatter", 24, False,
                 id="reduce_scatter-input-size"),
    pytest.param("reduce_scatter_tensor", (bf16(2),), {"input_tensor": bf16(8), "async_op": True},
                 "reduce_scatter", 16, True, id="reduce_scatter-mixed-async"),
]


@pytest.mark.parametrize("api,args,kwargs,op,nbytes,is_async", CALLS)
def test_each_collective_is_recorded_with_op_bytes_and_time(traced, api, args, kwargs, op, nbytes, is_async):
    backend, tracer, _ = traced
    clock = MicrostepClock(tracer)
    clock.begin(0)
    result = getattr(backend, api)(*args, **kwargs)
    ms = clock.end()

    assert backend.calls == [api]
    assert len(ms.collectives) == 1
    c = ms.collectives[0]
    assert (c.op, c.bytes, c.api, c.phase) == (op, nbytes, api, "forward")
    if is_async:
        assert isinstance(result, Work), "the caller still gets its work handle"
        assert backend.waited == 1, "an async op is waited for inside the timed region"
        assert c.time_s >= WAIT_S
    else:
        assert result is None
        assert c.time_s >= OP_S


def test_a_microstep_splits_into_comm_and_compute(traced):
    backend, tracer, syncs = traced
    clock = MicrostepClock(tracer)
    clock.begin(0)
    backend.all_gather_into_tensor(f32(8), f32(4))                     # forward: ZeRO-3 gather
    time.sleep(0.03)                                                   # "compute"
    clock.phase("backward")
    backend.reduce_scatter_tensor(f32(4), f32(8), async_op=True)       # backward: gradients
    clock.phase("step")
    backend.all_reduce(f32(1))                                         # step: grad norm
    first = clock.end()
    clock.begin(1)
    backend.all_reduce(bf16(100))
    second = clock.end()

    assert [(c.op, c.bytes, c.phase) for c in first.collectives] == [
        ("all_gather", 32, "forward"), ("reduce_scatter", 32, "backward"), ("all_reduce", 4, "step")]
    assert backend.waited == 1
    assert first.index == 0 and second.index == 1
    assert first.comm_s == sum(c.time_s for c in first.collectives)
    assert first.comm_s >= 2 * OP_S + WAIT_S
    assert first.compute_s == pytest.approx(first.total_s - first.comm_s)
    assert first.compute_s >= 0.03
    assert first.total_s >= first.comm_s + 0.03
    assert [(c.op, c.bytes, c.phase) for c in second.collectives] == [("all_reduce", 200, "forward")]
    assert clock.microsteps == [first, second]
    # begin, each phase change, end and each op synchronise the device (before and after the op)
    assert len(syncs) == (2 + 2 + 2 * 3) + (2 + 2 * 1)
    assert set(first.phase_s) == {"forward", "backward", "step"}
    assert first.phase_s["forward"] >= 0.03
    assert sum(first.phase_s.values()) == pytest.approx(first.total_s)
    assert set(second.phase_s) == {"forward"}
    # the dict form is what goes into the record: plain JSON
    d = json.loads(json.dumps(first.to_dict()))
    assert d["phase_s"] == first.phase_s
    assert d["collectives"][0] == {"op": "all_gather", "bytes": 32, "time_s": first.collectives[0].time_s,
                                   "api": "all_gather_into_tensor", "phase": "forward"}
    # each call's entry and exit on the host's clock, in the order issued, for the ranks' matching (arrivals.py)
    calls, stamps = clock.calls()
    assert calls == [("all_gather", 32), ("reduce_scatter", 32), ("all_reduce", 4), ("all_reduce", 200)]
    assert [b - a for a, b, _ in stamps] == pytest.approx([c.time_s for m in clock.microsteps for c in m.collectives])
    assert all(b <= c for (_, b, _), (c, _, _) in zip(stamps, stamps[1:]))
    assert [g for _, _, g in stamps] == [None] * 4                    # the default group: every rank
    assert stamps[1][0] - stamps[0][1] >= 0.03                        # the compute between them
    assert MicrostepClock(tracer).calls() == ([], [])                 # a new step's clock starts empty


def test_calls_outside_a_microstep_are_passed_through_but_not_recorded(traced):
    backend, tracer, syncs = traced
    backend.all_reduce(f32(4))                      # before any clock: sink is None
    clock = MicrostepClock(tracer)
    clock.begin(0)
    backend.all_reduce(f32(4))
    ms = clock.end()
    work = backend.all_reduce(f32(4), async_op=True)  # after end(): sink is None again
    assert tracer.sink is None
    assert backend.calls == ["all_reduce"] * 3
    assert len(ms.collectives) == 1
    assert isinstance(work, Work) and backend.waited == 0, "untraced async ops are not waited for"


def test_unknown_phase_is_refused(traced):
    _, tracer, _ = traced
    clock = MicrostepClock(tracer)
    clock.begin(0)
    assert PHASES == ("teacher", "forward", "backward", "step")
    with pytest.raises(AssertionError):
        clock.phase("optimizer")


def test_install_wraps_only_what_the_backend_has_and_uninstall_restores_it():
    backend = FakeBackend()
    originals = {api: getattr(backend, api) for api in ("all_reduce", "all_gather_into_tensor",
                                                        "reduce_scatter_tensor")}
    tracer = CommTracer(backend, lambda: None)
    tracer.install()
    tracer.install()  # idempotent: not wrapped twice
    for api, original in originals.items():
        assert getattr(backend, api) != original
    assert not hasattr(backend, "broadcast"), "APIs the backend lacks are not invented"
    clock = MicrostepClock(tracer)
    clock.begin(0)
    backend.all_reduce(f32(1))
    assert len(tracer.sink) == 1, "wrapped once, recorded once"

    tracer.uninstall()
    for api, original in originals.items():
        assert getattr(backend, api) == original
        assert getattr(backend, api).__func__ is getattr(FakeBackend, api)
    backend.all_reduce(f32(1))  # a sink is still set, but nothing is wrapped any more
    assert len(clock.microsteps[0].collectives) == 1


@pytest.mark.parametrize("arg,args,kwargs,expected", [
    (None, (), {}, 0),
    (("tensor", 0), (f32(5),), {}, 20),
    (("tensor", 0), (), {"tensor": bf16(5)}, 10),
    (("tensor_list", 0), ([f32(2), f32(3)], f32(1)), {}, 20),
    (("input_tensor", 1), (f32(1),), {}, 0),          # argument not given at all
    (("input", 1), (f32(2), torch.zeros(3, dtype=torch.float64)), {}, 24),
])
def test_message_bytes(arg, args, kwargs, expected):
    assert message_bytes(arg, args, kwargs) == expected


# --- TRACED_APIS against DeepSpeed's real backend ------------------------------------------

def torch_backend_signatures() -> dict[str, list[str]]:
    """Parameter names (after self) of TorchBackend's methods, read from its source: its
    decorators hide the real signatures from inspect.signature."""
    from deepspeed.comm.torch import TorchBackend

    tree = ast.parse(textwrap.dedent(inspect.getsource(TorchBackend)))
    cls = tree.body[0]
    assert isinstance(cls, ast.ClassDef) and cls.name == "TorchBackend"
    return {f.name: [a.arg for a in f.args.posonlyargs + f.args.args][1:]
            for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}


@pytest.fixture(scope="module")
def real_signatures():
    return torch_backend_signatures()


def test_the_signature_reader_sees_the_known_collectives(real_signatures):
    assert real_signatures["all_reduce"][:2] == ["tensor", "op"]
    assert real_signatures["reduce_scatter_tensor"][:2] == ["output_tensor", "input_tensor"]


@pytest.mark.parametrize("api", sorted(TRACED_APIS))
def test_traced_api_matches_deepspeeds_torch_backend(real_signatures, api):
    op, arg = TRACED_APIS[api]
    assert api in real_signatures, f"TorchBackend has no method {api}"
    assert real_signatures[api].index("group") == GROUP_AT[api], f"{api}{tuple(real_signatures[api])}: group"
    if arg is not None:
        name, position = arg
        params = real_signatures[api]
        assert position < len(params), f"{api}{tuple(params)} has no parameter at {position}"
        assert params[position] == name, f"{api}{tuple(params)}: position {position} is not {name}"


def test_every_traced_op_is_a_valid_record_op():
    schema = json.loads((REPO_ROOT / "schemas" / "record.schema.json").read_text(encoding="utf-8"))
    ops = (schema["properties"]["microsteps"]["items"]["items"]["properties"]["collectives"]["items"]
           ["properties"]["op"]["enum"])
    assert {op for op, _ in TRACED_APIS.values()} <= set(ops)


def test_a_call_on_a_subgroup_is_stamped_with_its_ranks_the_default_group_with_none(traced, monkeypatch):
    import torch.distributed as dist

    backend, tracer, _ = traced
    pairs = {"pair": [0, 2], "everyone": [0, 1, 2, 3]}
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    monkeypatch.setattr(dist, "get_process_group_ranks", lambda group: pairs[group])
    clock = MicrostepClock(tracer)
    clock.begin(0)
    backend.all_reduce(f32(4), None, "pair")                             # by position, as deepspeed.comm does
    backend.all_gather_into_tensor(f32(8), f32(4), group="pair")         # by keyword
    backend.reduce_scatter_tensor(f32(4), f32(8), group="everyone")      # a group of every rank
    backend.all_reduce(f32(4))                                           # the default group
    clock.end()
    assert [g for _, _, g in clock.calls()[1]] == [(0, 2), (0, 2), None, None]
