"""Whom a profiled collective waited for (benchmarks/training/arrivals.py): every rank's calls matched one to one,
the first rank's wait for the latest arrival, the rank that came last and how long it held the others back, clocks of
another kernel put on the first rank's; then the record's split of the held-up time (harness/held_up.py) and the
summary's straggler line."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import unit_helpers  # noqa: F401  (puts the repository root on sys.path)

from benchmarks.training.arrivals import annotate, arrivals, call_log, clock_id, into_steps, unmatched
from contract.metrics import METRICS
from harness.held_up import (STRAGGLER_PCT, STRAGGLER_RATIO, comm_held_up_for_peer_pct, comm_held_up_pct, for_peer_s,
                             held_up_s, straggler, straggler_words, stragglers)
from harness.record import ResultRecord
from harness.report.summary import microstep_table
from harness.report.summary import straggler_lines
from harness.verdict.compare import environment_diff


def log(rank, calls, kernel="boot-a", host=None, shift=0.0):
    """calls: [(op, bytes, entry, exit)] on this rank's clock, `shift` ahead of the first rank's."""
    return {"rank": rank, "host": host or f"node{rank}", "clock": kernel,
            "calls": [[op, n, entry + shift, leave + shift] for op, n, entry, leave in calls]}


# two ranks, three calls: rank 1 arrives 40 ms after rank 0 at the first, rank 0 5 ms after rank 1 at the second;
# the third they reach together
RANK0 = [("all_gather", 1000, 0.000, 0.045), ("reduce_scatter", 2000, 0.100, 0.103), ("all_reduce", 4, 0.200, 0.201)]
RANK1 = [("all_gather", 1000, 0.040, 0.045), ("reduce_scatter", 2000, 0.095, 0.103), ("all_reduce", 4, 0.200, 0.201)]


def test_the_first_ranks_wait_for_the_latest_arrival_and_the_rank_that_held_the_others_back():
    found = arrivals([log(0, RANK0), log(1, RANK1)])
    assert found["calls"] == 3
    assert found["peer_wait_s"] == pytest.approx([0.040, 0.0, 0.0])
    r0, r1 = found["ranks"]
    assert (r1["rank"], r1["last_calls"], r1["held_back_s"]) == (1, 1, pytest.approx(0.040))
    assert (r0["rank"], r0["last_calls"], r0["held_back_s"]) == (0, 1, pytest.approx(0.005))   # a tie is nobody's
    assert "clock_offset_s" not in found                                                       # one kernel


def test_a_wait_never_exceeds_the_call_and_three_ranks_credit_only_the_latest_beyond_the_next():
    late = [("all_gather", 8, 0.5, 0.6)]
    found = arrivals([log(0, [("all_gather", 8, 0.0, 0.1)]), log(1, [("all_gather", 8, 0.3, 0.6)]), log(2, late)])
    assert found["peer_wait_s"] == [pytest.approx(0.1)]        # at most the call's own 0.1 s
    assert [r["held_back_s"] for r in found["ranks"]] == [0.0, 0.0, pytest.approx(0.2)]   # 0.5 - 0.3


def test_a_rank_on_another_kernel_is_put_on_the_first_ranks_clock_by_the_median_of_the_exits():
    shifted = log(1, RANK1, kernel="boot-b", shift=1234.5)
    found = arrivals([log(0, RANK0), shifted])
    assert found["peer_wait_s"] == pytest.approx([0.040, 0.0, 0.0])
    assert found["clock_offset_s"] == {"1": pytest.approx(1234.5)}
    # the same clocks read as one kernel's would make rank 1 twenty minutes late
    assert arrivals([log(0, RANK0), log(1, RANK1, shift=1234.5)])["peer_wait_s"][0] == pytest.approx(0.045)


def test_a_time_namespace_is_another_clock_though_the_kernel_is_one():
    """`unshare --time --monotonic` offsets CLOCK_MONOTONIC (time.perf_counter) on the same kernel (one boot_id): a
    rank there must not be taken to share the first rank's clock. Needs root (or user namespaces) and Linux >= 5.6."""
    if not clock_id():
        pytest.skip("no /proc boot_id here")
    probe = ("import time, sys; sys.path.insert(0, '.'); from benchmarks.training.arrivals import clock_id; "
             "print(clock_id()); print(time.perf_counter())")
    there = subprocess.run(["unshare", "--time", "--monotonic", "1234", sys.executable, "-c", probe],
                           capture_output=True, text=True, cwd=unit_helpers.REPO_ROOT)
    if there.returncode != 0:
        pytest.skip(f"no time namespace here: {there.stderr.strip()[-200:]}")
    import time
    theirs, their_clock = there.stdout.split("\n")[:2]
    assert theirs != clock_id() and theirs.split()[0] == clock_id().split()[0]   # one boot, another clock
    assert float(their_clock) - time.perf_counter() == pytest.approx(1234, abs=5.0)


