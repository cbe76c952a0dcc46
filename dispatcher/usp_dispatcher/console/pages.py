"""The console's pages and actions: login, events, one event and its replay.

Pages need the session cookie (without it: a redirect to the login page); actions are POSTs that
also need the session's CSRF token and, when the browser sends one, an ``Origin`` of this host.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final, TypeVar
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Form, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from usp_workers import operations
from usp_workers.models import DeliveryStatus
from usp_workers.operations import EventFilter
from usp_workers.settings import Settings

from ..deps import SessionDep, SettingsDep
from ..problems import HTTPProblem
from . import session as login
from .session import ConsoleSession

__all__ = ["STATIC_PATH", "router", "static_files"]

STATIC_PATH: Final = "/console/static"
_HERE = Path(__file__).parent
_T = TypeVar("_T")
_UNSETTLED: Final = frozenset({DeliveryStatus.PENDING.value, DeliveryStatus.IN_FLIGHT.value})
#: Every console answer: no framing, no inline script, nothing cached, no referrer elsewhere.
_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

router = APIRouter(prefix="/console", include_in_schema=False)
templates = Jinja2Templates(directory=_HERE / "templates")


def _when(moment: datetime | None) -> str:
    return "" if moment is None else _utc(moment).strftime("%Y-%m-%d %H:%M:%S UTC")


templates.env.filters["when"] = _when


def static_files() -> StaticFiles:
    """The stylesheet and script, shipped in the package (mounted at :data:`STATIC_PATH`)."""
    return StaticFiles(directory=_HERE / "static")


# ------------------------------------------------------------------------------- guards


def _admin_token(settings: Settings) -> str:
    return settings.admin_token.get_secret_value() if settings.admin_token is not None else ""


async def _page_session(request: Request, settings: SettingsDep) -> ConsoleSession:
    found = login.read(request.cookies.get(login.COOKIE), _admin_token(settings))
    if found is None:
        raise HTTPException(303, "log in first", headers={"Location": "/console/login", **_HEADERS})
    return found


async def _action_session(
    request: Request, settings: SettingsDep, csrf: Annotated[str | None, Form(max_length=128)] = None
) -> ConsoleSession:
    found = login.read(request.cookies.get(login.COOKIE), _admin_token(settings))
    if found is None:
        raise HTTPProblem(401, "console_login_required", "Unauthorized", "Log in at /console/login first.")
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
        raise HTTPProblem(403, "cross_origin", "Forbidden", "The form was not posted from this console.")
    if not found.csrf_ok(csrf):
        detail = "The form's CSRF token is missing or wrong: reload the page."
        raise HTTPProblem(403, "csrf_token_invalid", "Forbidden", detail)
    return found


PageDep = Annotated[ConsoleSession, Depends(_page_session)]
ActionDep = Annotated[ConsoleSession, Depends(_action_session)]


# ------------------------------------------------------------------------------- login


@router.get("", response_class=HTMLResponse)
async def home(console: PageDep) -> Response:
    return _redirect("/console/events")


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, settings: SettingsDep) -> Response:
    return _render(request, "login.html", {"configured": bool(_admin_token(settings)), "failed": False})


@router.post("/login", response_class=HTMLResponse)
async def log_in(
    request: Request, settings: SettingsDep, token: Annotated[str, Form(max_length=512)] = ""
) -> Response:
    configured = _admin_token(settings)
    if not configured or not hmac.compare_digest(token.encode(), configured.encode()):
        context = {"configured": bool(configured), "failed": True}
        return _render(request, "login.html", context, status_code=401)
    response = _redirect("/console/events")
    response.set_cookie(
        login.COOKIE,
        login.issue(configured),
        max_age=login.LIFETIME_SECONDS,
        path="/console",
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )
    return response


@router.post("/logout")
async def log_out(console: ActionDep) -> Response:
    response = _redirect("/console/login")
    response.delete_cookie(login.COOKIE, path="/console", httponly=True, samesite="strict")
    return response


# ------------------------------------------------------------------------------- events


@router.get("/events", response_class=HTMLResponse)
async def events(
    request: Request,
    db: SessionDep,
    console: PageDep,
    type: Annotated[str, Query(max_length=64)] = "",
    subject: Annotated[str, Query(max_length=128)] = "",
    status: Annotated[str, Query(max_length=16)] = "",
    since: Annotated[str, Query(max_length=32)] = "",
    until: Annotated[str, Query(max_length=32)] = "",
    cursor: Annotated[str, Query(max_length=256)] = "",
) -> Response:
    """Events, newest first, found by type, subject (a booking, service or post id), delivery
    state and time (UTC)."""
    asked = {"type": type, "subject": subject, "status": status, "since": since, "until": until}
    statuses = [s.value for s in DeliveryStatus]
    context: dict[str, Any] = {"console": console, "asked": asked, "statuses": statuses}
    try:
        filters = EventFilter(
            event_type=type or None,
            subject_id=subject or None,
            since=_moment(since, "since"),
            until=_moment(until, "until"),
            delivery_status=_status(status),
        )
        page = await _call(operations.list_events, db, filters, cursor=cursor or None, limit=50)
    except operations.OperationError as exc:
        context |= {"problem": exc.detail, "page": None}
        return _render(request, "events.html", context, status_code=422)
    next_query = {k: v for k, v in asked.items() if v}
    if page.next_cursor:
        next_query["cursor"] = page.next_cursor
    return _render(request, "events.html", context | {"page": page, "next_query": next_query})


@router.get("/events/{event_id}", response_class=HTMLResponse)
async def event(
    request: Request,
    event_id: str,
    db: SessionDep,
    console: PageDep,
    replayed: Annotated[int | None, Query(ge=0, le=10_000)] = None,
) -> Response:
    """One event: its payload, every delivery and every attempt; refreshed while any delivery
    is still on its way."""
    return await _event_page(request, db, console, event_id, replayed=replayed)


@router.post("/events/{event_id}/replay")
async def replay(
    request: Request,
    event_id: str,
    db: SessionDep,
    console: ActionDep,
    subscription_id: Annotated[str, Form(max_length=40)] = "",
) -> Response:
    try:
        done = await _call(operations.replay_event, db, event_id, subscription_id=subscription_id or None)
    except operations.OperationError as exc:
        return await _event_page(request, db, console, event_id, problem=exc.detail, status_code=409)
    return _redirect(f"/console/events/{done.event_id}?replayed={len(done.deliveries)}")


async def _event_page(
    request: Request,
    db: SessionDep,
    console: ConsoleSession,
    event_id: str,
    *,
    replayed: int | None = None,
    problem: str | None = None,
    status_code: int = 200,
) -> Response:
    try:
        detail = await _call(operations.event_detail, db, event_id)
    except operations.NotFound as exc:
        return _render(request, "missing.html", {"console": console, "problem": exc.detail}, status_code=404)
    context = {
        "console": console,
        "detail": detail,
        "payload": json.dumps(detail.payload, indent=2, ensure_ascii=False),
        "unsettled": any(d.status in _UNSETTLED for d in detail.deliveries),
        "replayed": replayed,
        "problem": problem,
    }
    return _render(request, "event.html", context, status_code=status_code)


# ------------------------------------------------------------------------------- helpers


async def _call(function: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    return await run_in_threadpool(function, *args, **kwargs)


def _render(request: Request, name: str, context: dict[str, Any], *, status_code: int = 200) -> Response:
    return templates.TemplateResponse(request, name, context, status_code=status_code, headers=_HEADERS)


def _redirect(location: str) -> Response:
    return RedirectResponse(location, status_code=303, headers=_HEADERS)


def _moment(text: str, name: str) -> datetime | None:
    """A form's ``datetime-local`` (no offset: UTC) or an RFC 3339 time."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise operations.InvalidRequest("invalid_time", f"{name}: {text!r} is not a date and time") from None
    return _utc(moment)


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _status(text: str) -> DeliveryStatus | None:
    if not text:
        return None
    try:
        return DeliveryStatus(text)
    except ValueError:
        raise operations.InvalidRequest("invalid_status", f"no delivery status {text!r}") from None
