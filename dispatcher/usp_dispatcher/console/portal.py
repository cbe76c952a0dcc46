"""The platform portal (``/portal``): one platform's subscriptions, their deliveries and attempts,
test events, replays, the JWKS and verification snippets; entered by a short-lived link the
operator issues (``usp-webhooks portal-link``). Every query is scoped to the platform's profile.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Final
from urllib.parse import urlencode, urlsplit

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, Response
from sqlmodel import Session, col, select

from usp_dispatcher.console import session as login
from usp_dispatcher.console.session import Login
from usp_dispatcher.console.web import UNSETTLED, admin_token, call, redirect, render, session_dependencies
from usp_dispatcher.errors import Refusal
from usp_dispatcher.settings import ApiSettings
from usp_dispatcher.web.deps import ResolverDep, SessionDep, SettingsDep
from usp_dispatcher.web.problems import status_of
from usp_dispatcher.webhooks import probes
from usp_dispatcher.webhooks.samples import sample_event
from usp_schemas import EVENT_TYPES
from usp_workers import Subscription, Transport, emit, event_matches, operations

__all__ = ["LINK_SECONDS", "link", "router"]

COOKIE: Final = "usp_portal"
LINK_SECONDS: Final = 15 * 60
SESSION_SECONDS: Final = 8 * 3600

router = APIRouter(prefix="/portal", include_in_schema=False)


def link(settings: ApiSettings, platform: str, *, base_url: str) -> tuple[str, datetime]:
    """A link into the portal as ``platform`` (a profile URI), valid for :data:`LINK_SECONDS`."""
    token = login.issue(admin_token(settings), purpose="portal-link", subject=platform)
    expires = datetime.now(UTC) + timedelta(seconds=LINK_SECONDS)
    return f"{base_url.rstrip('/')}/portal/enter?{urlencode({'token': token})}", expires


_page, _action = session_dependencies(
    cookie=COOKIE,
    purpose="portal",
    lifetime=SESSION_SECONDS,
    entry="/portal/expired",
    without="Open the portal by a fresh portal link.",
)

PageDep = Annotated[Login, Depends(_page)]
ActionDep = Annotated[Login, Depends(_action)]


# ------------------------------------------------------------------------------- entering


@router.get("/enter", response_class=HTMLResponse)
async def enter(
    request: Request, settings: SettingsDep, token: Annotated[str, Query(max_length=4096)] = ""
) -> Response:
    """Trade a portal link for a session cookie, and leave the token out of the address bar."""
    signing = admin_token(settings)
    found = login.read(token, signing, purpose="portal-link", lifetime=LINK_SECONDS)
    if found is None:
        return render(request, "portal_expired.html", {"portal": None}, status_code=401)
    response = redirect("/portal")
    response.set_cookie(
        COOKIE,
        login.issue(signing, purpose="portal", subject=found.subject),
        max_age=SESSION_SECONDS,
        path="/portal",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="lax",  # it arrives from a link in another site's page or mail: Strict would drop it
    )
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


@router.get("/expired", response_class=HTMLResponse)
async def expired(request: Request) -> Response:
    return render(request, "portal_expired.html", {"portal": None}, status_code=401)


@router.post("/logout")
async def log_out(portal: ActionDep) -> Response:
    response = redirect("/portal/expired")
    response.delete_cookie(COOKIE, path="/portal", httponly=True, samesite="lax")
    return response


# ------------------------------------------------------------------------------- pages


@router.get("", response_class=HTMLResponse)
async def home(request: Request, db: SessionDep, portal: PageDep) -> Response:
    """The platform's subscriptions and its latest deliveries."""
    mine = await call(_subscriptions, db, portal.subject)
    recent = await call(operations.platform_deliveries, db, portal.subject, limit=25)
    context = {
        "portal": portal,
        "subscriptions": mine,
        "deliveries": recent.items,
        "jwks_url": _jwks(request),
    }
    return render(request, "portal.html", context)


@router.get("/subscriptions/{subscription_id}", response_class=HTMLResponse)
async def subscription(
    request: Request,
    subscription_id: str,
    db: SessionDep,
    portal: PageDep,
    sent: Annotated[str, Query(max_length=64)] = "",
) -> Response:
    """One of the platform's subscriptions: health, deliveries, a test event, the snippets."""
    return await _subscription_page(request, db, portal, subscription_id, sent=sent)


async def _subscription_page(
    request: Request,
    db: Session,
    portal: Login,
    subscription_id: str,
    *,
    sent: str = "",
    problem: str | None = None,
    status_code: int = 200,
) -> Response:
    health = await call(_own_subscription, db, portal.subject, subscription_id)
    if health is None:
        return _missing(request, portal)
    deliveries = await call(
        operations.platform_deliveries, db, portal.subject, subscription_id=subscription_id
    )
    url = urlsplit(health.url)
    context = {
        "portal": portal,
        "s": health,
        "deliveries": deliveries.items,
        "unsettled": any(d.status in UNSETTLED for d in deliveries.items),
        "types": [t for t in EVENT_TYPES if event_matches(t, health.event_types)],
        "jwks_url": _jwks(request),
        "insecure": _jwks(request).startswith("http:"),
        "mcp_url": str(request.base_url).rstrip("/") + "/mcp",
        "profile": portal.subject,
        "path": url.path or "/",
        "sent": sent,
        "problem": problem,
    }
    return render(request, "portal_subscription.html", context, status_code=status_code)


