"""What an operator does when a platform says "we never got it": look, replay, recover, redrive.

The functions behind the admin API, the console and the operator commands, free of FastAPI.
What replay, recover and redrive do and do not touch: docs/architecture.md, "Operator verbs".
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, SQLModel, col, select

from usp_workers.engine import health, ordering
from usp_workers.engine.ordering import BlockedSubject, blocked_counts, subject_of
from usp_workers.engine.outbox import Enqueue, _enqueue_after_commit, event_matches, new_delivery_row, reaches
from usp_workers.storage.db import session as open_session
from usp_workers.storage.models import (
    Attempt,
    AttemptOutcome,
    BreakerState,
    Delivery,
    DeliveryStatus,
    EventRecord,
    Job,
    JobStatus,
    Notice,
    OnDead,
    Ordering,
    Subscription,
    SubscriptionState,
    new_id,
    utcnow,
)

__all__ = [
    "DELETED",
    "DISABLED_BY_OPERATOR",
    "HEALTH_WINDOW",
    "JOB_BATCH",
    "MAX_JOB_RESENDS",
    "MAX_PAGE",
    "MAX_RATE_LIMIT",
    "AttemptView",
    "Conflict",
    "DeadLetterFilter",
    "DeliveryView",
    "EventDetail",
    "EventFilter",
    "EventSummary",
    "InvalidRequest",
    "JobKind",
    "JobView",
    "NotFound",
    "NoticeView",
    "OperationError",
    "Page",
    "Replayed",
    "SubscriptionHealth",
    "blocked_subjects",
    "dead_letter",
    "decode_cursor",
    "encode_cursor",
    "event_detail",
    "get_job",
    "list_events",
    "list_notices",
    "list_subscriptions",
    "reclaim_stale_jobs",
    "replay_event",
    "resume_job",
    "run_job",
    "set_rate_limit",
    "set_subscription_state",
    "start_recover",
    "start_redrive",
    "step_job",
    "subscription_health",
]

logger = logging.getLogger("usp_workers")

#: Largest page a list returns, whatever ``limit`` asks for.
MAX_PAGE = 200
#: Deliveries a job handles per transaction.
JOB_BATCH = 500
#: The attempts a subscription's success rate is computed over.
HEALTH_WINDOW = timedelta(hours=24)
#: ``disabled_reason`` when an operator disables a subscription.
DISABLED_BY_OPERATOR = "disabled by an operator"
#: ``disabled_reason`` of a subscription deleted through the feed API: never enabled again
#: (the one definition: ``usp_dispatcher.feed`` writes it, :func:`set_subscription_state` reads it).
DELETED = "deleted"
#: The highest per-subscription rate limit accepted: an endpoint that takes more needs no limit
#: (each start is a transaction on the subscription's bucket, :mod:`usp_workers.engine.ratelimit`).
MAX_RATE_LIMIT = 10_000

_CURSOR_PREFIX = "v1:"
_MAX_CURSOR = 256

_events: sa.Table = SQLModel.metadata.tables[EventRecord.__tablename__]
_deliveries: sa.Table = SQLModel.metadata.tables[Delivery.__tablename__]
_attempts: sa.Table = SQLModel.metadata.tables[Attempt.__tablename__]
_subscriptions: sa.Table = SQLModel.metadata.tables[Subscription.__tablename__]
_jobs: sa.Table = SQLModel.metadata.tables[Job.__tablename__]

Clock = Callable[[], datetime]
_T = TypeVar("_T")
_S = TypeVar("_S", bound="sa.Select[Any]")


# ------------------------------------------------------------------------------- errors


class OperationError(Exception):
    """A refusal with a stable ``reason`` code (never user input) and a human ``detail``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class NotFound(OperationError):
    """The event, subscription or job does not exist."""


class Conflict(OperationError):
    """The request contradicts the stored state (a disabled subscription, a deleted one, ...)."""


class InvalidRequest(OperationError):
    """The request is malformed (a cursor that is not ours, a time range that ends first)."""


# ------------------------------------------------------------------------------- views


