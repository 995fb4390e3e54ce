"""Every rank's own device, read at once (load.pulse_devices): a step waits for its slowest device, and a pulse that
times one device while the others wait cannot see one of eight GPUs that runs slower, nor a VM's host that runs its
vCPUs slower only while all of them are busy (docs/measurement.md, "Every device at once"). The machine's pace then
counts every device (harness/pace.py matmul_pace)."""
from __future__ import annotations

import multiprocessing

from test_compare import record, reference
from test_probe import env_with, paced_env, probe
from test_machine_load import _window

from benchmarks.node.probe import Pulses
from harness.held_up import night_stragglers
from harness.nodes import load_during
from harness.pace import matmul_pace, pace
from harness.verdict.compare import compare, environment_diff
from unit_helpers import schema_valid, typed


def own(rank, host, before, after):
    return {**_window(rank, host, host, 1.0, 0.9), "pulse_own": {"before": before, "after": after, "unit": "GFLOP/s"}}


def test_the_run_keeps_its_slowest_and_fastest_device_each_the_better_of_before_and_after():
    load = load_during([own(0, "a", 101.0, 99.0), own(1, "a", 52.0, 60.0), own(2, "b", 100.0, None)])
    assert load["pulse_devices"] == {"slowest": 60.0, "fastest": 101.0, "rank": 1, "host": "a", "devices": 3}
    assert "pulse_devices" not in load_during([_window(0, "a", "a", 1.0, 0.9)])        # a record from before
    assert "pulse_devices" not in load_during([own(0, "a", None, None)])             # every pulse failed


def devices_env(fp32: float, slowest: float, fastest: float, rank: int = 1) -> dict:
    env = paced_env(fp32)
    env["load"]["pulse_devices"] = {"slowest": slowest, "fastest": fastest, "rank": rank, "host": "vm", "devices": 2,
                                    "paced": fp32 * slowest / fastest}
    return env


def _samples(ref_env: dict, run_env: dict, factor: float):
    ref = reference([100.0, 101.0, 99.0], env=ref_env)
    runs = [record(i, env=run_env, samples_per_s=(v * factor, "samples/s")) for i, v in enumerate([100.0, 99.5, 100.5])]
    (v,) = [v for v in compare(typed(runs), [ref]) if v.metric == "samples_per_s"]
    return v


def test_one_slow_device_explains_a_regression_the_first_ranks_pulse_misses():
    """The first rank's device read the reference's pace (80 vs 80) while rank 1's, read at once with it, ran at
    0.6x: the step waits for rank 1, and 0.6x the samples/s is the machine's. The reference read its devices
    never (from before): its devices count as even."""
    ref = env_with(probe())
    ref["load"] = {"pulse_fp32": 80.0}
    v = _samples(ref, devices_env(80.0, slowest=48.0, fastest=80.0), factor=0.6)
    assert v.verdict == "not comparable"
    assert v.reason.startswith("not comparable: the machine ran 40 % slower during this run than the reference's (fp32 "
                               "matmul (this run's slowest device (rank 1) at 0.60x its machine's fastest, read at "
                               "once) 48 vs 80 GFLOP/s per core, this run's pulse)"), v.reason
    assert _samples(ref, paced_env(80.0), factor=0.6).verdict == "regression"   # no devices read: as before
    # devices within the pulse's noise of each other explain nothing
    assert _samples(ref, devices_env(80.0, slowest=76.0, fastest=80.0), factor=0.6).verdict == "regression"


def test_two_sides_that_read_every_device_at_once_are_judged_like_for_like():
    """Both sides read every device at once: their slowest devices' paces are compared, whatever one device alone
    read. A VM whose host ran both vCPUs at 0.55x while both were busy, and either alone at full speed, ran its
    steps at that pace; a run whose devices at once read the reference's pace is judged as the software's."""
    ref = devices_env(101.0, slowest=100.0, fastest=101.0)
    slowed = devices_env(100.0, slowest=55.0, fastest=56.0)
    assert pace(ref, slowed)[:2] == (55.0, 100.0) and "every device at once" in pace(ref, slowed).devices
    v = _samples(ref, slowed, factor=0.55)
    assert v.verdict == "not comparable" and "ran 45 % slower" in v.reason and "every device at once" in v.reason
    assert _samples(ref, devices_env(100.0, slowest=99.0, fastest=101.0), factor=0.55).verdict == "regression"


def test_the_pace_counts_a_slow_device_on_either_side():
    assert matmul_pace(80.0, 80.0, None, None) == (80.0, 80.0, "")
    now, then, words = matmul_pace(80.0, 80.0, None, {"slowest": 40.0, "fastest": 80.0, "rank": 3, "paced": 40.0})
    assert (now, then) == (80.0, 40.0) and words.startswith("the reference's slowest device (rank 3) at 0.50x")
    even = {"slowest": 80.0, "fastest": 80.0, "rank": 0, "paced": 80.0}
    assert matmul_pace(80.0, 80.0, even, None) == (80.0, 80.0, "")


