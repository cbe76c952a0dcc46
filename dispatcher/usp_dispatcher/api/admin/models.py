"""The admin API's answers, typed so ``/docs`` documents every field."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from usp_workers import DeliveryStatus, OnDead, Ordering, SubscriptionState, operations

__all__ = [
    "AttemptOut",
    "BlockedSubjectList",
    "BlockedSubjectOut",
    "DeliveryOut",
    "DeliveryPage",
    "DeliveryRef",
    "EventDetailOut",
    "EventPage",
    "EventSummaryOut",
    "JobOut",
    "NoticeOut",
    "NoticePage",
    "ProblemOut",
    "RateLimitIn",
    "RecoverIn",
    "RedriveIn",
    "ReplayIn",
    "ReplayOut",
    "SubscriptionHealthOut",
    "SubscriptionPage",
    "_Out",
]


class ProblemOut(BaseModel):
    """An RFC 9457 problem (sent as ``application/problem+json``); switch on ``reason``."""

    type: str
    title: str
    status: int
    detail: str
    reason: str = Field(description="stable code, e.g. event_not_found, subscription_disabled")


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
