"""Migrated databases for tests, migrated once per process and handed out as new.

Running the migrations (and seeding the demo catalog) is most of a database test's set-up: 0.15-0.3 s
a chain on SQLite, about as much on PostgreSQL, for ~2,000 tests. So each test process migrates
once per ``migrate`` function: a SQLite test gets a copy of a template file it made; a PostgreSQL
test a schema from a pool, reset before it is handed out again (the test's rows deleted, the rows
``migrate`` added copied back from a pristine schema, sequences put back). A schema whose shape a
test changed (a downgrade, a dropped table) is dropped instead of reused, and tests that need an
empty database (the first migration itself) still ask ``tests.postgres.fresh_schema`` for one.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tests.postgres import create_schema, drop_schema, schema_url

__all__ = ["Migrate", "drop_pooled_schemas", "migrated_database", "migrated_schema", "migrated_sqlite"]

#: Brings an empty database to the head of one or more migration chains.
Migrate = Callable[[Engine], object]
#: How long emptying a schema may wait for a lock a test's lingering connection still holds; then
#: the schema is dropped instead (a test never waits on another's leftovers for long).
CLEAR_LOCK_TIMEOUT = "2s"

_templates: dict[str, Path] = {}
_pools: dict[tuple[str, str], _Pool] = {}


@contextmanager
def migrated_database(
    request: pytest.FixtureRequest, kind: str, folder: Path, migrate: Migrate
) -> Iterator[str]:
    """The URL of a database as ``migrate`` leaves a new one, for a test on ``kind``
    (``"sqlite"`` or ``"postgresql"``): a SQLite file in ``folder``, or a pooled schema on the
    ``postgres_url`` fixture's server."""
    if kind == "sqlite":
        yield migrated_sqlite(folder / "usp.sqlite3", migrate)
        return
    with migrated_schema(request.getfixturevalue("postgres_url"), migrate) as url:
        yield url


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
    #: One connection on the base URL, kept for the session: creating, resetting, dropping.
    admin: Engine
    free: list[str] = field(default_factory=list)
    #: A schema as ``migrate`` left it, never handed out: the rows (if any) every schema starts with.
    pristine: str = ""
    #: What the pristine schema looks like (relations, columns, chain revisions).
    shape: str = ""
    #: Its tables but the chains' version tables, children before parents.
    tables: tuple[str, ...] = ()
    #: Of those, the ones ``migrate`` put rows in (a seeded catalog), parents before children.
    seeded: tuple[str, ...] = ()
    sequences: tuple[str, ...] = ()


@contextmanager
def migrated_schema(base_url: str, migrate: Migrate) -> Iterator[str]:
    """A URL on ``base_url``'s database whose connections use a schema as ``migrate`` leaves a new
    one: migrated, holding only the rows ``migrate`` adds."""
    key = (base_url, _name(migrate))
    if key not in _pools:
        _pools[key] = _new_pool(base_url, migrate)
    pool = _pools[key]
    schema = _reused(pool) or _migrated(pool)
    try:
        yield schema_url(base_url, schema)
    finally:
        pool.free.append(schema)


def drop_pooled_schemas() -> None:
    """Drop the schemas this process kept (at the end of the session)."""
    for pool in _pools.values():
        for schema in [*pool.free, pool.pristine]:
            drop_schema(pool.admin, schema)
        pool.admin.dispose()
    _pools.clear()


def _new_pool(base_url: str, migrate: Migrate) -> _Pool:
    pool = _Pool(base_url, migrate, sa.create_engine(base_url, poolclass=sa.pool.StaticPool))
    pool.pristine = _migrated(pool)
    with pool.admin.connect() as connection:
        pool.shape = _shape(connection, pool.pristine)
        metadata = sa.MetaData(schema=pool.pristine)
        metadata.reflect(connection)
        tables = [table for table in metadata.sorted_tables if not table.name.startswith("alembic_version")]
        pool.tables = tuple(table.name for table in reversed(tables))
        pool.seeded = tuple(
            table.name
            for table in tables
            if connection.execute(sa.select(sa.literal(1)).select_from(table).limit(1)).first()
        )
        pool.sequences = tuple(
            connection.scalars(
                sa.text("SELECT sequencename FROM pg_sequences WHERE schemaname = :s"), {"s": pool.pristine}
            )
        )
    return pool


def _migrated(pool: _Pool) -> str:
    schema = create_schema(pool.admin)
    engine = sa.create_engine(schema_url(pool.base_url, schema))
    try:
        pool.migrate(engine)
    finally:
        engine.dispose()
    return schema


def _reused(pool: _Pool) -> str | None:
    """A schema the last test used, reset now rather than when that test ended: a thread of it
    that wrote late (after its teardown) cannot leave rows for the next test."""
    while pool.free:
        schema = pool.free.pop()
        if _reset(pool, schema):
            return schema
        drop_schema(pool.admin, schema)
    return None


def _reset(pool: _Pool, schema: str) -> bool:
    """Put back the pristine schema's rows and sequences in place of the test's, if the schema
    still has the pristine one's shape; whether it may be handed out again."""
    quote = pool.admin.dialect.identifier_preparer.format_table

    def here(name: str) -> str:
        return quote(sa.table(name, schema=schema))

    def there(name: str) -> str:
        return quote(sa.table(name, schema=pool.pristine))

    # Quoted names from the catalog, in one round trip.
    script = [f"DELETE FROM {here(name)}" for name in pool.tables]  # noqa: S608
    script += [f"INSERT INTO {here(name)} SELECT * FROM {there(name)}" for name in pool.seeded]  # noqa: S608
    script += [
        f"SELECT setval('{here(name)}', last_value, is_called) FROM {there(name)}"  # noqa: S608
        for name in pool.sequences
    ]
    try:
        with pool.admin.begin() as connection:
            connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{CLEAR_LOCK_TIMEOUT}'")
            if _shape(connection, schema) != pool.shape:
                return False
            connection.exec_driver_sql("; ".join(script))
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
