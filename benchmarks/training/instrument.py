"""Per-micro-step instrument: which collectives DeepSpeed issues, when, how big, how long.

How it measures (the README repeats this):
- Every collective DeepSpeed issues goes through ``deepspeed.comm.comm.cdb``, the backend object
  (TorchBackend) behind ``deepspeed.comm``: ZeRO-1/2 gradient all-reduce, the post-step parameter
  all-gather, ZeRO-3's parameter all-gathers and gradient reduce-scatters, gradient-norm
  reductions. ``CommTracer`` wraps that object's collective methods, so what it sees is what
  DeepSpeed really issued, with the op, the bytes of the full buffer (nccl-tests' "size": the
  output of an all-gather, the input of a reduce-scatter) and the time.
- Profile mode is synchronising: before each op the device is synchronised, the op is issued,
  an async op is waited for at once, and the device is synchronised again. The op's time is
  then pure communication, and a micro-step's compute time is its total minus its ops' times.
  This serialises what DeepSpeed would overlap (overlap_comm, ZeRO-3 prefetch), so profile-mode
  step times are NOT throughput figures: throughput comes from separate steps in throughput
  mode, where nothing is wrapped and the device is synchronised only at step boundaries.
- On CPU/gloo, collectives are synchronous calls anyway; synchronising is a no-op.

DeepSpeed's own ``comms_logger`` is not used: in 0.19.8 each latency it reports includes all
earlier calls of the same op, and it synchronises after every op too.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

# cdb method -> (nccl-tests op name, (name, position) of the argument whose tensor(s) give the
# message size). Positions are those of TorchBackend's methods (deepspeed/comm/torch.py, 0.19.x);
# its decorators hide the signatures from inspect, so they are stated here and tested.
TRACED_APIS: dict[str, tuple[str, Optional[tuple[str, int]]]] = {
    "all_reduce": ("all_reduce", ("tensor", 0)),
    "all_reduce_coalesced": ("all_reduce", ("tensors", 0)),
    "inference_all_reduce": ("all_reduce", ("tensor", 0)),
    "all_gather_into_tensor": ("all_gather", ("output_tensor", 0)),
    "all_gather": ("all_gather", ("tensor_list", 0)),
    "all_gather_coalesced": ("all_gather", ("output_tensors", 0)),
    "reduce_scatter_tensor": ("reduce_scatter", ("input_tensor", 1)),
    "reduce_scatter": ("reduce_scatter", ("input_list", 1)),
    "broadcast": ("broadcast", ("tensor", 0)),
    "reduce": ("reduce", ("tensor", 0)),
    "all_to_all_single": ("all_to_all", ("input", 1)),
    "send": ("send", ("tensor", 0)),
    "recv": ("recv", ("tensor", 0)),
    "barrier": ("barrier", None),
}
GROUP_AT = {"all_reduce": 2, "all_reduce_coalesced": 2, "inference_all_reduce": 2, "all_gather_into_tensor": 2,
            "all_gather": 2, "all_gather_coalesced": 2, "reduce_scatter_tensor": 3, "reduce_scatter": 3, "broadcast": 2,
            "reduce": 3, "all_to_all_single": 4, "send": 2, "recv": 2, "barrier": 0}
"""Position of each traced method's `group` parameter (TorchBackend's, tested like TRACED_APIS): deepspeed.comm
passes it by keyword to most, by position to the all-reduces. Which ranks a call waits for (arrivals.py)."""
PHASES = ("teacher", "forward", "backward", "step")
"""A micro-step's phases in order: the distillation teacher's forward (only with a teacher), the
student's forward (and loss), its backward, and the optimizer step (last micro-step only)."""


@dataclass
class Collective:
    op: str
    bytes: int
    time_s: float
    api: str
    phase: str


