"""Fixtures for the live-webhook tests: the whole API (``create_app``) under a real uvicorn on
127.0.0.1, API keys of two platforms, and the business's published keys, on SQLite and
PostgreSQL alike (``database_url`` of the dispatcher's conftest)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.engine import Engine

from tests.dispatcher.conftest import MakeSettings, Serve
from usp_core import db, keys
from usp_dispatcher import access, database
from usp_dispatcher.api.app import create_app
from usp_dispatcher.cli.config import Settings
from usp_dispatcher.mcp.http import MCPEndpoint
from usp_receiver import JWKS


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def settings(make_settings: MakeSettings) -> Settings:
    return make_settings()


@pytest.fixture
def keyed(engine: Engine, settings: Settings) -> Engine:
    """The test database migrated, with a signing key (what start-up does), without a server."""
    database.upgrade(engine)
    with db.session(engine) as session:
        keys.ensure_signing_key(session, settings)
        session.commit()
    return engine


@pytest.fixture
def app(settings: Settings) -> FastAPI:
    return create_app(settings)


@pytest.fixture
def base_url(app: FastAPI, serve: Serve) -> str:
    """The API (and ``/mcp``) under uvicorn; started, so the database is migrated and keyed."""
    return serve(app)


@pytest.fixture
def endpoint(app: FastAPI, base_url: str) -> MCPEndpoint:
    mcp: MCPEndpoint = app.state.mcp
    return mcp


@pytest.fixture
def acme_key(engine: Engine, base_url: str) -> str:
    """An API key of the platform ``acme``."""
    with db.session(engine) as session:
        return access.issue_api_key(session, "acme")


@pytest.fixture
def globex_key(engine: Engine, base_url: str) -> str:
    """An API key of another platform, ``globex``."""
    with db.session(engine) as session:
        return access.issue_api_key(session, "globex")


@pytest.fixture
def business_keys(base_url: str, business_keys_for: Callable[[str], JWKS]) -> JWKS:
    """What a platform trusts: the JWKS the business publishes."""
    return business_keys_for(base_url)


@pytest.fixture
def business_keys_for() -> Callable[[str], JWKS]:
    """The JWKS a server at a base URL publishes (for tests that start their own server)."""

    def fetch(base_url: str) -> JWKS:
        response = httpx.get(f"{base_url}/.well-known/usp/jwks.json")
        response.raise_for_status()
        return JWKS.from_json(response.content)

    return fetch