def test_a_machine_counts_its_own_devices_so_that_two_slow_machines_are_not_one_slower():
    """Two machines: a's pulse alone read 60 (the slowest machine's pace, load.pulse_fp32), its devices at once even;
    b's alone read 100, one of its devices at 0.7x its other. The step runs at the slower of a (60) and b's slow
    device (70): 60, not a's 60 times b's 0.7."""
    def node(rank, host, alone, at_once):
        return {**own(rank, host, at_once, at_once), **({"pulse": {"before": alone, "after": alone}} if alone else {})}
    load = load_during([node(0, "a", 60.0, 60.0), node(1, "a", None, 59.0), node(2, "b", 100.0, 100.0),
                        node(3, "b", None, 70.0)])
    assert load["pulse_fp32"] == 60.0
    assert load["pulse_devices"] == {"slowest": 59.0, "fastest": 60.0, "rank": 1, "host": "a", "devices": 4,
                                     "paced": 59.0}
    one = load_during([node(0, "b", 100.0, 100.0), node(1, "b", None, 70.0)])["pulse_devices"]
    assert (one["slowest"], one["fastest"], one["paced"]) == (70.0, 100.0, 70.0)


def _read_at_once(q):
    p = Pulses("cpu")
    p.own_start()
    q.put(p.own_window())


def test_every_rank_reads_its_own_device_at_once_and_never_fails():
    """Two processes read their pulses at once, as the ranks do between two barriers (benchmarks/training/train.py):
    each a real fp32 figure, before and after, in the window's form."""
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_read_at_once, args=(q,)) for _ in range(2)]
    for p in procs:
        p.start()
    windows = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    for w in windows:
        assert w["unit"] == "GFLOP/s" and w["before"] > 0 and w["after"] > 0, w
    load = load_during([{**_window(r, "vm", "k", 1.0, 0.9), "pulse_own": w} for r, w in enumerate(windows)])
    devices = load["pulse_devices"]
    assert devices["devices"] == 2 and 0 < devices["slowest"] <= devices["fastest"]


def test_a_straggler_whose_device_read_slowest_at_once_is_said_so_in_the_nights_line():
    """The nightly names the rank the others waited for; where that rank's own device was the slowest read at once,
    beyond the pulse's noise, its line says so: a GPU (a vCPU) that ran slower, not the software."""
    late = {"rank": 1, "host": "node1", "held_back_pct": 41.0, "next_pct": 2.0, "stands_out": True}

    def night(devices):
        base = {"run_id": "z3-mb2-ga4", "kind": "training", "platform": "cpu", "benchmark": "llama-tiny",
                "status": "ok", "reason": None, "metrics": {"samples_per_s": {"value": 13.4, "unit": "1/s"}},
                "microsteps": []}
        load = {"straggler": late, **({"pulse_devices": devices} if devices else {})}
        return typed([schema_valid({**base, "environment": {"load": load}})])

    slow = {"slowest": 50.0, "fastest": 100.0, "rank": 1, "host": "node1", "devices": 2}
    assert night_stragglers(night(slow)) == [
        "z3-mb2-ga4 (llama-tiny): rank 1 (node1) held the others back 41 % of the profiled steps, its device the "
        "slowest read at once (0.50x the fastest), in 1 of 1 runs"]
    plain = "z3-mb2-ga4 (llama-tiny): rank 1 (node1) held the others back 41 % of the profiled steps, in 1 of 1 runs"
    assert night_stragglers(night({**slow, "slowest": 90.0})) == [plain]       # within the pulse's noise (15 % on cpu)
    assert night_stragglers(night({**slow, "rank": 0})) == [plain]             # another rank's device was the slowest
    assert night_stragglers(night(None)) == [plain]                           # a record from before


def test_what_changed_names_a_device_slower_than_the_rest_on_either_side():
    even, slow = devices_env(80.0, slowest=79.0, fastest=80.0), devices_env(80.0, slowest=48.0, fastest=80.0, rank=5)
    assert environment_diff(even, slow)["load.pulse_devices"] == ["none slower than the noise",
                                                                  "rank 5 (vm) at 0.60x the fastest"]
    assert environment_diff(slow, even)["load.pulse_devices"] == ["rank 5 (vm) at 0.60x the fastest",
                                                                  "none slower than the noise"]
    assert "load.pulse_devices" not in environment_diff(even, devices_env(80.0, slowest=72.0, fastest=80.0))  # noise
    assert "load.pulse_devices" not in environment_diff(paced_env(80.0), slow)     # a reference that read none
