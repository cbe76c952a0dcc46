"""How every command that opens the database reads its configuration: the environment."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import Engine

from usp_workers.settings import Settings
from usp_workers.storage import db

__all__ = ["load_settings", "open_engine"]


def load_settings() -> Settings:
    """The configuration every command uses: the environment (and ``.env``)."""
    return Settings()


@contextmanager
def open_engine(settings: Settings) -> Iterator[Engine]:
    """An engine for the configured database, disposed of when the command is done."""
    engine = db.make_engine(settings)
    try:
        yield engine
    finally:
        engine.dispose()
