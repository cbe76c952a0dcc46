"""How the operator commands read their configuration: every setting, from the environment."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import Engine

from usp_core import db
from usp_core.settings import CommonSettings
from usp_dispatcher.settings import ApiSettings
from usp_workers import SchedulerSettings

__all__ = ["Settings", "load_settings", "open_engine"]


class Settings(ApiSettings, SchedulerSettings):
    """Every setting: for ``usp-webhooks up``, which runs the API, a worker and the scheduler in
    one process tree, and for the command line.

    >>> Settings(retry_schedule="5,60", auth_mechanisms="bearer").retry_schedule
    (5.0, 60.0)
    """


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
