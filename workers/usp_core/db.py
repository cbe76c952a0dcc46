"""Engines and sessions for SQLite (embedded default) and PostgreSQL, and running a chain of
schema migrations.

SQLite is tuned for several processes (API, workers, relay) sharing one file: WAL so readers do
not block the writer, a busy timeout so writers queue instead of failing, foreign keys enforced.
The schema is only ever created by Alembic migrations (:func:`run_migrations`), on both databases,
so the tables tests run against are the tables production gets.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session

from usp_core.settings import CommonSettings

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = [
    "Migrated",
    "lock_for_count",
    "make_engine",
    "run_migrations",
    "session",
    "session_or_held",
]

#: Seconds a new PostgreSQL connection may take to open.
CONNECT_TIMEOUT_SECONDS = 5


def make_engine(settings: CommonSettings | str) -> Engine:
    """An engine for ``settings.database_url`` (or a URL), with SQLite made multi-process safe."""
    url = settings if isinstance(settings, str) else settings.database_url
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # No server-side prepared statements: psycopg prepares a statement after its fifth run, and
    # PostgreSQL then switches to a *generic* plan, blind to the parameters. For the claim
    # (``id IN (...50 ids) AND status = 'pending' ...``) the generic plan scans every pending
    # delivery instead of looking 50 ids up: measured 0.1 ms per claim with a custom plan,
    # 100 ms to 1.8 s with the generic one while 10,000 deliveries are pending (bench/pipeline.py).
    # A connect timeout: an unreachable host fails a request in seconds, not at the OS's TCP
    # timeout (minutes), so the API can answer 503 and producers back off.
    connect_args: dict[str, Any] = (
        {"prepare_threshold": None, "connect_timeout": CONNECT_TIMEOUT_SECONDS}
        if sa.make_url(url).get_driver_name() == "psycopg"
        else {}
    )
    return sa.create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20, connect_args=connect_args)


def session(engine: Engine) -> Session:
    """A session that keeps loaded objects usable after commit (we hand them to other layers)."""
    return Session(engine, expire_on_commit=False)


@contextmanager
def session_or_held(engine: Engine, held: Session | None) -> Iterator[Session]:
    """``held`` when there is one, left open (whoever opened it closes it); else a new
    :func:`session`, closed at the end of the block."""
    if held is not None:
        yield held
        return
    with session(engine) as fresh:
        yield fresh


def lock_for_count(session: Session, key: str, table: type[Any]) -> None:
    """Serialise count-then-insert limits on ``key`` until the session's transaction ends.

    Two inserts under one limit at once would both count one place left and both insert. On
    PostgreSQL a transaction-scoped advisory lock on ``key`` makes the second wait until the first
    committed (other keys do not wait). SQLite has one writer at a time: a write statement that
    changes nothing on ``table`` takes the database's write lock now, before the count, so the
    second transaction counts after the first committed (coarser, as SQLite's writes always are).
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtextextended(key, 0))))
    else:
        session.execute(sa.update(table).where(sa.false()).values(id=table.id))


@dataclass(frozen=True, slots=True)
class Migrated:
    """What one migration run did: the chain's revision before and after, and the tables it
    created (sorted by name)."""

    before: str | None
    after: str | None
    created: tuple[str, ...]


def run_migrations(
    engine: Engine,
    scripts: Path,
    *,
    lock: int,
    revision: str = "head",
    version_table: str = "alembic_version",
) -> Migrated:
    """Run the Alembic chain in ``scripts`` to ``revision`` in one transaction, holding the
    advisory lock ``lock`` on PostgreSQL: several replicas starting together on one empty
    database must not migrate concurrently (the dispatcher runs its own chain through this
    too, under a lock of its own, recording it in ``version_table``)."""
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": lock})
        before = _revision(connection, version_table)
        if revision == "head" and before is not None and before == _head(scripts):
            # Already there (every start but the first): no reflection of the catalog, no Alembic
            # run. Listing the tables scans pg_class, which many dropped schemas make slow.
            return Migrated(before, before, ())
        from alembic import command  # here: only a process that migrates pays for importing Alembic

        tables = set(sa.inspect(connection).get_table_names())
        config = _config(scripts)
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
        created = set(sa.inspect(connection).get_table_names()) - tables - {version_table}
        return Migrated(before, _revision(connection, version_table), tuple(sorted(created)))


@cache
def _head(scripts: Path) -> str | None:
    """The chain's head revision, its scripts read once per process (``None`` unless one head)."""
    from alembic.script import ScriptDirectory

    heads = ScriptDirectory.from_config(_config(scripts)).get_heads()
    return heads[0] if len(heads) == 1 else None


def _config(scripts: Path) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(scripts))
    return config


def _revision(connection: sa.Connection, version_table: str) -> str | None:
    from alembic.migration import MigrationContext

    context = MigrationContext.configure(connection, opts={"version_table": version_table})
    return context.get_current_revision()


def sqlite_pragmas(dbapi_connection: Any, *, foreign_keys: bool = True) -> None:
    """Make a SQLite connection safe for several processes sharing one file: WAL so readers do
    not block the writer, a busy timeout so writers queue instead of failing. The embedded broker
    uses this too, without foreign keys (kombu's tables are not ours to constrain)."""
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    if foreign_keys:
        cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    sqlite_pragmas(dbapi_connection)
