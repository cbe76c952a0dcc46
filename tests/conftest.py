"""Shared fixtures: the real services some tests need, and the anyio backend.

Tests that need Redis or PostgreSQL talk to real servers, never to fakes: a fake would not show
the races the dedupe stores exist to win. A server that does not answer fails the test with the
command that starts it, instead of skipping: a silently skipped test looks exactly like a passing
one in CI.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.databases import drop_pooled_schemas
from tests.postgres import vacuum_catalogs

REDIS_URL_ENV = "USP_TEST_REDIS_URL"
POSTGRES_URL_ENV = "USP_TEST_POSTGRES_URL"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
AMQP_URL_ENV = "USP_TEST_AMQP_URL"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672//"
DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio only (the library targets asyncio frameworks)."""
    return "asyncio"


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """URL of a live RabbitMQ (``USP_TEST_AMQP_URL``) for the pipeline tests on that broker."""
    url = os.environ.get(AMQP_URL_ENV, DEFAULT_AMQP_URL)
    from usp_dispatcher.cli.config import Settings
    from usp_workers.runtime.celery_app import make_celery

    try:
        with make_celery(Settings(_env_file=None, broker_url=url)).connection_for_write() as connection:
            connection.ensure_connection(max_retries=1)
    except Exception as exc:
        pytest.fail(
            f"RabbitMQ at {url} does not answer ({exc}). Start one with `rabbitmq-server -detached`,"
            f" or point {AMQP_URL_ENV} at a running server."
        )
    return url


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of a live Redis (``USP_TEST_REDIS_URL``); tests must use their own key prefix."""
    url = os.environ.get(REDIS_URL_ENV, DEFAULT_REDIS_URL)
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(
            f"Redis at {url} does not answer ({exc}). Start one with "
            "`docker run --rm -d -p 6379:6379 redis:7` (or `redis-server --daemonize yes`), "
            f"or point {REDIS_URL_ENV} at a running server.",
            pytrace=False,
        )
    finally:
        client.close()
    return url


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """SQLAlchemy URL of a live PostgreSQL (``USP_TEST_POSTGRES_URL``); tests use their own tables
    (schemas: ``tests.databases``, ``tests.postgres``)."""
    url = os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL)
    import sqlalchemy as sa

    # libpq-based drivers take a connect timeout; others keep their default.
    libpq = sa.make_url(url).get_driver_name() in ("psycopg", "psycopg2")
    engine = sa.create_engine(url, connect_args={"connect_timeout": 2} if libpq else {})
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        vacuum_catalogs(engine)  # what earlier runs left behind (see tests.postgres)
    except sa.exc.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL at {url} does not answer ({exc.orig}). Start one with "
            "`docker run --rm -d -p 5432:5432 -e POSTGRES_HOST_AUTH_METHOD=trust -e POSTGRES_DB=test "
            f"postgres:16`, or point {POSTGRES_URL_ENV} at a running server.",
            pytrace=False,
        )
    finally:
        engine.dispose()
    yield url
    drop_pooled_schemas()


@pytest.fixture(autouse=True)
def _no_outage_carried_over() -> None:
    """Outages are counted per process (one log line each): a test that left one open must not
    silence the next test's first warning. Only reset what is loaded (receiver tests load none)."""
    import sys

    outage = sys.modules.get("usp_workers.engine.outage")
    if outage is not None:
        outage.BROKER_OUTAGE.reset()
        outage.DATABASE_OUTAGE.reset()
    problems = sys.modules.get("usp_dispatcher.web.problems")
    if problems is not None:
        problems.OUTAGE.reset()


#: Fixtures of the tests that run the pipeline as real processes (a minute at most each, most of
#: it waiting on workers and brokers).
_LONG_FIXTURES = frozenset({"pipeline"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long tests first: pytest-xdist hands tests out in this order, so the long ones spread
    over the workers at the start and short ones fill in around them, instead of three workers
    ending the run on a queue of long ones (the last ~2.5 minutes of a run used to be them alone,
    with the CPU half idle). The order within each group stays as collected."""
    items.sort(
        key=lambda item: (
            not (_LONG_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("slow"))
        )
    )
