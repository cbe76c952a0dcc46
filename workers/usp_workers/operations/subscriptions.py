"""One subscription's health, and the operator's controls over it: enable, disable, rate limit."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlmodel import Session

from usp_core.clock import utcnow
from usp_workers.engine import health, ordering
from usp_workers.engine.custom_headers import masked
from usp_workers.engine.endpoint_auth import masked as masked_auth
from usp_workers.engine.ordering import BlockedSubject, blocked_counts
from usp_workers.operations.announce import masked_url
from usp_workers.operations.errors import Conflict, InvalidRequest, NotFound
from usp_workers.operations.query import _attempts, _deliveries, _subscription, _subscriptions
from usp_workers.operations.views import Clock, SubscriptionHealth
from usp_workers.storage.models import (
    AttemptOutcome,
    BreakerState,
    DeliveryStatus,
    Notice,
    OnDead,
    Ordering,
    Subscription,
    SubscriptionState,
)

#: The attempts a subscription's success rate is computed over.
HEALTH_WINDOW = timedelta(hours=24)


#: ``disabled_reason`` when an operator disables a subscription.
DISABLED_BY_OPERATOR = "disabled by an operator"


#: ``disabled_reason`` of a subscription deleted through the feed API: never enabled again
#: (the one definition: ``usp_dispatcher.webhooks.feed`` writes it, :func:`set_subscription_state` reads it).
DELETED = "deleted"


#: The ``subscription.disabled`` notice's detail when a lease lapses (:func:`lapse_leases`).
LEASE_LAPSED = "lease lapsed: its listener stopped renewing it"


#: The highest per-subscription rate limit accepted: an endpoint that takes more needs no limit
#: (each start is a transaction on the subscription's bucket, :mod:`usp_workers.engine.ratelimit`).
MAX_RATE_LIMIT = 10_000


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
                Notice(subscription_id=subscription.id, kind=health.NOTICE_ENABLED, created_at=moment)
            )
    elif subscription.state != SubscriptionState.DISABLED:
        subscription.state = SubscriptionState.DISABLED
        subscription.disabled_reason = DISABLED_BY_OPERATOR
        subscription.updated_at = moment
        session.add(
            Notice(
                subscription_id=subscription.id,
                kind=health.NOTICE_DISABLED,
                detail=DISABLED_BY_OPERATOR,
                created_at=moment,
            )
        )
    session.add(subscription)
    session.commit()
    return _health(session, [subscription], moment)[0]


def lapse_leases(connection: sa.Connection, *, now: datetime) -> list[str]:
    """Delete the active subscriptions whose lease passed unrenewed before ``now`` (a listener
    gone without unsubscribing: killed, crashed, its machine off), each with a
    ``subscription.disabled`` notice saying so; return their ids. What they still had pending
    goes dead unsent, as a deleted subscription's does."""
    lapsed = list(
        connection.execute(
            sa.update(_subscriptions)
            .where(_subscriptions.c.lease_until < now)
            .where(_subscriptions.c.state == SubscriptionState.ACTIVE.value)
            .values(state=SubscriptionState.DISABLED.value, disabled_reason=DELETED, updated_at=now)
            .returning(_subscriptions.c.id)
        ).scalars()
    )
    for subscription_id in lapsed:
        health.record_notice(connection, subscription_id, health.NOTICE_DISABLED, LEASE_LAPSED, now=now)
    return lapsed


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
        own_headers = masked(s.custom_headers)
        items.append(
            SubscriptionHealth(
                id=s.id,
                url=masked_url(s.url),
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
                signatures=tuple(json.loads(s.signatures)),
                payload_filter=s.payload_filter,
                headers=tuple(own_headers["headers"]),
                sign_headers=own_headers["signed"],
                retry_schedule=json.loads(s.retry_schedule) if s.retry_schedule else None,
                auth=masked_auth(s.endpoint_auth),
            )
        )
    return items
