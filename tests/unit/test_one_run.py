"""Whether one run would do on a machine (harness/verdict/one_run.py): the rate of benches and nights whose first run
read a regression that did not repeat, its one-sided 95 % upper bound against the share a team accepts, and the
advice in words naming the knob that runs once. The bound is checked against scipy's beta quantile (Clopper-Pearson's
exact form), which the harness does not import for it."""
from __future__ import annotations

import math

import pytest
from scipy.stats import beta

from harness.errors import HarnessError
from harness.verdict.one_run import FALSE_ALARM, advise, binomial_cdf, check_target, needed, upper_bound


def nights(n: int, false_alarms: int = 0, source: str = "nightly", confirmed: int = 0):
    """(units, sources) of n benches or nights, the first `false_alarms` with a first reading that did not repeat,
    the next `confirmed` with one the reruns confirmed."""
    units = {f"/r/{i}": ({FALSE_ALARM} if i < false_alarms else {"confirmed"} if i < false_alarms + confirmed
                         else set()) for i in range(n)}
    return units, {u: source for u in units}


@pytest.mark.parametrize("k,n", [(0, 1), (0, 14), (0, 59), (1, 30), (3, 14), (5, 10), (2, 500), (40, 4000)])
def test_the_bound_is_clopper_pearsons(k, n):
    assert upper_bound(k, n) == pytest.approx(beta.ppf(0.95, k + 1, n - k), abs=1e-9)


def test_the_binomial_sum_holds_at_its_edges():
    assert binomial_cdf(0, 10, 0.0) == 1.0 and binomial_cdf(9, 10, 1.0) == 0.0 and binomial_cdf(10, 10, 1.0) == 1.0
    assert binomial_cdf(0, 3, 0.5) == pytest.approx(0.125) and binomial_cdf(3, 3, 0.3) == pytest.approx(1.0)
    assert binomial_cdf(2000, 4000, 0.5) == pytest.approx(0.5 + 0.5 / math.sqrt(math.pi * 2000), abs=1e-5)
    assert upper_bound(0, 0) == 1.0 and upper_bound(4, 4) == 1.0


def test_how_many_quiet_nights_settle_it():
    assert needed(0, 14, 0.05) == 59                          # the rule of three's 3/n, exactly: 1 - 0.05**(1/59) < 5 %
    assert upper_bound(0, 58) > 0.05 >= upper_bound(0, 59)
    assert needed(0, 80, 0.05) == 80                          # already within
    more = needed(1, 30, 0.05)
    assert upper_bound(1, more) <= 0.05 < upper_bound(1, more - 1)
    strict = needed(5, 10, 0.01)
    assert strict > 10 and upper_bound(5, strict) <= 0.01 < upper_bound(5, strict - 1)


def test_a_quiet_machine_of_few_nights_is_not_yet_known_and_says_how_many_more():
    a = advise(*nights(14))
    assert (a.verdict, a.units, a.with_false_alarm, a.needed) == ("not yet known", 14, 0, 59)
    assert a.bound_pct == pytest.approx(19.26, abs=0.01)
    assert a.text == ("Not yet known whether one run would do on this machine: a first run read a regression that did "
                      "not repeat in 0 of its 14 nights (0.0 %; 95 % upper bound 19.3 %; aimed at: at most 5 %, "
                      "--false-alarms); 45 more nights without one (59 in all) would bound it within 5 %.")


def test_enough_quiet_benches_say_one_run_would_do_and_name_the_knob():
    a = advise(*nights(60, source="bench", confirmed=7))      # confirmed regressions are no false alarms
    assert a.verdict == "one run would do" and a.needed is None
    assert "0 of its 60 benches" in a.text and "a bench's confirm_regressions=0 would raise" in a.text
    assert "--repeats" not in a.text
    units, sources = nights(60)
    assert "the nightly's --repeats 1 would raise" in advise(units, sources).text
    # a looser aim settles it sooner; a stricter one does not
    assert advise(*nights(14), target_pct=20).verdict == "one run would do"
    assert advise(*nights(60), target_pct=1).verdict == "not yet known"


def test_a_machine_whose_first_runs_raise_false_alarms_keeps_its_reruns():
    units, sources = nights(14, false_alarms=3)
    sources.update({u: "bench" for u in list(units)[:5]})
    a = advise(units, sources)
    assert (a.verdict, a.with_false_alarm) == ("keep the reruns", 3)
    assert "3 of its 14 benches and nights (21.4 %;" in a.text and "about once in 5" in a.text


def test_a_rate_within_the_aim_but_not_yet_bounded_is_not_yet_known():
    a = advise(*nights(30, false_alarms=1))
    assert a.verdict == "not yet known" and a.needed == needed(1, 30, 0.05)
    assert f"{a.needed - 30} more nights without one ({a.needed} in all)" in a.text


@pytest.mark.parametrize("pct", [0, 100, -5, 250, float("nan")])
def test_an_aim_that_is_no_share_is_refused(pct):
    with pytest.raises(HarnessError, match="is not a share a team can aim at"):
        check_target(pct)
    assert check_target(5) == 5
