"""A step's time and its rate are one median (harness/training_metrics.py: step_time_s, samples_per_s = samples /
step_time_s), so they read one verdict: a step's time (contract.metrics per_step) is judged as its rate, its change
1 - reference/now (harness/verdict/explained.py worse_pct). Before, a step 1.25-1.33x slower was a regression of its
time and a pass of its samples/s at a 25 % tolerance: 3 of the 7 step_time_s regressions of 13 default-cpu benches
on the Zen 5 EPYC (2026-12-06, tests/perf/confirm_spells.py) had no samples_per_s regression beside them."""
from __future__ import annotations

import unit_helpers  # noqa: F401  (puts the repository root on sys.path)

from harness.report.verdicts import change_text, interval_text, tolerance_text
from harness.verdict.compare import Verdict, decide
from harness.verdict.explained import worse_pct
from harness.verdict.references import Provenance, Reference

PROV = Provenance("suite", "me", "2026-12-06", "cpu box", {})
SAMPLES, TIME = 48.27, 0.3315                       # 16 samples a step: samples/s = 16 / step time


def ref(metric: str, value: float, direction: str, tolerance: float) -> Reference:
    return Reference("cpu", "llama-tiny", {}, metric, value, "x", direction, tolerance, "ok",
                     (value * 0.99, value, value * 1.01), PROV)


def test_a_step_time_and_its_samples_per_s_read_one_verdict_at_every_slowdown():
    for tolerance in (10.0, 25.0):
        for k in [0.60 + 0.005 * i for i in range(200)]:          # 0.6x to 1.6x the reference's step time
            steps = [TIME * k * f for f in (0.995, 1.0, 1.004)]
            rate = decide([SAMPLES * TIME / s for s in steps], ref("samples_per_s", SAMPLES, "higher", tolerance))
            time = decide(steps, ref("step_time_s", TIME, "lower", tolerance))
            assert time[0] == rate[0], (tolerance, k, time, rate)
            assert abs(time[2]["worse_pct"] - rate[2]["worse_pct"]) < 1e-9


def test_the_slowdown_that_read_two_verdicts_reads_one():
    """spells-2 of 2026-12-06: ZeRO-3 mb 2 x ga 4's step 0.794 s against 0.606 (1.31x): samples/s 0.76x, a pass
    at 25 %; its time was +31 %, a regression, and is now -23.7 % of its rate, a pass like it."""
    assert round(worse_pct(0.794, 0.606, "lower", "step_time_s"), 1) == 23.7
    assert round(worse_pct(0.794, 0.606, "lower"), 1) == 31.0                 # a time of another kind: its own
    assert round(worse_pct(16 / 0.794, 16 / 0.606, "higher", "samples_per_s"), 1) == 23.7
    assert worse_pct(1.1, 1.0, "lower", "peak_mem_gib") == worse_pct(1.1, 1.0, "lower")   # memory as ever


def test_a_step_time_reads_in_the_tables_as_its_rate():
    now = decide([0.437, 0.44, 0.435], ref("step_time_s", 0.331, "lower", 25.0))
    v = Verdict("cpu", "llama-tiny", {}, "step_time_s", now[0], now[1], unit="s", value=now[2]["value"],
                reference=0.331, worse_pct=now[2]["worse_pct"], interval_pct=now[2]["interval_pct"], tolerance_pct=25.0)
    assert now[0] == "pass"                                              # samples/s 0.757x: within 0.75x
    assert change_text(v) == "0.76x (1.32x slower)"                       # ref/now, as before
    assert tolerance_text(v) == "[0.75x, 1.25x]"                          # its rate's band (a time's was [0.80x, 1.33x])
    assert interval_text(v).startswith("[0.7")
