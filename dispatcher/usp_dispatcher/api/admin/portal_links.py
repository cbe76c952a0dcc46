"""``/admin``: links to a platform's own portal page."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from usp_dispatcher.console import portal
from usp_dispatcher.web.deps import SettingsDep

__all__ = ["router"]

router = APIRouter()


class PortalLinkIn(BaseModel):
    platform: str = Field(
        min_length=1,
        max_length=2048,
        description="the platform's profile URI (its subscriptions' platform_profile)",
    )


class PortalLinkOut(BaseModel):
    url: str = Field(description="opens the platform portal as this platform; hand it to the platform only")
    expires_at: datetime


@router.post("/portal-links", status_code=201, response_model=PortalLinkOut)
async def portal_link(request: Request, settings: SettingsDep, body: PortalLinkIn) -> PortalLinkOut:
    """A short-lived link into the platform portal for one platform: its subscriptions,
    deliveries, test events, replays and verification snippets, and nothing of anyone else's."""
    link, expires = portal.link(settings, body.platform, base_url=str(request.base_url))
    return PortalLinkOut(url=link, expires_at=expires)
