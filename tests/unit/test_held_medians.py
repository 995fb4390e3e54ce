"""The small calls' median where one side's is a call the host held up (harness/verdict/explained.py held_medians,
at_held_up_median): a sweep whose median small call is over STALL_FACTOR times its own lower quartile (most of its
small sizes had over half their calls held up for the scheduler's tick) against a reference whose median is not
(or the other way round) is `not comparable`, the lower quartile judging the calls; like against like, or a side
without its quartile, is judged as before. The records are two real bound cpu-short sweeps of all_reduce on the
2-core AVX2 EPYC (family 25 model 1, 2026-12-06 22:15 and 22:16 UTC, back to back, the same commit): median
490 us over a quartile of 381 (unheld), then 2,753 over 417 (held)."""
from __future__ import annotations

import copy
import json

from contract.collectives import STALL_FACTOR
from harness.verdict.ab import references_of
from harness.verdict.compare import compare
from unit_helpers import REPO_ROOT, typed

DATA = REPO_ROOT / "tests" / "data" / "held_medians"
UNHELD = json.loads((DATA / "avx2-unheld.json").read_text())
HELD = json.loads((DATA / "avx2-held.json").read_text())


def scaled(rec: dict, **factors: float) -> dict:
    """A copy of `rec` with each named metric's value times its factor, or dropped where the factor is None."""
    out = copy.deepcopy(rec)
    for name, factor in factors.items():
        if factor is None:
            out["metrics"].pop(name)
        else:
            out["metrics"][name]["value"] *= factor
    return out


def verdict(new: dict, old: dict, metric: str = "small_median_us"):
    return next(v for v in compare(typed([new]), references_of(typed([old])), min_samples=1) if v.metric == metric)


def test_the_records_are_what_the_rule_reads():
    med, p25 = (UNHELD["metrics"][m]["value"] for m in ("small_median_us", "small_p25_us"))
    assert round(med) == 490 and round(p25) == 381 and med < STALL_FACTOR * p25 and STALL_FACTOR == 3.0
    med, p25 = (HELD["metrics"][m]["value"] for m in ("small_median_us", "small_p25_us"))
    assert round(med) == 2753 and round(p25) == 417 and med > STALL_FACTOR * p25


def test_a_held_up_median_against_an_unheld_one_is_not_comparable_and_the_quartile_judges():
    v = verdict(HELD, UNHELD)   # what the baseline of this box called a 6.1x regression
    assert v.verdict == "not comparable", (v.verdict, v.reason)
    assert v.reason == ("not comparable: this sweep's median small call (2,753 us) is one the host held up, 6.6x its "
                        "lower quartile (417 us; a call over 3x it was held up), the reference's (490 us) 1.3x its own: "
                        "at most of this sweep's small sizes over half the calls waited for the scheduler's tick, so the "
                        "median moved with how many did, not with the calls' speed; their lower quartile "
                        "(small_p25_us) judges them")
    assert v.worse_pct is not None and v.worse_pct > 400   # the ratio kept as information
    assert verdict(HELD, UNHELD, "small_p25_us").verdict == "pass"
    back = verdict(UNHELD, HELD)   # the reference held up: this sweep's apparent 5.6x improvement is the reference's
    assert back.verdict == "not comparable" and back.reason.startswith(
        "not comparable: the reference's median small call (2,753 us) is one the host held up"), back.reason


def test_like_against_like_or_without_a_quartile_is_judged_as_before():
    assert verdict(scaled(HELD, small_median_us=2.0), HELD).verdict == "regression"    # both held: the tick slowed
    slower = scaled(UNHELD, small_median_us=1.8, small_p25_us=1.8)   # every call slower, none held up
    assert verdict(slower, UNHELD).verdict == "regression"
    assert verdict(slower, UNHELD, "small_p25_us").verdict == "regression"
    # a reference without its quartile (taken before it was kept), or a sweep without one: the median alone
    assert verdict(HELD, scaled(UNHELD, small_p25_us=None)).verdict == "regression"
    assert verdict(scaled(HELD, small_p25_us=None), UNHELD).verdict == "regression"
    # the held-up side faster is no held-up median's doing: an improvement stays one (137 us, 6.6x its quartile)
    assert verdict(scaled(HELD, small_median_us=0.05, small_p25_us=0.05), UNHELD).verdict == "improvement"
    assert verdict(HELD, scaled(UNHELD, small_p25_us=0.0)).verdict == "regression"   # a quartile of 0: no rule
    assert verdict(scaled(HELD, small_p25_us=0.0), UNHELD).verdict == "regression"
