"""``GET /healthz`` (the process answers) and ``GET /readyz`` (it can work: database and broker).

Both are public, as load balancers and orchestrators probe without credentials; neither says
more than which dependency failed and how (:func:`usp_workers.readiness`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.engine import Engine

from usp_dispatcher.web.deps import SettingsDep, get_engine
from usp_workers import readiness

__all__ = ["router"]

router = APIRouter(tags=["health"])


class Alive(BaseModel):
    status: str = Field(description="always ok: the process serves requests")


class CheckOut(BaseModel):
    ok: bool
    error: str | None = Field(default=None, description="what failed: the exception class and its first line")


class Ready(BaseModel):
    status: str = Field(description="ready, or unready (HTTP 503) when a check failed")
    checks: dict[str, CheckOut] = Field(description="database and broker")


@router.get("/healthz", response_model=Alive)
async def healthz() -> Alive:
    """Liveness: touches nothing, so a slow database never gets the process restarted."""
    return Alive(status="ok")


@router.get("/readyz", response_model=Ready, responses={503: {"model": Ready}})
async def readyz(settings: SettingsDep, engine: Annotated[Engine, Depends(get_engine)]) -> JSONResponse:
    """Readiness: the database and the broker answer within a few seconds each."""
    checks = await run_in_threadpool(readiness, engine, settings)
    ready = all(check.ok for check in checks)
    body = Ready(
        status="ready" if ready else "unready",
        checks={check.name: CheckOut(ok=check.ok, error=check.error) for check in checks},
    )
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)
