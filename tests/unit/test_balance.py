"""An efficiency against the matmul rate (matmul_eff_pct) judged across two machines whose balance of matmul rate
and memory bandwidth differs (harness/pace.py balance, harness/verdict/explained.py at_balance): at the same
software a step reads between 1x (all matmuls) and then/now FLOP per byte (all memory traffic) of the
reference's efficiency; a change within the tolerance of that range is the machines', beyond it a verdict."""
from __future__ import annotations

import pytest

from harness.pace import Balance, balance
from harness.verdict.explained import at_balance
from harness.verdict.references import Reference


def env(fp32: float, triad: float, bf16: float | None = None, device: str = "cpu") -> dict:
    matmul = {"fp32": {"best": fp32}, **({"bf16": {"best": bf16}} if bf16 else {})}
    return {"machine": {"probe": {"device": device, "matmul": matmul, "triad": {"best": triad}}}}


def ref(value: float = 30.0, tolerance: float = 10.0, direction: str = "higher") -> Reference:
    return Reference("h100", "llama-440m", {}, "matmul_eff_pct", value, "%", direction, tolerance)


def figures(value: float, reference: float = 30.0) -> dict:
    return {"value": value, "worse_pct": -100.0 * (value - reference) / reference}


def test_the_balance_is_each_machine_s_flop_per_byte_in_the_run_s_first_dtype():
    b = balance(env(100.0, 20.0, bf16=400.0), env(200.0, 20.0, bf16=400.0), ["bf16", "fp32"])
    assert b == Balance(now=10.0, then=5.0, dtype="fp32", device="cpu")   # the suite's dtype order: fp32 first
    assert b.memory_bound == pytest.approx(0.5)
    assert balance(env(100.0, 20.0, bf16=400.0), env(200.0, 20.0), ["bf16"]) is None, "a side lacks the dtype"
    assert balance(env(100.0, 20.0), env(200.0, 20.0, device="cuda"), ["fp32"]) is None, "another device"
    assert balance({}, env(200.0, 20.0), ["fp32"]) is None and balance(env(1.0, 1.0), env(1.0, 1.0), []) is None


@pytest.mark.parametrize("now,verdict,explained", [
    (0.80, "regression", True),            # within [0.5x, 1x]
    (0.47, "regression", True),            # 6 % below 0.5x, within the 10 %
    (0.40, "regression", False),           # 20 % below: beyond what the balance allows
    (1.30, "improvement", False),          # the range lies below 1x
    (0.80, "insufficient data", True),     # an apparent regression, one run a side
    (0.95, "pass", False),                 # nothing to explain
])
def test_a_change_is_the_machines_only_within_the_tolerance_of_the_range(now, verdict, explained):
    twice = Balance(now=10.0, then=5.0, dtype="fp32", device="cuda")   # this machine: 2x the FLOP per byte
    text = at_balance(verdict, figures(30.0 * now), ref(), twice)
    assert bool(text) == explained
    if explained:
        assert text.startswith("not comparable: the machines' balance differs (fp32 matmul per byte of memory "
                               "bandwidth (triad) 10 vs 5 FLOP/B)")
        assert "one all memory traffic 0.50x" in text


def test_more_bandwidth_per_flop_explains_an_improvement_and_noise_explains_nothing():
    half = Balance(now=5.0, then=10.0, dtype="bf16", device="cuda")      # the range is [1x, 2x]
    assert at_balance("improvement", figures(45.0), ref(), half)
    assert at_balance("regression", figures(20.0), ref(), half) is None
    near = Balance(now=10.0, then=9.8, dtype="bf16", device="cuda")      # 2 %: within cuda's pace noise (3 %)
    assert at_balance("regression", figures(29.0 * 0.98 - 3), ref(), near) is None
    assert at_balance("regression", figures(20.0), ref(), None) is None


def test_a_lower_is_better_quantity_is_turned_first():
    twice = Balance(now=10.0, then=5.0, dtype="fp32", device="cpu")
    # a time 1.6x the reference's is 0.625x of its speed: within [0.5x, 1x]
    assert at_balance("regression", {"value": 16.0, "worse_pct": 60.0}, ref(10.0, 35.0, "lower"), twice)
    # 3x is 1.5x the time at 0.5x of its speed: 50 % beyond, in the time's own terms, as its tolerance is
    assert at_balance("regression", {"value": 30.0, "worse_pct": 200.0}, ref(10.0, 35.0, "lower"), twice) is None
