"""The nightly history store: every run of every night, across nights (SQLAlchemy).

Default: an embedded SQLite file (results/history.sqlite). A team's shared store is PostgreSQL
(postgresql://user:password@host/db; its driver, psycopg, is in the lock): every platform's nightly
writes into the one database, at the same time if they run at once (tests/integration/
test_postgres_store.py runs it for real). A night is one machine's: the store keeps the host that started it
(harness/nightly.py one_host refuses another host the same night id of a platform). A run's records are stored in one transaction once they
are written to disk; a night interrupted half-way is resumed from what the store holds, and a run
whose records reached the disk but not the store (the nightly killed, or the store gone, in between)
is stored from its record files, not redone.

`bench` keeps its runs here too (table bench_runs, by machine): on a machine with no reference of
its own, the earlier bench runs of that machine are its baseline (harness/verdict/baseline.py). And what its
regressions became when it ran them again (tables confirm_benches and confirmations: harness/verdict/alarms.py).
"""
from __future__ import annotations

import json
import re
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Iterator, Optional

from ..errors import HarnessError
from ..record import ResultRecord
from .store_migrations import upgrade

DEFAULT_URL = "sqlite:///results/history.sqlite"
CONNECT_TIMEOUT_S = 15
ANOTHER_STORE = "name another store"
"""What to do about a store that cannot be used, besides moving a damaged file aside: callers say it
with their own option (bench: history=..., the nightly: --store ...)."""


def store_file(url: str) -> Optional[str]:
    """The file of a SQLite store; None for an in-memory one, any other database or a URL that does not parse."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return parsed.database


def repo_url(url: str, root: Any) -> str:
    """A relative SQLite file's URL made a file of `root` (the repository: the nightly's --store and the alarms
    command read the same file from any working folder); any other URL as given."""
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        return f"sqlite:///{root / url[len('sqlite:///'):]}"
    return url


def store_name(url: str) -> str:
    """How a message names a store: a SQLite store by its file, any other by its URL without the password."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return store_file(url) or make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


