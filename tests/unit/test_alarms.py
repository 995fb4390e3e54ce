"""What a bench's regressions became when it ran them again is kept in the history store, and `python -m harness
alarms` counts it per machine, platform and metric (harness/verdict/alarms.py): how often one run's regression did
not repeat, and how far beyond the reference those first readings lay against the tolerance that judged them. The
benches are test_confirm_regressions.py's (its `execute` returns known values); the store and the command are real."""
from __future__ import annotations

import json
import sqlite3

import pytest

from harness.__main__ import main
from harness.verdict.alarms import Tally, report
from harness.verdict.history import History

from test_confirm_regressions import bench_of

BOX = {"host": "box-a", "machine": {"cpu": {}}}
"""A machine the store keeps benches under ('host box-a': the CPU's model unknown)."""


def benches(tmp_path, monkeypatch) -> str:
    """Four benches of one machine that ran their regressions again (one confirmed, one that did not repeat, one
    unsettled, one that read none) and one that did not (confirm_regressions=0): the store's URL."""
    url = f"sqlite:///{tmp_path / 'history.sqlite'}"
    for name, first, reruns, more in (("slow", 15.0, [14.8, 15.2], ()), ("spell", 15.0, [22.1, 21.9], ()),
                                      ("lasting", 15.0, [15.5, 22.0], ()),
                                      ("calm", 21.5, [], ()), ("off", 15.0, [], ("confirm_regressions=0",))):
        bench_of(tmp_path / name, monkeypatch, first, reruns, *more, history=url, environment=BOX)
    return url


def test_each_bench_keeps_what_its_reruns_read(tmp_path, monkeypatch):
    url = benches(tmp_path, monkeypatch)
    assert "Kept in the history store (" in (tmp_path / "spell" / "out" / "compare.md").read_text()
    assert "Kept in the history store" not in (tmp_path / "calm" / "out" / "compare.md").read_text()
    kept, rows = History(url).confirmation_rows()
    assert [(b.machine, b.platform, b.times) for b in kept] == [("host box-a", "cpu", 2)] * 4   # not the one with 0
    assert {b.out_dir.split("/")[-2] for b in kept} == {"slow", "spell", "lasting", "calm"}
    assert json.loads(kept[0].judged) == [["llama-tiny", m, "reference", 1]
                                          for m in ("peak_mem_gib", "samples_per_s", "step_time_s")]
    found = {(r.out_dir.split("/")[-2], r.metric): r for r in rows}
    assert set(found) == {(b, m) for b in ("slow", "spell", "lasting") for m in ("samples_per_s", "step_time_s")}
    assert (found["lasting", "samples_per_s"].outcome, found["lasting", "samples_per_s"].beyond) == ("unsettled", 2)
    slow, spell = found["slow", "samples_per_s"], found["spell", "samples_per_s"]
    assert (slow.outcome, slow.final_verdict, json.loads(slow.reruns), slow.beyond) == ("confirmed", "regression",
                                                                                      [14.8, 15.2], 3)
    assert (spell.outcome, spell.final_verdict, spell.final_value, spell.beyond) == ("not repeated", "pass", 21.9, 1)
    assert (spell.record_id, spell.against, spell.reference, spell.tolerance_pct, spell.first_value) == \
        ("00-llama-tiny", "reference", 22.0, 25.0, 15.0)
    assert round(spell.first_worse_pct, 1) == 31.8 and json.loads(spell.failed) == []


