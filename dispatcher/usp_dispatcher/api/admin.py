"""``/admin/*``: what on-call needs when a platform says "we never got it" (admin token).

A thin layer over :mod:`usp_workers.operations`: it parses, calls, and shapes the answer as
typed models (so ``/docs`` documents every field). Long operations (recover, redrive) answer
``202`` with a job at once; the job runs in a worker (``usp.run_job``), and ``GET
/admin/jobs/{id}`` shows its progress.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Body, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field
from sqlmodel import Session, col, select

from usp_core import keys
from usp_dispatcher.console import portal
from usp_dispatcher.settings import ApiSettings
from usp_dispatcher.web.auth import AdminDep
from usp_dispatcher.web.deps import ResolverDep, SessionDep, SettingsDep
from usp_dispatcher.web.problems import HTTPProblem
from usp_dispatcher.webhooks import probes
from usp_workers import (
    DeliveryStatus,
    OnDead,
    Ordering,
    ProbeRun,
    Subscription,
    SubscriptionState,
    Transport,
    operations,
    tasks,
)
from usp_workers.operations import DeadLetterFilter, EventFilter

__all__ = ["router"]


class ProblemOut(BaseModel):
    """An RFC 9457 problem (sent as ``application/problem+json``); switch on ``reason``."""

    type: str
    title: str
    status: int
    detail: str
    reason: str = Field(description="stable code, e.g. event_not_found, subscription_disabled")


def _problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    what = {
        401: "no admin token, or a wrong one",
        404: "no such event, subscription or job",
        409: "the subscription cannot take it (disabled, deleted, not subscribed, not in the audience)",
        422: "invalid parameters (a cursor not ours, a time without offset, a range ending first, "
        "a rate limit out of range)",
        429: "a probe of this target ran less than 10 s ago (Retry-After says when to try)",
        503: "the job is recorded but the broker refused it: resume it later",
    }
    return {status: {"model": ProblemOut, "description": what[status]} for status in statuses}


router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep], responses=_problems(401, 422))

_T = TypeVar("_T")
_STATUS: dict[type[operations.OperationError], tuple[int, str]] = {
    operations.NotFound: (404, "Not found"),
    operations.Conflict: (409, "Conflict"),
    operations.InvalidRequest: (422, "Invalid request"),
}

Cursor = Annotated[str | None, Query(max_length=256, description="next_cursor of the previous page")]
Limit = Annotated[int, Query(ge=1, le=operations.MAX_PAGE, description="items per page")]
Since = Annotated[datetime | None, Query(description="from this moment (inclusive, RFC 3339 with offset)")]
Until = Annotated[datetime | None, Query(description="until this moment (exclusive)")]


# ------------------------------------------------------------------------------- models


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class AttemptOut(_Out):
    attempt_number: int
    started_at: datetime
    duration_ms: float
    status_code: int | None = Field(description="the endpoint's HTTP status (null: no answer)")
    response_excerpt: str | None = Field(description="the first bytes of the endpoint's answer")
    error_class: str | None = Field(description="why the try failed: timeout, connect_error, ...")
    outcome: str = Field(description="succeeded | retry | dead | disabled")
    key_ids: str | None = Field(
        default=None, description="the key ids that signed the try, sig1 first; null: nothing was sent"
    )


class DeliveryOut(_Out):
    id: str
    event_id: str
    subscription_id: str
    status: DeliveryStatus
    attempt_count: int
    next_attempt_at: datetime
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    completed_at: datetime | None
    superseded_by: str | None = Field(
        default=None,
        description="status superseded: the delivery a replay, recover or redrive made in its place",
    )
    event_type: str | None = Field(default=None, description="set in dead-letter listings")
    attempts: list[AttemptOut] = Field(default_factory=list, description="every try, oldest first")


class EventSummaryOut(_Out):
    id: str = Field(description="the event_id")
    event_type: str
    subject_id: str | None
    correlation_id: str | None
    order_id: str | None
    audience: str | None = Field(description="null: public; '': the business only; else a platform profile")
    occurred_at: datetime
    created_at: datetime = Field(description="when the event was accepted")
    deliveries: dict[str, int] = Field(description="delivery rows per status")


class EventPage(BaseModel):
    items: list[EventSummaryOut]
    next_cursor: str | None


class EventDetailOut(_Out):
    event: EventSummaryOut
    payload: dict[str, Any] = Field(description="the event exactly as delivered")
    deliveries: list[DeliveryOut] = Field(description="every delivery, replays included, oldest first")


class DeliveryPage(BaseModel):
    items: list[DeliveryOut]
    next_cursor: str | None


class ReplayIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    subscription_id: str | None = Field(
        default=None,
        max_length=40,
        description="only this subscription (it need not have had the event: back-fill); "
        "omitted: every active subscription the event matches and reaches",
    )


class DeliveryRef(BaseModel):
    id: str
    subscription_id: str


class ReplayOut(BaseModel):
    event_id: str
    deliveries: list[DeliveryRef] = Field(description="the new deliveries (earlier ones are kept)")


class RecoverIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    since: datetime = Field(description="events accepted from this moment (inclusive)")
    until: datetime | None = Field(default=None, description="until this moment (exclusive); omitted: now")
    enable: bool = Field(
        default=False, description="enable the subscription first (recovering a disabled one is a 409)"
    )


class RedriveIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    subscription_id: str | None = Field(default=None, max_length=40)
    event_type: str | None = Field(default=None, max_length=64)
    since: datetime | None = None
    until: datetime | None = None


class JobOut(_Out):
    id: str
    kind: str = Field(description="recover | redrive")
    status: str = Field(description="running | succeeded | failed")
    params: dict[str, Any]
    total: int = Field(description="deliveries to handle, counted at the start (exact once finished)")
    processed: int
    backfilled: int = Field(
        description="of those, deliveries created for events the subscription missed while disabled"
    )
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class SubscriptionHealthOut(_Out):
    id: str
    url: str
    platform_profile: str | None
    event_types: list[str]
    state: SubscriptionState
    disabled_reason: str | None
    breaker_state: str = Field(description="closed | open | half_open")
    breaker_until: datetime | None
    rate_limit: int | None = Field(description="deliveries per second at most (null: unlimited)")
    consecutive_failures: int
    failing_since: datetime | None
    last_success_at: datetime | None
    last_failure_at: datetime | None
    recent_attempts: int = Field(description="attempts in the last 24 hours")
    success_rate: float | None = Field(description="share of those that succeeded (null: none)")
    pending: int = Field(description="deliveries waiting to be tried")
    dead: int = Field(description="deliveries in the dead letter")
    ordering: Ordering = Field(description="none, or subject: each subject's events in emission order")
    on_dead: OnDead = Field(
        description="under subject ordering: a dead delivery blocks its subject, or is skipped"
    )
    blocked_subjects: int = Field(
        description="subjects waiting behind a dead delivery (GET …/blocked-subjects lists them)"
    )
    signatures: list[str] = Field(
        description="the schemes every delivery is signed with: rfc9421, standard-webhooks,"
        " standard-webhooks-v1a"
    )


class BlockedSubjectOut(_Out):
    subject: str = Field(description="the booking, waitlist entry, post… whose later events wait")
    delivery_id: str = Field(description="the dead delivery holding it: redrive or replay it to go on")
    event_id: str
    event_type: str
    dead_since: datetime | None
    waiting: int = Field(description="later deliveries of the subject held back")


class BlockedSubjectList(BaseModel):
    items: list[BlockedSubjectOut]


class RateLimitIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    per_second: int | None = Field(
        strict=True,
        description="deliveries started per second at most, across every worker (1 to "
        f"{operations.MAX_RATE_LIMIT}); null lifts the limit",
    )


class SubscriptionPage(BaseModel):
    items: list[SubscriptionHealthOut]
    next_cursor: str | None


class NoticeOut(_Out):
    id: int
    subscription_id: str
    kind: str = Field(
        description="subscription.disabled | subscription.enabled | subscription.breaker_opened |"
        " subscription.breaker_reopened | subscription.breaker_closed"
    )
    detail: str
    created_at: datetime


class NoticePage(BaseModel):
    items: list[NoticeOut]
    next_cursor: str | None


# ------------------------------------------------------------------------------- events


@router.get("/events", response_model=EventPage)
async def list_events(
    session: SessionDep,
    event_type: Annotated[str | None, Query(max_length=64)] = None,
    subject_id: Annotated[
        str | None, Query(max_length=128, description="booking, service or entry id")
    ] = None,
    correlation_id: Annotated[str | None, Query(max_length=128)] = None,
    since: Since = None,
    until: Until = None,
    delivery_status: Annotated[
        DeliveryStatus | None, Query(description="only events with a delivery in this status")
    ] = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> EventPage:
    """Events, newest first, with how their deliveries stand."""
    filters = EventFilter(event_type, subject_id, correlation_id, since, until, delivery_status)
    page = await _run(operations.list_events, session, filters, cursor=cursor, limit=limit)
    return EventPage(
        items=[EventSummaryOut.model_validate(item) for item in page.items], next_cursor=page.next_cursor
    )


class IdsOut(BaseModel):
    ids: list[str] = Field(description="oldest first: one is the id meant, several make it ambiguous")


@router.get("/ids", response_model=IdsOut, responses=_problems(422))
async def find_ids(
    short: Annotated[str, Query(max_length=64, description="an id as a table shows it: evt_…7203eef7")],
    session: SessionDep,
) -> IdsOut:
    """The full ids (events, subscriptions, deliveries, jobs) a shortened one may stand for, at
    most five: what lets the CLI take the ids its tables print."""
    return IdsOut(ids=await _run(operations.find_ids, session, short))


@router.get("/events/{event_id}", response_model=EventDetailOut, responses=_problems(404))
async def get_event(event_id: str, session: SessionDep) -> EventDetailOut:
    """One event, its payload, every delivery of it and every attempt of each."""
    return EventDetailOut.model_validate(await _run(operations.event_detail, session, event_id))


@router.post(
    "/events/{event_id}/replay", status_code=202, response_model=ReplayOut, responses=_problems(404, 409)
)
async def replay_event(
    event_id: str, session: SessionDep, body: Annotated[ReplayIn | None, Body()] = None
) -> ReplayOut:
    """Deliver the event again (same ``event_id``, signed afresh) as new deliveries: to one
    subscription, or to every active subscription it matches and reaches. Earlier deliveries and
    their attempts are kept. 409 when the named subscription is disabled, not subscribed to the
    type, or not in the event's audience."""
    subscription_id = body.subscription_id if body is not None else None
    replayed = await _run(operations.replay_event, session, event_id, subscription_id=subscription_id)
    return ReplayOut(
        event_id=replayed.event_id,
        deliveries=[DeliveryRef(id=d, subscription_id=s) for d, s in replayed.deliveries],
    )


