"""Fixtures for the delivery engine: a database (SQLite and PostgreSQL), a real webhook server,
signing keys, a controllable clock, settings fit for tests.

* ``database`` runs each test on both databases: a SQLite file of its own, and a PostgreSQL
  schema of its own (``search_path`` set per connection), so tests never see each other's rows
  nor those of other test modules sharing the server. Both hold no rows and come from the Alembic
  migrations (``usp_workers.storage.migrate.upgrade``), never ``create_all``, run once per process
  (``tests.databases``).
* ``hub`` is one uvicorn server on 127.0.0.1 for the whole session; ``endpoints`` gives each test
  its own paths on it, and ``hub.seen(path)`` shows every request that reached a path.
  ``serve_hub()`` starts another one (another port: another endpoint, with its own
  per-endpoint concurrency bound), stopped when the test ends.
* ``pipeline`` is the real-process pipeline: a database as ``database`` gives (from the same
  per-process templates and schema pool), a broker (this test process's Redis database, held
  under a lock; RabbitMQ; or the embedded SQLite broker) and the settings
  its children read from their environment; ``start_worker`` and ``start_relay`` start Celery
  worker and scheduler subprocesses, stopped (and their output printed) at the end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy.engine import Engine

from tests.databases import migrated_database
from tests.servers import serving
from tests.workers.endpoints import Hub
from tests.workers.support import (
    Clock,
    Endpoints,
    Pipeline,
    RelayProcess,
    ServiceProcess,
    StartRelay,
    StartWorker,
    WorkerProcess,
    amqp_exclusive,
    exclusive,
    redis_db_url,
)
from usp_core.db import make_engine, session
from usp_core.keycache import clear_signing_key_cache
from usp_core.keys import ensure_signing_key, published_jwks
from usp_dispatcher.cli.config import Settings
from usp_receiver import JWKS
from usp_workers.engine.transport import make_client
from usp_workers.runtime import tasks
from usp_workers.storage.migrate import upgrade

MakeSettings = Callable[..., Settings]


# -- database ------------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    """An engine on an empty, migrated database of its own: SQLite file or PostgreSQL schema."""
    with ExitStack() as stack:
        url = stack.enter_context(migrated_database(request, request.param, tmp_path, upgrade))
        engine = make_engine(url)
        stack.callback(engine.dispose)
        yield engine


# -- settings, keys, clock, client -------------------------------------------------------------


@pytest.fixture
def make_settings(tmp_path: Path) -> MakeSettings:
    """Settings for tests: loopback targets allowed, a compressed schedule without jitter, short
    timeouts. Every field the engine reads is explicit, so no ``USP_*`` environment leaks in."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "database_url": f"sqlite:///{tmp_path / 'unused.sqlite3'}",  # its broker file goes there too
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


@contextmanager
def hub_server() -> Iterator[Hub]:
    """A uvicorn server on a free 127.0.0.1 port serving a fresh :class:`Hub`, in a thread."""
    app = Hub()
    with serving(app) as served:
        app.port = served.port
        yield app


@pytest.fixture(scope="session")
def hub() -> Iterator[Hub]:
    """One webhook server for the session (see :func:`hub_server`)."""
    with hub_server() as app:
        yield app


@pytest.fixture
def serve_hub() -> Iterator[Callable[[], Hub]]:
    """Start more webhook servers for one test (``serve_hub() -> Hub``); all stop at its end."""
    with ExitStack() as stack:
        yield lambda: stack.enter_context(hub_server())


@pytest.fixture
def endpoints(hub: Hub) -> Iterator[Endpoints]:
    registry = Endpoints(hub)
    try:
        yield registry
    finally:
        registry.close()


# -- the real-process pipeline -------------------------------------------------------------------------


@pytest.fixture(
    params=[("redis", "sqlite"), ("redis", "postgresql"), ("embedded", "sqlite")],
    ids=["redis-sqlite", "redis-postgresql", "embedded-sqlite"],
)
def pipeline(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pipeline]:
    """A migrated database with a signing key, a broker, and settings fit for tests (loopback
    targets, a short schedule without jitter, a fast relay). Override the parameters with
    ``@pytest.mark.parametrize("pipeline", [("redis", "postgresql")], indirect=True)``; the
    broker ``"amqp"`` is RabbitMQ (``USP_TEST_AMQP_URL``)."""
    broker_kind, database_kind = request.param
    with ExitStack() as stack:
        client: redis.Redis | None = None
        lock = None
        if broker_kind == "redis":
            locked = redis_db_url(request.getfixturevalue("redis_url"))
            client = stack.enter_context(redis.Redis.from_url(locked))
            lock = stack.enter_context(exclusive(client))
            broker = locked
        elif broker_kind == "amqp":
            # RabbitMQ runs share its queue across test runs too: a lock of its own serialises them.
            broker = request.getfixturevalue("amqp_url")
            stack.enter_context(amqp_exclusive(request.getfixturevalue("redis_url"), broker))
        else:
            broker = f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}"
        url = stack.enter_context(migrated_database(request, database_kind, tmp_path, upgrade))
        fields: dict[str, Any] = {
            "database_url": url,
            "broker_url": broker,
            "allow_private_targets": True,
            "retry_schedule": (1.0, 1.0, 1.0),
            "retry_jitter": 0.0,
            "lease_seconds": 30.0,
            "requeue_after_seconds": 30.0,
            "relay_interval_seconds": 0.2,
            "connect_timeout": 2.0,
            "total_timeout": 5.0,
            "key_publish_lead_seconds": 0.0,
        }
        engine = make_engine(url)
        try:
            pipeline = Pipeline(fields, engine, tmp_path, broker_kind, client, lock)
            with session(engine) as s:
                ensure_signing_key(s, pipeline.settings)
                s.commit()
            yield pipeline
        finally:
            tasks.uninstall_enqueuer()
            engine.dispose()


@pytest.fixture
def _children() -> Iterator[list[ServiceProcess]]:
    """Every child process a test started: stopped at its end (SIGTERM, then SIGKILL to the
    process group), their output printed (pytest shows it when the test failed)."""
    started: list[ServiceProcess] = []
    try:
        yield started
    finally:
        for child in started:
            code = child.stop()
            print(f"----- {child.log_path.name} (exit {code}) -----\n{child.output()}")


@pytest.fixture
def start_worker(pipeline: Pipeline, _children: list[ServiceProcess]) -> StartWorker:
    """Start a Celery worker subprocess (``start_worker(name, concurrency=N)``; default: the
    production default)."""

    def start(name: str = "worker", **kw: Any) -> WorkerProcess:
        worker = WorkerProcess(pipeline, name, **kw)
        _children.append(worker)
        return worker

    return start


@pytest.fixture
def start_relay(pipeline: Pipeline, _children: list[ServiceProcess]) -> StartRelay:
    """Start a scheduler subprocess (``start_relay(name)``)."""

    def start(name: str = "relay", **kw: Any) -> RelayProcess:
        relay = RelayProcess(pipeline, name, **kw)
        _children.append(relay)
        return relay

    return start