def test_alarms_counts_the_false_alarms_per_metric(tmp_path, monkeypatch, capsys):
    url = benches(tmp_path, monkeypatch)
    capsys.readouterr()                                   # the benches' own output
    assert main(["alarms", "--store", url]) == 0
    said = capsys.readouterr().out
    flat = " ".join(said.split())                         # its lines wrapped at the house width
    assert ("cpu on host box-a: 4 bench(es) from" in flat and "12 first verdict(s) judged over 3 metric(s); 6 "
            "regression(s) read: 2 confirmed, 2 unsettled, 2 did not repeat, 0 without a verdict") in flat, said
    row = next(line.split() for line in said.splitlines() if line.startswith("llama-tiny") and "samples_per_s" in line)
    assert row[:9] == ["llama-tiny", "samples_per_s", "reference", "4", "3", "1", "1", "1", "25.0"]
    assert "+32 %  " in said and "25 %" in said
    assert "none (1 at or beyond the smallest confirmed, 32 %)" in said
    assert "peak_mem_gib" not in said                     # judged, never read a regression: a row with --all
    assert main(["alarms", "--store", url, "--all"]) == 0 and "peak_mem_gib" in capsys.readouterr().out
    assert main(["alarms", "--store", url, "--json"]) == 0
    rows = {r["metric"]: r for r in json.loads(capsys.readouterr().out)}
    assert (rows["samples_per_s"]["judged"], rows["samples_per_s"]["not_repeated"], rows["peak_mem_gib"]["read"]) \
        == (4, 1, 0)
    assert main(["alarms", "--store", url, "--platform", "h100"]) == 0
    assert "No bench in" in capsys.readouterr().out


def test_a_tolerance_that_passes_the_false_alarms_is_named_where_one_exists():
    t = Tally()
    t.worse["not repeated"] += [12.3, 8.0]
    assert t.separating() == ">= 13 %"
    t.worse["confirmed"].append(40.0)
    assert t.separating() == ">= 13 % (below the smallest confirmed, 40 %)"
    t.worse["confirmed"].append(10.0)
    assert t.separating() == "none (1 at or beyond the smallest confirmed, 10 %)"
    assert Tally().separating() == "-" and Tally().rate() == "-"


def test_a_folder_kept_again_replaces_its_confirmation(tmp_path):
    h = History(f"sqlite:///{tmp_path / 'h.sqlite'}")
    row = dict(record_id="00-x", metric="samples_per_s", against="reference", benchmark="x", unit="samples/s",
               reference=2.0, tolerance_pct=10.0, first_value=1.0, first_worse_pct=50.0, reruns="[2.0]", failed="[]",
               beyond=1, outcome="not repeated", final_verdict="pass", final_value=1.5)
    for _ in range(2):
        h.add_confirmations("m", "cpu", "/out", 1, json.dumps([["x", "samples_per_s", "reference", 1]]), [row])
    kept, rows = h.confirmation_rows()
    assert len(kept) == 1 and len(rows) == 1
    text = report(kept, rows, "h.sqlite", markdown=True)
    assert "| x | samples_per_s | reference | 1 | 1 | 0 | 0 | 1 | 100.0 % | +50 % | - | 10 % | >= 51 % |" in text


def test_a_store_that_cannot_keep_it_is_a_note_and_the_bench_goes_on(tmp_path, monkeypatch):
    (tmp_path / "store").mkdir()                                  # a folder where the store's file should be
    _, records, md = bench_of(tmp_path, monkeypatch, 15.0, [22.1, 21.9], history=f"sqlite:///{tmp_path / 'store'}",
                              environment=BOX)
    assert len(records) == 3 and "the first run's reading did not repeat" in md
    assert "confirmation not kept: history store" in md and "set history=<another SQLAlchemy URL>" in md


def test_a_store_that_is_not_there_is_named_and_not_created(tmp_path, capsys):
    missing = tmp_path / "none.sqlite"
    assert main(["alarms", "--store", f"sqlite:///{missing}"]) == 2
    assert f"history store {missing} does not exist" in capsys.readouterr().err and not missing.exists()
    with pytest.raises(SystemExit) as stop:                        # argparse's own message and usage
        main(["alarms", "--bogus"])
    assert stop.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_an_older_store_gains_the_tables_empty(tmp_path):
    store = tmp_path / "old.sqlite"
    History(f"sqlite:///{store}")
    with sqlite3.connect(store) as c:
        c.execute("DROP TABLE confirmations")
        c.execute("DROP TABLE confirm_benches")
        c.execute("UPDATE alembic_version SET version_num = '0003'")
    h = History(f"sqlite:///{store}")
    assert h.upgraded.endswith("schema 0003 -> 0005, every row kept") and h.confirmation_rows() == ([], [])
