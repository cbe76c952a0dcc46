"""The console's pages and actions: login, events (and replay), the dead letter (and redrive),
jobs, subscriptions (health, activity, enable/disable, rate limit), signing keys (rotate).

Pages need the session cookie (without it: a redirect to the login page); actions are POSTs that
also need the session's CSRF token and, when the browser sends one, an ``Origin`` of this host.
"""

from __future__ import annotations

import hmac
import json
from datetime import datetime
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy.engine import Engine

from usp_core import keys
from usp_dispatcher.console import session as login
from usp_dispatcher.console.session import Login
from usp_dispatcher.console.web import (
    UNSETTLED,
    admin_token,
    call,
    redirect,
    render,
    session_dependencies,
    utc,
)
from usp_dispatcher.durations import parse_retry_schedule
from usp_dispatcher.errors import Conflict, HTTPProblem, NotFound, Refused
from usp_dispatcher.settings import ApiSettings
from usp_dispatcher.web.deps import SessionDep, SettingsDep, get_engine
from usp_dispatcher.webhooks import feed
from usp_schemas import OPERATIONAL_EVENT_TYPES
from usp_workers import (
    RFC9421,
    DeliveryStatus,
    SubscriptionState,
    Transport,
    WebhookSecrets,
    activity,
    metrics,
    operations,
    tasks,
)
from usp_workers.operations import DeadLetterFilter, EventFilter

__all__ = ["router"]

router = APIRouter(prefix="/console", include_in_schema=False)

#: Deliveries a subscription's page lists (its event pages and the dead letter hold the rest).
RECENT_DELIVERIES: Final = 20


# ------------------------------------------------------------------------------- guards


_page_session, _action_session = session_dependencies(
    cookie=login.COOKIE,
    purpose="console",
    lifetime=login.LIFETIME_SECONDS,
    entry="/console/login",
    without="Log in at /console/login first.",
)

PageDep = Annotated[Login, Depends(_page_session)]
ActionDep = Annotated[Login, Depends(_action_session)]


# ------------------------------------------------------------------------------- login


@router.get("", response_class=HTMLResponse)
async def home(console: PageDep) -> Response:
    return redirect("/console/events")


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, settings: SettingsDep) -> Response:
    return render(request, "login.html", {"configured": bool(admin_token(settings)), "failed": False})


@router.post("/login", response_class=HTMLResponse)
async def log_in(
    request: Request, settings: SettingsDep, token: Annotated[str, Form(max_length=512)] = ""
) -> Response:
    configured = admin_token(settings)
    if not configured or not hmac.compare_digest(token.encode(), configured.encode()):
        context = {"configured": bool(configured), "failed": True}
        return render(request, "login.html", context, status_code=401)
    response = redirect("/console/events")
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
    response = redirect("/console/login")
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
        page = await call(operations.list_events, db, filters, cursor=cursor or None, limit=50)
    except operations.OperationError as exc:
        context |= {"problem": exc.detail, "page": None}
        return render(request, "events.html", context, status_code=422)
    next_query = _next_query(asked, page.next_cursor)
    return render(request, "events.html", context | {"page": page, "next_query": next_query})


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
        done = await call(operations.replay_event, db, event_id, subscription_id=subscription_id or None)
    except operations.OperationError as exc:
        return await _event_page(request, db, console, event_id, problem=exc.detail, status_code=409)
    return redirect(f"/console/events/{done.event_id}?replayed={len(done.deliveries)}")


async def _event_page(
    request: Request,
    db: SessionDep,
    console: Login,
    event_id: str,
    *,
    replayed: int | None = None,
    problem: str | None = None,
    status_code: int = 200,
) -> Response:
    try:
        detail = await call(operations.event_detail, db, event_id)
        matching = await call(operations.event_matching, db, event_id)
    except operations.NotFound as exc:
        return render(request, "missing.html", {"console": console, "problem": exc.detail}, status_code=404)
    context = {
        "console": console,
        "detail": detail,
        "matching": matching,
        "timeline": _timeline(detail),
        "payload": json.dumps(detail.payload, indent=2, ensure_ascii=False),
        "unsettled": any(d.status in UNSETTLED for d in detail.deliveries),
        "replayed": replayed,
        "problem": problem,
    }
    return render(request, "event.html", context, status_code=status_code)


# ------------------------------------------------------------------------------- dead letter, jobs