# ------------------------------------------------------------------------------- dead letter


@router.get("/dead-letter", response_model=DeliveryPage)
async def list_dead_letter(
    session: SessionDep,
    subscription_id: Annotated[str | None, Query(max_length=40)] = None,
    event_type: Annotated[str | None, Query(max_length=64)] = None,
    since: Since = None,
    until: Until = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> DeliveryPage:
    """Dead deliveries, newest first."""
    filters = DeadLetterFilter(subscription_id, event_type, since, until)
    page = await _run(operations.dead_letter, session, filters, cursor=cursor, limit=limit)
    return DeliveryPage(
        items=[DeliveryOut.model_validate(item) for item in page.items], next_cursor=page.next_cursor
    )


@router.post("/dead-letter/redrive", status_code=202, response_model=JobOut, responses=_problems(404, 503))
async def redrive_dead_letter(
    session: SessionDep, body: Annotated[RedriveIn | None, Body()] = None
) -> JobOut:
    """Re-deliver the dead letter (all of it, or filtered) to active subscriptions, as a job."""
    request = body if body is not None else RedriveIn()
    filters = DeadLetterFilter(request.subscription_id, request.event_type, request.since, request.until)
    return await _started(await _run(operations.start_redrive, session, filters))


# ------------------------------------------------------------------------------- jobs


@router.get("/jobs/{job_id}", response_model=JobOut, responses=_problems(404))
async def get_job(job_id: str, session: SessionDep) -> JobOut:
    """A recover or redrive job and its progress."""
    return JobOut.model_validate(await _run(operations.get_job, session, job_id))


@router.post("/jobs/{job_id}/resume", status_code=202, response_model=JobOut, responses=_problems(404, 503))
async def resume_job(job_id: str, session: SessionDep) -> JobOut:
    """Send a running or failed job to the workers again (its worker died, its hand-off or a
    batch failed): it continues after its last committed batch. A finished job is answered as is."""
    job = await _run(operations.resume_job, session, job_id)
    return await _started(job)


# ------------------------------------------------------------------------------- subscriptions


@router.get("/subscriptions", response_model=SubscriptionPage)
async def list_subscriptions(
    session: SessionDep, state: SubscriptionState | None = None, cursor: Cursor = None, limit: Limit = 50
) -> SubscriptionPage:
    """Subscriptions, oldest first, with their health."""
    page = await _run(operations.list_subscriptions, session, state=state, cursor=cursor, limit=limit)
    return SubscriptionPage(
        items=[SubscriptionHealthOut.model_validate(item) for item in page.items],
        next_cursor=page.next_cursor,
    )


@router.get("/notices", response_model=NoticePage)
async def list_notices(
    session: SessionDep,
    subscription_id: Annotated[str | None, Query(max_length=40)] = None,
    kind: Annotated[str | None, Query(max_length=64)] = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> NoticePage:
    """Health notices, newest first: subscriptions disabled (410, failing too long, an operator)
    or enabled, breakers opened, re-opened after a failed probe, closed."""
    page = await _run(
        operations.list_notices,
        session,
        subscription_id=subscription_id,
        kind=kind,
        cursor=cursor,
        limit=limit,
    )
    items = [NoticeOut.model_validate(item) for item in page.items]
    return NoticePage(items=items, next_cursor=page.next_cursor)


@router.get(
    "/subscriptions/{subscription_id}", response_model=SubscriptionHealthOut, responses=_problems(404)
)
async def get_subscription(subscription_id: str, session: SessionDep) -> SubscriptionHealthOut:
    return SubscriptionHealthOut.model_validate(
        await _run(operations.subscription_health, session, subscription_id)
    )


@router.get(
    "/subscriptions/{subscription_id}/blocked-subjects",
    response_model=BlockedSubjectList,
    responses=_problems(404),
)
async def list_blocked_subjects(subscription_id: str, session: SessionDep) -> BlockedSubjectList:
    """The subjects of an ordered subscription that wait behind a dead delivery (``on_dead``
    block), longest blocked first; every other subject keeps flowing."""
    items = await _run(operations.blocked_subjects, session, subscription_id)
    return BlockedSubjectList(items=[BlockedSubjectOut.model_validate(item) for item in items])


@router.post(
    "/subscriptions/{subscription_id}/disable", response_model=SubscriptionHealthOut, responses=_problems(404)
)
async def disable_subscription(subscription_id: str, session: SessionDep) -> SubscriptionHealthOut:
    """Stop delivering to the subscription (its pending deliveries go to the dead letter unsent)."""
    health = await _run(operations.set_subscription_state, session, subscription_id, enabled=False)
    return SubscriptionHealthOut.model_validate(health)


@router.post(
    "/subscriptions/{subscription_id}/enable",
    response_model=SubscriptionHealthOut,
    responses=_problems(404, 409),
)
async def enable_subscription(subscription_id: str, session: SessionDep) -> SubscriptionHealthOut:
    """Deliver to the subscription again, with its failure streak cleared and its breaker closed
    (then ``recover`` what it missed). 409 for a deleted subscription."""
    health = await _run(operations.set_subscription_state, session, subscription_id, enabled=True)
    return SubscriptionHealthOut.model_validate(health)


@router.put(
    "/subscriptions/{subscription_id}/rate-limit",
    response_model=SubscriptionHealthOut,
    responses=_problems(404),
)
async def set_rate_limit(
    subscription_id: str, body: RateLimitIn, session: SessionDep
) -> SubscriptionHealthOut:
    """Limit how many deliveries to the subscription start in any one second, whatever the
    number of workers (null: no limit). Deliveries over the limit wait for a free second without
    spending an attempt. 422 (``invalid_rate_limit``) below 1 or above the maximum."""
    health = await _run(operations.set_rate_limit, session, subscription_id, body.per_second)
    return SubscriptionHealthOut.model_validate(health)


@router.post(
    "/subscriptions/{subscription_id}/recover",
    status_code=202,
    response_model=JobOut,
    responses=_problems(404, 409, 503),
)
async def recover_subscription(subscription_id: str, body: RecoverIn, session: SessionDep) -> JobOut:
    """Re-deliver every failed or dead delivery of the subscription for events accepted in
    ``[since, until)``, and back-fill the events it missed while disabled (they have no
    delivery), as a job (no cap: it streams in batches). 409 when it is disabled, unless
    ``enable`` asks to enable it first."""
    job = await _run(
        operations.start_recover,
        session,
        subscription_id,
        since=body.since,
        until=body.until,
        enable=body.enable,
    )
    return await _started(job)


# ------------------------------------------------------------------------------- signing keys


class KeyOut(BaseModel):
    """A signing key's public facts (never its private material)."""

    kid: str
    alg: str
    created_at: datetime
    signs_from: datetime
    retires_at: datetime | None = Field(description="stops signing then; null: until rotated out")
    published: bool = Field(description="in the JWKS now")
    state: keys.KeyState


class KeyList(BaseModel):
    items: list[KeyOut]


class RotateIn(BaseModel):
    alg: Literal["ed25519", "ecdsa-p256-sha256"] = "ed25519"


class RotateOut(BaseModel):
    key: KeyOut
    first: bool = Field(description="there was no key before it, so it signs at once")
    signs_from: datetime = Field(description="when the new key starts signing")
    older_keys_retire_at: datetime | None = Field(
        description="when the older keys stop signing; null when there were none"
    )


@router.get("/keys", response_model=KeyList)
async def list_keys(session: SessionDep, settings: SettingsDep) -> KeyList:
    """Every signing key with its schedule and what it does now."""
    facts = await run_in_threadpool(keys.describe_keys, session, settings)
    return KeyList(items=[KeyOut.model_validate(fact, from_attributes=True) for fact in facts])


@router.post("/keys/rotate", status_code=201, response_model=RotateOut)
async def rotate_key(
    session: SessionDep, settings: SettingsDep, body: Annotated[RotateIn | None, Body()] = None
) -> RotateOut:
    """Add a key: published at once, signing after the publish lead, the older keys then signing
    alongside it for the overlap before they retire. The first key of a database signs at once."""
    alg = body.alg if body is not None else "ed25519"
    return await run_in_threadpool(_rotate, session, settings, alg)


def _rotate(session: Session, settings: ApiSettings, alg: str) -> RotateOut:
    record, first = keys.rotate_or_first(session, settings, alg=alg)
    session.commit()
    retiring = None if first else record.signs_from + timedelta(seconds=settings.key_overlap_seconds)
    fact = keys.describe_key(record, settings)
    return RotateOut(
        key=KeyOut.model_validate(fact, from_attributes=True),
        first=first,
        signs_from=record.signs_from,
        older_keys_retire_at=retiring,
    )


# ------------------------------------------------------------------------------- portal links


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


# ------------------------------------------------------------------------------- probes


class ProbeIn(BaseModel):
    url: str | None = Field(default=None, max_length=2048, description="the endpoint to probe")
    subscription_id: str | None = Field(
        default=None, max_length=40, description="probe this subscription's URL (instead of url)"
    )
    format: Transport | None = Field(
        default=None, description="rest or jsonrpc; default: the subscription's, else rest"
    )


class ProbeCaseOut(BaseModel):
    case: str
    sent: str = Field(description="what the delivery got wrong on purpose (or right)")
    expected: str = Field(description="2xx (a verifying receiver accepts) or 4xx (it refuses)")
    status: int | None = Field(description="what the endpoint answered (null: no answer)")
    error: str | None
    ok: bool
    finding: str


class ProbeRunOut(BaseModel):
    id: str
    created_at: datetime
    actor: str
    target: str
    transport: str
    problems: int
    verdict: str
    results: list[ProbeCaseOut]


class ProbeRunPage(BaseModel):
    items: list[ProbeRunOut]


@router.post("/probes", status_code=201, response_model=ProbeRunOut, responses=_problems(404, 429))
async def run_probe(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    resolver: ResolverDep,
    body: Annotated[ProbeIn, Body()],
) -> ProbeRunOut:
    """Send the verification battery (``usp-webhooks probe``) to an endpoint, signed with the
    current key: does it accept what it should and refuse, with a 4xx, what it should? Nothing is
    recorded as a delivery; the run is, and ``GET /admin/probes`` lists it."""
    url, transport = body.url, body.format or Transport.REST
    subscription = None
    if (url is None) == (body.subscription_id is None):
        raise HTTPProblem(422, "invalid_probe", "Invalid request", "give either url or subscription_id")
    if body.subscription_id is not None:
        subscription = await run_in_threadpool(session.get, Subscription, body.subscription_id)
        if subscription is None:
            raise HTTPProblem(
                404, "subscription_not_found", "Not found", f"no subscription {body.subscription_id!r}"
            )
        url, transport = subscription.url, body.format or Transport(subscription.transport)
    assert url is not None
    who = f"admin token, from {request.client.host if request.client else 'an unknown address'}"
    run = await probes.run(
        session, settings, url, transport, actor=who, resolver=resolver, subscription=subscription
    )
    return _probe_out(run)


@router.get("/probes", response_model=ProbeRunPage)
async def list_probes(session: SessionDep, limit: Limit = 50) -> ProbeRunPage:
    """Probe runs, newest first: who ran them, against what, and every case's answer."""
    statement = select(ProbeRun).order_by(col(ProbeRun.created_at).desc()).limit(limit)
    runs = await run_in_threadpool(lambda: list(session.exec(statement).all()))
    return ProbeRunPage(items=[_probe_out(run) for run in runs])


def _probe_out(run: ProbeRun) -> ProbeRunOut:
    cases, verdict = probes.cases_of(run)
    return ProbeRunOut(
        id=run.id,
        created_at=run.created_at,
        actor=run.actor,
        target=run.target,
        transport=run.transport,
        problems=run.problems,
        verdict=verdict,
        results=[ProbeCaseOut(**case) for case in cases],
    )


# ------------------------------------------------------------------------------- helpers


async def _run(function: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """Run an operation off the event loop; its refusals become problems."""
    try:
        return await run_in_threadpool(function, *args, **kwargs)
    except operations.OperationError as exc:
        status, title = next(v for k, v in _STATUS.items() if isinstance(exc, k))
        raise HTTPProblem(status, exc.reason, title, exc.detail) from None


async def _started(job: operations.JobView) -> JobOut:
    """Hand a recorded job to the workers; 503 (naming the job, to resume) when the broker refuses."""
    if job.status == "running" and not await run_in_threadpool(tasks.send_job, job.id):
        raise HTTPProblem(
            503,
            "broker_unavailable",
            "Service unavailable",
            f"job {job.id} is recorded but could not be sent to the workers; "
            f"POST /admin/jobs/{job.id}/resume once the broker is back",
            extra={"job_id": job.id},
        )
    return JobOut.model_validate(job)
