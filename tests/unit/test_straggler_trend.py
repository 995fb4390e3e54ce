"""A straggler across nights (harness/straggler_trend.py): a rank or a node that holds the others back a little more
each night, never standing out on one, is named once its share has risen every night of the last CREEP_NIGHTS."""
from __future__ import annotations

import unit_helpers  # noqa: F401  (puts the repository root on sys.path)

from harness.held_up import shares
from harness.report.nightly import write_reports
from harness.report.overview import OverviewRow, overview_line
from harness.straggler_trend import CREEP_NIGHTS, CREEP_PCT, CREEP_RISE, night_straggler_lines
from unit_helpers import schema_valid, typed

STEP_S = 1.0


def _steps(held: dict[int, float], hosts: dict[int, str]) -> list[dict]:
    """Two profiled steps of STEP_S whose calls were matched; rank r held the others back held[r] % of them."""
    ranks = [{"rank": r, "host": hosts[r], "last_calls": 1, "held_back_s": pct / 100 * STEP_S} for r, pct in held.items()]
    arrivals = {"peer_wait_s": [[0.0]], "calls": 4, "ranks": ranks}
    names = sorted(set(hosts.values()))
    if len(names) > 1:
        arrivals["hosts"] = [{"host": h, "ranks": [r for r in held if hosts[r] == h], "last_calls": 1,
                              "held_back_s": sum(pct for r, pct in held.items() if hosts[r] == h) / 100 * STEP_S}
                             for h in names]
    return [{"step": i, "mode": "profile", "warmup": False, "step_time_s": STEP_S, "loss": 1.0, "arrivals": arrivals}
            for i in (1, 2)]


def _record(held: dict[int, float], run_id: str = "z1-mb4-ga2", hosts=None, stands_out: bool = False):
    hosts = hosts or {r: "vm" for r in held}
    top = max(held, key=held.get)
    load = {"straggler": {"rank": top, "host": hosts[top], "held_back_pct": held[top], "next_pct": 0.0,
                          "stands_out": stands_out}}
    return typed([schema_valid({"run_id": run_id, "kind": "training", "platform": "cpu", "benchmark": "llama-tiny",
                                "status": "ok", "reason": None, "environment": {"load": load},
                                "metrics": {"samples_per_s": {"value": 40.0, "unit": "1/s"}},
                                "steps": _steps(held, hosts)})])[0]


def _nights(*shares_of_rank1, repeats=3, **kw):
    """One (night, record) per repeat for each night, rank 1's share as given, rank 0 at 1 %."""
    out = []
    for i, pct in enumerate(shares_of_rank1):
        out += [(f"2026-11-{i + 1:02d}", _record({0: 1.0, 1: pct}, **kw)) for _ in range(repeats)]
    return out


def _split(nights):
    names = sorted({n for n, _ in nights})
    return [r for n, r in nights if n == names[-1]], names[-1], [x for x in nights if x[0] != names[-1]], names[:-1]


def test_shares_are_each_ranks_held_back_share_of_the_profiled_steps():
    rec = _record({0: 2.0, 1: 9.0})
    assert shares(rec.steps) == {0: 2.0, 1: 9.0}
    assert shares(rec.steps, "hosts") == {}   # one host: no per-host count
    assert shares([{**s, "arrivals": {}} for s in rec.steps]) == {}


def test_a_rank_that_lags_more_each_night_is_named_before_it_stands_out():
    assert CREEP_NIGHTS == 3
    tonight, night, earlier, nights = _split(_nights(2.0, 4.0, 8.0))
    (line,) = night_straggler_lines(tonight, night, earlier, nights)
    assert line == ("z1-mb4-ga2 (llama-tiny): rank 1 (vm) held the others back more each night: 2 %, 4 %, 8 % of the "
                    "profiled steps (nights 2026-11-01, 2026-11-02, 2026-11-03; the median of each night's repeats)")
    # only the last CREEP_NIGHTS count: an older higher night does not hide the rise
    tonight, night, earlier, nights = _split(_nights(30.0, 2.0, 4.0, 8.0))
    assert len(night_straggler_lines(tonight, night, earlier, nights)) == 1