@router.get("/events/{event_id}", response_class=HTMLResponse)
async def event(request: Request, event_id: str, db: SessionDep, portal: PageDep) -> Response:
    """An event the platform was sent: its payload and the platform's own deliveries of it."""
    mine = await call(operations.platform_deliveries, db, portal.subject, event_id=event_id)
    if not mine.items:
        return _missing(request, portal)
    detail = await call(operations.event_detail, db, event_id)
    context = {"portal": portal, "event": detail.event, "payload": detail.payload, "deliveries": mine.items}
    return render(request, "portal_event.html", context)


@router.post("/subscriptions/{subscription_id}/test")
async def send_test(
    request: Request,
    subscription_id: str,
    db: SessionDep,
    portal: ActionDep,
    event_type: Annotated[str, Form(max_length=64)],
) -> Response:
    """A sample event of ``event_type`` (fresh ``event_id``) to this subscription only."""
    health = await call(_own_subscription, db, portal.subject, subscription_id)
    if health is None:
        return _missing(request, portal)
    if event_type not in EVENT_TYPES or not event_matches(event_type, health.event_types):
        problem = f"the subscription does not take {event_type!r} events"
        return await _subscription_page(
            request, db, portal, subscription_id, problem=problem, status_code=422
        )
    event_id = await call(_send_sample, db, event_type, portal.subject, subscription_id)
    return redirect(f"/portal/subscriptions/{subscription_id}?{urlencode({'sent': event_id})}")


@router.post("/subscriptions/{subscription_id}/probe")
async def probe_subscription(
    request: Request,
    subscription_id: str,
    db: SessionDep,
    settings: SettingsDep,
    resolver: ResolverDep,
    portal: ActionDep,
) -> Response:
    """Run the verification battery against this subscription's endpoint (``usp-webhooks
    probe``): does it refuse, with a 4xx, what a verifying receiver refuses?"""
    health = await call(_own_subscription, db, portal.subject, subscription_id)
    row = await call(db.get, Subscription, subscription_id)
    if health is None or row is None:
        return _missing(request, portal)
    who = f"platform {portal.subject} (portal)"
    try:
        run = await probes.run(
            db, settings, row.url, Transport(row.transport), actor=who, resolver=resolver, subscription=row
        )
    except Refusal as exc:
        status = status_of(exc)
        return await _subscription_page(
            request, db, portal, subscription_id, problem=exc.detail, status_code=status
        )
    cases, verdict = probes.cases_of(run)
    context = {"portal": portal, "s": health, "run": run, "cases": cases, "verdict": verdict}
    return render(request, "portal_probe.html", context)


@router.post("/events/{event_id}/replay")
async def replay(
    request: Request,
    event_id: str,
    db: SessionDep,
    portal: ActionDep,
    subscription_id: Annotated[str, Form(max_length=40)],
) -> Response:
    """Deliver an event again to one of the platform's subscriptions."""
    if await call(_own_subscription, db, portal.subject, subscription_id) is None:
        return _missing(request, portal)
    try:
        await call(operations.replay_event, db, event_id, subscription_id=subscription_id)
    except operations.OperationError as exc:
        return await _subscription_page(
            request, db, portal, subscription_id, problem=exc.detail, status_code=409
        )
    return redirect(f"/portal/subscriptions/{subscription_id}")


# ------------------------------------------------------------------------------- helpers


def _subscriptions(db: Session, profile: str) -> list[operations.SubscriptionHealth]:
    ids = db.exec(
        select(Subscription.id)
        .where(col(Subscription.platform_profile) == profile)
        .order_by(col(Subscription.id))
    ).all()
    return [operations.subscription_health(db, subscription_id) for subscription_id in ids]


def _own_subscription(
    db: Session, profile: str, subscription_id: str
) -> operations.SubscriptionHealth | None:
    """The subscription when it is this platform's (the same answer as none at all otherwise:
    the portal does not say what exists elsewhere)."""
    row = db.get(Subscription, subscription_id)
    if row is None or row.platform_profile != profile:
        return None
    return operations.subscription_health(db, subscription_id)


def _send_sample(db: Session, event_type: str, profile: str, subscription_id: str) -> str:
    record = emit(db, sample_event(event_type), audience=profile, to=subscription_id)
    event_id = record.id
    db.commit()
    return event_id


def _jwks(request: Request) -> str:
    return str(request.base_url).rstrip("/") + "/.well-known/usp/jwks.json"


def _missing(request: Request, portal: Login) -> Response:
    context: dict[str, Any] = {
        "portal": portal,
        "problem": "Not found among your subscriptions and deliveries.",
    }
    return render(request, "portal_missing.html", context, status_code=404)