def _connect_args(url: str) -> dict:
    """A server store that does not answer fails in CONNECT_TIMEOUT_S, not after the OS's TCP timeout
    (minutes), unless the URL sets its own connect_timeout."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return {}           # create_engine says what is wrong with it
    if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
        return {"connect_timeout": CONNECT_TIMEOUT_S}
    return {}


def _record(text: str, where: str) -> ResultRecord:
    """A stored record read back through the one validator (ResultRecord.from_dict)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise HarnessError(f"{where}: not readable JSON: {exc}") from None
    return ResultRecord.from_dict(data, where)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class History:
    """The store at `url`. Whatever the database says on opening, reading or writing (not a database,
    locked, read-only, a driver missing) is a HarnessError naming the store and what to do (`remedy`:
    the caller's option for another store); the store itself is left as it is, never recreated, and
    each write is one transaction, so a failed one leaves nothing half-written. Opening it brings its
    schema to this suite's revision (harness/verdict/store_migrations: created, or upgraded in place keeping
    every row; a store of a newer suite is refused, never written); `upgraded` says what was done."""

    def __init__(self, url: str = DEFAULT_URL, remedy: str = ANOTHER_STORE):
        import sqlalchemy as sa

        self.sa = sa
        self.name, self.file, self.remedy = store_name(url), store_file(url), remedy
        with self._errors_named():
            self.engine = sa.create_engine(url, connect_args=_connect_args(url))
            self.upgraded = upgrade(self.engine, self.name, remedy)
            # the tables as the migrations made them (harness/verdict/store_migrations: the one definition)
            meta = sa.MetaData()
            meta.reflect(bind=self.engine, only=["nights", "runs", "bench_runs", "confirm_benches", "confirmations"])
        self.nights, self.runs, self.bench_runs = (meta.tables[t] for t in ("nights", "runs", "bench_runs"))
        self.confirm_benches, self.confirmations = meta.tables["confirm_benches"], meta.tables["confirmations"]
        if self.upgraded:
            print(self.upgraded, file=sys.stderr)

    @contextmanager
    def _errors_named(self) -> Iterator[None]:
        """The one place where what the database (or its driver) raises becomes the user's message."""
        from sqlalchemy.exc import DatabaseError, SQLAlchemyError

        try:
            yield
        except (SQLAlchemyError, ImportError) as exc:
            cause = str(getattr(exc, "orig", None) or exc).splitlines()[0]
            if self.file and type(exc) is DatabaseError:   # sqlite3.DatabaseError: not a database, malformed
                raise HarnessError(f"history store {self.name} is not readable ({cause}); it is left as it is: "
                                   f"move it aside (a new store starts there), or {self.remedy}") from None
            raise HarnessError(f"history store {self.name} cannot be used ({cause}): {self.remedy}") from None

    @contextmanager
    def _db(self, write: bool = False) -> Iterator:
        """A connection; for a write, one transaction (committed whole or rolled back)."""
        with self._errors_named(), (self.engine.begin() if write else self.engine.connect()) as c:
            yield c

    def start_night(self, night: str, platform: str, suite: str, out_dir: str, host: Optional[str] = None) -> bool:
        """Register a night, started on `host`; False when it was registered before (a resumed night)."""
        with self._db(write=True) as c:
            found = c.execute(self.sa.select(self.nights.c.night).where(
                self.nights.c.night == night, self.nights.c.platform == platform)).first()
            if found is None:
                c.execute(self.nights.insert().values(night=night, platform=platform, suite=suite,
                                                      out_dir=out_dir, started_utc=_now(), host=host))
        return found is None

    def night_host(self, night: str, platform: str) -> Optional[tuple[Optional[str], str]]:
        """(the host that started the night, or None for a night stored before hosts were, its out_dir); None when
        the night was never started."""
        with self._db() as c:
            row = c.execute(self.sa.select(self.nights.c.host, self.nights.c.out_dir).where(
                self.nights.c.night == night, self.nights.c.platform == platform)).first()
        return None if row is None else (row.host, row.out_dir)

    def finish_night(self, night: str, platform: str) -> None:
        with self._db(write=True) as c:
            c.execute(self.nights.update().where(self.nights.c.night == night, self.nights.c.platform == platform)
                      .values(finished_utc=_now()))

    def night_started(self, night: str, platform: str) -> Optional[str]:
        """When the night was first started (ISO UTC), None when it never was."""
        with self._db() as c:
            return c.execute(self.sa.select(self.nights.c.started_utc).where(
                self.nights.c.night == night, self.nights.c.platform == platform)).scalar()

    def add_runs(self, night: str, platform: str, repeat: int, records: list[ResultRecord]) -> None:
        """One run's records (a collective sweep has one per op) in one transaction: all or none."""
        now = _now()
        with self._db(write=True) as c:
            for record in records:
                c.execute(self.runs.insert().values(night=night, platform=platform, repeat=repeat,
                                                    run_id=record.run_id, benchmark=record.benchmark,
                                                    status=record.status, created_utc=now,
                                                    record=json.dumps(record.to_dict())))

    def finished(self, night: str, platform: str) -> set[tuple[int, str]]:
        """(repeat, run_id) of the runs this night already stored."""
        with self._db() as c:
            rows = c.execute(self.sa.select(self.runs.c.repeat, self.runs.c.run_id).where(
                self.runs.c.night == night, self.runs.c.platform == platform)).all()
        return {(r.repeat, r.run_id) for r in rows}

    def records(self, platform: str, nights: Optional[list[str]] = None) -> list[tuple[str, ResultRecord]]:
        """(night, record) of the platform's runs, oldest night first; only the given nights if any."""
        return [(night, rec) for night, _, rec in self._runs(platform, nights)]

    def repeats(self, platform: str, night: str) -> list[tuple[int, ResultRecord]]:
        """(repeat, record) of one night's runs, the first repeat first."""
        return [(repeat, rec) for _, repeat, rec in self._runs(platform, [night])]

    def _runs(self, platform: str, nights: Optional[list[str]]) -> list[tuple[str, int, ResultRecord]]:
        query = self.sa.select(self.runs.c.night, self.runs.c.repeat, self.runs.c.record).where(
            self.runs.c.platform == platform)
        if nights is not None:
            query = query.where(self.runs.c.night.in_(nights))
        with self._db() as c:
            rows = c.execute(query.order_by(self.runs.c.night, self.runs.c.repeat, self.runs.c.run_id)).all()
        return [(r.night, r.repeat, _record(r.record, f"{self.name}: run of night {r.night}")) for r in rows]

    def last_nights(self) -> list[tuple[str, str, str, Optional[str]]]:
        """(platform, night, out_dir, finished_utc or None) of each platform's latest night, by platform."""
        n = self.nights.c
        with self._db() as c:
            rows = c.execute(self.sa.select(n.platform, n.night, n.out_dir, n.finished_utc)
                             .order_by(n.platform, n.night.desc())).all()
        latest: dict[str, tuple[str, str, str, Optional[str]]] = {}
        for r in rows:
            latest.setdefault(r.platform, (r.platform, r.night, r.out_dir, r.finished_utc))
        return list(latest.values())

    def earlier_nights(self, platform: str, night: str, count: int) -> list[str]:
        """The last `count` finished nights of the platform before `night`, oldest first."""
        with self._db() as c:
            rows = c.execute(self.sa.select(self.nights.c.night).where(
                self.nights.c.platform == platform, self.nights.c.night < night,
                self.nights.c.finished_utc.is_not(None)).order_by(self.nights.c.night.desc()).limit(count)).all()
        return sorted(r.night for r in rows)

    def add_bench(self, machine: str, platform: str, out_dir: str, records: list[ResultRecord]) -> None:
        """One bench invocation's records, in one transaction (all or none); a folder stored before
        (collected again) is replaced."""
        now, bench = _now(), self.bench_runs.c
        with self._db(write=True) as c:
            c.execute(self.bench_runs.delete().where(bench.machine == machine, bench.platform == platform,
                                                     bench.out_dir == out_dir))
            for rec in records:
                c.execute(self.bench_runs.insert().values(
                    machine=machine, platform=platform, out_dir=out_dir, run_id=rec.run_id,
                    benchmark=rec.benchmark, status=rec.status, created_utc=now, record=json.dumps(rec.to_dict())))

    def bench_records(self, machine: str, platform: str, last: int) -> list[tuple[str, ResultRecord]]:
        """(out_dir, record) of the machine's last `last` bench invocations on the platform, oldest first."""
        bench = self.bench_runs.c
        with self._db() as c:
            outs = c.execute(self.sa.select(bench.out_dir, self.sa.func.min(bench.created_utc).label("at"))
                             .where(bench.machine == machine, bench.platform == platform)
                             .group_by(bench.out_dir).order_by(self.sa.desc("at")).limit(last)).all()
            if not outs:
                return []
            rows = c.execute(self.sa.select(bench.out_dir, bench.created_utc, bench.record)
                             .where(bench.machine == machine, bench.platform == platform,
                                    bench.out_dir.in_([o.out_dir for o in outs]))
                             .order_by(bench.created_utc, bench.run_id)).all()
        return [(r.out_dir, _record(r.record, f"{self.name}: run of {r.out_dir}")) for r in rows]

    def add_confirmations(self, machine: str, platform: str, out_dir: str, times: int, judged: str,
                          rows: list[dict], source: str = "bench") -> None:
        """One bench's confirmation (harness/verdict/alarms.py: `judged`, its first verdicts counted, JSON; `rows`, the
        regressions its first runs read and what their reruns read) in one transaction; a folder kept before is
        replaced. source: 'bench', or 'nightly' (a night's first repeat judged alone, its other repeats the reruns)."""
        now = _now()
        with self._db(write=True) as c:
            for table in (self.confirm_benches, self.confirmations):
                c.execute(table.delete().where(table.c.machine == machine, table.c.platform == platform,
                                               table.c.out_dir == out_dir))
            c.execute(self.confirm_benches.insert().values(machine=machine, platform=platform, out_dir=out_dir,
                                                           times=times, judged=judged, created_utc=now,
                                                           source=source))
            for row in rows:
                c.execute(self.confirmations.insert().values(machine=machine, platform=platform, out_dir=out_dir,
                                                             created_utc=now, **row))

    def confirmation_rows(self, platform: Optional[str] = None) -> tuple[list[Any], list[Any]]:
        """(the benches that ran their regressions again, the regressions they read), oldest first; one platform's
        where given. Rows as the database returns them (attributes named as the columns)."""
        benches, found = self.confirm_benches, self.confirmations
        with self._db() as c:
            out = []
            for table in (benches, found):
                query = self.sa.select(table)
                if platform is not None:
                    query = query.where(table.c.platform == platform)
                out.append(c.execute(query.order_by(table.c.created_utc, table.c.out_dir)).all())
        return out[0], out[1]
