"""Looking: events (filtered, newest first), one event with its deliveries and attempts, the dead
letter, a platform's deliveries, notices and subscriptions.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from usp_core.clock import utcnow
from usp_workers.engine.health import NOTICE_DELIVERY_DEAD
from usp_workers.engine.outbox import refusal
from usp_workers.operations.announce import masked_url
from usp_workers.operations.errors import InvalidRequest, NotFound
from usp_workers.operations.query import (
    _attempts_of,
    _check_range,
    _clamp,
    _dead_letter_filters,
    _deliveries,
    _delivery_counts,
    _delivery_page,
    _events,
    _in_range,
    _subscription,
    _subscriptions,
    decode_cursor,
    encode_cursor,
)
from usp_workers.operations.subscriptions import _health
from usp_workers.operations.views import (
    Clock,
    DeadLetterFilter,
    DeliveryView,
    EventDetail,
    EventFilter,
    EventSummary,
    Matching,
    NoticeView,
    Page,
    SubscriptionHealth,
    _delivery_view,
    _summary,
)
from usp_workers.storage.models import DeliveryStatus, EventRecord, Notice, Subscription, SubscriptionState


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


#: Subscriptions :func:`event_matching` accounts for, at most (the oldest first).
MATCHING_LIMIT = 200


def event_matching(session: Session, event_id: str) -> list[Matching]:
    """Which subscriptions take the event and, for each that does not, why: judged by its types,
    audience and filter as they stand now (:func:`usp_workers.engine.outbox.refusal`), or its state."""
    record = session.get(EventRecord, event_id)
    if record is None:
        raise NotFound("event_not_found", f"no event {event_id!r}")
    rows = session.connection().execute(
        sa.select(
            _subscriptions.c.id,
            _subscriptions.c.url,
            _subscriptions.c.state,
            _subscriptions.c.event_types,
            _subscriptions.c.platform_profile,
            _subscriptions.c.payload_filter,
        )
        .order_by(_subscriptions.c.id)
        .limit(MATCHING_LIMIT)
    )
    matching = []
    for row in rows:
        why = refusal(record, row)
        if why is None and row.state != SubscriptionState.ACTIVE.value:
            why = f"it is {row.state}"
        matching.append(Matching(row.id, masked_url(row.url), why))
    return matching


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
    statement = _newest_deliveries(cursor, limit).join(
        _subscriptions, _subscriptions.c.id == _deliveries.c.subscription_id
    )
    statement = statement.where(_subscriptions.c.platform_profile == platform_profile)
    if subscription_id is not None:
        statement = statement.where(_deliveries.c.subscription_id == subscription_id)
    if event_id is not None:
        statement = statement.where(_deliveries.c.event_id == event_id)
    return _delivery_page(session, statement, _clamp(limit))


def subscription_deliveries(
    session: Session, subscription_id: str, *, cursor: str | None = None, limit: int = 20
) -> Page[DeliveryView]:
    """One subscription's deliveries, newest first, each with its attempts and event type
    (:class:`NotFound` when there is no such subscription): what its console page lists."""
    _subscription(session, subscription_id)
    statement = _newest_deliveries(cursor, limit).where(_deliveries.c.subscription_id == subscription_id)
    return _delivery_page(session, statement, _clamp(limit))


def _newest_deliveries(cursor: str | None, limit: int) -> sa.Select[Any]:
    statement = (
        sa.select(_deliveries, _events.c.event_type)
        .join(_events, _events.c.id == _deliveries.c.event_id)
        .order_by(_deliveries.c.id.desc())
        .limit(_clamp(limit) + 1)
    )
    if cursor is not None:
        statement = statement.where(_deliveries.c.id < decode_cursor(cursor))
    return statement


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
    """Health notices, newest first, of one subscription or all. A dead delivery's notice (what
    its ``delivery.dead`` operational event is made from) is listed only when asked for by kind:
    the dead letter is where dead deliveries are looked at."""
    limit = _clamp(limit)
    statement = select(Notice).order_by(col(Notice.id).desc()).limit(limit + 1)
    if kind is None:
        statement = statement.where(col(Notice.kind) != NOTICE_DELIVERY_DEAD)
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
