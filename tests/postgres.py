"""PostgreSQL schemas for tests: new ones, dropped after (``fresh_schema``; the pool of migrated
ones in ``tests.databases`` is built on these), and the system catalogs they churn through
vacuumed as the run goes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.engine import Engine

__all__ = ["create_schema", "drop_schema", "fresh_schema", "schema_url", "vacuum_catalogs"]

#: The catalogs every CREATE/DROP of a schema of tables writes to.
CATALOGS = (
    "pg_class",
    "pg_attribute",
    "pg_attrdef",
    "pg_constraint",
    "pg_depend",
    "pg_index",
    "pg_sequence",
    "pg_type",
)
#: Schemas dropped (by this process) between two vacuums of the catalogs.
DROPS_PER_VACUUM = 20

_dropped = 0


@contextmanager
def fresh_schema(base_url: str) -> Iterator[str]:
    """A URL on ``base_url``'s database whose connections use a new, empty schema (their
    ``search_path``), dropped when the block ends."""
    admin = sa.create_engine(base_url)
    try:
        schema = create_schema(admin)
        try:
            yield schema_url(base_url, schema)
        finally:
            drop_schema(admin, schema)
    finally:
        admin.dispose()


def create_schema(admin: Engine) -> str:
    """A new, empty schema of a name no other test uses."""
    schema = f"usp_test_{uuid.uuid4().hex[:12]}"
    with admin.begin() as connection:
        connection.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    return schema


def drop_schema(admin: Engine, schema: str) -> None:
    """Drop ``schema`` and all in it, vacuuming the catalogs every ``DROPS_PER_VACUUM`` drops."""
    global _dropped
    with admin.begin() as connection:
        connection.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    _dropped += 1
    if _dropped % DROPS_PER_VACUUM == 0:
        vacuum_catalogs(admin)


def schema_url(base_url: str, schema: str) -> str:
    """``base_url`` with its connections' ``search_path`` set to ``schema``."""
    url = sa.make_url(base_url).update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False)


def vacuum_catalogs(admin: Engine) -> None:
    """Let the catalogs reuse the space of the schemas dropped so far.

    Every test schema adds and removes dozens of tables; with autovacuum off (as it is on the
    CI machine's PostgreSQL) their rows stay behind as dead tuples, and every catalog read
    (reflection, DDL, Alembic) scans more of them as the run goes: ``pg_attribute`` grew from
    0.5 to 13 MB over 110 PostgreSQL tests, and a second run of the same tests on catalogs left
    at 240 MB took 12% longer. A plain ``VACUUM`` takes no lock that holds up other sessions; a
    role that may not vacuum a catalog gets a warning, not an error.
    """
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.execute(sa.text("VACUUM " + ", ".join(f"pg_catalog.{name}" for name in CATALOGS)))
