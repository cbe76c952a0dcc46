"""``GET /metrics``: the delivery engine's state in the Prometheus text format.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.api.metrics``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy.engine import Engine

from usp_dispatcher.web.auth import require_admin
from usp_dispatcher.web.deps import SettingsDep, get_engine
from usp_workers import metrics

__all__ = ["router"]

_bearer = HTTPBearer(auto_error=False, scheme_name="AdminToken", description="USP_ADMIN_TOKEN")


async def metrics_access(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """The admin token, unless ``USP_METRICS_PUBLIC`` opens the endpoint."""
    if not settings.metrics_public:
        await require_admin(settings, credentials)


router = APIRouter(tags=["operations"], dependencies=[Depends(metrics_access)])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format"}},
)
async def get_metrics(settings: SettingsDep, engine: Annotated[Engine, Depends(get_engine)]) -> Response:
    """Deliveries by status and event type, queue depth and backlog age, dead-letter size, the
    attempt latency histogram (recent window), and each subscription's breaker state."""
    body = await run_in_threadpool(metrics.render, engine, settings.metrics_window_seconds)
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)