def test_no_trend_without_a_rise_every_night_enough_nights_or_a_share_worth_naming():
    for series in ((2.0, 8.0, 7.5), (4.0, 4.0, 8.0), (1.0, 2.0, CREEP_PCT - 0.5), (5.0, 6.0, 5.0 + CREEP_RISE - 0.5)):
        tonight, night, earlier, nights = _split(_nights(*series))
        assert night_straggler_lines(tonight, night, earlier, nights) == [], series
    tonight, night, earlier, nights = _split(_nights(4.0, 8.0))
    assert night_straggler_lines(tonight, night, earlier, nights) == []              # two nights: no trend yet
    tonight, night, _, nights = _split(_nights(2.0, 4.0, 8.0))
    assert night_straggler_lines(tonight, night, [], nights) == []                    # the run did not run those nights


def test_the_median_of_a_nights_repeats_not_its_worst():
    nights = _nights(2.0, 4.0) + [("2026-11-03", _record({0: 1.0, 1: pct})) for pct in (3.0, 30.0, 3.5)]
    tonight, night, earlier, names = _split(nights)
    assert night_straggler_lines(tonight, night, earlier, names) == []                # 3.5 % tonight: below 4 %


def test_a_straggler_that_stood_out_tonight_is_named_once_with_its_trend():
    nights = _nights(2.0, 4.0) + [("2026-11-03", _record({0: 1.0, 1: 20.0}, stands_out=True))] * 3
    tonight, night, earlier, names = _split(nights)
    (line,) = night_straggler_lines(tonight, night, earlier, names)
    assert line.startswith("z1-mb4-ga2 (llama-tiny): rank 1 (vm) held the others back 20 % of the profiled steps, in "
                           "3 of 3 runs; rank 1 (vm) held the others back more each night: 2 %, 4 %, 20 % of"), line
    nights = _nights(9.0, 4.0) + [("2026-11-03", _record({0: 1.0, 1: 20.0}, stands_out=True))] * 3
    (line,) = night_straggler_lines(*_split(nights))
    assert line.endswith("in 3 of 3 runs")                                   # no rise: tonight's words alone
    # one repeat of three stood out (a spell of the host: harness/held_up.py night_stragglers): the rise alone
    nights = _nights(2.0, 4.0) + [("2026-11-03", _record({0: 1.0, 1: pct}, stands_out=pct > 15))
                                  for pct in (20.0, 9.0, 8.0)]
    (line,) = night_straggler_lines(*_split(nights))
    assert line == ("z1-mb4-ga2 (llama-tiny): rank 1 (vm) held the others back more each night: 2 %, 4 %, 9 % of the "
                    "profiled steps (nights 2026-11-01, 2026-11-02, 2026-11-03; the median of each night's repeats)"), line