@dataclass(frozen=True, slots=True)
class Page(Generic[_T]):
    """One page, newest first (subscriptions: oldest first); ``next_cursor`` is ``None`` at the end."""

    items: list[_T]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which events :func:`list_events` returns; every field narrows, ``None`` means any."""

    event_type: str | None = None
    subject_id: str | None = None
    correlation_id: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    #: only events with at least one delivery in this status
    delivery_status: DeliveryStatus | None = None


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """Which dead deliveries :func:`dead_letter` lists and a redrive takes."""

    subscription_id: str | None = None
    event_type: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    def as_params(self) -> dict[str, Any]:
        return {
            "subscription_id": self.subscription_id,
            "event_type": self.event_type,
            "since": _iso(self.since),
            "until": _iso(self.until),
        }


@dataclass(frozen=True, slots=True)
class EventSummary:
    id: str
    event_type: str
    subject_id: str | None
    correlation_id: str | None
    order_id: str | None
    audience: str | None
    occurred_at: datetime
    created_at: datetime
    #: number of delivery rows per status (replays add rows, so this can exceed the subscribers)
    deliveries: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AttemptView:
    attempt_number: int
    started_at: datetime
    duration_ms: float
    status_code: int | None
    response_excerpt: str | None
    error_class: str | None
    outcome: str
    #: the kids that signed the try, ``sig1`` first (``None``: nothing was sent)
    key_ids: str | None = None


@dataclass(frozen=True, slots=True)
class DeliveryView:
    id: str
    event_id: str
    subscription_id: str
    status: str
    attempt_count: int
    next_attempt_at: datetime
    last_status_code: int | None
    last_error: str | None
    created_at: datetime
    completed_at: datetime | None
    superseded_by: str | None = None
    event_type: str | None = None
    attempts: list[AttemptView] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class EventDetail:
    event: EventSummary
    payload: dict[str, Any]
    deliveries: list[DeliveryView]


@dataclass(frozen=True, slots=True)
class Replayed:
    """The deliveries a replay created: ``(delivery id, subscription id)``."""

    event_id: str
    deliveries: list[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class SubscriptionHealth:
    id: str
    url: str
    platform_profile: str | None
    event_types: list[str]
    state: str
    disabled_reason: str | None
    breaker_state: str
    breaker_until: datetime | None
    rate_limit: int | None
    consecutive_failures: int
    failing_since: datetime | None
    last_success_at: datetime | None
    last_failure_at: datetime | None
    #: attempts in the last :data:`HEALTH_WINDOW` and the share of them that succeeded
    #: (``None`` when there were none)
    recent_attempts: int
    success_rate: float | None
    pending: int
    dead: int
    #: subjects whose later events wait behind a dead delivery (subject ordering, ``on_dead``
    #: block): :func:`usp_workers.engine.ordering.blocked_subjects` lists them
    blocked_subjects: int
    ordering: str
    on_dead: str


@dataclass(frozen=True, slots=True)
class NoticeView:
    """Something an operator must hear about a subscription: it was disabled (by a 410, by
    failing too long, by an operator) or enabled, its breaker opened, re-opened after a failed
    probe, or closed."""

    id: int
    subscription_id: str
    kind: str
    detail: str
    created_at: datetime


class JobKind:
    RECOVER = "recover"
    REDRIVE = "redrive"


@dataclass(frozen=True, slots=True)
class JobView:
    id: str
    kind: str
    status: str
    params: dict[str, Any]
    #: rows to handle, counted when the job started (exact once it finished)
    total: int
    processed: int
    #: of those, new deliveries of events a recovered subscription missed while disabled
    backfilled: int
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


# ------------------------------------------------------------------------------- cursors


def encode_cursor(last_id: str) -> str:
    """An opaque cursor for "the rows after ``last_id``".

    >>> decode_cursor(encode_cursor("evt_019a"))
    'evt_019a'
    """
    raw = (_CURSOR_PREFIX + last_id).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    """The id inside a cursor from :func:`encode_cursor`; :class:`InvalidRequest` otherwise."""
    if len(cursor) > _MAX_CURSOR:
        raise InvalidRequest("invalid_cursor", "the cursor is not one this service issued")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise InvalidRequest("invalid_cursor", "the cursor is not one this service issued") from None
    if not raw.startswith(_CURSOR_PREFIX) or len(raw) == len(_CURSOR_PREFIX):
        raise InvalidRequest("invalid_cursor", "the cursor is not one this service issued")
    return raw.removeprefix(_CURSOR_PREFIX)


# ------------------------------------------------------------------------------- events


def list_events(
    session: Session, filters: EventFilter, *, cursor: str | None = None, limit: int = 50
) -> Page[EventSummary]:
    """Events matching ``filters``, newest accepted first, with their delivery counts per status.

    Ordered by acceptance time, then id: ids are the producer's (any layout), so their order says
    nothing about time."""
    _check_range(filters.since, filters.until)
    limit = _clamp(limit)
    statement = sa.select(_events).order_by(_events.c.created_at.desc(), _events.c.id.desc()).limit(limit + 1)
    if cursor is not None:
        after_time, after_id = _event_position(decode_cursor(cursor))
        statement = statement.where(
            sa.or_(
                _events.c.created_at < after_time,
                sa.and_(_events.c.created_at == after_time, _events.c.id < after_id),
            )
        )
    if filters.event_type is not None:
        statement = statement.where(_events.c.event_type == filters.event_type)
    if filters.subject_id is not None:
        statement = statement.where(_events.c.subject_id == filters.subject_id)
    if filters.correlation_id is not None:
        statement = statement.where(_events.c.correlation_id == filters.correlation_id)
    statement = _in_range(statement, _events.c.created_at, filters.since, filters.until)
    if filters.delivery_status is not None:
        statement = statement.where(
            sa.exists().where(
                _deliveries.c.event_id == _events.c.id,
                _deliveries.c.status == filters.delivery_status.value,
            )
        )
    rows = session.connection().execute(statement).all()
    more = len(rows) > limit
    rows = rows[:limit]
    counts = _delivery_counts(session, [row.id for row in rows])
    items = [_summary(row, counts.get(row.id, {})) for row in rows]
    last = rows[-1] if rows else None
    return Page(items, encode_cursor(f"{last.created_at.isoformat()}|{last.id}") if more and last else None)


def _event_position(position: str) -> tuple[datetime, str]:
    """(acceptance time, id) of an events cursor; :class:`InvalidRequest` when it is not one."""
    when, _, event_id = position.partition("|")
    try:
        moment = datetime.fromisoformat(when)
    except ValueError:
        raise InvalidRequest("invalid_cursor", "the cursor is not one this service issued") from None
    if not event_id or moment.tzinfo is None:
        raise InvalidRequest("invalid_cursor", "the cursor is not one this service issued")
    return moment, event_id


def event_detail(session: Session, event_id: str) -> EventDetail:
    """One event, its payload, every delivery of it (oldest first) with every attempt."""
    record = session.get(EventRecord, event_id)
    if record is None:
        raise NotFound("event_not_found", f"no event {event_id!r}")
    connection = session.connection()
    deliveries = connection.execute(
        sa.select(_deliveries).where(_deliveries.c.event_id == event_id).order_by(_deliveries.c.id)
    ).all()
    attempts = _attempts_of(connection, [d.id for d in deliveries])
    counts: dict[str, int] = {}
    for row in deliveries:
        counts[row.status] = counts.get(row.status, 0) + 1
    summary = EventSummary(
        id=record.id,
        event_type=record.event_type,
        subject_id=record.subject_id,
        correlation_id=record.correlation_id,
        order_id=record.order_id,
        audience=record.audience,
        occurred_at=record.occurred_at,
        created_at=record.created_at,
        deliveries=counts,
    )
    views = [_delivery_view(row, attempts=attempts.get(row.id, [])) for row in deliveries]
    return EventDetail(summary, json.loads(record.payload), views)


def replay_event(
    session: Session, event_id: str, *, subscription_id: str | None = None, now: Clock = utcnow
) -> Replayed:
    """Deliver ``event_id`` again, as new deliveries, to one subscription or to every active one
    it matches and reaches; commit, then hand the new deliveries to the broker.

    With ``subscription_id`` the subscription must be active, subscribed to the event's type and
    reached by its audience (:class:`Conflict` otherwise: replaying a platform's booking to
    another platform would leak it). Without, a replay that finds no target creates nothing.
    """
    # FOR KEY SHARE (PostgreSQL): retention, which locks the events it prunes FOR UPDATE SKIP
    # LOCKED, then skips this one; if retention holds it already, this waits for the prune and
    # finds no event (404) instead of failing the INSERT below on the foreign key (a 500).
    record = session.get(EventRecord, event_id, with_for_update={"key_share": True}, populate_existing=True)
    if record is None:
        raise _no_event_to_replay(event_id)
    if subscription_id is not None:
        subscription = _subscription(session, subscription_id)
        _check_target(subscription, record)
        targets = [(subscription.id, subscription.ordering)]
    else:
        rows = session.connection().execute(
            sa.select(
                _subscriptions.c.id,
                _subscriptions.c.event_types,
                _subscriptions.c.platform_profile,
                _subscriptions.c.ordering,
            )
            .where(_subscriptions.c.state == SubscriptionState.ACTIVE.value)
            .order_by(_subscriptions.c.id)
        )
        targets = [
            (row.id, row.ordering)
            for row in rows
            if event_matches(record.event_type, json.loads(row.event_types))
            and reaches(row.platform_profile, record.audience)
        ]
    moment = now()
    created = [(new_id("dlv"), target) for target, _ in targets]
    if created:
        subjects = [
            subject_of(ordering, record.subject_id, record.created_at, record.id) for _, ordering in targets
        ]
        try:
            session.connection().execute(
                sa.insert(_deliveries),
                # As emit's: marked handed off now; the relay re-sends only if the hand-off is lost.
                [
                    new_delivery_row(did, event_id, sid, moment, enqueued_at=moment, subject=subject)
                    for (did, sid), subject in zip(created, subjects, strict=True)
                ],
            )
            _supersede(session.connection(), [(did, event_id, sid) for did, sid in created], moment)
        except sa.exc.IntegrityError:
            # SQLite has no row lock to hold retention off: it pruned the event since we read it.
            session.rollback()
            if session.get(EventRecord, event_id) is None:
                raise _no_event_to_replay(event_id) from None
            raise
        _enqueue_after_commit(session, [did for did, _ in created])
    session.commit()
    return Replayed(event_id, created)


def _supersede(connection: sa.Connection, created: list[tuple[str, str, str]], moment: datetime) -> None:
    """Mark the dead deliveries of each new delivery's (event, subscription) as superseded by it,
    so that the dead letter, the metrics and the subscription counts stop counting them."""
    connection.execute(
        sa.update(_deliveries)
        .where(
            _deliveries.c.event_id == sa.bindparam("e"),
            _deliveries.c.subscription_id == sa.bindparam("s"),
            _deliveries.c.status == DeliveryStatus.DEAD.value,
        )
        .values(status=DeliveryStatus.SUPERSEDED.value, superseded_by=sa.bindparam("by"), updated_at=moment),
        [{"by": new, "e": event, "s": subscription} for new, event, subscription in created],
    )


def _no_event_to_replay(event_id: str) -> NotFound:
    return NotFound(
        "event_not_found",
        f"no event {event_id!r} is stored: it never reached this service, or it was older than the "
        "retention (USP_RETENTION_DAYS) and has been pruned; a pruned event cannot be replayed",
    )


# ------------------------------------------------------------------------------- dead letter


def dead_letter(
    session: Session, filters: DeadLetterFilter, *, cursor: str | None = None, limit: int = 50
) -> Page[DeliveryView]:
    """Dead deliveries matching ``filters``, newest first, each with its attempts. A delivery
    delivered again (replay, recover, redrive) leaves the dead letter: it is ``superseded``, and
    ``superseded_by`` names the delivery that took its place."""
    _check_range(filters.since, filters.until)
    limit = _clamp(limit)
    statement = (
        sa.select(_deliveries, _events.c.event_type)
        .join(_events, _events.c.id == _deliveries.c.event_id)
        .where(_deliveries.c.status == DeliveryStatus.DEAD.value)
        .order_by(_deliveries.c.id.desc())
        .limit(limit + 1)
    )
    if cursor is not None:
        statement = statement.where(_deliveries.c.id < decode_cursor(cursor))
    statement = _dead_letter_filters(statement, filters)
    return _delivery_page(session, statement, limit)


def platform_deliveries(
    session: Session,
    platform_profile: str,
    *,
    subscription_id: str | None = None,
    event_id: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> Page[DeliveryView]:
    """Deliveries to the subscriptions of one platform (``platform_profile``), newest first, each
    with its attempts and event type; narrowed to one of its subscriptions or one event. Never
    another platform's, nor the business's own: what the platform portal shows."""
    limit = _clamp(limit)
    statement = (
        sa.select(_deliveries, _events.c.event_type)
        .join(_events, _events.c.id == _deliveries.c.event_id)
        .join(_subscriptions, _subscriptions.c.id == _deliveries.c.subscription_id)
        .where(_subscriptions.c.platform_profile == platform_profile)
        .order_by(_deliveries.c.id.desc())
        .limit(limit + 1)
    )
    if subscription_id is not None:
        statement = statement.where(_deliveries.c.subscription_id == subscription_id)
    if event_id is not None:
        statement = statement.where(_deliveries.c.event_id == event_id)
    if cursor is not None:
        statement = statement.where(_deliveries.c.id < decode_cursor(cursor))
    return _delivery_page(session, statement, limit)


def _delivery_page(session: Session, statement: sa.Select[Any], limit: int) -> Page[DeliveryView]:
    """The deliveries ``statement`` selects (with their event type, ``limit + 1`` rows at most,
    newest first), each with its attempts, as a page."""
    rows = session.connection().execute(statement).all()
    more = len(rows) > limit
    rows = rows[:limit]
    attempts = _attempts_of(session.connection(), [row.id for row in rows])
    items = [_delivery_view(row, event_type=row.event_type, attempts=attempts.get(row.id)) for row in rows]
    return Page(items, encode_cursor(rows[-1].id) if more else None)


def _attempts_of(connection: sa.Connection, delivery_ids: list[str]) -> dict[str, list[AttemptView]]:
    """Every attempt of each delivery, in order."""
    attempts: dict[str, list[AttemptView]] = {}
    if delivery_ids:
        for row in connection.execute(
            sa.select(_attempts)
            .where(_attempts.c.delivery_id.in_(delivery_ids))
            .order_by(_attempts.c.delivery_id, _attempts.c.attempt_number, _attempts.c.id)
        ):
            attempts.setdefault(row.delivery_id, []).append(_attempt_view(row))
    return attempts


# ------------------------------------------------------------------------------- jobs


def start_recover(
    session: Session,
    subscription_id: str,
    *,
    since: datetime,
    until: datetime | None = None,
    enable: bool = False,
    now: Clock = utcnow,
) -> JobView:
    """Record (and commit) a recover job for ``subscription_id``, for events accepted in
    ``[since, until)``: its failed and dead deliveries are delivered again, and the events that
    matched it while it was disabled (which have no delivery at all) are back-filled; run it
    with :func:`run_job` (the ``usp.run_job`` task). ``total`` counts both; ``backfilled``, as the
    job runs, the second.

    The subscription must be active (its new deliveries would otherwise go dead unsent):
    ``enable`` enables it first (:func:`set_subscription_state`), else a disabled one is a
    :class:`Conflict`.
    """
    _check_range(since, until)
    subscription = _subscription(session, subscription_id)
    if enable:
        set_subscription_state(session, subscription_id, enabled=True, now=now)
        session.refresh(subscription)
    if subscription.state != SubscriptionState.ACTIVE:
        raise Conflict(
            "subscription_disabled",
            f"subscription {subscription_id!r} is disabled: enable it before recovering its deliveries",
        )
    moment = now()
    params = {
        "subscription_id": subscription_id,
        "since": _iso(since),
        "until": _iso(until),
        "backfill_before": _iso(moment),
    }
    return _start(session, JobKind.RECOVER, params, moment)


def start_redrive(session: Session, filters: DeadLetterFilter, *, now: Clock = utcnow) -> JobView:
    """Record (and commit) a job re-delivering the dead letter (filtered) to active subscriptions."""
    _check_range(filters.since, filters.until)
    if filters.subscription_id is not None:
        _subscription(session, filters.subscription_id)
    return _start(session, JobKind.REDRIVE, filters.as_params(), now())


def get_job(session: Session, job_id: str) -> JobView:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound("job_not_found", f"no job {job_id!r}")
    session.refresh(job)
    return _job_view(job)


def resume_job(session: Session, job_id: str, *, now: Clock = utcnow) -> JobView:
    """Make a failed job runnable again (committed); a running or finished one is returned as is.
    Send it to a worker afterwards: it continues after the last batch that committed."""
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound("job_not_found", f"no job {job_id!r}")
    if job.status == JobStatus.FAILED:
        job.status = JobStatus.RUNNING
        job.error = None
        job.resends = 0  # resumed by hand: the scheduler's count of dead runners starts again
        job.finished_at = None
        job.updated_at = now()
        session.add(job)
        session.commit()
    return _job_view(job)


#: Re-sends of a job without progress after which the scheduler fails it instead.
MAX_JOB_RESENDS = 3


def reclaim_stale_jobs(engine: Engine, *, now: datetime, stale_after: float) -> list[str]:
    """The running jobs that made no progress in the ``stale_after`` seconds before ``now``,
    oldest first, each marked as re-sent (``updated_at = now``, ``resends + 1``): send them to
    the workers again.

    A running job's ``updated_at`` moves with every batch it commits, so one that stands still
    that long lost its runner (a killed worker, a message no broker will hand out again). The
    mark is one conditional ``UPDATE``: two schedulers never both take one job, and a job is
    taken again only after another ``stale_after`` without progress. A runner that was merely
    slow is harmless: :func:`step_job`'s conditional cursor lets only one of the two commit each
    batch.

    A job re-sent :data:`MAX_JOB_RESENDS` times without committing a batch in between is not sent
    again but marked failed: something in its next batch kills whichever worker runs it (a
    poison batch), and re-sending it forever would take a worker down every ``stale_after``.
    Its cursor stays where it stood.
    """
    cutoff = now - timedelta(seconds=stale_after)
    stale = sa.and_(_jobs.c.status == JobStatus.RUNNING.value, _jobs.c.updated_at < cutoff)
    with engine.begin() as connection:
        given_up = connection.execute(
            sa.update(_jobs)
            .where(stale, _jobs.c.resends >= MAX_JOB_RESENDS)
            .values(
                status=JobStatus.FAILED.value,
                error=f"its runner died {MAX_JOB_RESENDS + 1} times without finishing a batch; "
                "not sent again",
                updated_at=now,
                finished_at=now,
            )
            .returning(_jobs.c.id)
        ).scalars()
        for job_id in given_up:
            logger.error("job %s failed: its runner died %d times on one batch", job_id, MAX_JOB_RESENDS + 1)
        resent = connection.execute(
            sa.update(_jobs)
            .where(stale)
            .values(updated_at=now, resends=_jobs.c.resends + 1)
            .returning(_jobs.c.id)
        ).scalars()
        return sorted(resent)


def run_job(
    engine: Engine,
    job_id: str,
    *,
    enqueue: Enqueue | None = None,
    batch_size: int = JOB_BATCH,
    now: Clock = utcnow,
) -> JobView:
    """Work ``job_id`` through to the end, one batch per transaction; return its final state.

    ``enqueue`` hands each batch's deliveries to the broker after its commit; without one (or
    when it fails) they are left for the relay, which sends them at its next pass. A job that
    already finished is returned as is. An unexpected error marks the job failed (its cursor
    stays where the last batch ended, so it can be resumed) and is raised again.
    """
    try:
        while step_job(engine, job_id, enqueue=enqueue, batch_size=batch_size, now=now):
            pass
    except Exception as exc:
        _fail(engine, job_id, exc, now())
        raise
    with open_session(engine) as s:
        return get_job(s, job_id)


def step_job(
    engine: Engine,
    job_id: str,
    *,
    enqueue: Enqueue | None = None,
    batch_size: int = JOB_BATCH,
    now: Clock = utcnow,
) -> bool:
    """Handle the job's next batch; ``False`` when the job is finished (or was already).

    The batch and the job's new cursor commit together, and the cursor update is conditional on
    the cursor this batch started from: if two runners race on one job (a redelivered task), the
    second one's batch rolls back instead of sending the same deliveries twice. A recover job
    goes through the subscription's deliveries first, then back-fills the events it has none
    of (:func:`_backfill_batch`), its cursor then prefixed ``events:``.
    """
    moment = now()
    with open_session(engine) as s:
        job = s.get(Job, job_id)
        if job is None:
            raise NotFound("job_not_found", f"no job {job_id!r}")
        if job.status != JobStatus.RUNNING:
            return False
        params = json.loads(job.params)
        enqueued_at = moment if enqueue is not None else None
        limit = max(1, batch_size)
        if job.cursor is not None and job.cursor.startswith(_BACKFILL_CURSOR):
            step = _backfill_batch(s, job.cursor, params, limit=limit, moment=moment, enqueued_at=enqueued_at)
        else:
            step = _delivery_batch(s, job, params, limit=limit, moment=moment, enqueued_at=enqueued_at)
            if step is None and job.kind == JobKind.RECOVER and params.get("backfill_before"):
                step = _Step(handed=[], cursor=_BACKFILL_CURSOR, processed=0)
        if step is None:
            s.connection().execute(
                sa.update(_jobs)
                .where(_jobs.c.id == job_id, _jobs.c.status == JobStatus.RUNNING.value)
                .values(
                    status=JobStatus.SUCCEEDED.value,
                    total=job.processed,
                    updated_at=moment,
                    finished_at=moment,
                )
            )
            s.commit()
            return False
        advanced = (
            s.connection()
            .execute(
                sa.update(_jobs)
                .where(
                    _jobs.c.id == job_id,
                    _jobs.c.status == JobStatus.RUNNING.value,
                    _jobs.c.cursor.is_(None) if job.cursor is None else _jobs.c.cursor == job.cursor,
                )
                .values(
                    cursor=step.cursor,
                    processed=_jobs.c.processed + step.processed,
                    backfilled=_jobs.c.backfilled + step.backfilled,
                    updated_at=moment,
                    resends=0,
                )
            )
            .rowcount
        )
        if advanced != 1:
            s.rollback()
            logger.warning("job %s: another runner took this batch; stopping here", job_id)
            return False
        s.commit()
    if step.handed and enqueue is not None:
        try:
            enqueue(step.handed)
        except Exception:
            # Committed is safe: the relay re-sends them once requeue_after_seconds have passed.
            logger.exception("job %s: broker hand-off failed for %d deliveries", job_id, len(step.handed))
    return True


#: A recover job's cursor once it back-fills events (followed by the last event id handled).
_BACKFILL_CURSOR = "events:"


@dataclass(frozen=True, slots=True)
class _Step:
    """One job batch: the deliveries to hand to the broker, where the next batch starts, and
    how many rows it handled (``backfilled`` of them new deliveries for missed events)."""

    handed: list[str]
    cursor: str
    processed: int
    backfilled: int = 0


def _delivery_batch(
    s: Session,
    job: Job,
    params: dict[str, Any],
    *,
    limit: int,
    moment: datetime,
    enqueued_at: datetime | None,
) -> _Step | None:
    """Re-deliver the job's next deliveries: a dead one gets a new delivery in its place, a
    waiting one is brought forward. None when there are no more."""
    rows = _job_candidates(s, job.kind, params, after=job.cursor, limit=limit)
    if not rows:
        return None
    connection = s.connection()
    handed: list[str] = []
    fresh = [
        new_delivery_row(
            new_id("dlv"),
            row.event_id,
            row.subscription_id,
            moment,
            enqueued_at=enqueued_at,
            subject=(row.subject_key, row.subject_order),  # the dead one's place
        )
        for row in rows
        if row.status == DeliveryStatus.DEAD.value
    ]
    if fresh:
        connection.execute(sa.insert(_deliveries), fresh)
        _supersede(
            connection, [(row["id"], row["event_id"], row["subscription_id"]) for row in fresh], moment
        )
    waiting = [row.id for row in rows if row.status == DeliveryStatus.PENDING.value]
    if waiting:
        brought = connection.execute(
            sa.update(_deliveries)
            .where(_deliveries.c.id.in_(waiting), _deliveries.c.status == DeliveryStatus.PENDING.value)
            .values(next_attempt_at=moment, enqueued_at=enqueued_at, updated_at=moment)
            .returning(_deliveries.c.id)
        ).scalars()
        handed.extend(brought)
    handed.extend(str(row["id"]) for row in fresh)
    return _Step(handed=handed, cursor=rows[-1].id, processed=len(rows))


def _backfill_batch(
    s: Session,
    cursor: str,
    params: dict[str, Any],
    *,
    limit: int,
    moment: datetime,
    enqueued_at: datetime | None,
) -> _Step | None:
    """A delivery for each of the next events that the recovered subscription should have had
    and has none of: those that matched it while it was disabled (emit skips a disabled
    subscription). None when there are no more."""
    subscription = s.get(Subscription, params["subscription_id"])
    if subscription is None:
        return None
    after = cursor.removeprefix(_BACKFILL_CURSOR) or None
    statement = _missed_events(s, subscription, params).order_by(_events.c.id).limit(limit)
    if after is not None:
        statement = statement.where(_events.c.id > after)
    rows = s.connection().execute(statement).all()
    if not rows:
        return None
    fresh = [
        new_delivery_row(
            new_id("dlv"),
            row.id,
            subscription.id,
            moment,
            enqueued_at=enqueued_at,
            subject=subject_of(subscription.ordering, row.subject_id, row.created_at, row.id),
        )
        for row in rows
    ]
    s.connection().execute(sa.insert(_deliveries), fresh)
    return _Step(
        handed=[str(row["id"]) for row in fresh],
        cursor=_BACKFILL_CURSOR + rows[-1].id,
        processed=len(rows),
        backfilled=len(rows),
    )


def _missed_events(s: Session, subscription: Subscription, params: dict[str, Any]) -> sa.Select[Any]:
    """The events of the job's range, accepted before it started, that ``subscription`` matches
    (types, audience) and has no delivery of."""
    since, until = _moment(params["since"]), _moment(params["until"])
    before = _moment(params["backfill_before"])
    assert before is not None
    ranged = _in_range(sa.select(_events.c.event_type).distinct(), _events.c.created_at, since, until)
    patterns = json.loads(subscription.event_types)
    types = [t for t in s.connection().execute(ranged).scalars() if event_matches(t, patterns)]
    delivered = sa.exists().where(
        _deliveries.c.event_id == _events.c.id, _deliveries.c.subscription_id == subscription.id
    )
    statement = sa.select(_events.c.id, _events.c.subject_id, _events.c.created_at).where(
        _events.c.event_type.in_(types), _events.c.created_at < before, ~delivered
    )
    if subscription.platform_profile is not None:  # :func:`usp_workers.engine.outbox.reaches`, in SQL
        statement = statement.where(
            sa.or_(_events.c.audience.is_(None), _events.c.audience == subscription.platform_profile)
        )
    return _in_range(statement, _events.c.created_at, since, until)


# ------------------------------------------------------------------------------- subscriptions


def list_subscriptions(
    session: Session,
    *,
    state: SubscriptionState | None = None,
    cursor: str | None = None,
    limit: int = 50,
    now: Clock = utcnow,
) -> Page[SubscriptionHealth]:
    """Subscriptions, oldest first, with their health."""
    limit = _clamp(limit)
    statement = select(Subscription).order_by(col(Subscription.id)).limit(limit + 1)
    if cursor is not None:
        statement = statement.where(col(Subscription.id) > decode_cursor(cursor))
    if state is not None:
        statement = statement.where(col(Subscription.state) == state)
    subscriptions = list(session.exec(statement).all())
    more = len(subscriptions) > limit
    subscriptions = subscriptions[:limit]
    items = _health(session, subscriptions, now())
    return Page(items, encode_cursor(subscriptions[-1].id) if more else None)


def list_notices(
    session: Session,
    *,
    subscription_id: str | None = None,
    kind: str | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> Page[NoticeView]:
    """Health notices, newest first, of one subscription or all."""
    limit = _clamp(limit)
    statement = select(Notice).order_by(col(Notice.id).desc()).limit(limit + 1)
    if cursor is not None:
        try:
            before = int(decode_cursor(cursor))
        except ValueError:
            raise InvalidRequest("invalid_cursor", "the cursor is not one this service issued") from None
        statement = statement.where(col(Notice.id) < before)
    if subscription_id is not None:
        statement = statement.where(col(Notice.subscription_id) == subscription_id)
    if kind is not None:
        statement = statement.where(col(Notice.kind) == kind)
    rows = list(session.exec(statement).all())
    more = len(rows) > limit
    rows = rows[:limit]
    items = [
        NoticeView(
            id=row.id or 0,
            subscription_id=row.subscription_id,
            kind=row.kind,
            detail=row.detail,
            created_at=row.created_at,
        )
        for row in rows
    ]
    return Page(items, encode_cursor(str(items[-1].id)) if more else None)


def blocked_subjects(session: Session, subscription_id: str) -> list[BlockedSubject]:
    """The subscription's subjects waiting behind a dead delivery (:class:`NotFound` when there
    is no such subscription)."""
    _subscription(session, subscription_id)
    return ordering.blocked_subjects(session.connection(), subscription_id)


def subscription_health(session: Session, subscription_id: str, *, now: Clock = utcnow) -> SubscriptionHealth:
    """One subscription with its health (:class:`NotFound` when there is none)."""
    return _health(session, [_subscription(session, subscription_id)], now())[0]


def set_subscription_state(
    session: Session, subscription_id: str, *, enabled: bool, now: Clock = utcnow
) -> SubscriptionHealth:
    """Enable or disable a subscription (committed); both are idempotent.

    Disabling stops new deliveries (and makes pending ones go dead unsent) and records a
    ``subscription.disabled`` notice. Enabling clears the failure streak and closes the breaker:
    the operator says the endpoint is fixed, and an old streak would otherwise disable it again
    at the next failure. A deleted subscription stays deleted (:class:`Conflict`).
    """
    subscription = _subscription(session, subscription_id)
    moment = now()
    if enabled:
        if subscription.disabled_reason == DELETED:
            raise Conflict("subscription_deleted", f"subscription {subscription_id!r} was deleted")
        if subscription.state != SubscriptionState.ACTIVE:
            health.reset_health(session, subscription.id, now=moment)
            subscription.state = SubscriptionState.ACTIVE
            subscription.disabled_reason = None
            session.add(
                Notice(subscription_id=subscription.id, kind="subscription.enabled", created_at=moment)
            )
    elif subscription.state != SubscriptionState.DISABLED:
        subscription.state = SubscriptionState.DISABLED
        subscription.disabled_reason = DISABLED_BY_OPERATOR
        subscription.updated_at = moment
        session.add(
            Notice(
                subscription_id=subscription.id,
                kind="subscription.disabled",
                detail=DISABLED_BY_OPERATOR,
                created_at=moment,
            )
        )
    session.add(subscription)
    session.commit()
    return _health(session, [subscription], moment)[0]


def set_rate_limit(
    session: Session, subscription_id: str, per_second: int | None, *, now: Clock = utcnow
) -> SubscriptionHealth:
    """Limit the deliveries *started* to a subscription in any second, across every worker, or
    lift the limit with ``None`` (committed). Deliveries over it wait, no attempt spent.

    :class:`InvalidRequest` for a limit below 1 (:func:`usp_workers.engine.health.set_rate_limit`
    decides) or above :data:`MAX_RATE_LIMIT`; :class:`NotFound` for no such subscription.
    """
    if per_second is not None and per_second > MAX_RATE_LIMIT:
        raise InvalidRequest(
            "invalid_rate_limit", f"the rate limit is at most {MAX_RATE_LIMIT} deliveries per second"
        )
    moment = now()
    try:
        subscription = health.set_rate_limit(session, subscription_id, per_second, now=moment)
    except ValueError as exc:
        raise InvalidRequest("invalid_rate_limit", str(exc)) from None
    if subscription is None:
        raise NotFound("subscription_not_found", f"no subscription {subscription_id!r}")
    session.commit()
    return _health(session, [subscription], moment)[0]


# ------------------------------------------------------------------------------- helpers


def _clamp(limit: int) -> int:
    return max(1, min(limit, MAX_PAGE))


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _moment(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def _check_range(since: datetime | None, until: datetime | None) -> None:
    for moment in (since, until):
        if moment is not None and moment.tzinfo is None:
            raise InvalidRequest("invalid_time", "times must carry a UTC offset (e.g. 2026-03-14T22:00:00Z)")
    if since is not None and until is not None and until <= since:
        raise InvalidRequest("invalid_time_range", "until must be later than since")


def _in_range(
    statement: _S, column: sa.ColumnElement[Any], since: datetime | None, until: datetime | None
) -> _S:
    if since is not None:
        statement = statement.where(column >= since)
    if until is not None:
        statement = statement.where(column < until)
    return statement


def _dead_letter_filters(statement: _S, filters: DeadLetterFilter) -> _S:
    if filters.subscription_id is not None:
        statement = statement.where(_deliveries.c.subscription_id == filters.subscription_id)
    if filters.event_type is not None:
        statement = statement.where(_events.c.event_type == filters.event_type)
    return _in_range(statement, _events.c.created_at, filters.since, filters.until)


def _subscription(session: Session, subscription_id: str) -> Subscription:
    subscription = session.get(Subscription, subscription_id)
    if subscription is None:
        raise NotFound("subscription_not_found", f"no subscription {subscription_id!r}")
    return subscription


def _check_target(subscription: Subscription, record: EventRecord) -> None:
    if subscription.state != SubscriptionState.ACTIVE:
        raise Conflict(
            "subscription_disabled", f"subscription {subscription.id!r} is disabled: enable it first"
        )
    if not event_matches(record.event_type, json.loads(subscription.event_types)):
        raise Conflict(
            "event_type_not_subscribed",
            f"subscription {subscription.id!r} is not subscribed to {record.event_type}",
        )
    if not reaches(subscription.platform_profile, record.audience):
        raise Conflict(
            "audience_mismatch",
            f"event {record.id} is not for subscription {subscription.id!r}'s platform",
        )


def _delivery_counts(session: Session, event_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    if not event_ids:
        return {}
    rows = session.connection().execute(
        sa.select(_deliveries.c.event_id, _deliveries.c.status, sa.func.count())
        .where(_deliveries.c.event_id.in_(list(event_ids)))
        .group_by(_deliveries.c.event_id, _deliveries.c.status)
    )
    counts: dict[str, dict[str, int]] = {}
    for event_id, status, count in rows:
        counts.setdefault(event_id, {})[status] = int(count)
    return counts


def _summary(row: sa.Row[Any], counts: dict[str, int]) -> EventSummary:
    return EventSummary(
        id=row.id,
        event_type=row.event_type,
        subject_id=row.subject_id,
        correlation_id=row.correlation_id,
        order_id=row.order_id,
        audience=row.audience,
        occurred_at=row.occurred_at,
        created_at=row.created_at,
        deliveries=counts,
    )


def _attempt_view(row: sa.Row[Any]) -> AttemptView:
    return AttemptView(
        attempt_number=row.attempt_number,
        started_at=row.started_at,
        duration_ms=row.duration_ms,
        status_code=row.status_code,
        response_excerpt=row.response_excerpt,
        error_class=row.error_class,
        outcome=row.outcome,
        key_ids=row.key_ids,
    )


def _delivery_view(
    row: sa.Row[Any], *, attempts: list[AttemptView] | None = None, event_type: str | None = None
) -> DeliveryView:
    return DeliveryView(
        id=row.id,
        event_id=row.event_id,
        subscription_id=row.subscription_id,
        status=row.status,
        attempt_count=row.attempt_count,
        next_attempt_at=row.next_attempt_at,
        last_status_code=row.last_status_code,
        last_error=row.last_error,
        created_at=row.created_at,
        completed_at=row.completed_at,
        superseded_by=row.superseded_by,
        event_type=event_type,
        attempts=attempts or [],
    )


def _start(session: Session, kind: str, params: dict[str, Any], moment: datetime) -> JobView:
    # The newest delivery now: the job stops there, so rows it creates are not swept up again.
    newest = session.connection().execute(sa.select(sa.func.max(_deliveries.c.id))).scalar()
    params = params | {"max_delivery_id": newest}
    total = 0
    if newest is not None:
        candidates = _candidates_query(kind, params).with_only_columns(sa.func.count()).order_by(None)
        total = int(session.connection().execute(candidates).scalar_one())
    if params.get("backfill_before"):
        subscription = _subscription(session, params["subscription_id"])
        missed = _missed_events(session, subscription, params).with_only_columns(sa.func.count())
        total += int(session.connection().execute(missed).scalar_one())
    job = Job(kind=kind, params=json.dumps(params), total=total, created_at=moment, updated_at=moment)
    if newest is None and total == 0:
        job.status = JobStatus.SUCCEEDED
        job.finished_at = moment
    session.add(job)
    session.commit()
    return _job_view(job)


def _job_candidates(
    session: Session, kind: str, params: dict[str, Any], *, after: str | None, limit: int
) -> list[sa.Row[Any]]:
    statement = _candidates_query(kind, params).order_by(_deliveries.c.id).limit(limit)
    if after is not None:
        statement = statement.where(_deliveries.c.id > after)
    if session.connection().dialect.name == "postgresql":
        # Rows a worker is claiming right now are skipped by it, not waited for by us.
        statement = statement.with_for_update(of=_deliveries, skip_locked=True)
    return list(session.connection().execute(statement).all())


def _candidates_query(kind: str, params: dict[str, Any]) -> sa.Select[Any]:
    """The deliveries a job re-delivers (see the module docstring), in any order."""
    newer = _deliveries.alias("newer")
    latest = ~sa.exists().where(
        newer.c.event_id == _deliveries.c.event_id,
        newer.c.subscription_id == _deliveries.c.subscription_id,
        newer.c.id > _deliveries.c.id,
    )
    statement = (
        sa.select(
            _deliveries.c.id,
            _deliveries.c.event_id,
            _deliveries.c.subscription_id,
            _deliveries.c.status,
            _deliveries.c.subject_key,
            _deliveries.c.subject_order,
        )
        .join(_events, _events.c.id == _deliveries.c.event_id)
        .where(latest)
    )
    if params.get("max_delivery_id") is not None:
        statement = statement.where(_deliveries.c.id <= params["max_delivery_id"])
    if kind == JobKind.RECOVER:
        statement = statement.where(
            _deliveries.c.subscription_id == params["subscription_id"],
            sa.or_(
                _deliveries.c.status == DeliveryStatus.DEAD.value,
                sa.and_(
                    _deliveries.c.status == DeliveryStatus.PENDING.value,
                    _deliveries.c.attempt_count > 0,
                ),
            ),
        )
        return _in_range(statement, _events.c.created_at, _moment(params["since"]), _moment(params["until"]))
    if kind == JobKind.REDRIVE:
        active = sa.select(_subscriptions.c.id).where(
            _subscriptions.c.state == SubscriptionState.ACTIVE.value
        )
        statement = statement.where(
            _deliveries.c.status == DeliveryStatus.DEAD.value,
            _deliveries.c.subscription_id.in_(active.scalar_subquery()),
        )
        filters = DeadLetterFilter(
            subscription_id=params.get("subscription_id"),
            event_type=params.get("event_type"),
            since=_moment(params.get("since")),
            until=_moment(params.get("until")),
        )
        return _dead_letter_filters(statement, filters)
    raise ValueError(f"unknown job kind {kind!r}")


def _fail(engine: Engine, job_id: str, exc: Exception, moment: datetime) -> None:
    """Mark the job failed with the error's class (its text may hold data; the log has it)."""
    try:
        with engine.begin() as connection:
            connection.execute(
                sa.update(_jobs)
                .where(_jobs.c.id == job_id, _jobs.c.status == JobStatus.RUNNING.value)
                .values(
                    status=JobStatus.FAILED.value,
                    error=type(exc).__name__,
                    updated_at=moment,
                    finished_at=moment,
                )
            )
    except sa.exc.SQLAlchemyError:
        logger.exception("job %s: could not record its failure", job_id)


