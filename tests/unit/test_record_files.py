"""The one loader of result records (harness/verdict/record_files.py): what a record is (the schema), what a
folder holds, and how a reader is told about what is not a record."""
from __future__ import annotations

import json

import pytest
from test_compare_against import record, write

from harness.errors import HarnessError
from harness.record import ResultRecord
from harness.verdict.record_files import load_record, load_records, read_json


def test_a_record_round_trips_through_the_typed_record(tmp_path):
    data = record("r0", 20.0)
    typed = ResultRecord.from_dict(data)
    assert typed.run_id == "r0" and typed.metrics["samples_per_s"]["value"] == 20.0
    assert {k: v for k, v in typed.to_dict().items() if k in data} == data
    typed.metrics["samples_per_s"]["value"] = 1.0
    assert data["metrics"]["samples_per_s"]["value"] == 20.0, "from_dict copies, never keeps the caller's dict"


def test_a_dict_that_is_not_a_record_is_refused_naming_where_and_what(tmp_path):
    bad = record("r0", 20.0)
    del bad["overrides"]
    bad["status"] = "fine"
    with pytest.raises(HarnessError, match=r"r0\.json: not a valid record .*'overrides' is a required property"):
        ResultRecord.from_dict(bad, "out/r0.json")


def test_a_folder_s_records_are_loaded_and_what_is_not_one_is_skipped_or_refused(tmp_path):
    folder = tmp_path / "out"
    write(folder, [record("r0", 20.0), record("r1", 21.0)])
    (folder / "suite.json").write_text(json.dumps({"suite": "default"}))       # beside the records: never read
    (folder / "tune-state.json").write_text(json.dumps({"step": 2}))            # JSON, not a record
    (folder / "broken.json").write_text("{not json")
    loaded = load_records([folder])
    assert [r.run_id for _, r in loaded.records] == ["r0", "r1"]
    assert [line.split(": ", 1)[1].split(":")[0] for line in loaded.skipped] == ["not a readable JSON file",
                                                                                   "not a valid record"]
    with pytest.raises(HarnessError) as err:
        load_records([folder], strict=True, heading="cannot compare")
    lines = str(err.value).splitlines()
    assert lines[0] == "cannot compare:" and len(lines) == 3 and "broken.json" in lines[1] and "tune-state" in lines[2]


def test_a_named_file_that_is_not_a_record_is_an_error_and_nothing_is_half_loaded(tmp_path):
    write(tmp_path / "out", [record("r0", 20.0)])
    notes = tmp_path / "notes.json"
    notes.write_text(json.dumps({"notes": "x"}))
    with pytest.raises(HarnessError, match="notes.json: not a valid record"):
        load_records([tmp_path / "out", notes])
    with pytest.raises(HarnessError, match="nowhere: no such file or folder"):
        load_records([tmp_path / "nowhere"])
    assert load_record(tmp_path / "out" / "r0.json").run_id == "r0"
    with pytest.raises(HarnessError, match="not a readable JSON file"):
        read_json(tmp_path / "missing.json")


def test_a_folder_whose_records_lie_below_it_is_refused_naming_the_subfolders_that_hold_them(tmp_path):
    """Found pointing `compare` at a tune's OUT: its trials are in step1/, step2/, ...; beside them lie
    tune.json (its state, never read as a record) and run folders of logs and probes that hold no record."""
    from harness.verdict.compare import load_records as compare_records

    tune = tmp_path / "tune"
    write(tune / "step2", [record("r0", 20.0)])
    write(tune / "confirm" / "x", [record("r1", 21.0)])
    (tune / "tune.json").write_text(json.dumps({"steps": []}))
    (tune / "step2" / "runs" / "r0").mkdir(parents=True)
    (tune / "step2" / "runs" / "r0" / "rank0.json").write_text(json.dumps({"rank": 0}))
    with pytest.raises(HarnessError) as err:
        compare_records([str(tune)])
    assert str(err.value) == (f"no result records in {tune} (records lie in its subfolders: {tune / 'confirm' / 'x'}, "
                              f"{tune / 'step2'}; name them)")
    assert [r.run_id for r in compare_records([str(tune / "step2")])] == ["r0"]