@router.get("/dead-letter", response_class=HTMLResponse)
async def dead_letter(
    request: Request,
    db: SessionDep,
    engine: Annotated[Engine, Depends(get_engine)],
    console: PageDep,
    subscription: Annotated[str, Query(max_length=40)] = "",
    type: Annotated[str, Query(max_length=64)] = "",
    since: Annotated[str, Query(max_length=32)] = "",
    until: Annotated[str, Query(max_length=32)] = "",
    cursor: Annotated[str, Query(max_length=256)] = "",
) -> Response:
    """Dead deliveries, newest first, filtered as a redrive can be; the totals by status are the
    numbers ``/metrics`` reports (the same query)."""
    asked = {"subscription": subscription, "type": type, "since": since, "until": until}
    totals: dict[str, int] = {}
    for (status, _), count in (await call(_delivery_counts, engine)).items():
        totals[status] = totals.get(status, 0) + count
    dead = totals.get(DeliveryStatus.DEAD.value, 0)
    context: dict[str, Any] = {"console": console, "asked": asked, "totals": totals, "dead": dead}
    try:
        filters = _dead_filter(subscription, type, since, until)
        page = await call(operations.dead_letter, db, filters, cursor=cursor or None, limit=50)
    except operations.OperationError as exc:
        context |= {"problem": exc.detail, "page": None}
        return render(request, "dead_letter.html", context, status_code=422)
    next_query = _next_query(asked, page.next_cursor)
    return render(request, "dead_letter.html", context | {"page": page, "next_query": next_query})


@router.post("/dead-letter/redrive")
async def redrive(
    request: Request,
    db: SessionDep,
    console: ActionDep,
    subscription: Annotated[str, Form(max_length=40)] = "",
    type: Annotated[str, Form(max_length=64)] = "",
    since: Annotated[str, Form(max_length=32)] = "",
    until: Annotated[str, Form(max_length=32)] = "",
) -> Response:
    """Start a redrive job of the dead deliveries the filters select; its page shows progress."""
    try:
        filters = _dead_filter(subscription, type, since, until)
        job = await call(operations.start_redrive, db, filters)
    except operations.OperationError as exc:
        return render(request, "missing.html", {"console": console, "problem": exc.detail}, status_code=422)
    return await _hand_to_workers(job)


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job(
    request: Request,
    job_id: str,
    db: SessionDep,
    console: PageDep,
    unsent: Annotated[bool, Query()] = False,
) -> Response:
    """A recover or redrive job; refreshed while it runs."""
    try:
        found = await call(operations.get_job, db, job_id)
    except operations.NotFound as exc:
        return render(request, "missing.html", {"console": console, "problem": exc.detail}, status_code=404)
    return render(request, "job.html", {"console": console, "job": found, "unsent": unsent})


@router.post("/jobs/{job_id}/resume")
async def resume(job_id: str, db: SessionDep, console: ActionDep) -> Response:
    """Send a job to the workers again (its worker died, or the broker refused it)."""
    try:
        found = await call(operations.resume_job, db, job_id)
    except operations.NotFound:
        return redirect(f"/console/jobs/{job_id}")
    return await _hand_to_workers(found)


async def _hand_to_workers(job: operations.JobView) -> Response:
    """Send a recorded job to the workers and show it; when the broker refuses, its page says
    so and offers to resume it (as ``/admin`` answers 503)."""
    if job.status == "running" and not await call(tasks.send_job, job.id):
        return redirect(f"/console/jobs/{job.id}?unsent=true")
    return redirect(f"/console/jobs/{job.id}")


def _timeline(detail: operations.EventDetail) -> list[tuple[datetime, str]]:
    """What happened to an event, oldest first: accepted, each delivery made (the first ones and
    any replay's), each attempt and its outcome, each delivery settled."""
    happened = [(utc(detail.event.created_at), "accepted")]
    for d in detail.deliveries:
        happened.append((utc(d.created_at), f"delivery {d.id} to {d.subscription_id} created"))
        for a in d.attempts:
            answer = a.status_code if a.status_code is not None else a.error_class or "no answer"
            text = f"attempt {a.attempt_number} of {d.id}: {answer}, {a.outcome} ({a.duration_ms:.0f} ms)"
            happened.append((utc(a.started_at), text))
        if d.completed_at is not None:
            happened.append((utc(d.completed_at), f"delivery {d.id} {d.status.replace('_', ' ')}"))
    return sorted(happened, key=lambda item: item[0])


