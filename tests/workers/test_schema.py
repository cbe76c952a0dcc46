"""The engine's migration chain and its table models describe the same schema.

A model field added without a revision (or a revision that drifts from the model) would pass
every test that builds tables from the migrations yet break a real upgrade, or the reverse; this
is the check that catches it, on SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel


def _engine_tables(name: str | None, type_: str, _parents: Any) -> bool:
    return type_ != "table" or (name is not None and name.startswith("usp_"))


def test_migrations_match_the_table_models(database: Engine) -> None:
    with database.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"compare_type": True, "include_name": _engine_tables}
        )
        assert compare_metadata(context, SQLModel.metadata) == []
