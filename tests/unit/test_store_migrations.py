"""The history store's schema versions (harness/verdict/store_migrations, issue 29 item 2): a store written by
an earlier suite is upgraded in place with every row kept, a new one is created at the head revision,
and a store of a newer suite is refused by name and left byte for byte as it was."""
from __future__ import annotations

import hashlib
import shutil
import sqlite3
from pathlib import Path

import pytest
import unit_helpers  # noqa: F401  (puts the repository root on sys.path)

from harness.errors import HarnessError
from harness.verdict.history import History
from harness.verdict.store_migrations import BASELINE, HEAD

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "history" / "store-8aa740d.sqlite"
"""A store written by suite commit 8aa740d (unversioned: nights, runs, bench_runs), 2 nights x 2
platforms of real records (reference_results/sources/cluster-scale)."""
TABLES = ("nights", "runs", "bench_runs")


def _rows(path: Path) -> dict[str, list[tuple]]:
    with sqlite3.connect(path) as c:
        return {t: sorted(c.execute(f"SELECT * FROM {t}").fetchall()) for t in TABLES}


def _columns(path: Path) -> dict[str, list[tuple]]:
    """Per table: (name, type, notnull, pk) of every column."""
    with sqlite3.connect(path) as c:
        return {t: [(r[1], r[2], r[3], r[5]) for r in c.execute(f"PRAGMA table_info({t})")] for t in TABLES}


def test_a_store_of_the_unversioned_suite_is_upgraded_in_place_keeping_every_row(tmp_path, capsys):
    store = tmp_path / "history.sqlite"
    shutil.copy(FIXTURE, store)
    before = _rows(store)
    assert {t: len(v) for t, v in before.items()} == {"nights": 4, "runs": 16, "bench_runs": 6}
    h = History(f"sqlite:///{store}")
    assert h.upgraded == f"history store {store}: schema {BASELINE} -> {HEAD}, every row kept"
    assert h.upgraded in capsys.readouterr().err
    # not one row lost or changed; a night gains its host (0003), unknown for the nights stored before
    assert _rows(store) == {**before, "nights": [(*row, None) for row in before["nights"]]}
    with sqlite3.connect(store) as c:
        assert c.execute("SELECT version_num FROM alembic_version").fetchall() == [(HEAD,)]
        indexes = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"ix_runs_platform_night", "ix_nights_platform_night", "ix_bench_runs_machine_platform"} <= indexes
    assert len(h.records("cpu")) == 8 and h.earlier_nights("cpu", "2026-11-23", 5) == ["2026-11-21", "2026-11-22"]
    assert len(h.bench_records("host-a", "cpu", 3)) == 4
    assert h.confirmation_rows() == ([], [])                         # what benches' reruns read (0004): none yet
    assert History(f"sqlite:///{store}").upgraded is None             # at the head: nothing to do


def test_a_new_store_is_created_at_the_head_with_the_baselines_tables(tmp_path):
    store = tmp_path / "new.sqlite"
    h = History(f"sqlite:///{store}")
    assert h.upgraded is None
    with sqlite3.connect(store) as c:
        assert c.execute("SELECT version_num FROM alembic_version").fetchall() == [(HEAD,)]
    # the baseline migration is the schema the old suite wrote; since, the host that started a night (0003)
    assert _columns(store) == {**_columns(FIXTURE), "nights": [*_columns(FIXTURE)["nights"], ("host", "VARCHAR(255)", 0, 0)]}
    with sqlite3.connect(store) as c:                                 # and what benches' reruns read (0004)
        assert {"confirm_benches", "confirmations"} <= {r[0] for r in c.execute("SELECT name FROM sqlite_master")}
    h.start_night("2026-11-26", "cpu", "nightly-cpu", "out")
    assert not h.start_night("2026-11-26", "cpu", "nightly-cpu", "out")


def test_a_store_of_a_newer_suite_is_refused_by_name_and_never_written(tmp_path):
    store = tmp_path / "history.sqlite"
    shutil.copy(FIXTURE, store)
    History(f"sqlite:///{store}")
    with sqlite3.connect(store) as c:
        c.execute("UPDATE alembic_version SET version_num = '0099'")
    digest = hashlib.sha256(store.read_bytes()).hexdigest()
    with pytest.raises(HarnessError, match=rf"history store {store} is at schema revision 0099, newer than this "
                                           rf"suite's {HEAD}.*left as it is.*pass --store"):
        History(f"sqlite:///{store}", remedy="pass --store <another SQLAlchemy URL>")
    assert hashlib.sha256(store.read_bytes()).hexdigest() == digest


