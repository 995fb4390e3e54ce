"""The history store's schema, versioned with Alembic (harness/verdict/history.py opens every store through
`upgrade`): `versions/` holds one migration per schema revision, oldest first, and the store's own
`alembic_version` table says which revision it is at.

On opening, a store is brought to this suite's revision (HEAD) in one transaction:
- an empty database gets every table, from the first revision on;
- a store written before the schema was versioned (the three tables, no `alembic_version`: every
  store of suite commits up to 8aa740d) is stamped as the baseline revision, then upgraded, every
  row kept;
- a store at an older revision is upgraded;
- a store at a revision this suite does not know (written by a newer suite) is refused by name and
  never written: the suite that reads it must be at least as new.

To change the schema: add `versions/NNNN_<what>.py` with `revision`, `down_revision` and an
`upgrade()` using alembic.op, then set HEAD. Migrations never import the suite's own table
definitions: each describes its schema as it was.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ...errors import HarnessError

SCRIPT_DIR = Path(__file__).resolve().parent
"""Alembic's script location: the migrations are in its versions/."""
HEAD = "0005"
"""The revision this suite writes and reads."""
BASELINE = "0001"
"""The schema of every store written before versioning: nights, runs, bench_runs."""
UNVERSIONED_TABLES = {"nights", "runs", "bench_runs"}
MIGRATION_LOCK = 0x5e1f_2900
"""PostgreSQL advisory lock key held while a suite creates or upgrades a shared store."""


def _script() -> Any:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPT_DIR))
    return cfg, ScriptDirectory.from_config(cfg)


def revision_of(connection: Any) -> Optional[str]:
    """The store's revision: its alembic_version, else BASELINE when it holds the unversioned tables,
    else None (an empty database). Read with SQLAlchemy: Alembic, whose import costs every command that
    opens a store ~0.25 s on one core, is loaded only to create or upgrade one."""
    import sqlalchemy as sa

    tables = set(sa.inspect(connection).get_table_names())
    if "alembic_version" in tables:
        rows = [row[0] for row in connection.execute(sa.text("SELECT version_num FROM alembic_version"))]
        if len(rows) == 1:
            return rows[0]
        if rows:                            # several heads: Alembic's own answer (an error naming them)
            from alembic.runtime.migration import MigrationContext

            return MigrationContext.configure(connection).get_current_revision()
    return BASELINE if UNVERSIONED_TABLES <= tables else None


def upgrade(engine: Any, name: str, remedy: str) -> Optional[str]:
    """Bring the store to HEAD (module docstring); returns what was done to an existing store
    ('... schema 0001 -> 0002'), None when it was at HEAD or new. A revision newer than HEAD raises
    HarnessError before any write. Two suites creating or upgrading one store at once: the one that
    loses the race finds it at HEAD afterwards and goes on."""
    from sqlalchemy.exc import SQLAlchemyError

    for attempt in range(3):
        try:
            return _upgrade(engine, name, remedy)
        except Exception as exc:
            if not isinstance(exc, SQLAlchemyError):
                from alembic.util.exc import CommandError   # only Alembic, loaded by then, raises it
                if not isinstance(exc, CommandError):
                    raise
            with engine.connect() as connection:
                if revision_of(connection) == HEAD:
                    return None
            if attempt == 2:
                raise
    return None


def _take_the_store(connection: Any) -> None:
    """One migrating suite at a time, and its work one transaction: the others wait, then find the store at
    HEAD. PostgreSQL: an advisory lock, released at commit. SQLite: its driver begins a transaction only
    before a row is written and commits each CREATE on its own, so a migration stopped midway would leave
    half a schema, and a suite opening the store meanwhile would see tables without `alembic_version` and
    migrate them again; BEGIN IMMEDIATE makes the whole migration one transaction under the write lock."""
    import sqlalchemy as sa

    if connection.dialect.name == "postgresql":
        connection.execute(sa.text(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"))
    elif connection.dialect.name == "sqlite":
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _upgrade(engine: Any, name: str, remedy: str) -> Optional[str]:
    with engine.connect() as connection:                 # at HEAD (every opening but the first): no lock
        if revision_of(connection) == HEAD:
            return None
    with engine.begin() as connection:
        _take_the_store(connection)
        current = revision_of(connection)
        if current == HEAD:
            return None
        from alembic.runtime.environment import EnvironmentContext
        from alembic.runtime.migration import MigrationContext

        cfg, script = _script()
        known = {r.revision for r in script.walk_revisions()}
        if current is not None and current not in known:
            raise HarnessError(f"history store {name} is at schema revision {current}, newer than this suite's "
                               f"{HEAD}: it was written by a newer suite and is left as it is; upgrade the suite "
                               f"(git pull), or {remedy}")
        if current == BASELINE and MigrationContext.configure(connection).get_current_revision() is None:
            MigrationContext.configure(connection).stamp(script, BASELINE)

        def steps(rev: Any, context: Any) -> Any:
            return script._upgrade_revs(HEAD, rev)

        with EnvironmentContext(cfg, script, fn=steps, destination_rev=HEAD) as env:
            env.configure(connection=connection)
            env.run_migrations()
    return None if current is None else f"history store {name}: schema {current} -> {HEAD}, every row kept"
