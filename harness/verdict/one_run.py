"""Would one run do on this machine? The advice under each machine of `python -m harness alarms`, from its store.

Why. A bench that runs its regressions again (confirm_regressions) and a nightly of three repeats pay for reruns so
that a spell of the host is not read as a regression. Whether a machine needs them is a rate: of the benches and
nights that kept what their first run read (harness/verdict/alarms.py), how many would have raised a false alarm
(a regression the first run read and the reruns did not repeat) had they run once. A few quiet nights say little:
0 false alarms in 14 nights still allows 19 % of nights to raise one. So the advice reads the rate's one-sided 95 %
upper bound (Clopper-Pearson) against the share of benches or nights with a false alarm a team accepts (--false-alarms,
5 % by default: one in twenty), and says one of three things: one run would do (the bound is within it), keep the
reruns (the rate read is beyond it), or not yet known, with how many more benches or nights without a false alarm
would settle it.

What it cannot say: whether one run would miss a regression that all the repeats read (a first run that read a pass
is not kept); the reruns' verdicts are the rate's judge, and a machine whose spells last a whole bench reads them
as confirmed.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Optional

from ..errors import HarnessError

CONFIDENCE = 0.95
TARGET_PCT = 5.0
"""The share of benches or nights with a false alarm a team accepts from one run, by default (one in twenty)."""
FALSE_ALARM = "not repeated"


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) of k or fewer in n, each with probability p (in log space: n may be thousands)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    lp, lq = math.log(p), math.log1p(-p)
    return min(1.0, sum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp
                                 + (n - i) * lq) for i in range(0, min(k, n) + 1)))


def upper_bound(k: int, n: int, confidence: float = CONFIDENCE) -> float:
    """The one-sided Clopper-Pearson upper bound of a rate read as k in n (0 to 1; 1 for n = 0)."""
    if n <= 0 or k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(64):
        mid = (lo + hi) / 2
        if binomial_cdf(k, n, mid) > 1.0 - confidence:
            lo = mid
        else:
            hi = mid
    return hi


def needed(k: int, n: int, target: float) -> Optional[int]:
    """The fewest benches or nights (n or more) in which k false alarms bound the rate within target; None when no
    count would within 10^7."""
    if upper_bound(k, n) <= target:
        return n
    lo, hi = n, max(n + 1, k + 1)
    while upper_bound(k, hi) > target:
        lo, hi = hi, hi * 2
        if hi > 10 ** 7:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if upper_bound(k, mid) <= target else (mid, hi)
    return hi


@dataclass
class Advice:
    """One machine's and platform's: of `units` benches and nights, `with_false_alarm` would have raised one."""
    units: int
    with_false_alarm: int
    bound_pct: float
    target_pct: float
    verdict: str
    """'one run would do', 'keep the reruns' or 'not yet known'"""
    needed: Optional[int]
    """how many benches or nights without another false alarm would settle it ('not yet known' only)"""
    text: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def over_nights(self) -> str:
        """The count over a machine's nights, as the nightly's first-repeat line and the overview say it."""
        return (f"{self.with_false_alarm} of this machine's {self.units} night(s) so kept with a false alarm "
                f"(95 % bound {self.bound_pct:.0f} %): {self.verdict}")


def _units(sources: dict[str, str]) -> str:
    kinds = set(sources.values())
    return {frozenset({"bench"}): "benches", frozenset({"nightly"}): "nights"}.get(frozenset(kinds),
                                                                                     "benches and nights")


def advise(units: dict[str, set[str]], sources: dict[str, str], target_pct: float = TARGET_PCT) -> Advice:
    """units: {bench or night folder: the outcomes its first run's regressions had}; sources: {folder: 'bench' or
    'nightly'}. The advice, in a sentence naming the knob that runs once (a bench's confirm_regressions=0, the
    nightly's --repeats 1)."""
    n = len(units)
    k = sum(1 for outcomes in units.values() if FALSE_ALARM in outcomes)
    bound, target = upper_bound(k, n), target_pct / 100.0
    kinds = set(sources.values())
    knob = " and ".join(x for x, kind in (("a bench's confirm_regressions=0", "bench"),
                                          ("the nightly's --repeats 1", "nightly")) if kind in kinds)
    read = (f"a first run read a regression that did not repeat in {k} of its {n} {_units(sources)} "
            f"({100 * k / n:.1f} %; 95 % upper bound {100 * bound:.1f} %; aimed at: at most {target_pct:g} %, "
            "--false-alarms)" if n else "no bench or night of it kept what its first run read")
    more = None
    if n and bound <= target:
        verdict = "one run would do"
        text = f"One run would do on this machine: {read}; {knob} would raise no more false alarms than that."
    elif n and k / n > target:
        verdict = "keep the reruns"
        text = (f"Keep the reruns on this machine: {read}; one run would raise a false alarm about once in "
                f"{n / k:.0f} (or widen the tolerance the last column names, where one separates them).")
    else:
        verdict, more = "not yet known", needed(k, n, target)
        count = (f"{more - n} more {_units(sources)} without one ({more} in all) would bound it within "
                 f"{target_pct:g} %" if more
                 else f"no count of them would bound it within {target_pct:g} %")
        text = f"Not yet known whether one run would do on this machine: {read}; {count}."
    return Advice(n, k, round(100 * bound, 2), target_pct, verdict, more, text)


def units_of(benches: list[Any], rows: list[Any], machine: str, platform: str,
             source: Optional[str] = None) -> tuple[dict[str, set[str]], dict[str, str]]:
    """(units, sources) for advise: the store's benches and nights of one machine and platform (of one source where
    given: 'bench' or 'nightly'), each with the outcomes its first run's regressions had."""
    mine = [b for b in benches if (b.machine, b.platform) == (machine, platform) and source in (None, b.source)]
    units: dict[str, set[str]] = {b.out_dir: set() for b in mine}
    for r in rows:
        if (r.machine, r.platform) == (machine, platform) and r.out_dir in units:
            units[r.out_dir].add(r.outcome)
    return units, {b.out_dir: b.source for b in mine}


def check_target(pct: float) -> float:
    """--false-alarms: a share strictly between 0 and 100 %."""
    if not 0.0 < pct < 100.0:
        raise HarnessError(f"--false-alarms {pct:g} is not a share a team can aim at: give a percentage between 0 and "
                           "100 (exclusive), e.g. 5 (one bench or night in twenty with a false alarm)")
    return pct


def night_cell(benches: list[Any], rows: list[Any], out_dir: str, target_pct: float = TARGET_PCT) -> str:
    """The overview's word on a night (harness/report/overview.py): what its first repeat read alone and, over its
    machine's nights in the store, whether one repeat would do; '' for a night that kept none (one repeat)."""
    night = next((b for b in benches if b.out_dir == out_dir and b.source == "nightly"), None)
    if night is None:
        return ""
    mine = [r for r in rows if (r.machine, r.platform, r.out_dir) == (night.machine, night.platform, out_dir)]
    counts = Counter(r.outcome for r in mine)
    tonight = (f"{len(mine)} regression(s) read alone, {counts['confirmed']} confirmed, {counts[FALSE_ALARM]} did "
               "not repeat" if mine else "no regression read alone")
    a = advise(*units_of(benches, rows, night.machine, night.platform, "nightly"), target_pct)
    return f"{tonight}; {a.over_nights()}"
