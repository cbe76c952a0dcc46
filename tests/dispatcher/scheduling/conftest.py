"""Fixtures for the scheduling domain: a migrated database (both chains) on SQLite and PostgreSQL,
and a small catalog built at a fixed ``NOW`` so every time comparison is deterministic."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import Engine

from tests.dispatcher.scheduling.support import Catalog, build_catalog
from usp_dispatcher import database


@pytest.fixture
def migrated(engine: Engine) -> Engine:
    """The test database (SQLite file or PostgreSQL schema) with both migration chains applied."""
    database.upgrade(engine)
    return engine


@pytest.fixture
def catalog(migrated: Engine) -> Catalog:
    """A one-seat service with three slots and a four-seat one with one slot (no events)."""
    return build_catalog(migrated)
