"""Fixtures for the MCP binding: a prepared database (migrated, signing key, demo catalog), API
keys for two platforms, and the official SDK client connected three ways:

* :func:`connect` — the server in this process over the SDK's in-memory JSON-RPC streams (the
  same dispatch loop stdio and HTTP use: framing, middleware, error mapping), for breadth;
* :func:`spawn_stdio` — ``python -m usp_dispatcher.cli mcp`` as a child process, exactly what
  ``usp-webhooks mcp`` runs;
* over Streamable HTTP against the API under a real uvicorn (in the tests that need it).

Every test runs on SQLite and PostgreSQL (``database_url`` of the dispatcher's conftest).
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from sqlalchemy.engine import Engine

from tests.dispatcher.conftest import ADMIN_TOKEN, MakeSettings
from usp_core import db
from usp_dispatcher import access
from usp_dispatcher.cli.config import Settings
from usp_dispatcher.mcp import build_server
from usp_dispatcher.mcp.stdio import _prepare_database

SpawnStdio = Callable[..., Any]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def settings(make_settings: MakeSettings) -> Settings:
    return make_settings()


@pytest.fixture
def mcp_engine(settings: Settings) -> Iterator[Engine]:
    """The test database, prepared as the server prepares it at start-up."""
    engine = db.make_engine(settings)
    _prepare_database(engine, settings)
    yield engine
    engine.dispose()


@pytest.fixture
def acme_key(mcp_engine: Engine) -> str:
    """An API key of the platform ``acme`` (principal ``key:acme``)."""
    with db.session(mcp_engine) as session:
        return access.issue_api_key(session, "acme")


@pytest.fixture
def globex_key(mcp_engine: Engine) -> str:
    """An API key of another platform, ``globex``."""
    with db.session(mcp_engine) as session:
        return access.issue_api_key(session, "globex")


@asynccontextmanager
async def connect(engine: Engine, settings: Settings) -> AsyncIterator[Client]:
    """The SDK client on the server in this process (JSON-RPC over in-memory streams)."""
    async with Client(build_server(engine, settings), mode="legacy") as client:
        yield client


@pytest.fixture
def stdio_env(settings: Settings, tmp_path: Path) -> dict[str, str]:
    """The child's environment: this test's database and broker, the admin token."""
    return {
        "USP_DATABASE_URL": settings.database_url,
        "USP_BROKER_URL": str(settings.broker_url),
        "USP_ADMIN_TOKEN": ADMIN_TOKEN,
        "USP_ALLOW_PRIVATE_TARGETS": "true",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }


def stdio_parameters(env: dict[str, str], cwd: Path) -> StdioServerParameters:
    """How the SDK client starts ``usp-webhooks mcp`` (the module form of the console script)."""
    return StdioServerParameters(
        command=sys.executable, args=["-m", "usp_dispatcher.cli", "mcp"], env=env, cwd=str(cwd)
    )
