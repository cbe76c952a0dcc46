"""Fixtures for the access layer: a migrated database with a signing key (SQLite and PostgreSQL),
settings for it, and an agent whose key directory a real uvicorn serves on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.dispatcher.conftest import MakeSettings, Serve
from usp_core import db, keys
from usp_dispatcher import database
from usp_dispatcher.access import DirectoryCache
from usp_dispatcher.cli.config import Settings
from usp_receiver import SigningKey

PROFILE = "https://agent.example/profiles/scheduling-agent.json"
OTHER_PROFILE = "https://other.example/profile.json"


@pytest.fixture
def settings(make_settings: MakeSettings) -> Settings:
    return make_settings()


@pytest.fixture
def migrated(engine: Engine, settings: Settings) -> Engine:
    """Both migration chains applied and the business's first signing key made."""
    database.upgrade(engine)
    with db.session(engine) as session:
        keys.ensure_signing_key(session, settings)
        session.commit()
    return engine


@pytest.fixture
def session(migrated: Engine) -> Iterator[Session]:
    with db.session(migrated) as session:
        yield session


@dataclass
class Agent:
    """An agent platform: its signing key and the directory its origin serves (editable)."""

    origin: str
    key: SigningKey
    directory: dict[str, Any] = field(default_factory=dict)
    status: int = 200
    fetches: int = 0
    cache_control: str | None = None


@pytest.fixture
def agent(serve: Serve) -> Agent:
    """A real HTTP server on 127.0.0.1 serving the agent's JWKS at the Web Bot Auth path."""
    key = SigningKey.generate()
    state = Agent(origin="", key=key, directory={"keys": [dict(key.public.jwk)]})

    async def directory(request: Request) -> Response:
        state.fetches += 1
        if state.status != 200:
            return Response(status_code=state.status)
        headers = {"Cache-Control": state.cache_control} if state.cache_control else None
        return JSONResponse(
            state.directory, media_type="application/http-message-signatures-directory+json", headers=headers
        )

    app = Starlette(routes=[Route("/.well-known/http-message-signatures-directory", directory)])
    state.origin = serve(app)
    return state


@pytest.fixture
def directories() -> DirectoryCache:
    """A cache of the test's own, so no test sees another's directories."""
    return DirectoryCache()
