"""The default suite's records hold what they held when the golden form was written, field for field,
timings aside (tests/golden_records.py): a refactor of the harness must not change a record."""
from __future__ import annotations

import json

from ..golden_records import GOLDEN, differences, golden


def test_the_default_suite_records_match_their_golden_form(default_suite):
    assert default_suite.returncode == 0, default_suite.stderr[-3000:]
    records = default_suite.first_records()   # a regression's reruns aside (confirm_regressions)
    kept = sorted(p.stem for p in GOLDEN.glob("*.json"))
    assert sorted(records) == kept, "the default suite's records are not the ones the golden form names"
    problems = {name: differences(json.loads((GOLDEN / f"{name}.json").read_text()), golden(record))
                for name, record in records.items()}
    problems = {name: found[:20] for name, found in problems.items() if found}
    assert not problems, problems


def test_a_changed_field_is_found():
    record = {"metrics": {"final_loss": {"value": 10.5, "unit": "nats"}, "step_time_s": {"value": 1.0}},
              "environment": {"torch": "2.13.0", "settings": {"measure.steps": 2}}}
    same_but_slower = {"metrics": {"final_loss": {"value": 10.5, "unit": "nats"}, "step_time_s": {"value": 2.0}},
                       "environment": {"torch": "2.12.0", "settings": {"measure.steps": 2}}}
    assert differences(golden(record), golden(same_but_slower)) == []
    other_unit = {"metrics": {"final_loss": {"value": 10.5, "unit": "bits"}, "step_time_s": {"value": 1.0}},
                  "environment": {"torch": "2.13.0", "settings": {"measure.steps": 3}}}
    assert differences(golden(record), golden(other_unit)) == [
        ".environment.settings.measure.steps: 3 != 2",
        ".metrics.final_loss.unit: 'bits' != 'nats'"]
    assert differences(golden(record), golden({"metrics": record["metrics"]})) == [".environment: missing"]


def test_fp32_noise_in_a_loss_passes_and_a_real_change_does_not():
    def kl(value):
        return golden({"steps": [{"mode": "throughput", "kl_loss": value}]})

    assert differences(kl(0.02555309794843197), kl(0.02555302530527115)) == []     # an AVX2-only box against the golden one
    assert differences(kl(0.02555309794843197), kl(0.0255631)) == [".steps[0].kl_loss: 0.0255631 != 0.02555309794843197"]
    assert differences(golden({"loss": 4.235226631164551}), golden({"loss": 4.2352366})) != []   # 2e-6 relative


def test_which_rank_came_last_is_masked_but_the_number_of_calls_is_not():
    def came(last, calls=10):
        return golden({"steps": [{"mode": "profile", "arrivals": {"calls": calls, "ranks": [
            {"rank": 0, "host": "vm", "last_calls": last, "held_back_s": 0.01 * last}]}}]})

    assert differences(came(3), came(7)) == []
    assert differences(came(3), came(3, calls=12)) == [".steps[0].arrivals.calls: 12 != 10"]