@dataclass
class Microstep:
    index: int
    total_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    collectives: list[Collective] = field(default_factory=list)
    phase_s: dict[str, float] = field(default_factory=dict)
    """Wall time of each phase (compute and its collectives), device synchronised at each boundary."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def message_bytes(arg: Optional[tuple[str, int]], args: tuple, kwargs: dict) -> int:
    """Bytes of the buffer that defines the message size (0 for a barrier)."""
    if arg is None:
        return 0
    name, position = arg
    obj = kwargs[name] if name in kwargs else (args[position] if len(args) > position else None)
    return _nbytes(obj)


def _nbytes(obj: Any) -> int:
    if obj is None:
        return 0
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(t) for t in obj)
    return int(obj.numel() * obj.element_size())


class CommTracer:
    """Wraps the collective methods of DeepSpeed's comm backend while installed."""

    def __init__(self, backend: Any, synchronize: Callable[[], None]):
        self.backend = backend
        self.synchronize = synchronize
        self.phase = "forward"
        self.sink: Optional[list[Collective]] = None
        self.stamps: list[tuple[float, float, Optional[tuple[int, ...]]]] = []
        """(entry, exit, the group's ranks or None for every rank) of each call filed in a sink, on the host's
        monotonic clock (benchmarks/training/arrivals.py)."""
        self._members: dict[int, Optional[tuple[int, ...]]] = {}
        self._originals: dict[str, Callable] = {}

    def install(self) -> None:
        for api, (op, arg) in TRACED_APIS.items():
            method = getattr(self.backend, api, None)
            if method is None or api in self._originals:
                continue
            self._originals[api] = method
            setattr(self.backend, api, self._wrap(api, op, arg, method))

    def uninstall(self) -> None:
        for api, method in self._originals.items():
            setattr(self.backend, api, method)
        self._originals.clear()

    def _wrap(self, api: str, op: str, arg: Optional[tuple[str, int]], method: Callable) -> Callable:
        def traced(*args: Any, **kwargs: Any) -> Any:
            if self.sink is None:
                return method(*args, **kwargs)
            size = message_bytes(arg, args, kwargs)
            at = GROUP_AT.get(api, len(args))
            group = self.members(kwargs["group"] if "group" in kwargs else (args[at] if len(args) > at else None))
            self.synchronize()
            start = time.perf_counter()
            result = method(*args, **kwargs)
            if result is not None and hasattr(result, "wait"):  # async_op=True: a work handle
                result.wait()
            self.synchronize()
            leave = time.perf_counter()
            self.sink.append(Collective(op=op, bytes=size, time_s=leave - start, api=api, phase=self.phase))
            self.stamps.append((start, leave, group))
            return result

        return traced

    def members(self, group: Any) -> Optional[tuple[int, ...]]:
        """The global ranks of a call's process group; None for the default group (every rank)."""
        if group is None:
            return None
        if id(group) not in self._members:
            import torch.distributed as dist

            ranks = tuple(dist.get_process_group_ranks(group)) if dist.is_initialized() else ()
            self._members[id(group)] = None if not ranks or len(ranks) == dist.get_world_size() else ranks
        return self._members[id(group)]


class MicrostepClock:
    """Times micro-steps of one profiled optimizer step and files the tracer's ops under them."""

    def __init__(self, tracer: CommTracer):
        self.tracer = tracer
        self.microsteps: list[Microstep] = []
        self._start = 0.0
        tracer.stamps = []

    def calls(self) -> tuple[list[tuple[str, int]], list[tuple[float, float, Optional[tuple[int, ...]]]]]:
        """Every call of the step in the order issued, (op, bytes), and its (entry, exit, group) stamps."""
        return [(c.op, c.bytes) for m in self.microsteps for c in m.collectives], self.tracer.stamps

    def begin(self, index: int, phase: str = "forward") -> None:
        self.tracer.synchronize()
        self.microsteps.append(Microstep(index=index))
        self.tracer.sink = self.microsteps[-1].collectives
        self.tracer.phase = phase
        self._start = self._phase_start = time.perf_counter()

    def _close_phase(self) -> float:
        self.tracer.synchronize()
        now = time.perf_counter()
        spent = self.microsteps[-1].phase_s
        spent[self.tracer.phase] = spent.get(self.tracer.phase, 0.0) + now - self._phase_start
        self._phase_start = now
        return now

    def phase(self, name: str) -> None:
        assert name in PHASES
        self._close_phase()
        self.tracer.phase = name

    def end(self) -> Microstep:
        now = self._close_phase()
        ms = self.microsteps[-1]
        ms.total_s = now - self._start
        ms.comm_s = sum(c.time_s for c in ms.collectives)
        ms.compute_s = max(ms.total_s - ms.comm_s, 0.0)
        self.tracer.sink = None
        return ms
