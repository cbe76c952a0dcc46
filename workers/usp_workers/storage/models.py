"""The delivery engine's tables: events, subscriptions, deliveries, attempts, jobs, notices.

The database is the source of truth for delivery state; the broker only carries wake-ups. A
delivery's schedule lives in ``next_attempt_at`` (not in broker ETA messages), its ownership in
``status`` + ``lease_until``, so anything the broker loses (a flushed Redis, a killed worker) is
found again by the relay. Times are timezone-aware UTC everywhere (:class:`UtcDateTime`).
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Protocol

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from usp_core.clock import UtcDateTime, utcnow
from usp_core.ids import new_id

__all__ = [
    "Attempt",
    "AttemptOutcome",
    "BreakerState",
    "Delivery",
    "DeliveryStatus",
    "EventRecord",
    "EventView",
    "Job",
    "JobStatus",
    "Notice",
    "OnDead",
    "Ordering",
    "RateBucket",
    "Subscription",
    "SubscriptionState",
    "SubscriptionView",
    "Transport",
]


class Transport(enum.StrEnum):
    REST = "rest"  #: POST the event JSON
    JSONRPC = "jsonrpc"  #: POST a ``usp_webhook`` JSON-RPC notification


class Ordering(enum.StrEnum):
    """Whether a subscription's deliveries keep the order of their events."""

    NONE = "none"  #: any order: deliveries go out in parallel (the throughput default)
    #: events of one subject (a booking, a waitlist entry, a post) arrive in the order they were
    #: emitted; a failing event holds back only the later events of its own subject
    SUBJECT = "subject"


class OnDead(enum.StrEnum):
    """What a dead delivery does to the later events of its subject, under subject ordering."""

    BLOCK = "block"  #: they wait until it is redriven (or pruned by retention)
    SKIP = "skip"  #: they go on; the dead one stays in the dead letter


class SubscriptionState(enum.StrEnum):
    ACTIVE = "active"
    DISABLED = "disabled"