def test_calls_that_do_not_match_are_not_told_apart_and_say_why():
    assert unmatched([log(0, RANK0), log(1, RANK1[:2])]) == "rank 1 issued 2 profiled calls, rank 0 3"
    other = [RANK1[0], ("all_gather", 999, 0.095, 0.103), RANK1[2]]
    assert arrivals([log(0, RANK0), log(1, other)]) == {
        "unmatched": "call 1: rank 0 issued reduce_scatter of 2000 bytes, rank 1 all_gather of 999 bytes"}
    assert arrivals([log(0, RANK0)]) == {"unmatched": "a single rank"}
    steps = [[{"collectives": [{"op": "all_gather"}]}]]
    annotate(steps[0], {"unmatched": "a single rank"})
    assert "peer_wait_s" not in steps[0][0]["collectives"][0]


def test_a_ranks_log_pairs_each_call_with_its_stamps():
    mine = call_log(1, [("all_gather", 8), ("all_reduce", 4), ("all_gather", 8)],
                    [(1.0, 1.5, (0, 1)), (2.0, 2.25, None), (3.0, 3.5, (0, 1))])
    assert mine["rank"] == 1 and mine["host"] and "clock" in mine
    assert mine["calls"] == [["all_gather", 8, 1.0, 1.5, 0], ["all_reduce", 4, 2.0, 2.25, -1],
                             ["all_gather", 8, 3.0, 3.5, 0]]
    assert mine["groups"] == [[0, 1]]


def test_a_call_on_a_process_group_waits_only_for_its_groups_ranks():
    """Four ranks, a ZeRO++/MiCS-like call on the pairs {0, 1} and {2, 3}: rank 3 comes 0.5 s late to its pair's call,
    which rank 0 does not wait for; then an all-reduce over every rank, which it does."""
    def four(rank, entry_pair, entry_all):
        pair = [0, 1] if rank < 2 else [2, 3]
        return {"rank": rank, "host": f"node{rank // 2}", "clock": "boot-a", "groups": [pair],
                "calls": [["all_gather", 8, entry_pair, 0.6 if rank > 1 else 0.1, 0],
                          ["all_reduce", 4, entry_all, 1.2, -1]]}

    found = arrivals([four(0, 0.0, 1.0), four(1, 0.02, 1.0), four(2, 0.0, 1.0), four(3, 0.5, 1.1)])
    assert found["peer_wait_s"] == [pytest.approx(0.02), pytest.approx(0.1)]
    held = {r["rank"]: (r["last_calls"], r["held_back_s"]) for r in found["ranks"]}
    assert held == {0: (0, 0.0), 1: (1, pytest.approx(0.02)), 2: (0, 0.0), 3: (2, pytest.approx(0.6))}


def test_the_findings_of_each_profiled_step_go_to_that_step_by_index():
    steps = [{"index": 0, "mode": "throughput"},
             {"index": 1, "mode": "profile", "microsteps": [{"collectives": [{"op": "all_gather"}]}]},
             {"index": 2, "mode": "profile", "microsteps": [{"collectives": [{"op": "all_gather"}]}]}]
    found = [{"index": 2, "unmatched": "a single rank"},
             {"index": 1, **arrivals([log(0, RANK0[:1]), log(1, RANK1[:1])])}]
    into_steps(steps, found)
    assert "arrivals" not in steps[0]
    assert steps[1]["microsteps"][0]["collectives"][0]["peer_wait_s"] == pytest.approx(0.040)
    assert steps[1]["arrivals"]["calls"] == 1 and "index" not in steps[1]["arrivals"]
    assert "peer_wait_s" not in steps[1]["arrivals"]
    assert steps[2]["arrivals"] == {"unmatched": "a single rank"}
    assert "peer_wait_s" not in steps[2]["microsteps"][0]["collectives"][0]