def _delivery_counts(engine: Engine) -> dict[tuple[str, str], int]:
    with engine.connect() as connection:
        return metrics.delivery_counts(connection)


def _next_query(asked: dict[str, str], cursor: str | None) -> dict[str, str]:
    """The query string of a listing's next page: the filters asked, and the cursor."""
    query = {k: v for k, v in asked.items() if v}
    if cursor:
        query["cursor"] = cursor
    return query


def _dead_filter(subscription: str, event_type: str, since: str, until: str) -> DeadLetterFilter:
    return DeadLetterFilter(
        subscription_id=subscription or None,
        event_type=event_type or None,
        since=_moment(since, "since"),
        until=_moment(until, "until"),
    )


# ------------------------------------------------------------------------------- subscriptions


@router.get("/subscriptions", response_class=HTMLResponse)
async def subscriptions(
    request: Request,
    db: SessionDep,
    console: PageDep,
    state: Annotated[str, Query(max_length=16)] = "",
    cursor: Annotated[str, Query(max_length=256)] = "",
) -> Response:
    """Every subscription with its health, oldest first."""
    chosen = SubscriptionState(state) if state in set(SubscriptionState) else None
    page = await call(operations.list_subscriptions, db, state=chosen, cursor=cursor or None, limit=50)
    next_query = {"state": state, "cursor": page.next_cursor} if page.next_cursor else None
    context = {"console": console, "page": page, "state": state, "next_query": next_query}
    return render(request, "subscriptions.html", context)


@router.post("/subscriptions")
async def create_subscription(
    request: Request,
    db: SessionDep,
    console: ActionDep,
    settings: SettingsDep,
    url: Annotated[str, Form(max_length=2048)],
    transport: Annotated[Transport, Form()] = Transport.REST,
    event_types: Annotated[str, Form(max_length=2048)] = "*",
    signatures: Annotated[list[str] | None, Form(max_length=64)] = None,
    payload_filter: Annotated[str, Form(alias="filter", max_length=8192)] = "",
    headers: Annotated[str, Form(max_length=8192)] = "",
    secret_headers: Annotated[str, Form(max_length=8192)] = "",
    sign_headers: Annotated[bool, Form()] = False,
    retry_delays: Annotated[str, Form(max_length=512)] = "",
    max_age: Annotated[str, Form(max_length=16)] = "",
    auth_type: Annotated[str, Form(max_length=32)] = "",
    oauth_token_url: Annotated[str, Form(max_length=2048)] = "",
    oauth_client_id: Annotated[str, Form(max_length=256)] = "",
    oauth_client_secret: Annotated[str, Form(max_length=1024)] = "",
    oauth_scope: Annotated[str, Form(max_length=1024)] = "",
    mtls_certificate: Annotated[str, Form(max_length=16384)] = "",
    mtls_private_key: Annotated[str, Form(max_length=16384)] = "",
    mtls_ca_certificate: Annotated[str, Form(max_length=16384)] = "",
) -> Response:
    """A subscription of the business's own, checked as the REST API checks one; a Standard
    Webhooks secret it asked for is shown on its page this once."""
    patterns = [p.strip() for p in event_types.replace(",", " ").split() if p.strip()] or ["*"]
    asked = {
        "url": url,
        "transport": transport.value,
        "event_types": event_types,
        "filter": payload_filter,
        "headers": headers,
        "retry_delays": retry_delays,
        "max_age": max_age,
    }
    try:
        tree = _filter_tree(payload_filter)
        spec = feed.SubscriptionSpec(
            url.strip(),
            transport,
            patterns,
            signatures=(RFC9421, *(signatures or ())),
            payload_filter=tree,
            headers=_header_lines(headers, secret=False) + _header_lines(secret_headers, secret=True),
            sign_headers=sign_headers,
            retry_schedule=_retry_schedule(retry_delays, max_age),
            auth=_auth(
                auth_type,
                {
                    "token_url": oauth_token_url,
                    "client_id": oauth_client_id,
                    "client_secret": oauth_client_secret,
                    "scope": oauth_scope or None,
                },
                {
                    "certificate": mtls_certificate,
                    "private_key": mtls_private_key,
                    "ca_certificate": mtls_ca_certificate or None,
                },
            ),
        )
        checked = await feed.check_subscription(spec, settings)
        created = await call(feed.store_subscription, db, checked)
    except (Refused, Conflict) as exc:
        page = await call(operations.list_subscriptions, db, state=None, cursor=None, limit=50)
        context = {"console": console, "page": page, "state": "", "next_query": None, "problem": exc.detail}
        context["asked"] = asked
        return render(request, "subscriptions.html", context, status_code=422)
    return await _subscription_page(
        request, db, console, created.id, new_secrets=checked.secrets, created=True
    )


