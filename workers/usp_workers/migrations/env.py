"""Alembic environment: migrations run on the connection ``usp_workers.db.upgrade`` hands in."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import usp_workers.models  # noqa: F401  (registers the tables on SQLModel.metadata)

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through usp_workers.db.upgrade(engine)")

context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
