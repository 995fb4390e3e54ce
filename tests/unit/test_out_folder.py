"""out= that cannot be a results folder (a file is there, its parent is a file, /proc/...): one clear error
before anything runs, for bench, tune and the nightly (bench used to stop with FileNotFoundError's traceback)."""
from __future__ import annotations

import pytest

import unit_helpers  # noqa: F401  (puts the repository root on sys.path)

from harness.__main__ import main


def _never(*a, **k):
    pytest.fail("a run was launched")


@pytest.mark.parametrize("command", [["bench", "suite=smoke"], ["bench", "--dry-run", "suite=smoke"], ["tune"],
                                     ["nightly", "--reference", "none"]])
@pytest.mark.parametrize("where", ["file", "below a file"])
def test_an_out_that_cannot_be_a_folder_stops_before_anything_naming_it(tmp_path, capsys, monkeypatch, command,
                                                                          where):
    monkeypatch.setattr("harness.bench.execute", _never)
    monkeypatch.setattr("harness.nightly.run_night", _never)
    monkeypatch.setattr("harness.tune.tuner.Tuner.run", _never)
    blocker = tmp_path / "taken"
    blocker.write_text("a file\n", encoding="utf-8")
    out = blocker if where == "file" else blocker / "out"
    extra = [f"--store=sqlite:///{tmp_path / 'history.sqlite'}"] if command[0] == "nightly" else []
    status = main([*command, *extra, f"out={out}"])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err, err
    assert err.startswith(f"error: out={out} cannot be a results folder: "), err
    assert ("a file is there" if where == "file" else "Not a directory") in err
    assert blocker.read_text(encoding="utf-8") == "a file\n"
