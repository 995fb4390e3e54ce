"""A nightly of two or more repeats keeps what a one-repeat night would have judged (harness/nightly.py first_repeat):
each run's first repeat judged alone against the references and the rolling baseline that judged the night, and what
the night's repeats made of each regression it read, in the store's alarm tables (harness/verdict/alarms.py
keep_night), so that `python -m harness alarms` counts a platform's one-repeat false alarms from every night. Real
records: the Zen 5's default-cpu suites of 2026-12-05 (reference_results/sources/), three nights of the baseline and a
night of three repeats in which one run's first repeat reads half its samples/s (a spell) and another run reads it in
every repeat (a change)."""
from __future__ import annotations

import copy
import html
import json
import sqlite3

from harness.__main__ import main
from harness.errors import HarnessError
from harness.nightly import first_repeat, judge, overview
from harness.record import ResultRecord
from harness.report.nightly import write_reports

from test_nightly_machine import store_of, zen5

NIGHT = "2026-12-04"
SPELL, CHANGE = "02-z1-mb4-ga2", "05-z3-mb2-ga4"
"""The run whose first repeat alone is slow, and the run that is slow in every repeat."""
SLOWED = {"samples_per_s": 0.5, "tokens_per_s": 0.5, "step_time_s": 2.0}


def slowed(records: list[ResultRecord], run_ids: set[str]) -> list[ResultRecord]:
    """The records, those of `run_ids` at half their throughput (twice their step time)."""
    out = []
    for rec in records:
        d = copy.deepcopy(rec.to_dict())
        if rec.run_id in run_ids:
            for metric, factor in SLOWED.items():
                d["metrics"][metric]["value"] *= factor
                if d["metrics"][metric].get("samples"):
                    d["metrics"][metric]["samples"] = [x * factor for x in d["metrics"][metric]["samples"]]
        out.append(ResultRecord.from_dict(d))
    return out


def night_of_three(tmp_path, first_slow: set[str]):
    """The store with three baseline nights and tonight's three repeats (the first with `first_slow` slowed too)."""
    store = store_of(tmp_path, [("2026-12-01", zen5(1)), ("2026-12-02", zen5(2)), ("2026-12-03", zen5(3))])
    store.start_night(NIGHT, "cpu", "nightly-cpu", str(tmp_path / NIGHT))
    for repeat, (n, slow) in enumerate([(1, first_slow | {CHANGE}), (2, {CHANGE}), (3, {CHANGE})]):
        store.add_runs(NIGHT, "cpu", repeat, slowed(zen5(n), slow))
    store.finish_night(NIGHT, "cpu")
    return store


def judged_alone(store, tmp_path) -> str:
    tonight, verdicts, earlier_nights, earlier, _, _ = judge(store, "cpu", NIGHT, [], 7)
    assert len(tonight) == 33 and earlier_nights == ["2026-12-01", "2026-12-02", "2026-12-03"]
    return first_repeat(store, "cpu", NIGHT, [], verdicts, earlier, earlier_nights, tmp_path / NIGHT)


def test_a_nights_first_repeat_is_kept_with_what_its_other_repeats_read(tmp_path):
    store = night_of_three(tmp_path, {SPELL})
    line = judged_alone(store, tmp_path)
    assert line.startswith("first repeat alone (what a one-repeat night would have judged): 6 regression(s), of "
                           "which 3 the night's 3 repeats read too, 0 unsettled and 3 that did not repeat"), line
    kept, rows = store.confirmation_rows()
    assert [(b.source, b.times, b.out_dir) for b in kept] == [("nightly", 2, str(tmp_path / NIGHT))]
    judged = json.loads(kept[0].judged)           # every metric of the first repeat's 10 records, against the baseline
    assert ["llama-tiny", "samples_per_s", "baseline", 6] in judged
    found = {(r.record_id, r.metric): r for r in rows}
    assert set(found) == {(run, m) for run in (SPELL, CHANGE) for m in SLOWED}
    spell, change = found[SPELL, "samples_per_s"], found[CHANGE, "samples_per_s"]
    assert (spell.against, spell.outcome, spell.final_verdict, spell.beyond) == ("baseline", "not repeated", "pass", 1)
    assert len(json.loads(spell.reruns)) == 2 and spell.first_worse_pct > 40
    assert (change.outcome, change.final_verdict, change.beyond) == ("confirmed", "regression", 3)

    again = judged_alone(store, tmp_path)         # the night judged again (resumed): replaced, not added
    assert again == line and len(store.confirmation_rows()[0]) == 1


