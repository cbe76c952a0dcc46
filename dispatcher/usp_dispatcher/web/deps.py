"""What routes get injected: the settings, the engine, and a database session per request.

They live on ``app.state`` (set by the lifespan in :mod:`usp_dispatcher.api.app`), not in module
globals, so tests can run several apps with different settings and databases side by side.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, cast

from fastapi import Depends, Request
from sqlalchemy.engine import Engine
from sqlmodel import Session

from usp_core import db
from usp_core.ssrf import Resolver
from usp_dispatcher.settings import ApiSettings

__all__ = [
    "ResolverDep",
    "SessionDep",
    "SettingsDep",
    "get_engine",
    "get_resolver",
    "get_session",
    "get_settings",
]


async def get_settings(request: Request) -> ApiSettings:
    return cast(ApiSettings, request.app.state.settings)


async def get_engine(request: Request) -> Engine:
    return cast(Engine, request.app.state.engine)


async def get_resolver(request: Request) -> Resolver | None:
    """The DNS resolver the SSRF check uses; ``None`` is the system's (tests may set their own)."""
    return cast(Resolver | None, getattr(request.app.state, "target_resolver", None))


def get_session(engine: Annotated[Engine, Depends(get_engine)]) -> Iterator[Session]:
    """One session per request, closed afterwards; routes commit what they mean to keep."""
    with db.session(engine) as session:
        yield session


SettingsDep = Annotated[ApiSettings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
ResolverDep = Annotated[Resolver | None, Depends(get_resolver)]
