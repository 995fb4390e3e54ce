"""The history store as a team's shared PostgreSQL database (issue 29), run for real against a
private server (tests/integration/conftest.py: postgres_server): the schema created and upgraded
there by the same migrations as SQLite (and what benches' reruns read, counted by `alarms`), two platforms' nightlies writing into one store at the same
time, a nightly SIGKILLed in the middle of a write, `bench history=postgresql://...`, and a store
that cannot be reached or refuses the login."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from harness.errors import HarnessError
from harness.verdict.history import History
from harness.verdict.store_migrations import HEAD

from .conftest import REPO, wait_for

pytestmark = pytest.mark.integration
QUICK = ["suite=single", "workload.micro_batch_size=4", "measure.warmup_steps=1", "measure.steps=3",
         "measure.profile_steps=0"]
FIXTURE = REPO / "tests" / "data" / "history" / "store-8aa740d.sqlite"


def nightly_args(url, night, out, *extra, repeats=1):
    """Judged against its own earlier nights only (--reference none): nothing here depends on this
    machine's speed."""
    return ["--night", night, "--repeats", str(repeats), "--store", url, "--reference", "none", f"out={out}",
            *QUICK, *extra]


def nightly(url, night, out, *extra, repeats=1):
    return [sys.executable, "-m", "harness", "nightly", *nightly_args(url, night, out, *extra, repeats=repeats)]


def run(cmd, timeout=900):
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def engine(url):
    import sqlalchemy as sa

    return sa.create_engine(url)


def count(url, table):
    import sqlalchemy as sa

    with engine(url).connect() as c:
        return c.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar()


def test_an_unversioned_store_is_upgraded_on_postgresql_and_a_newer_one_refused(pg_store, capsys):
    """The store of suite 8aa740d (no schema version), carried into PostgreSQL row for row: opening it
    stamps and upgrades it in place, every row kept; a revision newer than the suite's is refused by
    name and the store is not written."""
    import sqlalchemy as sa

    old = engine(f"sqlite:///{FIXTURE}")
    meta = sa.MetaData()
    meta.reflect(bind=old)
    assert set(meta.tables) == {"nights", "runs", "bench_runs"}
    pg = engine(pg_store)
    meta.create_all(pg)
    rows = {}
    with old.connect() as src, pg.begin() as dst:
        for name, table in meta.tables.items():
            data = [dict(r._mapping) for r in src.execute(table.select())]
            rows[name] = len(data)
            if data:
                dst.execute(table.insert(), data)
    assert rows["runs"] > 0 and rows["nights"] > 0

    store = History(pg_store)
    assert store.upgraded and f"schema 0001 -> {HEAD}, every row kept" in store.upgraded
    assert "schema 0001" in capsys.readouterr().err
    assert {name: count(pg_store, name) for name in rows} == rows
    with pg.connect() as c:
        assert c.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == HEAD
        indexes = {r[0] for r in c.execute(sa.text("SELECT indexname FROM pg_indexes WHERE schemaname = 'public'"))}
    assert "ix_runs_platform_night" in indexes
    assert len(store.records("cpu")) == 8                 # the fixture's runs, read back through the validator
    # what a bench's reruns read (0004; harness/verdict/alarms.py), kept and counted there as in SQLite
    row = dict(record_id="00-llama-tiny", metric="samples_per_s", against="baseline", benchmark="llama-tiny",
               unit="samples/s", reference=70.0, tolerance_pct=10.0, first_value=50.0, first_worse_pct=28.6,
               reruns="[69.0, 71.0]", failed="[]", beyond=1, outcome="not repeated", final_verdict="pass",
               final_value=69.0)
    for _ in range(2):                                    # the folder kept again replaces its rows
        store.add_confirmations("host-a", "cpu", "/out/a", 2, '[["llama-tiny", "samples_per_s", "baseline", 1]]',
                                [row])
    assert count(pg_store, "confirm_benches") == 1 and count(pg_store, "confirmations") == 1
    said = run([sys.executable, "-m", "harness", "alarms", "--store", pg_store, "--markdown"])
    assert said.returncode == 0, said.stderr
    assert "| llama-tiny | samples_per_s | baseline | 1 | 1 | 0 | 0 | 1 | 100.0 % | +29 % | - | 10 % | >= 29 % |" \
        in said.stdout, said.stdout

    with pg.begin() as c:
        c.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    with pytest.raises(HarnessError, match=r"schema revision 9999, newer than this suite's .* left as it is"):
        History(pg_store)
    assert {name: count(pg_store, name) for name in rows} == rows


