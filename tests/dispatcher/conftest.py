"""Fixtures for the dispatcher: a database per test (SQLite file and PostgreSQL schema), settings
built for it, and a running app (lifespan included: migrations and the first signing key).

Every API test runs on both databases: the service must behave the same on the embedded default
and on production's PostgreSQL, and only running both shows that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy.engine import Engine

from tests.databases import migrated_database
from tests.postgres import fresh_schema
from tests.servers import running
from usp_core import db
from usp_dispatcher import database
from usp_dispatcher.api.app import create_app
from usp_dispatcher.cli.config import Settings
from usp_dispatcher.scheduling.seed import ensure_demo_catalog
from usp_dispatcher.ucap.seed import ensure_demo_content

ADMIN_TOKEN = "test-admin-token-7c1f0e"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

MakeSettings = Callable[..., Settings]
MakeClient = Callable[..., TestClient]
Serve = Callable[[Any], str]


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database as the API's first start leaves it (``installed``): a SQLite file, or a
    PostgreSQL schema of its own. Marked ``empty_database``, a test gets one with no tables (it
    tests the migrations, or a start that seeds nothing)."""
    if request.node.get_closest_marker("empty_database") is None:
        with migrated_database(request, request.param, tmp_path, installed) as url:
            yield url
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'usp.sqlite3'}"
    else:
        with fresh_schema(request.getfixturevalue("postgres_url")) as url:
            yield url


def installed(engine: Engine) -> None:
    """What the API's first start with the default settings does to a database, but for the signing
    key (each test's app makes its own): both chains migrated, the demo catalog and content seeded."""
    database.upgrade(engine)
    ensure_demo_catalog(engine)
    ensure_demo_content(engine)


@pytest.fixture
def make_settings(database_url: str, tmp_path: Path) -> MakeSettings:
    """Settings on the test database with the admin token set; keyword arguments override."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "database_url": database_url,
            "admin_token": SecretStr(ADMIN_TOKEN),
            "allow_private_targets": True,
            "key_publish_lead_seconds": 300.0,
            # The app hands posted events to the broker: the embedded one, in this test's folder
            # (unset, it would be a file in the working folder whenever the database is not SQLite).
            "broker_url": f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}",
        }
        values.update(overrides)
        return Settings(_env_file=None, **values)

    return make


@pytest.fixture
def make_client(make_settings: MakeSettings) -> Iterator[MakeClient]:
    """Start the app (lifespan and all) with settings overrides; every client closes at the end."""
    with ExitStack() as stack:

        def make(*, app: FastAPI | None = None, **overrides: Any) -> TestClient:
            target = app if app is not None else create_app(make_settings(**overrides))
            return stack.enter_context(TestClient(target))

        yield make


@pytest.fixture
def client(make_client: MakeClient) -> TestClient:
    """The app with default test settings (admin token set, private targets allowed)."""
    return make_client()


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """A second engine on the test database, to look at what the API stored."""
    engine = db.make_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Run ASGI apps under a real uvicorn on 127.0.0.1 (``serve(app) -> base URL``)."""
    with ExitStack() as stack:
        yield lambda app: stack.enter_context(running(app))
