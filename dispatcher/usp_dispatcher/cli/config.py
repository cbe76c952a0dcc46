"""How the operator commands read their configuration: every setting, from the environment."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import Engine

from usp_workers.settings import CommonSettings, Settings
from usp_workers.storage import db

__all__ = ["load_settings", "open_engine"]


def load_settings() -> Settings:
    """Every setting, from the environment (and ``.env``): for ``up`` and the operator's
    commands; the commands that run one process read that process kind's settings."""
    return Settings()


@contextmanager
def open_engine(settings: CommonSettings) -> Iterator[Engine]:
    """An engine for the configured database, disposed of when the command is done."""
    engine = db.make_engine(settings)
    try:
        yield engine
    finally:
        engine.dispose()