class BreakerState(enum.StrEnum):
    """A subscription's circuit breaker: ``open`` pauses its deliveries (attempts not spent)
    until ``breaker_until``; then one ``half_open`` probe decides between closed and open."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class JobStatus(enum.StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class DeliveryStatus(enum.StrEnum):
    PENDING = "pending"  #: waiting for ``next_attempt_at``
    IN_FLIGHT = "in_flight"  #: a worker holds it until ``lease_until``
    SUCCEEDED = "succeeded"
    DEAD = "dead"  #: exhausted its schedule, or its subscription is gone: the dead letter
    #: was dead; a replay, recover or redrive made ``superseded_by`` to deliver it again
    SUPERSEDED = "superseded"


class AttemptOutcome(enum.StrEnum):
    SUCCEEDED = "succeeded"
    RETRY = "retry"
    DEAD = "dead"
    DISABLED = "disabled"  #: 410 Gone: the subscription was disabled


class EventRecord(SQLModel, table=True):
    """An accepted event. ``payload`` is the exact JSON envelope sent as the REST body."""

    __tablename__ = "usp_events"

    id: str = Field(primary_key=True, max_length=80, description="the event_id")
    event_type: str = Field(index=True, max_length=64)
    subject_id: str | None = Field(default=None, index=True, max_length=128)
    correlation_id: str | None = Field(default=None, index=True, max_length=128)
    order_id: str | None = Field(default=None, max_length=128)
    occurred_at: datetime = Field(sa_type=UtcDateTime, index=True)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime, index=True)
    payload: str = Field(sa_type=sa.Text)
    audience: str | None = Field(
        default=None,
        max_length=2048,
        description="the platform profile the event is about (its booking or waitlist entry's"
        " platform): only that platform's subscriptions and the business's own (no profile) get"
        " it; null: every matching subscription",
    )
    traceparent: str | None = Field(
        default=None, max_length=64, description="W3C trace context of the call that emitted it (when traced)"
    )


class EventView(Protocol):
    """What a delivery reads of its event: an :class:`EventRecord`, or the lighter row a batch
    loads (:class:`usp_workers.engine.store.LoadedEvent`)."""

    @property
    def id(self) -> str: ...
    @property
    def payload(self) -> str: ...
    @property
    def correlation_id(self) -> str | None: ...


class Subscription(SQLModel, table=True):
    """Where a platform wants events: a URL, a transport and event-type patterns."""

    __tablename__ = "usp_subscriptions"

    id: str = Field(default_factory=lambda: new_id("sub"), primary_key=True, max_length=40)
    url: str = Field(max_length=2048)
    transport: Transport = Field(default=Transport.REST, sa_type=sa.String(16))
    event_types: str = Field(
        default='["*"]', sa_type=sa.Text, description="JSON list of patterns like booking.*"
    )
    platform_profile: str | None = Field(default=None, index=True, max_length=2048)
    state: SubscriptionState = Field(default=SubscriptionState.ACTIVE, sa_type=sa.String(16), index=True)
    disabled_reason: str | None = Field(default=None, max_length=256)
    rate_limit: int | None = Field(default=None, description="at most this many deliveries per second")
    consecutive_failures: int = Field(default=0)
    failing_since: datetime | None = Field(default=None, sa_type=UtcDateTime)
    last_success_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    last_failure_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    breaker_state: BreakerState = Field(default=BreakerState.CLOSED, sa_type=sa.String(16))
    breaker_until: datetime | None = Field(default=None, sa_type=UtcDateTime)
    breaker_opens: int = Field(
        default=0,
        sa_column_kwargs={"server_default": "0"},
        description="times the breaker opened since it was last closed (the cool-down doubles each time)",
    )
    ordering: Ordering = Field(
        default=Ordering.NONE, sa_type=sa.String(16), sa_column_kwargs={"server_default": "none"}
    )
    on_dead: OnDead = Field(
        default=OnDead.BLOCK, sa_type=sa.String(16), sa_column_kwargs={"server_default": "block"}
    )
    signatures: str = Field(
        default='["rfc9421"]',
        max_length=128,
        sa_column_kwargs={"server_default": '["rfc9421"]'},
        description="JSON list of the signature schemes each delivery carries: rfc9421, standard-webhooks, "
        "standard-webhooks-v1a",
    )
    webhook_secrets: str | None = Field(
        default=None,
        sa_type=sa.Text,
        repr=False,
        description="the Standard Webhooks secrets and keys, sealed (usp_workers.engine.webhook_secrets)",
    )
    lease_until: datetime | None = Field(
        default=None,
        sa_type=UtcDateTime,
        index=True,
        description="a leased subscription (a listener's) is deleted once this passes unrenewed",
    )
    payload_filter: str | None = Field(
        default=None,
        sa_type=sa.Text,
        description="JSON filter on the event's body beside its types (usp_workers.engine.filters)",
    )
    custom_headers: str | None = Field(
        default=None,
        sa_type=sa.Text,
        repr=False,
        description="headers of its own on every delivery, secret values sealed"
        " (usp_workers.engine.custom_headers)",
    )
    retry_schedule: str | None = Field(
        default=None,
        sa_type=sa.Text,
        description="its own waits and maximum age (usp_workers.engine.schedule); none: the service's",
    )
    endpoint_auth: str | None = Field(
        default=None,
        sa_type=sa.Text,
        repr=False,
        description="OAuth 2.0 client credentials or a client certificate, secrets sealed"
        " (usp_workers.engine.endpoint_auth)",
    )
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)


class SubscriptionView(Protocol):
    """What a delivery and its health checks read of a subscription: a :class:`Subscription`, or
    the lighter row a batch loads (:class:`usp_workers.engine.store.LoadedSubscription`)."""

    @property
    def id(self) -> str: ...
    @property
    def url(self) -> str: ...
    @property
    def transport(self) -> Transport: ...
    @property
    def state(self) -> SubscriptionState: ...
    @property
    def rate_limit(self) -> int | None: ...
    @property
    def consecutive_failures(self) -> int: ...
    @property
    def failing_since(self) -> datetime | None: ...
    @property
    def last_success_at(self) -> datetime | None: ...
    @property
    def breaker_state(self) -> BreakerState: ...
    @property
    def breaker_until(self) -> datetime | None: ...


class RateBucket(SQLModel, table=True):
    """A rate-limited subscription's token bucket (see :mod:`usp_workers.engine.ratelimit`): its
    theoretical arrival time, the moment from which the bucket is empty again."""

    __tablename__ = "usp_rate_buckets"

    subscription_id: str = Field(primary_key=True, max_length=40)
    tat: datetime = Field(sa_type=UtcDateTime)


class Delivery(SQLModel, table=True):
    """One event to one subscription, tried until it succeeds or goes dead."""

    __tablename__ = "usp_deliveries"
    __table_args__ = (
        sa.Index("ix_usp_deliveries_due", "status", "next_attempt_at"),
        sa.Index(
            "ix_usp_deliveries_subject",
            "subscription_id",
            "subject_key",
            "subject_order",
            postgresql_where=sa.text("subject_key IS NOT NULL"),
            sqlite_where=sa.text("subject_key IS NOT NULL"),
        ),
        # What the scheduler's relay scans: pending deliveries not held behind their subject.
        sa.Index(
            "ix_usp_deliveries_sendable",
            "next_attempt_at",
            postgresql_where=sa.text("status = 'pending' AND NOT held"),
            sqlite_where=sa.text("status = 'pending' AND held = 0"),
        ),
    )

    id: str = Field(default_factory=lambda: new_id("dlv"), primary_key=True, max_length=40)
    event_id: str = Field(foreign_key="usp_events.id", index=True, max_length=80)
    subscription_id: str = Field(foreign_key="usp_subscriptions.id", index=True, max_length=40)
    status: DeliveryStatus = Field(default=DeliveryStatus.PENDING, sa_type=sa.String(16))
    attempt_count: int = Field(default=0)
    next_attempt_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)
    enqueued_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    lease_until: datetime | None = Field(default=None, sa_type=UtcDateTime)
    last_status_code: int | None = Field(default=None)
    last_error: str | None = Field(default=None, max_length=512)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)
    completed_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    superseded_by: str | None = Field(default=None, max_length=40)
    #: under subject ordering (:mod:`usp_workers.engine.ordering`): the event's subject, and the event's
    #: place among that subject's events; null for an unordered delivery
    subject_key: str | None = Field(default=None, max_length=128)
    subject_order: str | None = Field(default=None, max_length=128)
    #: a pending ordered delivery the relay found behind an earlier one of its subject: out of the
    #: relay's scan until that one settles (:func:`usp_workers.engine.ordering.successors`)
    held: bool = Field(default=False, sa_column_kwargs={"server_default": sa.false()})


class Attempt(SQLModel, table=True):
    """One try of one delivery: what was sent back, how long it took, what we concluded."""

    __tablename__ = "usp_attempts"

    id: int | None = Field(default=None, primary_key=True)
    delivery_id: str = Field(foreign_key="usp_deliveries.id", index=True, max_length=40)
    attempt_number: int
    started_at: datetime = Field(sa_type=UtcDateTime, index=True)
    duration_ms: float
    status_code: int | None = Field(default=None)
    response_excerpt: str | None = Field(default=None, max_length=1024)
    error_class: str | None = Field(default=None, max_length=64)
    outcome: AttemptOutcome = Field(sa_type=sa.String(16))
    key_ids: str | None = Field(
        default=None, max_length=200, description="the kids that signed it, sig1 first (none: never sent)"
    )


class Job(SQLModel, table=True):
    """A long admin operation (recover, redrive, back-fill) run in batches: its progress is
    readable while it runs, and a restarted job knows where it stood."""

    __tablename__ = "usp_jobs"

    id: str = Field(default_factory=lambda: new_id("job"), primary_key=True, max_length=40)
    kind: str = Field(max_length=32)
    params: str = Field(default="{}", sa_type=sa.Text, description="the request, as JSON")
    status: JobStatus = Field(default=JobStatus.RUNNING, sa_type=sa.String(16), index=True)
    total: int = Field(default=0)
    processed: int = Field(default=0)
    cursor: str | None = Field(default=None, max_length=128, description="where the next batch starts")
    resends: int = Field(
        default=0,
        sa_column_kwargs={"server_default": "0"},
        description="times the scheduler re-sent the job since its last progress (its runner died)",
    )
    backfilled: int = Field(
        default=0,
        sa_column_kwargs={"server_default": "0"},
        description="deliveries a recover created for events its subscription missed while disabled",
    )
    error: str | None = Field(default=None, max_length=512)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)
    finished_at: datetime | None = Field(default=None, sa_type=UtcDateTime)


class Notice(SQLModel, table=True):
    """Something operators must hear about a subscription (``subscription.disabled``, breaker
    opened or closed), kept for the admin API."""

    __tablename__ = "usp_notices"

    id: int | None = Field(default=None, primary_key=True)
    subscription_id: str = Field(index=True, max_length=40)
    kind: str = Field(max_length=64)
    detail: str = Field(default="", max_length=512)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime, index=True)
    announced: bool = Field(
        default=False,
        sa_column_kwargs={"server_default": sa.false()},
        description="its operational event was emitted (usp_workers.operations.announce)",
    )


class ProbeRun(SQLModel, table=True):
    """One run of the probe battery (:mod:`usp_workers.operations.probe`): who asked, against what, and
    each case's answer and verdict (JSON), kept for the admin API."""

    __tablename__ = "usp_probe_runs"

    id: str = Field(default_factory=lambda: new_id("prb"), primary_key=True, max_length=40)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime, index=True)
    actor: str = Field(max_length=200, description="who ran it: the admin API's caller")
    target: str = Field(max_length=2048)
    transport: str = Field(max_length=16)
    problems: int
    results: str = Field(sa_type=sa.Text, description="JSON: one object per case")
