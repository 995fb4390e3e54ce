"""The host's exchange latency (benchmarks/node/exchange.py): a real ping-pong with a child process, and the kept
rounds of tests/perf/exchange_spells.py, whose figures docs/collectives.md "Slow spells" quotes."""
from __future__ import annotations

import json
import sys

import pytest

from unit_helpers import REPO_ROOT

from benchmarks.node.exchange import exchange, two_cpus

sys.path.insert(0, str(REPO_ROOT / "tests" / "perf"))
from exchange_spells import SPELL, figures  # noqa: E402
from harness.pace import SPELL_SLOPE  # noqa: E402

KEPT = REPO_ROOT / "tests" / "data" / "exchange_spells" / "zen5-2026-12-06.jsonl"


def test_a_ping_pong_with_a_child_process_gives_its_round_trips_quartiles():
    found = exchange(200)
    assert found["n"] == 200 and found["cpus"] == list(two_cpus())
    assert 0 < found["p25_us"] <= found["median_us"] <= found["p90_us"] < 1e6


def test_the_kept_rounds_say_what_the_docs_say():
    rows = [json.loads(line) for line in KEPT.read_text().splitlines() if line.strip()]
    f = figures(rows)
    assert f["rounds"] == 100 and SPELL == 1.15
    assert f["spell_rounds"] == 13          # the slower of each round's two pulses, as a record keeps it
    assert f["pulse_median_us"] == pytest.approx(43.0, abs=0.05)
    assert f["spell_pulse_us"] / f["pulse_median_us"] == pytest.approx(1.32, abs=0.005)
    for op, corr, calm, ratio, slopes in (("all_reduce", 0.80, 104, 1.51, (0.52, 2.62)),
                                          ("reduce_scatter", 0.69, 121, 1.61, (0.16, 2.62))):
        o = f[op]
        assert o["correlation"] == pytest.approx(corr, abs=0.005), op
        assert o["calm_p25_us"] == pytest.approx(calm, abs=0.5), op
        assert o["spell_p25_us"] / o["calm_p25_us"] == pytest.approx(ratio, abs=0.005), op
        assert (o["slopes"][0], o["slopes"][-1]) == pytest.approx(slopes, abs=0.005), op   # pace.py SPELL_SLOPE's
        assert o["slopes"][-1] == pytest.approx(SPELL_SLOPE, abs=0.05), op