GATHER_RANK = """
import json, sys, torch.distributed as dist
from benchmarks.training.arrivals import gather
rank, store = int(sys.argv[1]), dist.FileStore(sys.argv[2], 2)
dist.init_process_group("gloo", rank=rank, world_size=2, store=store)
# two profiled steps (indices 5, 6), one all-reduce each; rank 1 comes 0.2 s late to the second step's
late = 0.2 * rank
steps = [(5, [("all_reduce", 4)], [(1.0, 1.1, None)]), (6, [("all_reduce", 4)], [(2.0 + late, 2.3, None)])]
found = gather(rank, 2, steps)
print(json.dumps(found))
dist.destroy_process_group()
"""


def test_every_ranks_stamps_of_every_profiled_step_are_gathered_once_to_the_first_rank(tmp_path):
    """Two real gloo ranks: the gather is one collective after the last profiled step, and the first rank gets
    each step's findings under its index, the lag carried into the second step among them."""
    procs = [subprocess.Popen([sys.executable, "-c", GATHER_RANK, str(r), str(tmp_path / "store")],
                              cwd=unit_helpers.REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    first, second = json.loads(outs[0][0])
    assert json.loads(outs[1][0]) is None
    assert (first["index"], second["index"]) == (5, 6)
    assert first["peer_wait_s"] == [0.0] and second["peer_wait_s"] == [pytest.approx(0.2)]
    assert second["ranks"][1]["held_back_s"] == pytest.approx(0.2) and second["ranks"][1]["last_calls"] == 1


def call(op, nbytes, time_s, peer=None):
    return {"op": op, "bytes": nbytes, "time_s": time_s, "phase": "backward",
            **({} if peer is None else {"peer_wait_s": peer})}


def step(rs_s, rs_peer):
    """Two micro-steps of two gathers (1 ms each) and a reduce-scatter; the last reduce-scatter took rs_s, of which
    rs_peer waiting for the other rank."""
    out = []
    for i in range(2):
        calls = [call("all_gather", 100, 0.001, 0.0), call("all_gather", 100, 0.001, 0.0005),
                 call("reduce_scatter", 200, rs_s if i else 0.002, rs_peer if i else 0.0)]
        comm = sum(c["time_s"] for c in calls)
        out.append({"index": i, "total_s": 0.02 + comm, "compute_s": 0.02, "comm_s": comm, "collectives": calls})
    return out


def test_the_waiting_is_a_later_peers_as_measured_plus_the_hosts_stalls_after_the_last_arrival():
    # every call's peer wait counts; the quartile rule then looks at the rest of each call: the reduce-scatters'
    # rests are 2, 21, 2 and 4 ms, so the 21 ms one (over 3 x 2 ms) stalled 19 ms after both ranks had arrived
    profiled = [step(0.030, 0.009), step(0.024, 0.020)]
    assert for_peer_s(profiled) == [[pytest.approx(0.0005), pytest.approx(0.0095)],
                                    [pytest.approx(0.0005), pytest.approx(0.0205)]]
    assert held_up_s(profiled) == [[pytest.approx(0.0005), pytest.approx(0.0095 + 0.019)],
                                   [pytest.approx(0.0005), pytest.approx(0.0205)]]
    total = 0.036 + 0.030
    assert comm_held_up_for_peer_pct(profiled) == pytest.approx(100 * 0.031 / total)
    assert comm_held_up_pct(profiled) == pytest.approx(100 * (0.031 + 0.019) / total)
    # a straggler late to every micro-step slows every call of a kind alike: the quartile rule alone sees nothing
    late = [step(0.052, 0.050), step(0.052, 0.050)]
    for s in late:
        s[0]["collectives"][2].update(time_s=0.052, peer_wait_s=0.050)
    assert comm_held_up_for_peer_pct(late) > 70 and comm_held_up_pct(late) == comm_held_up_for_peer_pct(late)
    # a call without its wait (a single rank, calls not matched, an older record): not told apart, the rule on
    # the whole call as before
    profiled[1][0]["collectives"][0].pop("peer_wait_s")
    assert for_peer_s(profiled) is None and comm_held_up_for_peer_pct(profiled) is None
    assert held_up_s(profiled) == [[0.0, pytest.approx(0.030 - 0.002)], [0.0, pytest.approx(0.024 - 0.002)]]
    spec = METRICS["comm_held_up_for_peer_pct"]
    assert spec.reference_kind is None and not spec.paced        # information: never judged, never submitted


def came(calls, *ranks):
    return {"mode": "profile", "arrivals": {"calls": calls, "ranks": [
        {"rank": r, "host": f"node{r}", "last_calls": n, "held_back_s": s} for r, n, s in ranks]}}


def test_the_straggler_is_named_over_the_profiled_steps_in_the_summary():
    steps = [{"mode": "throughput"}, came(10, (0, 3, 0.004), (1, 7, 0.30)), came(10, (0, 4, 0.006), (1, 6, 0.25)),
             {"mode": "profile", "arrivals": {"unmatched": "a single rank"}}]
    assert stragglers(steps) == [
        {"rank": 1, "host": "node1", "last_calls": 13, "held_back_s": pytest.approx(0.55), "calls": 20},
        {"rank": 0, "host": "node0", "last_calls": 7, "held_back_s": pytest.approx(0.010), "calls": 20}]
    assert stragglers([{"mode": "profile"}]) == []

    rec = ResultRecord(schema_version="1.0", run_id="00-z3", kind="training", benchmark="llama-tiny", platform="cpu",
                       status="ok", reason=None, config={}, overrides=[], environment={}, metrics={},
                       microsteps=[step(0.014, 0.009)], steps=steps)
    lines = microstep_table(rec).splitlines()
    assert "for a peer ms" in lines[0]
    assert [row.split()[4:6] for row in lines[2:4]] == [["0.5", "0.5"], ["9.5", "9.5"]]
    assert lines[-1].strip() == ("last to reach the profiled calls (20), and how long it held the others back: "
                                 "rank 1 (node1) 65 % of calls, 550.0 ms; rank 0 (node0) 35 % of calls, 10.0 ms")
    md = microstep_table(rec, markdown=True).splitlines()
    assert md[-2] == "" and md[-1].startswith("- last to reach")


def profiled(seconds, *ranks):
    """A profiled step of `seconds`, its ranks (rank, host, held back s)."""
    return {"mode": "profile", "step_time_s": seconds, "arrivals": {"calls": 10, "ranks": [
        {"rank": r, "host": h, "last_calls": 5, "held_back_s": s} for r, h, s in ranks]}}


def test_a_rank_stands_out_as_the_straggler_by_its_share_of_the_profiled_time_and_against_the_next():
    late = straggler([{"mode": "throughput", "step_time_s": 9.0}, profiled(1.0, (0, "node1", 0.02), (1, "node2", 0.45)),
                      profiled(1.0, (0, "node1", 0.03), (1, "node2", 0.50))])
    assert late == {"rank": 1, "host": "node2", "held_back_pct": 47.5, "next_pct": 2.5, "stands_out": True}
    assert straggler_words(late) == "rank 1 (node2) held the others back 48 % of the profiled steps"
    # two ranks late by turns (the quiet default suite: at most 11 %, the next within 8 points) do not stand out
    turns = straggler([profiled(1.0, (0, "vm", 0.10), (1, "vm", 0.04))])
    assert turns["held_back_pct"] == 10.0 and not turns["stands_out"]
    assert straggler_words(turns) == ("none stood out (rank 0 (vm) held the others back 10 % of the profiled steps, "
                                      "the next 4 %)")
    # late by a fifth of the time, but so is the next rank: skew everywhere, no one rank to name
    assert not straggler([profiled(1.0, (0, "a", 0.20), (1, "b", 0.10))])["stands_out"]
    assert straggler([{"mode": "profile", "step_time_s": 1.0, "arrivals": {"unmatched": "a single rank"}}]) is None
    assert STRAGGLER_PCT == 15.0 and STRAGGLER_RATIO == 3.0


def load(found):
    return {"torch": "2.13.0", "env": {}, "suite_commit": "abc", "settings": {},
            "load": {"other_cpus": 0.0, **({"straggler": found} if found else {})},
            "machine": {"cpu": {"model": "AMD EPYC", "logical_cpus": 2, "mem_total_gib": 23.5}}}


def test_what_changed_names_a_straggler_that_came_or_went_or_moved_to_another_rank():
    quiet = {"rank": 0, "host": "node1", "held_back_pct": 5.0, "next_pct": 3.0, "stands_out": False}
    node2 = {"rank": 1, "host": "node2", "held_back_pct": 40.0, "next_pct": 2.0, "stands_out": True}
    came = environment_diff(load(quiet), load(node2))
    assert came == {"load.straggler": [
        "none stood out (rank 0 (node1) held the others back 5 % of the profiled steps, the next 3 %)",
        "rank 1 (node2) held the others back 40 % of the profiled steps"]}
    assert list(environment_diff(load(node2), load(quiet))) == ["load.straggler"]            # it went
    node1 = {**node2, "rank": 0, "host": "node1"}
    assert environment_diff(load(node2), load(node1))["load.straggler"][1].startswith("rank 0 (node1)")
    assert environment_diff(load(node2), load({**node2, "held_back_pct": 30.0})) == {}        # the same straggler
    assert environment_diff(load(quiet), load({**quiet, "held_back_pct": 9.0})) == {}         # none on either side
    assert environment_diff(load(None), load(node2)) == {}    # a reference from before it was measured: nothing said


def test_a_slow_node_whose_ranks_come_late_together_holds_the_others_back_as_a_node():
    """Four ranks on two hosts; both of B's ranks reach each call 0.15 s after A's. Each of them leads the next
    latest, its neighbour, by 1 ms: per rank nothing stands out; per host B held the others back 0.15 s a call."""
    def one(rank, host, entry):
        return {"rank": rank, "host": host, "clock": "k", "calls": [["all_reduce", 4, entry, 0.2]], "groups": []}

    found = arrivals([one(0, "A", 0.0), one(1, "A", 0.001), one(2, "B", 0.150), one(3, "B", 0.151)])
    assert [r["held_back_s"] for r in found["ranks"]] == [0.0, 0.0, 0.0, pytest.approx(0.001)]
    assert found["hosts"] == [{"host": "A", "ranks": [0, 1], "last_calls": 0, "held_back_s": 0.0},
                              {"host": "B", "ranks": [2, 3], "last_calls": 1, "held_back_s": pytest.approx(0.15)}]
    assert "hosts" not in arrivals([log(0, RANK0), log(1, RANK1, host="node0")])    # one host: the ranks say it

    def step(b_lag):
        return {"mode": "profile", "step_time_s": 1.0, "arrivals": {
            "calls": 10, "ranks": [{"rank": r, "host": "AB"[r // 2], "last_calls": 2, "held_back_s": 0.002}
                                   for r in range(4)],
            "hosts": [{"host": "A", "ranks": [0, 1], "last_calls": 1, "held_back_s": 0.01},
                      {"host": "B", "ranks": [2, 3], "last_calls": 9, "held_back_s": b_lag}]}}

    steps = [step(0.40), step(0.50)]
    assert stragglers(steps, "hosts")[0] == {"host": "B", "ranks": [2, 3], "last_calls": 18,
                                             "held_back_s": pytest.approx(0.9), "calls": 20}
    node = straggler(steps)
    assert node == {"host": "B", "ranks": [2, 3], "held_back_pct": 45.0, "next_pct": 1.0, "stands_out": True}
    assert straggler_words(node) == "node B (ranks 2, 3) held the others back 45 % of the profiled steps"
    assert straggler(steps)["stands_out"] and "rank" not in node
    # a node that does not stand out leaves the ranks' figure as it was
    assert straggler([step(0.05)]) == {"rank": 0, "host": "A", "held_back_pct": 0.2, "next_pct": 0.2,
                                       "stands_out": False}
    rec = ResultRecord(schema_version="1.2", run_id="00-z3", kind="training", benchmark="llama-tiny", platform="cpu",
                       status="ok", reason=None, config={}, overrides=[], environment={}, metrics={},
                       microsteps=[], steps=steps)
    assert straggler_lines(rec)[-1].strip() == (
        "the node last to reach the profiled calls (20), and how long it held the others back: node B (ranks 2, 3) "
        "90 % of calls, 900.0 ms; node A (ranks 0, 1) 10 % of calls, 20.0 ms")
    # what changed: the node came, or moved to another host
    quiet = {"rank": 0, "host": "A", "held_back_pct": 5.0, "next_pct": 3.0, "stands_out": False}
    assert environment_diff(load(quiet), load(node))["load.straggler"][1].startswith("node B (ranks 2, 3)")
    assert environment_diff(load(node), load({**node, "held_back_pct": 30.0})) == {}
    assert list(environment_diff(load(node), load({**node, "host": "C"}))) == ["load.straggler"]
