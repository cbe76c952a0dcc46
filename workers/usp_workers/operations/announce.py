"""Operational events: each notice (a subscription disabled, failing, recovered; a delivery dead)
becomes the service's own event, emitted through the outbox to the business's subscriptions that
name those types. The scheduler's pass announces what was noted since its last pass, in the same
transaction that marks the notices announced: each is announced once, and a crash between loses
nothing (docs/architecture.md, "Operational events")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, SQLModel

from usp_receiver import destination
from usp_schemas import OPERATIONAL_EVENT_TYPES, new_event_id
from usp_workers.engine import health
from usp_workers.engine.outbox import emit
from usp_workers.storage.models import Delivery, EventRecord, Notice, Subscription

__all__ = ["ANNOUNCED_KINDS", "BUSINESS_ONLY", "announce_notices", "masked_url"]

#: The audience of every operational event: the business's own subscriptions, never a platform's.
BUSINESS_ONLY = ""
#: Notice kinds and the operational event each becomes (the others are not announced).
ANNOUNCED_KINDS = {
    health.NOTICE_DISABLED: "subscription.disabled",
    health.NOTICE_BREAKER_OPENED: "subscription.failing",
    health.NOTICE_BREAKER_REOPENED: "subscription.failing",
    health.NOTICE_BREAKER_CLOSED: "subscription.recovered",
    health.NOTICE_DELIVERY_DEAD: "delivery.dead",
}
_notices: sa.Table = SQLModel.metadata.tables[Notice.__tablename__]
_subscriptions: sa.Table = SQLModel.metadata.tables[Subscription.__tablename__]
_deliveries: sa.Table = SQLModel.metadata.tables[Delivery.__tablename__]
_events: sa.Table = SQLModel.metadata.tables[EventRecord.__tablename__]


def masked_url(url: str) -> str:
    """``url`` with any credentials in it masked, as every view shows it.

    >>> masked_url("amqp://usp:s3cret@broker:5672/%2f?exchange=x")
    'amqp://***@broker:5672/%2f?exchange=x'
    """
    return destination(url, mask="***")


def announce_notices(session: Session, *, limit: int = 500) -> int:
    """Emit the operational event of each notice not yet announced (oldest first, at most
    ``limit``) and mark them announced, in one transaction; committed. Returns how many notices
    were taken (announced or, for kinds that are not news, only marked)."""
    connection = session.connection()
    rows = connection.execute(
        sa.select(_notices).where(_notices.c.announced.is_(False)).order_by(_notices.c.id).limit(limit)
    ).all()
    if not rows:
        return 0
    subscriptions = {
        row.id: row
        for row in connection.execute(
            sa.select(_subscriptions.c.id, _subscriptions.c.url, _subscriptions.c.state).where(
                _subscriptions.c.id.in_({row.subscription_id for row in rows})
            )
        )
    }
    for notice in rows:
        event = _event_of(connection, notice, subscriptions.get(notice.subscription_id))
        if event is not None:
            emit(session, event, audience=BUSINESS_ONLY)
    connection.execute(
        sa.update(_notices).where(_notices.c.id.in_([row.id for row in rows])).values(announced=True)
    )
    session.commit()
    return len(rows)


def _event_of(connection: sa.Connection, notice: Any, subscription: Any) -> dict[str, Any] | None:
    event_type = ANNOUNCED_KINDS.get(notice.kind)
    if event_type is None or subscription is None:
        return None
    envelope = {
        "event": event_type,
        "event_id": new_event_id(),
        "timestamp": _rfc3339(notice.created_at),
        "subscription_id": subscription.id,
    }
    if event_type != "delivery.dead":
        data = {
            "subscription_id": subscription.id,
            "url": masked_url(subscription.url),
            "state": subscription.state,
            "reason": notice.detail or None,
        }
        return envelope | {"data": data}
    delivery = connection.execute(
        sa.select(
            _deliveries.c.id,
            _deliveries.c.event_id,
            _deliveries.c.attempt_count,
            _deliveries.c.last_error,
            _events.c.event_type,
        )
        .join(_events, _events.c.id == _deliveries.c.event_id)
        .where(_deliveries.c.id == notice.detail)
    ).first()
    if delivery is None or delivery.event_type in OPERATIONAL_EVENT_TYPES:
        return None  # pruned already; or an operational event's own delivery: no event about it
    data = {
        "delivery_id": delivery.id,
        "event_id": delivery.event_id,
        "event_type": delivery.event_type,
        "subscription_id": subscription.id,
        "url": masked_url(subscription.url),
        "attempts": delivery.attempt_count,
        "last_error": delivery.last_error,
    }
    return envelope | {"data": data}


def _rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