def _job_view(job: Job) -> JobView:
    return JobView(
        id=job.id,
        kind=job.kind,
        status=JobStatus(job.status).value,
        params={k: v for k, v in json.loads(job.params).items() if k != "max_delivery_id"},
        total=job.total,
        processed=job.processed,
        backfilled=job.backfilled,
        error=job.error,
        created_at=job.created_at,
        updated_at=job.updated_at,
        finished_at=job.finished_at,
    )


def _health(
    session: Session, subscriptions: Sequence[Subscription], moment: datetime
) -> list[SubscriptionHealth]:
    ids = [s.id for s in subscriptions]
    recent: dict[str, tuple[int, int]] = {}
    backlog: dict[tuple[str, str], int] = {}
    blocked: dict[str, int] = {}
    if ids:
        connection = session.connection()
        ordered = [s.id for s in subscriptions if s.ordering == Ordering.SUBJECT]
        if ordered:
            blocked = blocked_counts(connection, ordered)
        succeeded = sa.case((_attempts.c.outcome == AttemptOutcome.SUCCEEDED.value, 1), else_=0)
        for subscription_id, total, ok in connection.execute(
            sa.select(_deliveries.c.subscription_id, sa.func.count(), sa.func.sum(succeeded))
            .join(_deliveries, _deliveries.c.id == _attempts.c.delivery_id)
            .where(_deliveries.c.subscription_id.in_(ids), _attempts.c.started_at >= moment - HEALTH_WINDOW)
            .group_by(_deliveries.c.subscription_id)
        ):
            recent[subscription_id] = (int(total), int(ok or 0))
        for subscription_id, status, count in connection.execute(
            sa.select(_deliveries.c.subscription_id, _deliveries.c.status, sa.func.count())
            .where(
                _deliveries.c.subscription_id.in_(ids),
                _deliveries.c.status.in_([DeliveryStatus.PENDING.value, DeliveryStatus.DEAD.value]),
            )
            .group_by(_deliveries.c.subscription_id, _deliveries.c.status)
        ):
            backlog[(subscription_id, status)] = int(count)
    items = []
    for s in subscriptions:
        total, ok = recent.get(s.id, (0, 0))
        items.append(
            SubscriptionHealth(
                id=s.id,
                url=s.url,
                platform_profile=s.platform_profile,
                event_types=json.loads(s.event_types),
                state=SubscriptionState(s.state).value,
                disabled_reason=s.disabled_reason,
                breaker_state=BreakerState(s.breaker_state).value,
                breaker_until=s.breaker_until,
                rate_limit=s.rate_limit,
                consecutive_failures=s.consecutive_failures,
                failing_since=s.failing_since,
                last_success_at=s.last_success_at,
                last_failure_at=s.last_failure_at,
                recent_attempts=total,
                success_rate=(ok / total) if total else None,
                pending=backlog.get((s.id, DeliveryStatus.PENDING.value), 0),
                dead=backlog.get((s.id, DeliveryStatus.DEAD.value), 0),
                blocked_subjects=blocked.get(s.id, 0),
                ordering=Ordering(s.ordering).value,
                on_dead=OnDead(s.on_dead).value,
            )
        )
    return items
