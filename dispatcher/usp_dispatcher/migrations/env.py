"""Alembic environment of the dispatcher's tables: run through :func:`usp_dispatcher.database.upgrade`.

Its own version table (``alembic_version_dispatcher``) keeps this chain independent of the
delivery engine's, and ``include_name`` keeps autogenerate to the dispatcher's tables: the ``usp_*``
tables in the same database belong to the other chain and must never show up here as drops.
"""

from __future__ import annotations

from typing import Any

from alembic import context

from usp_dispatcher.database import METADATA, VERSION_TABLE

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through usp_dispatcher.database.upgrade(engine)")


def _ours(name: str | None, type_: str, _parent_names: Any) -> bool:
    return type_ != "table" or name in METADATA.tables


context.configure(
    connection=connection,
    target_metadata=METADATA,
    version_table=VERSION_TABLE,
    include_name=_ours,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
