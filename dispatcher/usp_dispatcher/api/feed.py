"""``/services/feed/*``: subscriptions and platform-profile registration.

Admin-authenticated for now; platform credentials (bound to the platform's profile) come with the
MCP surface, which calls the same :mod:`usp_dispatcher.webhooks.feed` functions.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from usp_dispatcher.web.auth import AdminDep
from usp_dispatcher.web.deps import ResolverDep, SessionDep, SettingsDep
from usp_dispatcher.webhooks import feed
from usp_dispatcher.webhooks.profiles import register_profile
from usp_workers import OnDead, Ordering, SubscriptionState, Transport

__all__ = ["router"]

router = APIRouter(prefix="/services/feed", tags=["feed"], dependencies=[AdminDep])


AUTH_HELP = (
    "how each delivery proves itself to a gateway in front of the endpoint: {type:"
    " oauth2_client_credentials, token_url, client_id, client_secret, scope?, audience?} or {type: mtls,"
    " certificate, private_key, ca_certificate?} (PEM); the secret is sealed and shown masked"
)

FILTER_HELP = (
    "only events whose JSON passes it, beside event_types: leaves {path, one of eq ne in exists lt"
    " lte gt gte prefix} over dotted paths (data.service_id), combined with all / any / not"
    " (docs/protocol.md, 'Payload filters'); judged when an event is emitted"
)


class SubscriptionIn(BaseModel):
    """A new subscription."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2048, description="where to POST events (http or https)")
    transport: Transport = Field(
        default=Transport.REST, description="rest: the event JSON; jsonrpc: usp_webhook"
    )
    event_types: list[str] = Field(
        default_factory=lambda: ["*"], min_length=1, description="'*', exact types, or globs like booking.*"
    )
    platform_profile: str | None = Field(default=None, max_length=2048)
    ordering: Ordering = Field(
        default=Ordering.NONE,
        description="subject: each subject's events (a booking's, a waitlist entry's, a post's) arrive in"
        " the order they were emitted, one at a time per subject; none: in parallel, fastest",
    )
    on_dead: OnDead = Field(
        default=OnDead.BLOCK,
        description="under subject ordering, what a dead delivery does to its subject's later events:"
        " block (they wait until it is redriven) or skip (they go on)",
    )
    signatures: list[str] = Field(
        default_factory=lambda: ["rfc9421"],
        min_length=1,
        max_length=3,
        description="the schemes every delivery is signed with: rfc9421 (always), and"
        " standard-webhooks (v1, HMAC-SHA256; its whsec_ secret is in this answer, once) and/or"
        " standard-webhooks-v1a (Ed25519; its whpk_ public key is in this answer)",
    )
    lease_seconds: int | None = Field(
        default=None,
        ge=feed.MIN_LEASE_SECONDS,
        le=feed.MAX_LEASE_SECONDS,
        description="a temporary subscription (a listener's): deleted by the scheduler once this many"
        " seconds pass without POST .../lease renewing it; none: until deleted",
    )
    filter: dict[str, Any] | None = Field(
        default=None,
        description=FILTER_HELP,
        examples=[{"all": [{"path": "data.service_id", "eq": "svc_haircut_001"}]}],
    )
    headers: list[HeaderIn] = Field(
        default_factory=list,
        max_length=16,
        description="headers of its own on every delivery (a tenant id, a gateway key); a secret one is"
        " sealed at rest and shown masked",
    )
    sign_headers: bool = Field(default=False, description="cover those headers with the RFC 9421 signature")
    retry_schedule: RetryScheduleIn | None = Field(
        default=None, description="its own waits and maximum age; none: the service's (USP_RETRY_SCHEDULE)"
    )
    auth: dict[str, Any] | None = Field(default=None, description=AUTH_HELP)


