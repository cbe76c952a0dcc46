"""The delivery engine's schema: its Alembic chain, brought to its head by :func:`upgrade`."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import Engine

from usp_core import db

__all__ = ["MIGRATIONS", "upgrade"]

MIGRATIONS = Path(__file__).with_name("migrations")
_MIGRATION_LOCK = 0x5553_5057  # "USPW": the advisory lock id migrations hold on PostgreSQL


def upgrade(engine: Engine, revision: str = "head") -> db.Migrated:
    """Bring the schema to ``revision`` (creating it from an empty database)."""
    return db.run_migrations(engine, MIGRATIONS, lock=_MIGRATION_LOCK, revision=revision)