def test_alarms_counts_the_nights_beside_the_benches(tmp_path, capsys):
    store = night_of_three(tmp_path, {SPELL})
    judged_alone(store, tmp_path)
    url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    assert main(["alarms", "--store", url]) == 0
    flat = " ".join(capsys.readouterr().out.split())
    assert "a night's first repeat" in flat
    assert "cpu on AMD EPYC (2 CPUs, AVX512 +avx512_bf16; family 26 model 2): 1 night(s) from" in flat
    assert "bench(es) " not in flat, flat
    assert "6 regression(s) read: 3 confirmed, 0 unsettled, 3 did not repeat" in flat, flat
    assert main(["alarms", "--store", url, "--json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out) if r["metric"] == "samples_per_s")
    assert (row["nights"], row["benches"], row["judged"], row["not_repeated"], row["confirmed"]) == (1, 0, 6, 1, 1)
    assert (row["one_run"]["verdict"], row["one_run"]["units"], row["one_run"]["with_false_alarm"]) == \
        ("keep the reruns", 1, 1)
    assert "Keep the reruns on this machine: a first run read a regression that did not repeat in 1 of its 1 nights" \
        in flat and "the nightly's --repeats 1" not in flat
    assert main(["alarms", "--store", url, "--false-alarms", "0"]) == 2
    assert "--false-alarms 0 is not a share a team can aim at" in capsys.readouterr().err


def test_a_quiet_machines_nights_say_how_many_more_would_settle_one_repeat(tmp_path, capsys):
    """Nights whose first repeat read nothing that did not repeat: the night's line, `alarms` and the overview say
    how many of this machine's nights were kept and how many more would settle whether one repeat does."""
    store = night_of_three(tmp_path, set())                   # only the run slowed in every repeat
    line = judged_alone(store, tmp_path)
    assert line.endswith("0 of this machine's 1 night(s) so kept with a false alarm (95 % bound 95 %): not yet known")
    url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    assert main(["alarms", "--store", url]) == 0
    flat = " ".join(capsys.readouterr().out.split())
    assert "in 0 of its 1 nights (0.0 %; 95 % upper bound 95.0 %" in flat
    assert "58 more nights without one (59 in all) would bound it within 5 %" in flat
    assert main(["alarms", "--store", url, "--false-alarms", "96"]) == 0
    assert "One run would do on this machine" in capsys.readouterr().out
    page = tmp_path / "overview.html"
    overview(store, [], 7, page)
    said = capsys.readouterr().out
    cell = ("3 regression(s) read alone, 3 confirmed, 0 did not repeat; 0 of this machine's 1 night(s) so kept with a "
            "false alarm (95 % bound 95 %): not yet known")
    assert f"first repeat: {cell}" in said and f"<td>{html.escape(cell)}</td>" in page.read_text()


def test_a_night_of_one_repeat_keeps_nothing(tmp_path):
    store = store_of(tmp_path, [("2026-12-01", zen5(1)), ("2026-12-02", zen5(2)), (NIGHT, slowed(zen5(3), {SPELL}))])
    tonight, verdicts, earlier_nights, earlier, _, _ = judge(store, "cpu", NIGHT, [], 7)
    assert any(v.verdict == "regression" for v in verdicts["baseline"])   # read, but nothing to tell it from
    assert first_repeat(store, "cpu", NIGHT, [], verdicts, earlier, earlier_nights, tmp_path / NIGHT) == ""
    assert store.confirmation_rows() == ([], [])


def test_a_store_of_benches_confirmations_keeps_them_as_the_benches(tmp_path):
    """A store whose alarm tables were kept before the source was (schema 0004): each row is a bench's."""
    store = store_of(tmp_path, [])
    store.add_confirmations("host vm", "cpu", "/r/1", 2, "[]", [])
    with sqlite3.connect(tmp_path / "history.sqlite") as c:
        assert c.execute("SELECT source FROM confirm_benches").fetchall() == [("bench",)]
        c.execute("ALTER TABLE confirm_benches DROP COLUMN source")
        c.execute("UPDATE alembic_version SET version_num = '0004'")
    again = store_of(tmp_path, [])
    assert again.upgraded.endswith("schema 0004 -> 0005, every row kept")
    assert [(b.out_dir, b.source) for b in again.confirmation_rows()[0]] == [("/r/1", "bench")]


def test_a_store_that_fails_when_the_first_repeat_is_read_is_a_line(tmp_path, monkeypatch):
    store = night_of_three(tmp_path, {SPELL})
    tonight, verdicts, earlier_nights, earlier, _, _ = judge(store, "cpu", NIGHT, [], 7)

    def gone(*_):
        raise HarnessError("history store x: connection lost")

    monkeypatch.setattr(store, "repeats", gone)
    line = first_repeat(store, "cpu", NIGHT, [], verdicts, earlier, earlier_nights, tmp_path / NIGHT)
    assert line == "first repeat alone: not judged: history store x: connection lost"
    assert store.confirmation_rows() == ([], [])


def test_the_nights_reports_say_what_its_first_repeat_read_alone_under_the_baseline(tmp_path):
    store = night_of_three(tmp_path, {SPELL})
    tonight, verdicts, earlier_nights, earlier, _, words = judge(store, "cpu", NIGHT, [], 7)
    alone = first_repeat(store, "cpu", NIGHT, [], verdicts, earlier, earlier_nights, tmp_path / NIGHT)
    paths = write_reports(tmp_path / "out", platform="cpu", night=NIGHT, verdicts=verdicts, records=tonight,
                          history={}, baseline=f"{words}\n{alone}")
    md = paths["markdown"].read_text()
    assert f"\n- {words}\n- first repeat alone (what a one-repeat night would have judged): 6 regression(s)" in md
    page = paths["html"].read_text()
    assert f"<p>{html.escape(words)}</p>" in page and "<p>first repeat alone (what a one-repeat night" in page
