"""The base of the dispatcher's tables (scheduling, access, UCAP content): their own registry and
metadata, which the dispatcher's migration chain targets (the engine's tables are not in it)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import registry
from sqlmodel import SQLModel

__all__ = ["METADATA", "DispatcherTable"]

_registry = registry()


class DispatcherTable(SQLModel, registry=_registry):
    """Base of the dispatcher's tables: maps them into the dispatcher's own registry and metadata."""


#: Every dispatcher table, and nothing else: the target of the dispatcher's migration chain.
METADATA: sa.MetaData = _registry.metadata