class HeaderIn(BaseModel):
    """One header of the subscription's own."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=64, description="a header name; the protocol's own are refused")
    value: str = Field(max_length=2048)
    secret: bool = Field(default=False, description="sealed at rest, masked in every view and log")


class HeadersIn(BaseModel):
    """A subscription's new headers (replacing all of them)."""

    model_config = ConfigDict(extra="forbid")

    headers: list[HeaderIn] = Field(default_factory=list, max_length=16)
    signed: bool = Field(default=False, description="cover them with the RFC 9421 signature")


class RetryScheduleIn(BaseModel):
    """A subscription's own retry schedule."""

    model_config = ConfigDict(extra="forbid")

    delays: list[float] = Field(
        min_length=1, max_length=25, description="seconds to wait after each failed try (1 to 25 waits)"
    )
    max_age_seconds: float | None = Field(
        default=None, description="no try later than this after the delivery was made (60 s to 30 days)"
    )


class RetryScheduleChange(BaseModel):
    """A subscription's new retry schedule."""

    model_config = ConfigDict(extra="forbid")

    retry_schedule: RetryScheduleIn | None = Field(description="null: back to the service's schedule")


class AuthChange(BaseModel):
    """A subscription's new endpoint authentication."""

    model_config = ConfigDict(extra="forbid")

    auth: dict[str, Any] | None = Field(description=AUTH_HELP + "; null removes it")


class FilterIn(BaseModel):
    """A subscription's new payload filter."""

    model_config = ConfigDict(extra="forbid")

    filter: dict[str, Any] | None = Field(description=FILTER_HELP + "; null removes it")


class RotateIn(BaseModel):
    """A Standard Webhooks secret rotation."""

    model_config = ConfigDict(extra="forbid")

    overlap_seconds: int | None = Field(
        default=None,
        ge=0,
        le=7 * 86_400,
        description="how long the old secret (and key) keep signing beside the new one; by default"
        " USP_KEY_OVERLAP_SECONDS, as for the signing keys",
    )


class LeaseIn(BaseModel):
    """A lease renewal."""

    model_config = ConfigDict(extra="forbid")

    lease_seconds: int = Field(ge=feed.MIN_LEASE_SECONDS, le=feed.MAX_LEASE_SECONDS)


class ProfileIn(BaseModel):
    """A platform profile to read ``webhook_url`` (and friends) from."""

    model_config = ConfigDict(extra="forbid")

    profile: str = Field(min_length=1, max_length=2048, description="https URI of the platform profile")


@router.post("/subscriptions", status_code=201)
async def create_subscription(
    body: SubscriptionIn, session: SessionDep, settings: SettingsDep, resolver: ResolverDep
) -> JSONResponse:
    """Subscribe a URL to event types (422 when the URL or a pattern is refused)."""
    spec = feed.SubscriptionSpec(
        body.url,
        body.transport,
        body.event_types,
        body.platform_profile,
        body.ordering,
        body.on_dead,
        body.lease_seconds,
        tuple(body.signatures),
        body.filter,
        [h.model_dump() for h in body.headers],
        body.sign_headers,
        None if body.retry_schedule is None else body.retry_schedule.model_dump(),
        body.auth,
    )
    checked = await feed.check_subscription(spec, settings, resolver=resolver)
    subscription = await run_in_threadpool(feed.store_subscription, session, checked)
    return JSONResponse(feed.subscription_view(subscription, checked.secrets), status_code=201)