def test_a_node_whose_ranks_lag_together_more_each_night():
    hosts = {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    nights = []
    for i, pct in enumerate((2.0, 5.0, 9.0)):   # node2's ranks late together: per rank no lead, per node all of it
        nights += [(f"2026-11-{i + 1:02d}", _record({0: 0.5, 1: 0.5, 2: 0.6, 3: 0.4}, hosts=hosts))] * 3
        for _, rec in nights[-3:]:
            for s in rec.steps:
                next(h for h in s["arrivals"]["hosts"] if h["host"] == "node2")["held_back_s"] = pct / 100 * STEP_S
    tonight, night, earlier, names = _split(nights)
    (line,) = night_straggler_lines(tonight, night, earlier, names)
    assert "node node2 (ranks 2, 3) held the others back more each night: 2 %, 5 %, 9 %" in line


def test_the_reports_and_the_overview_carry_the_trend(tmp_path):
    tonight, night, earlier, nights = _split(_nights(2.0, 4.0, 8.0))
    lines = night_straggler_lines(tonight, night, earlier, nights)
    paths = write_reports(tmp_path, platform="cpu", night=night, verdicts={"baseline": []}, records=tonight,
                          history={}, stragglers=lines)
    assert f"## Stragglers\n\n- {lines[0]}\n" in paths["markdown"].read_text()
    assert "held the others back more each night: 2 %, 4 %, 8 %" in paths["html"].read_text()
    row = OverviewRow("cpu", night, tmp_path, None, tonight, {}, lines)
    assert overview_line(row).endswith(f"; straggler: {lines[0]}")
    assert OverviewRow("cpu", night, tmp_path, None, tonight, {}).straggler_lines == []   # tonight's own only


def test_the_kept_nights_give_the_figures_the_rule_quotes():
    """tests/data/straggler_nights: 8 quiet nights and 4 with rank 1 lagging more each night (tests/perf)."""
    import json
    import sys

    sys.path.insert(0, str(unit_helpers.REPO_ROOT / "tests" / "perf"))
    from straggler_nights import figures

    kept = unit_helpers.REPO_ROOT / "tests" / "data" / "straggler_nights" / "zen5-2026-12-06.jsonl"
    found = figures([json.loads(x) for x in kept.read_text().splitlines()])
    assert found["quiet_nights"] == 8 and found["quiet_median_pct"] == [0.1, 4.2]
    assert (found["quiet_named"], found["quiet_orderings"]) == (0, 672)       # no quiet trio named
    named = [[v["named"] for v in d["runs"].values()] for d in found["delayed"]]
    assert named == [[False, False], [True, True], [True, True], [True, True]]
    stood = [sum(v["stood_out_in"] for v in d["runs"].values()) for d in found["delayed"]]
    assert stood == [0, 0, 0, 3]                                             # named two nights before it stood out
    assert [d["runs"]["01-z1-mb4-ga2"]["rank1_pct"] for d in found["delayed"]] == [3.7, 7.1, 11.7, 14.2]


def test_the_page_charts_each_ranks_share_over_the_nights(tmp_path):
    import base64
    import re

    from harness.report.nightly_page import held_back_png
    from harness.straggler_trend import held_back_series

    tonight, night, earlier, nights = _split(_nights(2.0, 4.0, 8.0))
    series = held_back_series(tonight, night, earlier, nights)
    assert series == {"z1-mb4-ga2": {"rank 0 (vm)": [(n, 1.0) for n in nights + [night]],
                                     "rank 1 (vm)": list(zip(nights + [night], (2.0, 4.0, 8.0)))}}
    assert held_back_png(series, night).startswith(b"\x89PNG\r\n\x1a\n")
    page = write_reports(tmp_path, platform="cpu", night=night, verdicts={"baseline": []}, records=tonight,
                         history={}, held_back=series)["html"].read_text()
    (alt,) = re.findall(r'<img alt="(held the others back[^"]*)" src="data:image/png;base64,([^"]+)"', page)
    assert base64.b64decode(alt[1]).startswith(b"\x89PNG")
    # one night only: nothing to chart
    one = write_reports(tmp_path / "one", platform="cpu", night=night, verdicts={"baseline": []}, records=tonight,
                        history={}, held_back=held_back_series(tonight, night, [], []))["html"].read_text()
    assert "held the others back, per rank" not in one
    # where the ranks spanned hosts: each node, and only the ranks that were latest on some night
    hosts = {0: "node1", 1: "node1", 2: "node2", 3: "node2"}
    two = [_record({0: 0.5, 1: 0.5, 2: 0.6, 3: 0.4}, hosts=hosts)]
    before = [("2026-11-01", _record({0: 0.9, 1: 0.5, 2: 0.6, 3: 0.4}, hosts=hosts))]
    lines = held_back_series(two, night, before, ["2026-11-01"])["z1-mb4-ga2"]
    assert sorted(lines) == ["node node1 (ranks 0, 1)", "node node2 (ranks 2, 3)", "rank 0 (node1)", "rank 2 (node2)"]