def test_two_suites_opening_one_new_store_at_once_both_go_on(tmp_path):
    """Four processes (as nightlies of several platforms are) create one store at the same moment."""
    import subprocess
    import sys

    store = tmp_path / "shared.sqlite"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from harness.verdict.history import History; "
            "History(sys.argv[2]); print('ok')")
    repo = str(Path(__file__).resolve().parents[2])
    procs = [subprocess.Popen([sys.executable, "-c", code, repo, f"sqlite:///{store}"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    with sqlite3.connect(store) as c:
        assert c.execute("SELECT version_num FROM alembic_version").fetchall() == [(HEAD,)]


def test_a_store_at_the_head_is_opened_without_importing_alembic(tmp_path):
    """Every bench, compare and nightly opens its store; Alembic (~0.25 s to import on one core) is
    loaded only to create or upgrade one."""
    import subprocess
    import sys

    store = tmp_path / "history.sqlite"
    History(f"sqlite:///{store}")
    code = ("import sys; from harness.verdict.history import History; h = History(sys.argv[1]); "
            "print(h.upgraded, sorted(m for m in sys.modules if m.split('.')[0] == 'alembic'))")
    out = subprocess.run([sys.executable, "-c", code, f"sqlite:///{store}"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], check=True).stdout
    assert out.strip() == "None []"


def test_a_migration_that_fails_midway_leaves_the_store_as_it_was_and_a_later_opening_upgrades_it(tmp_path,
                                                                                                monkeypatch):
    """SQLite's driver commits each CREATE on its own unless a transaction was begun explicitly: a migration
    stopped after its first index (a full disk, a killed nightly) must leave no index behind, or every later
    opening fails on 'index already exists'. The same holds two suites apart: the other one must never see
    a half-made schema (tables, no alembic_version), or it stamps and migrates it a second time."""
    from alembic.operations import Operations

    store = tmp_path / "history.sqlite"
    shutil.copy(FIXTURE, store)
    digest = hashlib.sha256(store.read_bytes()).hexdigest()
    made = []
    real = Operations.create_index

    def second_index_fails(self, name, *args, **kwargs):
        made.append(name)
        if len(made) == 2:
            raise OSError("disk full (injected)")
        return real(self, name, *args, **kwargs)

    monkeypatch.setattr(Operations, "create_index", second_index_fails)
    with pytest.raises(OSError, match="injected"):
        History(f"sqlite:///{store}")
    assert made == ["ix_runs_platform_night", "ix_nights_platform_night"]
    assert hashlib.sha256(store.read_bytes()).hexdigest() == digest      # not stamped, no index: as it was
    monkeypatch.setattr(Operations, "create_index", real)
    assert History(f"sqlite:///{store}").upgraded == f"history store {store}: schema {BASELINE} -> {HEAD}, every row kept"


def test_a_suite_opening_a_store_while_another_creates_it_waits_and_finds_it_at_the_head(tmp_path):
    """The race behind the once-seen failure of the test above, made certain: one suite creates the store and is held
    inside its first migration (0.4 s after each table it makes), and a second opens the store meanwhile. The second
    must wait for the first's one transaction, then find the store at the head. Before BEGIN IMMEDIATE it saw the
    first table alone (SQLite's driver had committed it), took the store for empty, failed to create that table
    three times over and gave up."""
    import subprocess
    import sys
    import time

    store, marker = tmp_path / "shared.sqlite", tmp_path / "migrating"
    repo = str(Path(__file__).resolve().parents[2])
    slow = ("import sys, time, pathlib; sys.path.insert(0, sys.argv[1]); from alembic.operations import Operations; "
            "real = Operations.create_table\n"
            "def held(self, *a, **k):\n    made = real(self, *a, **k); pathlib.Path(sys.argv[3]).touch(); time.sleep(0.4)\n"
            "    return made\n"
            "Operations.create_table = held\n"
            "from harness.verdict.history import History; History(sys.argv[2]); print('ok')")
    opener = ("import sys; sys.path.insert(0, sys.argv[1]); from harness.verdict.history import History; "
              "print(History(sys.argv[2]).upgraded)")
    first = subprocess.Popen([sys.executable, "-c", slow, repo, f"sqlite:///{store}", str(marker)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not marker.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert marker.exists(), first.communicate()
    second = subprocess.run([sys.executable, "-c", opener, repo, f"sqlite:///{store}"], capture_output=True,
                            text=True, timeout=120)
    out, err = first.communicate(timeout=120)
    assert (first.returncode, out.strip()) == (0, "ok"), err
    assert (second.returncode, second.stdout.strip()) == (0, "None"), second.stderr    # nothing left to upgrade
    with sqlite3.connect(store) as c:
        assert c.execute("SELECT version_num FROM alembic_version").fetchall() == [(HEAD,)]


def test_a_night_started_on_another_host_is_refused_before_anything_runs_and_an_older_one_is_anyones(tmp_path):
    """A shared store takes several machines' nightlies: a second machine under the first's night id would skip
    every run the first stored and be judged with it (harness/nightly.py one_host)."""
    import socket

    from harness.nightly import one_host

    store = tmp_path / "history.sqlite"
    shutil.copy(FIXTURE, store)
    h = History(f"sqlite:///{store}")
    (night, platform), = {(n, p) for n, p in sqlite3.connect(store).execute("SELECT night, platform FROM nights")
                          if (n, p) == ("2026-11-21", "cpu")}
    one_host(h, night, platform)                      # stored before hosts were: anyone's to resume
    h.start_night("2026-12-06", "cpu", "nightly-cpu", "/results/ci-a", host="ci-a")
    assert h.night_host("2026-12-06", "cpu") == ("ci-a", "/results/ci-a")
    assert h.night_host("2026-12-07", "cpu") is None
    here = socket.gethostname()
    with pytest.raises(HarnessError, match=rf"night 2026-12-06 of platform cpu in the history store .* was started "
                                           rf"on host ci-a \(its results in /results/ci-a\); this is {here}: .*"
                                           rf"--night 2026-12-06-{here}"):
        one_host(h, "2026-12-06", "cpu")
    one_host(h, "2026-12-06", "cpu-cluster")          # another platform's night of that id
    h.start_night("2026-12-07", "cpu", "nightly-cpu", "/results/here", host=here)
    one_host(h, "2026-12-07", "cpu")                  # this host's own night: resumed