@router.get("/subscriptions")
async def list_subscriptions(
    session: SessionDep,
    cursor: Annotated[
        str | None, Query(max_length=64, description="next_cursor of the previous page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=feed.MAX_PAGE)] = 50,
    state: SubscriptionState | None = None,
) -> dict[str, Any]:
    """Subscriptions, active and disabled, oldest first."""
    page = await run_in_threadpool(feed.list_subscriptions, session, cursor=cursor, limit=limit, state=state)
    return {"items": [feed.subscription_view(s) for s in page.items], "next_cursor": page.next_cursor}


@router.put("/subscriptions/{subscription_id}/filter")
async def set_filter(subscription_id: str, body: FilterIn, session: SessionDep) -> dict[str, Any]:
    """Replace the subscription's payload filter (422 invalid_filter names the part at fault)."""
    subscription = await run_in_threadpool(feed.set_filter, session, subscription_id, body.filter)
    return feed.subscription_view(subscription)


@router.put("/subscriptions/{subscription_id}/headers")
async def set_headers(
    subscription_id: str, body: HeadersIn, session: SessionDep, settings: SettingsDep
) -> dict[str, Any]:
    """Replace the subscription's own headers (an empty list removes them; 422 invalid_header
    names the one at fault)."""
    items = [h.model_dump() for h in body.headers]
    subscription = await run_in_threadpool(
        feed.set_headers, session, subscription_id, items, body.signed, settings
    )
    return feed.subscription_view(subscription)


@router.put("/subscriptions/{subscription_id}/retry-schedule")
async def set_retry_schedule(
    subscription_id: str, body: RetryScheduleChange, session: SessionDep
) -> dict[str, Any]:
    """Replace the subscription's own retry schedule, or go back to the service's (null)."""
    asked = None if body.retry_schedule is None else body.retry_schedule.model_dump()
    subscription = await run_in_threadpool(feed.set_retry_schedule, session, subscription_id, asked)
    return feed.subscription_view(subscription)


@router.put("/subscriptions/{subscription_id}/auth")
async def set_auth(
    subscription_id: str, body: AuthChange, session: SessionDep, settings: SettingsDep, resolver: ResolverDep
) -> dict[str, Any]:
    """Replace the subscription's endpoint authentication (null removes it; 422 invalid_auth
    names the member at fault)."""
    subscription = await feed.set_endpoint_auth(
        session, subscription_id, body.auth, settings, resolver=resolver
    )
    return feed.subscription_view(subscription)


@router.get("/subscriptions/{subscription_id}")
async def get_subscription(subscription_id: str, session: SessionDep) -> dict[str, Any]:
    subscription = await run_in_threadpool(feed.get_subscription, session, subscription_id)
    return feed.subscription_view(subscription)


@router.delete("/subscriptions/{subscription_id}", status_code=204)
async def delete_subscription(subscription_id: str, session: SessionDep) -> Response:
    """Disable the subscription (``disabled_reason: deleted``); its deliveries keep their history."""
    await run_in_threadpool(feed.delete_subscription, session, subscription_id)
    return Response(status_code=204)


@router.post("/subscriptions/{subscription_id}/lease")
async def renew_lease(subscription_id: str, body: LeaseIn, session: SessionDep) -> dict[str, Any]:
    """Extend a leased subscription to ``lease_seconds`` from now (409 when it has no lease or
    was deleted: subscribe again)."""
    subscription = await run_in_threadpool(feed.renew_lease, session, subscription_id, body.lease_seconds)
    return feed.subscription_view(subscription)


@router.post("/subscriptions/{subscription_id}/secrets/rotate")
async def rotate_secrets(
    subscription_id: str, session: SessionDep, settings: SettingsDep, body: RotateIn | None = None
) -> dict[str, Any]:
    """A new Standard Webhooks secret (and key), shown in this answer once; the old ones keep
    signing for ``overlap_seconds`` (by default the signing keys' overlap, a day), so receivers can
    switch without a gap."""
    asked = (body or RotateIn()).overlap_seconds
    overlap = None if asked is None else timedelta(seconds=asked)
    rotated = await run_in_threadpool(
        feed.rotate_secrets, session, subscription_id, settings, overlap=overlap
    )
    subscription = await run_in_threadpool(feed.get_subscription, session, subscription_id)
    return feed.subscription_view(subscription, rotated)


@router.post("/profiles", status_code=201, responses={200: {"description": "existing subscription updated"}})
async def register_platform_profile(
    body: ProfileIn, session: SessionDep, settings: SettingsDep, resolver: ResolverDep
) -> JSONResponse:
    """Fetch a platform profile and subscribe its ``webhook_url``: 201 created, 200 updated."""
    subscription, created = await register_profile(session, settings, body.profile, resolver=resolver)
    return JSONResponse(feed.subscription_view(subscription), status_code=201 if created else 200)