def _header_lines(text: str, *, secret: bool) -> list[dict[str, Any]]:
    """``Name: value`` lines typed into a form, as the API takes headers."""
    items = []
    for line in text.splitlines():
        if not line.strip():
            continue
        name, colon, value = line.partition(":")
        if not colon:
            raise Refused("invalid_header", f"{name.strip()[:64]!r}: write a header as Name: value")
        items.append({"name": name.strip(), "value": value.strip(), "secret": secret})
    return items


def _auth(kind: str, oauth: dict[str, Any], mtls: dict[str, Any]) -> dict[str, Any] | None:
    """The endpoint authentication the form chose (its other fields are ignored)."""
    if kind == "oauth2_client_credentials":
        return {"type": kind, **oauth}
    if kind == "mtls":
        return {"type": kind, **mtls}
    return None


def _retry_schedule(delays: str, max_age: str) -> dict[str, Any] | None:
    """The retry waits and maximum age typed into a form (``None``: the service's schedule)."""
    try:
        return parse_retry_schedule(delays, max_age)
    except ValueError as exc:
        raise Refused("invalid_retry_schedule", str(exc)) from None


def _filter_tree(text: str) -> Any:
    """The filter typed into a form, as JSON (``None`` when blank)."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise Refused("invalid_filter", f"the filter is not JSON: {exc}") from None


@router.get("/subscriptions/{subscription_id}", response_class=HTMLResponse)
async def subscription(request: Request, subscription_id: str, db: SessionDep, console: PageDep) -> Response:
    """One subscription: health, latency percentiles and attempts per minute over the last hour."""
    return await _subscription_page(request, db, console, subscription_id)


async def _subscription_page(
    request: Request,
    db: SessionDep,
    console: Login,
    subscription_id: str,
    *,
    problem: str | None = None,
    status_code: int = 200,
    new_secrets: WebhookSecrets | None = None,
    created: bool = False,
) -> Response:
    try:
        found = await call(operations.subscription_health, db, subscription_id)
    except operations.NotFound as exc:
        return render(request, "missing.html", {"console": console, "problem": exc.detail}, status_code=404)
    recent = await call(activity.subscription_activity, db, subscription_id)
    about = await call(operations.list_events, db, EventFilter(subject_id=subscription_id), limit=50)
    announced = [e for e in about.items if e.event_type in OPERATIONAL_EVENT_TYPES][:20]
    latest = await call(operations.subscription_deliveries, db, subscription_id, limit=RECENT_DELIVERIES)
    chart = {
        "minutes": [int(m.timestamp()) for m in recent.minutes],
        "series": dict(sorted(recent.per_minute.items())),
    }
    context = {
        "console": console,
        "s": found,
        "activity": recent,
        "chart": chart,
        "deliveries": latest,
        "problem": problem,
        "new_secrets": new_secrets,
        "created": created,
        "announced": announced,
    }
    return render(request, "subscription.html", context, status_code=status_code)


@router.post("/subscriptions/{subscription_id}/state")
async def set_state(
    request: Request,
    subscription_id: str,
    db: SessionDep,
    console: ActionDep,
    enabled: Annotated[bool, Form()],
) -> Response:
    try:
        await call(operations.set_subscription_state, db, subscription_id, enabled=enabled)
    except operations.OperationError as exc:
        return await _subscription_page(
            request, db, console, subscription_id, problem=exc.detail, status_code=409
        )
    return redirect(f"/console/subscriptions/{subscription_id}")


@router.post("/subscriptions/{subscription_id}/recover")
async def recover(
    request: Request,
    subscription_id: str,
    db: SessionDep,
    console: ActionDep,
    since: Annotated[str, Form(max_length=32)],
    until: Annotated[str, Form(max_length=32)] = "",
    enable: Annotated[bool, Form()] = False,
) -> Response:
    """Start a recover job: the subscription's failed and dead deliveries of events accepted in
    the range go again, and what it missed while disabled is back-filled; its page shows progress."""
    try:
        start = _moment(since, "since")
        if start is None:
            raise operations.InvalidRequest("invalid_time", "since: a start is needed")
        job = await call(
            operations.start_recover,
            db,
            subscription_id,
            since=start,
            until=_moment(until, "until"),
            enable=enable,
        )
    except operations.OperationError as exc:
        return await _subscription_page(
            request, db, console, subscription_id, problem=exc.detail, status_code=409
        )
    return await _hand_to_workers(job)


@router.post("/subscriptions/{subscription_id}/rate-limit")
async def set_rate_limit(
    request: Request,
    subscription_id: str,
    db: SessionDep,
    console: ActionDep,
    per_second: Annotated[str, Form(max_length=12)] = "",
) -> Response:
    """A limit in deliveries started per second; empty lifts it."""
    try:
        limit = int(per_second) if per_second.strip() else None
    except ValueError:
        problem = f"{per_second!r} is not a whole number of deliveries per second"
        return await _subscription_page(
            request, db, console, subscription_id, problem=problem, status_code=422
        )
    try:
        await call(operations.set_rate_limit, db, subscription_id, limit)
    except operations.OperationError as exc:
        return await _subscription_page(
            request, db, console, subscription_id, problem=exc.detail, status_code=422
        )
    return redirect(f"/console/subscriptions/{subscription_id}")


@router.post("/subscriptions/{subscription_id}/secrets/rotate")
async def rotate_secret(
    request: Request, subscription_id: str, db: SessionDep, console: ActionDep, settings: SettingsDep
) -> Response:
    """A new Standard Webhooks secret, shown on the page this once; the old one signs beside it
    for the signing keys' overlap."""
    try:
        rotated = await call(feed.rotate_secrets, db, subscription_id, settings)
    except (NotFound, Conflict) as exc:
        return await _subscription_page(
            request, db, console, subscription_id, problem=exc.detail, status_code=409
        )
    return await _subscription_page(request, db, console, subscription_id, new_secrets=rotated)


