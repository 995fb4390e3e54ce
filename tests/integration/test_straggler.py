"""A straggler named: one rank of two sleeps 0.15 s at the end of each micro-step (measure.inject_delay_rank), so
the other reaches the next micro-step's first collective that long before it. The record must say that the first
rank's calls waited for a peer (comm_held_up_for_peer_pct, each call's peer_wait_s), and name the late rank with how
long it held the others back (benchmarks/training/arrivals.py, harness/held_up.py stragglers); a comparison with
the same run without the straggler names it among what changed (load.straggler)."""
from __future__ import annotations

import pytest

import subprocess
import sys

from harness.held_up import for_peer_s, held_up_s, straggler_words, stragglers, who
from harness.record import validate_record
from harness.verdict.history import History

from .conftest import REPO, run_bench

pytestmark = pytest.mark.integration

DELAY_S = 0.15
GA = 4


RUN = ("suite=single", "workload=llama-tiny", "zero=stage3", "workload.micro_batch_size=2",
       f"workload.grad_acc_steps={GA}", "measure.warmup_steps=1", "measure.steps=1", "measure.profile_steps=2")


def test_the_rank_that_came_late_is_named_and_the_others_wait_is_counted_as_for_a_peer(tmp_path):
    quiet = run_bench(tmp_path / "quiet", *RUN, timeout=600)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    run = run_bench(tmp_path / "out", *RUN, f"measure.inject_delay_s={DELAY_S}", "measure.inject_delay_rank=1",
                    timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (rec,) = run.records().values()
    assert rec["status"] == "ok" and not validate_record(rec)
    assert rec["environment"]["settings"]["measure.inject_delay_rank"] == 1

    # every micro-step of each profiled step begins with rank 0 waiting DELAY_S for rank 1 (its sleep at the end of
    # the micro-step before): the first micro-step of the second profiled step too, the ranks' stamps being gathered
    # once after the last profiled step, not between the two (a barrier there hid that wait)
    for waits, peer in zip(held_up_s(rec["microsteps"]), for_peer_s(rec["microsteps"])):
        for i in range(GA):
            assert peer[i] >= 0.7 * DELAY_S, (i, peer)
            assert peer[i] <= waits[i] + 1e-9
    assert rec["metrics"]["comm_held_up_for_peer_pct"]["value"] >= 50

    late, other = stragglers(rec["steps"])
    assert late["rank"] == 1 and other["rank"] == 0
    assert late["held_back_s"] >= 0.7 * DELAY_S * GA * 2 > 3 * other["held_back_s"]  # rank 0: 2-76 ms
    assert "last to reach the profiled calls" in run.stdout and "rank 1 (" in run.stdout
    assert "rank 1's micro-step is slowed on purpose" in run.stderr + run.stdout

    assert rec["environment"]["load"]["straggler"] == {
        "rank": 1, "host": late["host"], "held_back_pct": rec["environment"]["load"]["straggler"]["held_back_pct"],
        "next_pct": rec["environment"]["load"]["straggler"]["next_pct"], "stands_out": True}
    (before,) = quiet.records().values()
    was = before["environment"]["load"]["straggler"]
    compared = subprocess.run([sys.executable, "-m", "harness", "compare", str(run.out), "--against", str(quiet.out)],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
    said = " ".join(compared.stdout.split())
    # The quiet run's latest rank is the box's: 0-5 % of the profiled steps on the 2-core Zen 5, up to 17 % on the
    # 2-core AVX2 EPYC, where 2 of 12 quiet records stood out (docs/status.md, "Stragglers"). The comparison names
    # the change from whatever the quiet run read; the same rank standing out on both sides is no change.
    if was["stands_out"] and who(was) == who(rec["environment"]["load"]["straggler"]):
        assert "load.straggler" not in said, compared.stdout[-3000:]
    else:
        assert f"load.straggler: {straggler_words(was)} -> rank 1 ({late['host']}) held the others back" in said, \
            compared.stdout[-3000:]


def test_a_night_names_its_straggler_and_fails_on_it_when_asked(tmp_path):
    """No reference and no earlier night: every verdict is 'new', so only the straggler can fail the night."""
    night = subprocess.run([sys.executable, "-m", "harness", "nightly", "--night", "2026-12-06", "--repeats", "1",
                            "--store", f"sqlite:///{tmp_path / 'history.sqlite'}", "--reference", "none",
                            "--fail-on", "regression,straggler", f"out={tmp_path / 'night'}", *RUN,
                            f"measure.inject_delay_s={DELAY_S}", "measure.inject_delay_rank=1"],
                           cwd=REPO, capture_output=True, text=True, timeout=900)
    assert night.returncode == 1, night.stdout[-3000:] + night.stderr[-3000:]
    said = " ".join(night.stdout.split())
    assert "straggler: " in said and "(llama-tiny): rank 1 (" in said and "in 1 of 1 runs" in said, said[-3000:]
    assert "regression (" not in said and '"new"' in said   # the straggler alone failed it
    markdown = (tmp_path / "night" / "nightly.md").read_text()
    assert "## Stragglers\n\n- " in markdown and "rank 1 (" in markdown


NIGHTLY_RUN = ("suite=single", "workload=llama-tiny", "zero=stage1", "workload.micro_batch_size=4",
               "measure.warmup_steps=1", "measure.steps=3", "measure.profile_steps=1")   # the cpu nightly's ZeRO-1 run


def test_a_rank_that_lags_more_each_night_is_named_with_its_rise(tmp_path):
    """Three nights of the cpu nightly's ZeRO-1 run, one run a night: a quiet one, then rank 1 sleeping the quiet
    night's micro-step after each micro-step, then four of them. A quiet run's latest rank is not the same share on
    every box, nor on one box from run to run (one profiled step of two micro-steps): 0-5 % of the profiled steps on
    the 2-core Zen 5 box; on the 2-core AVX2 EPYC (a 0.36-0.41 s micro-step) rank 1 read 0-16 %, or rank 0 17-26 %,
    and a fixed 0.015 s there read 0-7 %, below its quiet night: no rise was named. A sleep of f micro-steps adds
    about 100 f / (1 + f) points (the others wait f of each 1 + f micro-steps): some 50 and 80 points, each night far
    above the last's spread (AVX2, 2026-12-07: f = 1 read 40, 56, 50 %, f = 4 79, 85, 84 %; f = 0.25 read 19 and
    29 %, too close to a quiet 26 %; fixed sleeps of 0, 0.04, 0.08, 0.16 s: 11, 13, 25, 40 %).
    The third night names the rise (harness/straggler_trend.py), whether that night's own straggler stands out or not
    (a trend below it: tests/unit/test_straggler_trend.py, tests/perf/straggler_nights.py), and --fail-on straggler
    fails on it."""
    store = f"sqlite:///{tmp_path / 'history.sqlite'}"
    micro_s = None
    for day, fraction in (("01", 0.0), ("02", 1.0), ("03", 4.0)):
        delay = round(fraction * micro_s, 4) if fraction else 0.0
        night = subprocess.run([sys.executable, "-m", "harness", "nightly", "--night", f"2026-11-{day}",
                                "--repeats", "1", "--store", store, "--reference", "none",
                                "--fail-on", "regression,straggler", f"out={tmp_path / day}", *NIGHTLY_RUN,
                                f"measure.inject_delay_s={delay}", "measure.inject_delay_rank=1"],
                               cwd=REPO, capture_output=True, text=True, timeout=900)
        said = " ".join(night.stdout.split())
        assert "Traceback" not in night.stderr, night.stderr[-3000:]
        if micro_s is None:
            (_, quiet), = History(store).records("cpu", ["2026-11-01"])
            micro_s = quiet.metrics["step_time_s"]["value"] / len(quiet.microsteps[0])
        print(f"night {day}: rank 1 slept {delay} s a micro-step (the quiet one: {micro_s:.3f} s);",
              *(line.strip() for line in night.stdout.splitlines() if "straggler" in line))
    assert night.returncode == 1, said[-3000:] + night.stderr[-3000:]
    assert "rank 1 (" in said and "held the others back more each night: " in said, said[-3000:]
    assert "(nights 2026-11-01, 2026-11-02, 2026-11-03; the median of each night's repeats)" in said
    markdown = (tmp_path / "03" / "nightly.md").read_text()
    assert "## Stragglers\n\n- " in markdown and "more each night" in markdown
    assert "held the others back, per rank (node), over the nights" in (tmp_path / "03" / "nightly.html").read_text()
