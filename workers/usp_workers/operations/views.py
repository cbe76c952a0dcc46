"""What operations answer: plain dataclasses of events, deliveries, attempts, jobs and
subscription health, and the filters they take.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

import sqlalchemy as sa

from usp_workers.storage.models import DeliveryStatus, Job, JobStatus

Clock = Callable[[], datetime]


_T = TypeVar("_T")


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
class Matching:
    """Whether a subscription took an event when it was emitted (or would now): ``why_not`` says
    what kept it out (its types, its platform, its filter, its state), ``None`` when it took it."""

    subscription_id: str
    url: str
    why_not: str | None


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
    #: the schemes every delivery is signed with (``rfc9421``, ``standard-webhooks``, ...)
    signatures: tuple[str, ...] = ("rfc9421",)
    #: its payload filter, as saved (canonical JSON), or ``None``
    payload_filter: str | None = None
    #: its own headers as every view shows them, secret values masked
    headers: tuple[dict[str, Any], ...] = ()
    #: whether the signature covers them
    sign_headers: bool = False
    #: its own retry schedule (``{"delays", "max_age_seconds"}``), or ``None``: the service's
    retry_schedule: dict[str, Any] | None = None
    #: its endpoint authentication as every view shows it (the secret masked), or ``None``
    auth: dict[str, Any] | None = None


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


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def _moment(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


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