# ------------------------------------------------------------------------------- keys

#: What a key may be rotated to: the algorithms every USP verifier must accept.
_ROTATE_ALGS: Final = ("ed25519", "ecdsa-p256-sha256")


@router.get("/keys", response_class=HTMLResponse)
async def signing_keys(
    request: Request,
    db: SessionDep,
    settings: SettingsDep,
    console: PageDep,
    rotated: Annotated[str, Query(max_length=64)] = "",
) -> Response:
    """The signing keys' public facts and where each is in its rotation."""
    facts = await call(keys.describe_keys, db, settings)
    context = {
        "console": console,
        "keys": facts,
        "algs": _ROTATE_ALGS,
        "rotated": rotated,
        "settings": settings,
    }
    return render(request, "keys.html", context)


@router.post("/keys/rotate")
async def rotate_key(
    db: SessionDep,
    settings: SettingsDep,
    console: ActionDep,
    alg: Annotated[str, Form(max_length=32)] = "ed25519",
) -> Response:
    """A new key: published at once, signing after the publish lead (see ``POST /admin/keys/rotate``)."""
    if alg not in _ROTATE_ALGS:
        raise HTTPProblem(
            422, "invalid_alg", "Invalid request", f"keys are rotated to one of {', '.join(_ROTATE_ALGS)}"
        )
    kid = await call(_rotate, db, settings, alg)
    return redirect(f"/console/keys?rotated={kid}")


def _rotate(db: SessionDep, settings: ApiSettings, alg: str) -> str:
    record, _ = keys.rotate_or_first(db, settings, alg=alg)
    kid = record.kid
    db.commit()
    return kid


# ------------------------------------------------------------------------------- helpers


def _moment(text: str, name: str) -> datetime | None:
    """A form's ``datetime-local`` (no offset: UTC) or an RFC 3339 time."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise operations.InvalidRequest("invalid_time", f"{name}: {text!r} is not a date and time") from None
    return utc(moment)


def _status(text: str) -> DeliveryStatus | None:
    if not text:
        return None
    try:
        return DeliveryStatus(text)
    except ValueError:
        raise operations.InvalidRequest("invalid_status", f"no delivery status {text!r}") from None