def test_two_platforms_nightlies_write_one_store_at_the_same_time(pg_store, tmp_path):
    """`make nightly ARGS="--store postgresql://..."` for cpu and `python -m harness nightly` for a
    second cpu platform, started together on one new store: both create it (one migrates, the other
    waits), both nights are stored whole, and each reads back only its own."""
    night = "2026-11-10"
    make = subprocess.Popen(["make", "-s", "nightly", "PLATFORM=cpu",
                             "ARGS=" + " ".join(nightly_args(pg_store, night, tmp_path / "cpu"))],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    other = subprocess.Popen(nightly(pg_store, night, tmp_path / "cpu-b", "platform=cpu", "platform.name=cpu-b"),
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    outs = {}
    try:
        for name, proc in (("cpu", make), ("cpu-b", other)):
            stdout, stderr = proc.communicate(timeout=900)
            outs[name] = (proc.returncode, stdout, stderr)
    finally:
        for proc in (make, other):
            proc.kill()
    for name, (rc, stdout, stderr) in outs.items():
        assert rc == 0, f"{name}: {stdout[-2000:]}\n{stderr[-2000:]}"
        assert f"night {night} vs baseline" in stdout
    store = History(pg_store)
    for platform in ("cpu", "cpu-b"):
        stored = store.records(platform, [night])
        assert [rec.platform for _, rec in stored] == [platform]
        assert stored[0][1].status == "ok"
    assert count(pg_store, "nights") == 2 and count(pg_store, "runs") == 2
    with engine(pg_store).connect() as c:
        import sqlalchemy as sa

        finished = c.execute(sa.text("SELECT count(*) FROM nights WHERE finished_utc IS NOT NULL")).scalar()
    assert finished == 2

    # every platform's last night on one page (issue 29 item 4)
    page = tmp_path / "overview.html"
    shown = run([sys.executable, "-m", "harness", "nightly", "--overview", str(page), "--store", pg_store,
                 "--reference", "none"], timeout=300)
    assert shown.returncode == 0, shown.stdout[-2000:] + shown.stderr[-2000:]
    for platform in ("cpu", "cpu-b"):
        assert f"{platform} {night}: 1 runs, 0 failed; references: 6 new; baseline: 6 new" in shown.stdout
        assert f"<td>{platform}</td><td>{night}</td><td>1 (0 failed)</td>" in page.read_text()
    assert (tmp_path / platform / "nightly.html").as_uri() in page.read_text()


def test_a_nightly_killed_in_the_middle_of_a_write_leaves_the_store_whole_and_resumes(pg_store, postgres_server,
                                                                                      tmp_path):
    """The nightly's first INSERT of a run is held by a lock this test takes on the runs table, so the
    nightly is inside its write transaction when it gets SIGKILL. The store then holds the night and
    no part of that run; the run's record is on disk. The same night run again stores that record
    from its file (not redone), runs the rest, and the store ends with each run exactly once."""
    import sqlalchemy as sa

    night, out = "2026-11-11", tmp_path / "night"
    History(pg_store)                                                 # the schema, before the lock
    holder = engine(pg_store).connect()
    held = holder.begin()
    holder.execute(sa.text("LOCK TABLE runs IN SHARE MODE"))        # reads go on, inserts wait
    proc = subprocess.Popen(nightly(pg_store, night, out, repeats=2), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    database = pg_store.rsplit("/", 1)[1]
    try:
        wait_for(lambda: postgres_server.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO runs%'",
            database) == "1", 600, "the nightly's INSERT waiting on the lock")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
        held.rollback()
        holder.close()
    assert proc.returncode == -signal.SIGKILL
    assert count(pg_store, "runs") == 0                               # nothing of the killed write
    assert count(pg_store, "nights") == 1
    on_disk = out / "repeat-0" / "00-llama-tiny.json"
    assert on_disk.is_file()
    written = json.loads(on_disk.read_text())

    resumed = run(nightly(pg_store, night, out, repeats=2))
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-2000:]
    assert "00-llama-tiny: finished before but not stored: stored from its record file(s), not redone" \
        in resumed.stdout
    store = History(pg_store)
    stored = store.records("cpu", [night])
    assert len(stored) == 2 and count(pg_store, "runs") == 2
    assert stored[0][1].created_utc == written["created_utc"]        # the record of the killed nightly, kept


def test_bench_keeps_its_runs_in_a_postgresql_store(pg_store, tmp_path):
    """`bench history=postgresql://...`: the run is stored in bench_runs, by machine."""
    result = run([sys.executable, "-m", "harness", "bench", "confirm_regressions=0", f"out={tmp_path / 'b'}", f"history={pg_store}", *QUICK])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert count(pg_store, "bench_runs") == 1
    import sqlalchemy as sa

    with engine(pg_store).connect() as c:
        row = c.execute(sa.text("SELECT platform, run_id, status FROM bench_runs")).one()
    assert tuple(row) == ("cpu", "00-llama-tiny", "ok")


@pytest.mark.parametrize("wrong,cause", [("password", "password authentication failed"),
                                         ("port", "Connection refused")])
def test_a_store_that_refuses_or_is_not_there_is_one_line_and_the_records_stay(postgres_server, pg_store, tmp_path,
                                                                               wrong, cause):
    """A wrong password or a port nobody listens on: the nightly stops before any run with one line
    naming the store (password hidden) and the cause; the records already in its folder are kept."""
    url = postgres_server.url(pg_store.rsplit("/", 1)[1], **({"password": "not-it"} if wrong == "password"
                                                             else {"port": _closed_port()}))
    out = tmp_path / "night"
    (out / "repeat-0").mkdir(parents=True)
    kept = out / "repeat-0" / "00-llama-tiny.json"
    kept.write_text(json.dumps({"written": "by an earlier night"}))
    before = kept.read_bytes()
    result = run(nightly(url, "2026-11-12", out), timeout=120)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: history store postgresql://suite:***@127.0.0.1:")
    assert cause in lines[0] and "not-it" not in result.stderr + result.stdout
    assert kept.read_bytes() == before and not (out / "repeat-0" / "runs").exists()


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
