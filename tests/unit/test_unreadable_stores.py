"""A store or a reference table that cannot be read is named, not fatal (issue 26 item 8): `bench`
still prints and writes its verdicts against the tables that parse, the nightly stops before it runs
anything, `compare` stops naming the file; an unreadable store is left byte for byte as it was."""
from __future__ import annotations

import json
import os

import pytest
from test_compare import reference
from test_machine_baseline import LAPTOP, run

import harness.verdict.references
from harness.__main__ import main
from harness.verdict.baseline import baseline_text, judge
from harness.bench import compare_with_references
from harness.verdict.compare import compare
from harness.errors import HarnessError
from harness.verdict.history import History, store_name
from harness.verdict.references import ReferenceFileError, load_references, read_references
from harness.report.verdicts import verdict_counts
from unit_helpers import typed

RANDOM = os.urandom(8192)
TEXT = b"name,value\nx,1\n" * 200


def a_store(tmp_path) -> bytes:
    path = tmp_path / "whole.sqlite"
    store = History(f"sqlite:///{path}")
    for i in range(40):
        store.add_bench("m", "cpu", f"/results/{i}", typed([run(20.0, i)]))
    data = path.read_bytes()
    path.unlink()
    return data


CONTENTS = {
    "random bytes": lambda tmp_path: RANDOM,
    "a text file": lambda tmp_path: TEXT,
    "a store cut in half": lambda tmp_path: (lambda data: data[:len(data) // 2])(a_store(tmp_path)),
    # its schema page intact, so it opens; the runs' pages zeroed: reading them fails
    "a store with its data pages zeroed": lambda tmp_path: (lambda data: data[:4096] + bytes(len(data) - 4096))(
        a_store(tmp_path)),
}


def unreadable(tmp_path, what: str):
    path = tmp_path / "history.sqlite"
    path.write_bytes(CONTENTS[what](tmp_path))
    return path, path.read_bytes(), sorted(os.listdir(tmp_path))


def use(url: str) -> None:
    """What bench does with its store: open, read the machine's earlier runs, keep this run."""
    store = History(url, remedy="set history=<another SQLAlchemy URL>")
    store.bench_records("m", "cpu", 6)
    store.add_bench("m", "cpu", "/results/new", typed([run(20.0)]))


@pytest.mark.parametrize("what", CONTENTS)
def test_an_unreadable_store_is_named_with_what_to_do_and_left_as_it_is(tmp_path, what):
    path, before, files = unreadable(tmp_path, what)
    with pytest.raises(HarnessError) as err:
        use(f"sqlite:///{path}")
    message = str(err.value)
    assert message.startswith(f"history store {path} is not readable (")
    assert "move it aside" in message and "history=<another SQLAlchemy URL>" in message
    assert "\n" not in message and "sqlalche.me" not in message and "[SQL:" not in message
    assert path.read_bytes() == before, "never replaced, recreated or migrated"
    assert sorted(os.listdir(tmp_path)) == files, "no journal or new store left beside it"


@pytest.mark.parametrize("url,shown,hidden", [
    ("postgresql://me:s3cret@db.example/bench", "postgresql://me:***@db.example/bench", "s3cret"),
    ("nosuchdriver://me:s3cret@h/x", "nosuchdriver://me:***@h/x", "s3cret"),
    ("not a url", "not a url", None),
])
def test_a_store_that_cannot_be_opened_is_named_without_its_password(url, shown, hidden):
    assert store_name(url) == shown
    with pytest.raises(HarnessError) as err:
        History(url, remedy="pass --store <another SQLAlchemy URL>")
    assert str(err.value).startswith(f"history store {shown} cannot be used (")
    assert str(err.value).endswith(": pass --store <another SQLAlchemy URL>")
    assert hidden is None or hidden not in str(err.value)


def test_a_write_that_fails_half_way_leaves_the_store_as_it_was(tmp_path):
    store = History(f"sqlite:///{tmp_path / 'history.sqlite'}")
    store.add_bench("m", "cpu", "/results/a", typed([run(20.0, 1)]))
    twice = typed([run(30.0, 2), run(31.0, 2)])             # the same run id twice: the second insert fails
    with pytest.raises(HarnessError, match="cannot be used"):
        store.add_bench("m", "cpu", "/results/a", twice)   # would first delete the folder's earlier rows
    kept = store.bench_records("m", "cpu", 6)
    assert [(d, r.metrics["samples_per_s"]["value"]) for d, r in kept] == [("/results/a", 20.0)]


def test_the_machines_baseline_with_an_unreadable_store_is_a_note_naming_it(tmp_path):
    path, before, _ = unreadable(tmp_path, "random bytes")
    (tmp_path / "out").mkdir()
    records = typed([run(20.0)])
    result = judge(records, compare(records, []), "auto", tmp_path / "out")
    note = baseline_text(result, "")
    assert note.startswith(f"history store not used: {path} is not readable (file is not a database)")
    assert "move it aside" in note and "history=none" in note and "\n" not in note
    assert result.verdicts == [] and path.read_bytes() == before


def write_table(path, refs) -> None:
    path.write_text(json.dumps({"schema_version": "1.0", "references": [r.to_dict() for r in refs]}))


BAD_TABLES = {  # name: (content, the problem, then the start of what is said of it)
    "not-json.json": (b"{\"references\": [", "not a readable reference file", "Expecting value"),
    "random.json": (RANDOM, "not a readable reference file", "'utf-8' codec can't decode"),
    "schema.json": (json.dumps({"schema_version": "1.0", "references": [{"platform": "cpu"}]}).encode(),
                    "invalid reference file", "references/0: "),
}


@pytest.fixture
def tables(tmp_path, monkeypatch):
    """reference_results/ holding one table that parses and three that do not."""
    folder = tmp_path / "reference_results"
    folder.mkdir()
    good = [reference([20.0, 20.5, 19.5], env=LAPTOP)]
    write_table(folder / "good.json", good)
    for name, (data, _, _) in BAD_TABLES.items():
        (folder / name).write_bytes(data)
    monkeypatch.setattr(harness.verdict.references, "REFERENCE_DIR", folder)
    return folder, good


def test_a_table_that_does_not_parse_is_left_out_and_named_in_one_line(tables):
    folder, good = tables
    read = read_references()
    assert read.references == good
    lines = {e.path.name: e.line() for e in read.unreadable}
    assert sorted(lines) == sorted(BAD_TABLES)
    for name, (_, problem, detail) in BAD_TABLES.items():
        assert lines[name].startswith(f"{folder / name}: {problem}: {detail}") and "\n" not in lines[name]
    assert "required property (and " in lines["schema.json"], "several problems: the first, and how many more"


@pytest.mark.parametrize("name", BAD_TABLES)
def test_compare_given_a_table_that_does_not_parse_stops_naming_it(tables, tmp_path, capsys, name):
    folder, _ = tables
    with pytest.raises(ReferenceFileError, match=f"^{folder / name}: "):
        load_references([folder / "good.json", folder / name])
    record = tmp_path / "r.json"
    record.write_text(json.dumps(run(20.0)))
    assert main(["compare", str(record), "--reference", str(folder / name)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {folder / name}: {BAD_TABLES[name][1]}")
    assert "Traceback" not in err
    assert main(["compare", str(record)]) == 2, "the default tables: reference_results/*.json"
    assert capsys.readouterr().err.startswith(f"error: {folder / 'not-json.json'}: not a readable reference file")


def test_bench_with_an_unreadable_store_and_a_bad_table_still_writes_its_verdicts(tables, tmp_path, capsys):
    _, good = tables
    path, before, _ = unreadable(tmp_path, "random bytes")
    out = tmp_path / "out"
    out.mkdir()
    records = typed([run(v, i) for i, v in enumerate([19.8, 20.1, 20.3])])
    expected = compare(records, good)
    assert any(v.verdict != "new" for v in expected), "judged against the table that parses"
    compare_with_references(records, out, "auto")
    printed, md = capsys.readouterr().out, (out / "compare.md").read_text()
    for text in (printed, md):
        assert verdict_counts(expected) in text
        assert "samples_per_s" in text
        for name in BAD_TABLES:
            assert f"reference table left out: {tables[0] / name}: " in text
        assert f"history store not used: {path} is not readable (file is not a database)" in text
    assert path.read_bytes() == before


def test_the_nightly_with_an_unreadable_store_stops_before_it_runs_naming_it(tmp_path, capsys, monkeypatch):
    path, before, files = unreadable(tmp_path, "random bytes")
    monkeypatch.setattr("harness.nightly.run_night", lambda *a, **k: pytest.fail("ran with an unreadable store"))
    status = main(["nightly", "--store", f"sqlite:///{path}", "--reference", "none", f"out={tmp_path / 'night'}"])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert err == (f"error: history store {path} is not readable (file is not a database); it is left as it is: "
                   "move it aside (a new store starts there), or pass --store <another SQLAlchemy URL>\n")
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == files



@pytest.mark.parametrize("night", ["../x", "a/b", "", "-x", "night one", "x" * 65])
def test_a_night_id_that_is_no_name_stops_the_nightly_before_anything(tmp_path, capsys, monkeypatch, night):
    """`--night ../x` used to run the suite, store a night '../x' and write results/nightly-cpu-../x/."""
    monkeypatch.setattr("harness.nightly.run_night", lambda *a, **k: pytest.fail("ran with a bad night id"))
    store = tmp_path / "history.sqlite"
    status = main(["nightly", f"--night={night}", "--store", f"sqlite:///{store}", "--reference", "none",
                   f"out={tmp_path / 'night'}"])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert err.startswith(f"error: --night {night!r} is invalid: a night id is letters, digits, ")
    assert not store.exists() and not (tmp_path / "night").exists()
