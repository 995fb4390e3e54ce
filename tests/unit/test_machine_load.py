"""The machine's load in every record (issue 16 item 1): what the ranks read over the measured
steps, how the harness turns it into other work per kernel, and what a comparison names as changed:
hardware, load, settings outside the configuration key, the suite's own commit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from benchmarks.node.machine import LoadWindow, busy_cpu_s, run_delay_s, steal_cpu_s
from harness.verdict.compare import commits_between, environment_diff
from harness.config.schema import REPO_ROOT
from harness.nodes import load_during
from harness.report.verdicts import environment_text, load_line
from unit_helpers import typed

STAT = "cpu  100 5 50 1000 20 3 2 40 7 0\ncpu0 50 2 25 500 10 1 1 20 0 0\n"


def test_busy_time_is_everything_but_idle_iowait_and_steal_with_guest_counted_once():
    # user 100 + nice 5 + system 50 + irq 3 + softirq 2 (guest 7 is inside user) = 160 ticks; steal 40 is
    # the hypervisor running another guest: no work of this machine's, counted apart
    tick = os.sysconf("SC_CLK_TCK")
    assert busy_cpu_s(STAT) == pytest.approx(160 / tick)
    assert steal_cpu_s(STAT) == pytest.approx(40 / tick)
    assert steal_cpu_s("cpu  100 5 50 1000 20 3 2\n") == 0.0, "a kernel without the steal column: none"
    assert busy_cpu_s("garbage") is None and steal_cpu_s("garbage") is None


def test_a_window_measures_this_process_and_the_machine():
    window = LoadWindow()
    cpu0, wall0 = time.process_time(), time.monotonic()
    end = wall0 + 0.4
    while time.monotonic() < end:   # one CPU busy in this process, as much as the scheduler gives it
        pass
    own = (time.process_time() - cpu0) / (time.monotonic() - wall0)
    w = window.close()
    assert w["wall_s"] >= 0.4 and w["boot_id"]
    # what this process used, as the process itself counts it: whatever else the box is running
    assert abs(w["own_cpus"] - own) <= 0.1 and w["own_cpus"] <= 1.05, (w, own)
    assert w["busy_cpus"] >= w["own_cpus"] - 0.1, "the machine is at least as busy as this process"
    assert 0.0 <= w["steal_cpus"] <= 2 * (os.cpu_count() or 1)
    assert len(w["load_avg_1_5_15"]) == 3


SPIN = "import time\nend = time.monotonic() + 3\nwhile time.monotonic() < end:\n    pass\n"


@pytest.mark.skipif(run_delay_s() is None, reason="this kernel keeps no schedstat")
def test_a_window_counts_the_time_this_process_waited_for_a_cpu_another_task_held():
    """Pinned to one CPU beside a spinner pinned there too, this process is ready to run about half the time
    the other holds the CPU: its wait_cpus (run-queue delay over the window) is that half. Sleeping (as a rank
    waiting on the network does) is no wait."""
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        window = LoadWindow()
        time.sleep(0.3)
        asleep = window.close()
        spinner = subprocess.Popen([sys.executable, "-c", SPIN])
        try:
            time.sleep(0.2)   # the spinner starts (it inherits this one CPU)
            window, end = LoadWindow(), time.monotonic() + 1.0
            while time.monotonic() < end:
                pass
            shared = window.close()
        finally:
            spinner.kill()
            spinner.wait()
    finally:
        os.sched_setaffinity(0, before)
    assert asleep["wait_cpus"] is not None and asleep["wait_cpus"] < 0.05, asleep
    # CFS gives two runnable tasks on one CPU half of it each: about 0.5 CPUs of waiting, whatever else runs
    assert 0.25 <= shared["wait_cpus"] <= 0.8 and shared["own_cpus"] <= 0.75, shared


def _window(rank, host, boot, busy, own, steal=None):
    return {"rank": rank, "host": host, "boot_id": boot, "wall_s": 10.0, "busy_cpus": busy, "own_cpus": own,
            "load_avg_1_5_15": [1.5 + rank, 1.0, 0.5], **({} if steal is None else {"steal_cpus": steal})}


def test_the_ranks_waits_on_one_kernel_add_up_and_a_rank_without_one_leaves_none():
    waits = [{**_window(0, "node1", "k", 1.7, 0.45), "wait_cpus": 0.3}, {**_window(1, "node2", "k", 1.7, 0.45), "wait_cpus": 0.25}]
    assert load_during(waits)["wait_cpus"] == 0.55
    assert load_during([waits[0], _window(1, "node2", "k", 1.7, 0.45)])["wait_cpus"] is None


def test_other_work_is_the_machine_busy_time_less_every_rank_on_the_same_kernel():
    one = load_during([_window(0, "vm", "k", 2.0, 0.9), _window(1, "vm", "k", 2.0, 0.8)], [0.1, 0.2, 0.3])
    assert one == {"window_s": 10.0, "busy_cpus": 2.0, "run_cpus": 1.7, "other_cpus": 0.3, "steal_cpus": None,
                   "wait_cpus": None, "load_avg_before": [0.1, 0.2, 0.3], "load_avg_after": [1.5, 1.0, 0.5], "kernels": 1,
                   "hosts": ["vm"], "pulse_fp32": None, "pulse_triad": None}
    # the emulated cluster: two hosts, one kernel: each node's ranks are not the other's "other work"
    shared = load_during([_window(0, "node1", "k", 1.9, 0.95), _window(1, "node2", "k", 1.9, 0.95)])
    assert shared["other_cpus"] == 0.0 and shared["kernels"] == 1 and shared["hosts"] == ["node1", "node2"]
    # two real machines: the busier one is kept
    apart = load_during([_window(0, "a", "k1", 1.0, 0.9), _window(1, "b", "k2", 3.0, 0.9)])
    assert apart["other_cpus"] == 2.1 and apart["kernels"] == 2
    assert load_during([]) is None


def test_a_hypervisors_steal_is_kept_apart_from_other_work_and_picks_the_busiest_kernel():
    """A 2-core VM whose hypervisor took 30-45 % of it read a 1 Gbit/s link's all_reduce up to 17 % low
    (tests/integration/test_cpu_cluster.py); its busy time had counted that steal as other work."""
    vm = load_during([_window(0, "vm", "k", 1.0, 0.8, steal=0.7), _window(1, "vm", "k", 1.0, 0.1, steal=0.5)])
    assert (vm["other_cpus"], vm["steal_cpus"]) == (0.1, 0.6)
    # two machines: b has less other work but its hypervisor took more: b is the busier
    both = load_during([_window(0, "a", "k1", 1.5, 0.9, steal=0.0), _window(1, "b", "k2", 1.2, 0.9, steal=0.9)])
    assert (both["other_cpus"], both["steal_cpus"]) == (0.3, 0.9)


def test_the_run_keeps_its_slowest_node_pace_the_better_of_its_pulses_before_and_after():
    def paced(rank, host, before, after):
        return {**_window(rank, host, host, 1.0, 0.9), "pulse": {"before": before, "after": after, "unit": "GFLOP/s"}}
    both = load_during([paced(0, "a", 80.0, 60.0), _window(1, "a", "a", 1.0, 0.9), paced(2, "b", 90.0, 90.0)])
    assert both["pulse_fp32"] == 80.0          # node a's better pulse (b's is 90); rank 1 read none (not first on its node)
    slow = load_during([paced(0, "a", 50.0, 60.0), paced(1, "b", 90.0, 90.0)])
    assert slow["pulse_fp32"] == 60.0          # slow at both ends: the run's pace is the slowest node's
    one_failed = load_during([paced(0, "a", None, 50.0)])
    assert one_failed["pulse_fp32"] == 50.0
    assert load_during([paced(0, "a", None, None)])["pulse_fp32"] is None


def test_the_run_keeps_its_slowest_node_memory_pace_the_same_way():
    def paced(rank, host, before, after):
        return {**_window(rank, host, host, 1.0, 0.9),
                "pulse": {"before": 80.0, "after": 80.0, "unit": "GFLOP/s",
                          "triad": {"before": before, "after": after, "unit": "GB/s"}}}
    load = load_during([paced(0, "a", 20.0, 35.0), paced(1, "b", 30.0, None)])
    assert (load["pulse_fp32"], load["pulse_triad"]) == (80.0, 30.0)   # a's better is 35, b's only 30
    old = load_during([{**_window(0, "a", "a", 1.0, 0.9), "pulse": {"before": 80.0, "after": 70.0}}])
    assert (old["pulse_fp32"], old["pulse_triad"]) == (80.0, None)     # a record from before the memory pulse
    assert "pulse_exchange_us" not in old                              # and the exchange pulse


def test_the_run_keeps_its_slowest_node_exchange_latency_the_slower_of_its_two_pulses():
    def paced(rank, host, before, after):
        return {**_window(rank, host, host, 1.0, 0.9),
                "pulse": {"before": 80.0, "after": 80.0, "unit": "GFLOP/s",
                          "exchange": {"before": before, "after": after, "unit": "us"}}}
    # a spell at either end counts: a's slower is 56, b's only pulse 52 (its other failed); the slowest node's is a's
    assert load_during([paced(0, "a", 41.0, 56.0), paced(1, "b", None, 52.0)])["pulse_exchange_us"] == 56.0
    assert "pulse_exchange_us" not in load_during([paced(0, "a", None, None)])


def env(load=None, settings=None, commit="abc", cpus=2):
    return {"torch": "2.13.0", "env": {}, "suite_commit": commit, "load": load, "settings": settings or {},
            "machine": {"cpu": {"model": "AMD EPYC", "logical_cpus": cpus, "mem_total_gib": 23.5}}}


def test_what_changed_names_material_other_work_and_ignores_small_differences():
    quiet, busy = {"other_cpus": 0.05}, {"other_cpus": 1.1}
    assert environment_diff(env(quiet), env(busy)) == {"load.other_cpus": [0.05, 1.1]}
    assert environment_diff(env(quiet), env({"other_cpus": 0.4})) == {}
    assert environment_diff(env(quiet, cpus=16), env(busy, cpus=16)) == {}, "1 CPU of 16 is no material change"
    assert environment_diff(env(None), env(busy)) == {}, "a reference from before load was read: nothing concluded"
    stolen = {"other_cpus": 0.05, "steal_cpus": 0.8}
    assert environment_diff(env({**quiet, "steal_cpus": 0.0}), env(stolen)) == {"load.steal_cpus": [0.0, 0.8]}
    assert environment_diff(env(quiet), env(stolen)) == {}, "a reference from before steal was read: nothing concluded"


def test_what_changed_names_settings_outside_the_configuration_key():
    ref = env(settings={"measure.inject_delay_s": 0.0, "measure.steps": 5})
    now = env(settings={"measure.inject_delay_s": 0.4, "measure.steps": 5})
    assert environment_diff(ref, now) == {"measure.inject_delay_s": [0.0, 0.4]}
    assert environment_diff(env(), now) == {}, "a setting one side did not record is not a change"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.strip()


def test_the_suite_commit_is_named_with_the_commits_between_when_the_checkout_has_them():
    try:
        head, older = _git("rev-parse", "HEAD"), _git("rev-parse", "HEAD~3")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout with 4 commits")
    assert commits_between(older, head) == 3
    diff = environment_diff(env(commit=older), env(commit=head + "-dirty"))
    assert diff == {"suite_commit": [older, head + "-dirty"], "suite_commit.commits_between": 3}
    assert environment_text(diff) == f"suite_commit: {older[:10]} -> {head[:10]} (3 commits between)"
    unknown = environment_diff(env(commit="0" * 40), env(commit=head))
    assert unknown == {"suite_commit": ["0" * 40, head]}, "a commit this checkout lacks: no count"
    assert environment_diff(env(commit=head), env(commit=head)) == {}


def test_the_bench_says_where_it_ran_and_how_busy_the_machine_was():
    recs = [{"environment": {**env({"other_cpus": x}), "hosts": ["vm"]}} for x in (0.1, 0.05, 1.3)]
    assert load_line(typed(recs)) == ("ran on AMD EPYC (2 CPUs) (host vm); other work during the measured steps: "
                               "0.05-1.30 CPUs (median 0.10) over 3 record(s)")
    assert load_line(typed([{"environment": {}}])) == "ran on an unrecorded machine"
    probed = json.loads((REPO_ROOT / "reference_results" / "sources" / "cpu-avx512-epyc" / "2026-12-03" / "s1"
                         / "01-z1-mb2-ga4.json").read_text(encoding="utf-8"))["environment"]
    assert load_line(typed([{"environment": probed}])).startswith(   # named as its references are (machine_name)
        "ran on AMD EPYC (2 CPUs, AVX512 +avx512_bf16) (host vm)")
    stolen = [{"environment": {**env({"other_cpus": 0.1, "steal_cpus": x}), "hosts": ["vm"]}} for x in (0.3, 0.8)]
    assert load_line(typed(stolen)).endswith("0.10 CPUs (median 0.10) over 2 record(s); the hypervisor took (steal) "
                                             "0.30-0.80 CPUs")
    bare = [{"environment": {**env({"other_cpus": 0.1, "steal_cpus": 0.0}), "hosts": ["vm"]}}]
    assert "steal" not in load_line(typed(bare)), "bare metal, or a hypervisor that took nothing: not named"


def test_what_changed_names_the_hosts_exchange_latency_when_it_moved_by_a_spells_share():
    from harness.verdict.changes import EXCHANGE_MOVED

    calm, spell = {"other_cpus": 0.0, "pulse_exchange_us": 41.7}, {"other_cpus": 0.0, "pulse_exchange_us": 52.7}
    assert EXCHANGE_MOVED == 1.15
    assert environment_diff(env(calm), env(spell)) == {"load.pulse_exchange_us": [41.7, 52.7]}
    assert environment_diff(env(spell), env(calm)) == {"load.pulse_exchange_us": [52.7, 41.7]}   # either way
    assert environment_diff(env(calm), env({**calm, "pulse_exchange_us": 46.0})) == {}          # 1.10x: no spell
    assert environment_diff(env({"other_cpus": 0.0}), env(spell)) == {}, "a reference from before: nothing said"
