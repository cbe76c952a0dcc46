"""Fixtures for the delivery engine: a database (SQLite and PostgreSQL), a real webhook server,
signing keys, a controllable clock, settings fit for tests.

* ``database`` runs each test on both databases: a fresh SQLite file, and a fresh PostgreSQL
  schema of its own (``search_path`` set per connection), so tests never see each other's rows
  nor those of other test modules sharing the server. The schema always comes from the Alembic
  migrations (``usp_workers.db.upgrade``), never ``create_all``.
* ``hub`` is one uvicorn server on 127.0.0.1 for the whole session; ``endpoints`` gives each test
  its own paths on it, and ``hub.seen(path)`` shows every request that reached a path.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import uvicorn
from sqlalchemy.engine import Engine

from usp_receiver import JWKS
from usp_workers.db import make_engine, session, upgrade
from usp_workers.keycache import clear_signing_key_cache
from usp_workers.keys import ensure_signing_key, published_jwks
from usp_workers.settings import Settings
from usp_workers.transport import make_client

from .endpoints import Hub
from .support import Clock, Endpoints

MakeSettings = Callable[..., Settings]


# -- database ------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An engine on an empty, migrated database of its own: SQLite file or PostgreSQL schema."""
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'usp.sqlite3'}")
        try:
            upgrade(engine)
            yield engine
        finally:
            engine.dispose()
        return
    url: str = request.getfixturevalue("postgres_url")
    yield from _postgres_schema(url)


def _postgres_schema(url: str) -> Iterator[Engine]:
    schema = f"usp_test_{uuid.uuid4().hex[:16]}"
    admin = sa.create_engine(url)
    try:
        with admin.begin() as connection:
            connection.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        engine = sa.create_engine(
            url,
            connect_args={"options": f"-csearch_path={schema}"},
            pool_size=10,
            max_overflow=20,
        )
        try:
            upgrade(engine)
            yield engine
        finally:
            engine.dispose()
            with admin.begin() as connection:
                connection.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    finally:
        admin.dispose()


# -- settings, keys, clock, client -------------------------------------------------------------


@pytest.fixture
def make_settings() -> MakeSettings:
    """Settings for tests: loopback targets allowed, a compressed schedule without jitter, short
    timeouts. Every field the engine reads is explicit, so no ``USP_*`` environment leaks in."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "database_url": "sqlite:///unused.sqlite3",
            "allow_private_targets": True,
            "private_target_allowlist": (),
            "retry_schedule": (0.05, 0.1, 0.2),
            "retry_jitter": 0.0,
            "connect_timeout": 2.0,
            "total_timeout": 5.0,
            "lease_seconds": 30.0,
            "per_endpoint_concurrency": 8,
            "key_store_path": None,
            "key_publish_lead_seconds": 0.0,
            "key_overlap_seconds": 3600.0,
        }
        return Settings(_env_file=None, **(values | overrides))

    return make


@pytest.fixture
def settings(make_settings: MakeSettings) -> Settings:
    return make_settings()


@pytest.fixture
def jwks(database: Engine, settings: Settings) -> JWKS:
    """The database's first signing key, created; the published JWKS receivers trust."""
    with session(database) as s:
        ensure_signing_key(s, settings)
        s.commit()
        document = published_jwks(s, settings)
    return JWKS.from_dict(document)


@pytest.fixture(autouse=True)
def _fresh_key_cache() -> Iterator[None]:
    clear_signing_key_cache()
    yield
    clear_signing_key_cache()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The delivery client, built as production builds it."""
    async with make_client(settings) as http:
        yield http


# -- the webhook server --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def hub() -> Iterator[Hub]:
    """One uvicorn server on a free 127.0.0.1 port for the session, serving a :class:`Hub`."""
    app = Hub()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="off",
        ws="none",
        http="h11",
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            pytest.fail("the test webhook server did not start")
        time.sleep(0.01)
    app.port = sock.getsockname()[1]
    try:
        yield app
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@pytest.fixture
def endpoints(hub: Hub) -> Iterator[Endpoints]:
    registry = Endpoints(hub)
    try:
        yield registry
    finally:
        registry.close()
