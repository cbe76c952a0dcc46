"""Migrated databases for tests, migrated once per process and handed out empty.

Running the migrations is most of a database test's set-up (0.15-0.3 s a chain on SQLite, about as
much on PostgreSQL, for ~2,000 tests). So each test process migrates once per chain: a SQLite test
gets a copy of a migrated template file; a PostgreSQL test gets a migrated schema from a pool, its
rows deleted and sequences restarted before it is handed out again. A schema whose shape a test
changed (a downgrade, a dropped table) is dropped instead of reused, and tests that need an empty
database (the first migration itself) still ask ``tests.postgres.fresh_schema`` for one.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tests.postgres import create_schema, drop_schema, schema_url

__all__ = ["Migrate", "drop_pooled_schemas", "migrated_schema", "migrated_sqlite"]

#: Brings an empty database to the head of one or more migration chains.
Migrate = Callable[[Engine], object]
#: How long emptying a schema may wait for a lock a test's lingering connection still holds; then
#: the schema is dropped instead (a test never waits on another's leftovers for long).
CLEAR_LOCK_TIMEOUT = "2s"

_templates: dict[str, Path] = {}
_pools: dict[tuple[str, str], _Pool] = {}


def migrated_sqlite(path: Path, migrate: Migrate) -> str:
    """The URL of a new SQLite file at ``path``, a copy of one this process migrated with ``migrate``."""
    key = _name(migrate)
    if key not in _templates:
        folder = Path(tempfile.mkdtemp(prefix="usp-template-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        template = folder / "template.sqlite3"
        engine = sa.create_engine(f"sqlite:///{template}")
        try:
            migrate(engine)
        finally:
            engine.dispose()  # the last connection closing folds the WAL into the file
        _templates[key] = template
    shutil.copyfile(_templates[key], path)
    return f"sqlite:///{path}"


@dataclass
class _Pool:
    """Schemas of one base URL migrated by one ``migrate``, free for the next test."""

    base_url: str
    migrate: Migrate
    #: One connection on the base URL, kept for the session: creating, emptying, dropping.
    admin: Engine
    free: list[str] = field(default_factory=list)
    #: What a freshly migrated schema looks like (relations, columns, chain revisions).
    shape: str = ""
    #: Its tables but the chains' version tables, children before parents.
    tables: tuple[str, ...] = ()


@contextmanager
def migrated_schema(base_url: str, migrate: Migrate) -> Iterator[str]:
    """A URL on ``base_url``'s database whose connections use a migrated schema of no rows."""
    key = (base_url, _name(migrate))
    if key not in _pools:
        _pools[key] = _Pool(base_url, migrate, sa.create_engine(base_url, poolclass=sa.pool.StaticPool))
    pool = _pools[key]
    schema = _reused(pool) or _new_schema(pool)
    try:
        yield schema_url(base_url, schema)
    finally:
        pool.free.append(schema)


def drop_pooled_schemas() -> None:
    """Drop the schemas this process kept (at the end of the session)."""
    for pool in _pools.values():
        while pool.free:
            drop_schema(pool.admin, pool.free.pop())
        pool.admin.dispose()
    _pools.clear()


def _new_schema(pool: _Pool) -> str:
    admin = pool.admin
    schema = create_schema(admin)
    engine = sa.create_engine(schema_url(pool.base_url, schema))
    try:
        pool.migrate(engine)
    finally:
        engine.dispose()
    if not pool.shape:
        with admin.connect() as connection:
            pool.shape = _shape(connection, schema)
            metadata = sa.MetaData(schema=schema)
            metadata.reflect(connection)
            pool.tables = tuple(
                table.name
                for table in reversed(metadata.sorted_tables)
                if not table.name.startswith("alembic_version")
            )
    return schema


def _reused(pool: _Pool) -> str | None:
    """A schema the last test used, emptied now rather than when that test ended: a thread of it
    that wrote late (after its teardown) cannot leave rows for the next test."""
    while pool.free:
        schema = pool.free.pop()
        if _emptied(pool, schema):
            return schema
        drop_schema(pool.admin, schema)
    return None


def _emptied(pool: _Pool, schema: str) -> bool:
    """Delete the rows a test left and restart the sequences, if the schema still has the shape
    of a freshly migrated one; whether it may be handed out again."""
    admin = pool.admin
    quote = admin.dialect.identifier_preparer.format_table
    # Quoted names from the catalog, in one round trip.
    deletes = "; ".join(f"DELETE FROM {quote(sa.table(name, schema=schema))}" for name in pool.tables)  # noqa: S608
    try:
        with admin.begin() as connection:
            connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{CLEAR_LOCK_TIMEOUT}'")
            if _shape(connection, schema) != pool.shape:
                return False
            connection.exec_driver_sql(deletes)
            connection.execute(
                sa.text(
                    "SELECT setval(s.seqrelid, s.seqstart, false) FROM pg_sequence s"
                    " JOIN pg_class c ON c.oid = s.seqrelid WHERE c.relnamespace = to_regnamespace(:s)"
                ),
                {"s": f'"{schema}"'},
            )
    except sa.exc.DBAPIError:
        return False
    return True


def _shape(connection: sa.Connection, schema: str) -> str:
    """The schema's relations with their column counts and kinds, and its chains' revisions."""
    relations = connection.execute(
        sa.text(
            "SELECT c.relname, c.relkind, count(a.attnum) FROM pg_class c"
            " LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
            " WHERE c.relnamespace = to_regnamespace(:s) GROUP BY c.relname, c.relkind ORDER BY c.relname"
        ),
        {"s": f'"{schema}"'},
    ).all()
    version = sa.column("version_num", sa.String)
    revisions: list[tuple[str, tuple[object, ...]]] = [
        (name, tuple(connection.scalars(sa.select(version).select_from(sa.table(name, schema=schema)))))
        for name, kind, _ in relations
        if kind == "r" and name.startswith("alembic_version")
    ]
    return repr((relations, revisions))


def _name(migrate: Migrate) -> str:
    return f"{migrate.__module__}.{migrate.__qualname__}"
