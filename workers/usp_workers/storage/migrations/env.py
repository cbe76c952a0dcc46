"""Alembic environment: migrations run on the connection ``usp_workers.storage.migrate.upgrade`` hands in."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import usp_core.keys  # noqa: F401  (these two register the tables on SQLModel.metadata)
import usp_workers.storage.models  # noqa: F401

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through usp_workers.storage.migrate.upgrade(engine)")


def _ours(name: str | None, type_: str, parent_names: object) -> bool:
    """Autogenerate looks at this chain's tables only: the dispatcher keeps its own tables (and
    version table) in the same database, under its own migration chain."""
    return type_ != "table" or (name is not None and name.startswith("usp_"))


context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    include_name=_ours,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
