"""The CPU share over the step at the run's median (harness/nodes.py at_median, harness/pace.py _load): each rank marks
its timed steps in its load window (benchmarks/node/machine.py LoadWindow.step_start/step_end), the harness reads the
load over the median step by time (of an even count the two middle ones: what the run's median step time, and its
samples/s, come from), and the CPU share judges a run by it where the record kept it. A neighbour's spell of a few
seconds in a run of ten moves the steps it covers, and the median with them, more than the whole window's share says:
that window also holds the warm-up and the profiled steps. Real records: a default-cpu run beside a unit-test run
(tests/data/neighbour, test_cpu_share.py) and its quiet twin."""
from __future__ import annotations

import copy
import time

import pytest

from benchmarks.node.machine import LoadWindow
from harness.nodes import at_median, load_during
from harness.pace import cpu_share
from test_cpu_share import RUNS, loaded, quiet_twin, verdicts_of


def test_a_window_keeps_each_marked_step_apart_from_what_it_left_unmarked():
    window = LoadWindow()
    time.sleep(0.1)                                   # a warm-up: in the window, no step
    window.step_start()
    cpu0, wall0 = time.process_time(), time.monotonic()
    while time.monotonic() < wall0 + 0.25:           # a step that computes, as much as the scheduler lets it
        pass
    own = (time.process_time() - cpu0) / (time.monotonic() - wall0)
    window.step_end()
    window.step_end()                                 # an end without a start marks nothing
    window.step_start()
    time.sleep(0.25)                                  # a step that waits (on a peer, the network)
    window.step_end()
    w = window.close()
    steps = w["steps"]
    assert set(steps) == {"wall_s", "busy_cpus", "steal_cpus", "own_cpus", "wait_cpus"}
    assert len(steps["wall_s"]) == 2 and all(0.24 <= t < 0.5 for t in steps["wall_s"]), steps
    # what this process used over each step, as it counts itself, whatever else the box runs
    assert abs(steps["own_cpus"][0] - own) <= 0.1 and steps["own_cpus"][1] < 0.05, (steps, own)
    assert w["wall_s"] >= 0.6 and w["own_cpus"] < steps["own_cpus"][0] + 0.05
    assert "steps" not in LoadWindow().close()        # a collective sweep marks none: no steps kept


def ranks_of(walls: list[float], busy: list[float], own: list[float]) -> list[dict]:
    """Two ranks' windows (one kernel) whose timed steps read these walls, machine busy CPUs and own CPUs (each
    rank half the ranks' own), with a quiet window overall."""
    n = len(walls)
    return [{"rank": r, "host": "box", "boot_id": "k", "wall_s": 12.0, "busy_cpus": 1.9, "own_cpus": 0.9,
             "steal_cpus": 0.0, "wait_cpus": 0.05, "load_avg_1_5_15": [1, 1, 1],
             "steps": {"wall_s": walls, "busy_cpus": busy, "own_cpus": [o / 2 for o in own],
                       "steal_cpus": [0.0] * n, "wait_cpus": [0.3 if o < 1.5 else 0.02 for o in own]}}
            for r in range(2)]


def test_the_median_step_is_read_alone_and_of_an_even_count_the_two_middle_ones():
    # five timed steps: three under a neighbour's spell (slow, the ranks got 1.0 CPUs of the box's 2), two quiet
    ranks = ranks_of([1.0, 1.6, 1.8, 1.0, 1.7], [2.0, 2.0, 2.0, 1.9, 2.0], [1.9, 1.0, 1.0, 1.85, 1.0])
    m = at_median(ranks)
    # by time: 1.0, 1.0, 1.6, 1.7, 1.8 -> the median, 1.6 (the second step)
    assert m == {"steps": 1, "of": 5, "wall_s": 1.6, "busy_cpus": 2.0, "run_cpus": 1.0, "other_cpus": 1.0,
                 "steal_cpus": 0.0, "wait_cpus": 0.6}
    load = load_during(ranks)
    assert load["other_cpus"] == 0.1 and load["at_median"] == m    # the window read the box nearly quiet
    # six steps: the two middle ones (1.0 quiet and 1.6 in the spell), weighted by their time
    even = at_median(ranks_of([1.0, 1.6, 1.8, 0.9, 1.7, 0.95], [2.0, 2.0, 2.0, 1.9, 2.0, 1.9],
                              [1.9, 1.0, 1.0, 1.85, 1.0, 1.85]))
    assert (even["steps"], even["of"], even["wall_s"]) == (2, 6, 2.6)
    assert even["other_cpus"] == pytest.approx((1.0 * 0.1 + 1.6 * 1.0) / 2.6, abs=0.01)
    assert at_median(ranks_of([1.2], [2.0], [1.0]))["steps"] == 1


def test_no_steps_kept_or_counts_that_differ_read_no_median():
    ranks = ranks_of([1.0, 1.2, 1.1], [2.0] * 3, [1.9] * 3)
    assert "at_median" not in load_during([{k: v for k, v in w.items() if k != "steps"} for w in ranks])
    odd = copy.deepcopy(ranks)
    odd[1]["steps"]["wall_s"].pop()
    assert at_median(odd) is None and "at_median" not in load_during(odd)
    broken = copy.deepcopy(ranks)
    broken[0]["steps"]["own_cpus"] = [None] * 3                   # a rank that could not read its own CPUs
    assert at_median(broken) is None


def spelled(record: dict) -> dict:
    """The real run beside a neighbour as if the neighbour had come in spells: its window read nearly quiet (the
    spells diluted by the warm-up, the quiet steps and the profiled ones), its median step what the whole run read."""
    out = copy.deepcopy(record)
    load = out["environment"]["load"]
    load["at_median"] = {"steps": 1, "of": 5, "wall_s": 1.4,
                         **{k: load[k] for k in ("busy_cpus", "run_cpus", "other_cpus", "steal_cpus", "wait_cpus")
                            if k in load}}
    load.update(run_cpus=1.8, other_cpus=0.1, busy_cpus=1.9)
    return out


@pytest.mark.parametrize("name", RUNS)
def test_a_spell_the_window_diluted_is_read_at_the_median_steps(name):
    run = loaded(name)
    twin = quiet_twin(run)
    window_only = copy.deepcopy(spelled(run))
    del window_only["environment"]["load"]["at_median"]
    # the whole window alone: the neighbour took too little of it to explain the slowdown, a regression
    assert verdicts_of([window_only], [twin])["samples_per_s"].verdict == "regression"
    verdict = verdicts_of([spelled(run)], [twin])["samples_per_s"]
    assert verdict.verdict == "not comparable" and "other work took" in verdict.reason, verdict.reason
    assert "CPUs during this run's median step (the reference's" in verdict.reason
    share = cpu_share(twin["environment"], [spelled(run)["environment"]])
    assert share.now == run["environment"]["load"]["run_cpus"] and share.then == 1.86


def test_a_quiet_run_reads_alike_either_way():
    run = quiet_twin(loaded(RUNS[0]))
    with_steps = copy.deepcopy(run)
    load = with_steps["environment"]["load"]
    load["at_median"] = {"steps": 1, "of": 5, "wall_s": 1.0, "busy_cpus": 1.92, "run_cpus": 1.87, "other_cpus": 0.05,
                         "steal_cpus": 0.0, "wait_cpus": 0.03}
    assert verdicts_of([with_steps], [run])["samples_per_s"].verdict == "pass"
    assert cpu_share(run["environment"], [with_steps["environment"]]) is None
