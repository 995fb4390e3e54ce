"""The waiting in a training run's measured communication (harness/held_up.py, contract/collectives.py
held_up_excess): a profiled call over 3x the lower quartile of its op and size was held up, and its time beyond that
quartile is counted as waiting; the record carries the share (comm_held_up_pct), the summary each micro-step's."""
from __future__ import annotations

import pytest
import unit_helpers  # noqa: F401  (puts the repository root on sys.path)

from contract.collectives import STALL_FACTOR, held_up_excess
from contract.metrics import METRICS
from harness.held_up import comm_held_up_pct, held_up_s
from harness.record import ResultRecord
from harness.report.summary import microstep_table


def test_a_call_over_three_times_its_kinds_lower_quartile_adds_its_excess_others_nothing():
    calls = [("ag", 1.0), ("rs", 10.0), ("ag", 1.2), ("ag", 5.0), ("rs", 11.0), ("ag", 1.1), ("rs", 40.0),
             ("ag", 3.0)]
    # ag: sorted 1.0, 1.1, 1.2, 3.0, 5.0: the nearest-rank quartile is the 2nd (ceil(5/4)), 1.1; rs: 10.0 of three
    excess = held_up_excess(calls)
    assert excess == pytest.approx([0.0, 0.0, 0.0, 5.0 - 1.1, 0.0, 0.0, 40.0 - 10.0, 0.0])
    assert held_up_excess([("x", 1.0), ("x", STALL_FACTOR * 1.0)]) == [0.0, 0.0]   # at the factor: not held up
    assert held_up_excess([("x", 1.0)]) == [0.0] and held_up_excess([]) == []


def call(op, nbytes, time_s):
    return {"op": op, "bytes": nbytes, "time_s": time_s, "api": op, "phase": "backward"}


def step(waited_s: float) -> list[dict]:
    """Three micro-steps of a ZeRO-3 step: two gathers and a reduce-scatter each; the last reduce-scatter waited."""
    out = []
    for i in range(3):
        rs = 0.002 + (waited_s if i == 2 else 0.0)
        calls = [call("all_gather", 2_000_000, 0.001), call("all_gather", 500_000, 0.0004),
                 call("reduce_scatter", 1_000_000, rs)]
        comm = sum(c["time_s"] for c in calls)
        out.append({"index": i, "total_s": 0.02 + comm, "compute_s": 0.02, "comm_s": comm, "collectives": calls})
    return out


def test_the_waiting_is_placed_in_its_micro_step_and_its_share_of_the_profiled_communication_recorded():
    profiled = [step(0.010), step(0.010)]
    assert held_up_s(profiled) == [[0.0, 0.0, pytest.approx(0.010)]] * 2
    total = 2 * (3 * 0.0014 + 3 * 0.002 + 0.010)
    assert comm_held_up_pct(profiled) == pytest.approx(100 * 0.020 / total)
    assert comm_held_up_pct([step(0.0)]) == 0.0
    assert comm_held_up_pct([[{"index": 0, "total_s": 0.1, "compute_s": 0.1, "comm_s": 0.0, "collectives": []}]]) is None
    spec = METRICS["comm_held_up_pct"]
    assert spec.reference_kind is None and not spec.paced        # information: never judged, never submitted

    rec = ResultRecord(schema_version="1.0", run_id="00-z3", kind="training", benchmark="llama-tiny", platform="cpu",
                       status="ok", reason=None, config={"workload": {"micro_batch_size": 2, "grad_acc_steps": 3},
                                                         "zero": {"stage": 3}},
                       overrides=[], environment={}, metrics={}, microsteps=profiled)
    text = microstep_table(rec)
    assert "held up ms" in text.splitlines()[0]
    rows = [line.split() for line in text.splitlines()[2:]]
    assert [r[4] for r in rows] == ["0.0", "0.0", "10.0"]     # the last micro-step's reduce-scatter waited 10 ms
