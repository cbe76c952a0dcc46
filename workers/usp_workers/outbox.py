"""The transactional outbox: an event and its deliveries are written in the caller's transaction.

``emit(session, event)`` adds the event and one delivery per matching active subscription to the
caller's transaction (the event as an ORM row, the deliveries in one INSERT after the session's
next flush; the subscriptions are read once per transaction, so a transaction of thousands of
events costs a few statements, not thousands of round trips). Nothing leaves the process until
that transaction commits; if it rolls back, nothing was ever sent. After the commit the
deliveries are handed to the broker at once (low latency), and because each delivery is written
already marked ``enqueued_at = now``, a crash between commit and hand-off loses nothing: the
relay re-sends any due delivery still pending ``requeue_after_seconds`` after it was marked (see
:mod:`usp_workers.relay`).
"""

from __future__ import annotations

import fnmatch
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, SQLModel, select

from usp_schemas import WebhookEvent, parse_event

from .models import (
    Delivery,
    DeliveryStatus,
    EventRecord,
    Subscription,
    SubscriptionState,
    new_id,
    utcnow,
)

__all__ = ["Enqueue", "emit", "event_matches", "set_enqueuer", "subject_id_of"]

logger = logging.getLogger("usp_workers")

#: Hands delivery ids to the broker. Set by the Celery app (``usp_workers.tasks``); tests may set
#: their own. ``None`` means "no broker here": the relay will pick the deliveries up.
Enqueue = Callable[[Sequence[str]], None]
_enqueuer: Enqueue | None = None
_PENDING_KEY = "usp_workers.enqueue_after_commit"
_SUBSCRIPTIONS_KEY = "usp_workers.active_subscriptions"
_ROWS_KEY = "usp_workers.deliveries_to_insert"
_deliveries: sa.Table = SQLModel.metadata.tables[Delivery.__tablename__]


def set_enqueuer(enqueue: Enqueue | None) -> None:
    """Choose how freshly committed deliveries reach the broker (process-wide)."""
    global _enqueuer
    _enqueuer = enqueue


def emit(session: Session, event: WebhookEvent | Mapping[str, Any] | bytes | str) -> EventRecord:
    """Record ``event`` and one delivery per matching active subscription, in ``session``'s
    transaction; hand the deliveries to the broker once it commits. Returns the event row.

    The caller owns the transaction: call this inside the same unit of work as the state change
    the event reports, then commit both together.

    >>> with session(engine) as s:                                    # doctest: +SKIP
    ...     booking.state = "confirmed"
    ...     emit(s, booking_confirmed_event(booking))
    ...     s.commit()
    """
    model = event if not isinstance(event, Mapping | bytes | str) else parse_event(event)
    payload = model.model_dump_json()
    now = utcnow()
    record = EventRecord(
        id=model.event_id,
        event_type=model.event,
        subject_id=subject_id_of(model),
        correlation_id=model.correlation_id,
        order_id=model.order_id,
        occurred_at=model.timestamp,
        created_at=now,
        payload=payload,
    )
    subscriptions = _active_subscriptions(session)
    session.add(record)
    rows = [
        {
            "id": new_id("dlv"),
            "event_id": record.id,
            "subscription_id": subscription_id,
            "status": DeliveryStatus.PENDING.value,
            "attempt_count": 0,
            "next_attempt_at": now,
            "enqueued_at": now,
            "created_at": now,
            "updated_at": now,
        }
        for subscription_id, patterns in subscriptions
        if event_matches(model.event, patterns)
    ]
    if rows:
        _insert_after_flush(session, rows)
        _enqueue_after_commit(session, [str(row["id"]) for row in rows])
    return record


def event_matches(event_type: str, patterns: Iterable[str]) -> bool:
    """Whether ``event_type`` matches any pattern: exact, ``*`` for all, or ``booking.*`` style.

    >>> event_matches("booking.confirmed", ["booking.*"]), event_matches("waitlist.left", ["booking.*"])
    (True, False)
    """
    return any(pattern == "*" or fnmatch.fnmatchcase(event_type, pattern) for pattern in patterns)


def subject_id_of(event: WebhookEvent) -> str | None:
    """The id of the object the event is about (booking, service or waitlist entry)."""
    for name in ("booking_id", "waitlist_entry_id", "service_id"):
        value = getattr(event, name, None)
        if isinstance(value, str):
            return value
    return None


def _insert_after_flush(session: Session, rows: list[dict[str, Any]]) -> None:
    """Queue delivery rows for one multi-row INSERT right after the session's next flush (every
    commit flushes), in the same transaction.

    Why not ``session.add(Delivery(...))``: without a relationship between the two models the
    ORM does not order a delivery's INSERT after its event's, so a flush holding both could
    break the foreign key; flushing each event on its own (as a per-event query's autoflush did)
    costs round trips per event. After the flush, every event of the flush is in, and the
    deliveries of them all go in one statement.
    """
    session.info.setdefault(_ROWS_KEY, []).extend(rows)
    if not sa.event.contains(session, "after_flush", _insert_deliveries):
        sa.event.listen(session, "after_flush", _insert_deliveries)


def _insert_deliveries(session: Session, _context: Any) -> None:
    rows: list[dict[str, Any]] = session.info.pop(_ROWS_KEY, [])
    if rows:
        session.connection().execute(sa.insert(_deliveries), rows)


def _active_subscriptions(session: Session) -> list[tuple[str, list[str]]]:
    """The active subscriptions' ids and patterns, read once per transaction and kept until the
    session flushes, commits or rolls back, or a :class:`Subscription` is added to it.

    Why: a transaction that emits many events (a bulk import, a catalog sync) would otherwise
    query the subscriptions once per event, and each query autoflushes the previous event's
    rows first: three round trips per event (~2 ms of CPU on PostgreSQL), where one query per
    transaction and one batched INSERT at commit will do. A subscription changed in the same
    session after the first emit (not added: that is seen) is seen after ``session.flush()``.
    """
    cached: list[tuple[str, list[str]]] | None = session.info.get(_SUBSCRIPTIONS_KEY)
    if cached is not None:
        return cached
    rows = session.exec(
        select(Subscription.id, Subscription.event_types).where(
            Subscription.state == SubscriptionState.ACTIVE
        )
    ).all()
    subscriptions = [(subscription_id, json.loads(patterns)) for subscription_id, patterns in rows]
    if not sa.event.contains(session, "after_flush", _forget_subscriptions):
        for name in ("after_flush", "after_commit", "after_soft_rollback"):
            sa.event.listen(session, name, _forget_subscriptions)
        sa.event.listen(session, "transient_to_pending", _forget_subscriptions_if_one_is_added)
    session.info[_SUBSCRIPTIONS_KEY] = subscriptions
    return subscriptions


def _forget_subscriptions(session: Session, *_: Any) -> None:
    session.info.pop(_SUBSCRIPTIONS_KEY, None)


def _forget_subscriptions_if_one_is_added(session: Session, instance: object) -> None:
    if isinstance(instance, Subscription):
        session.info.pop(_SUBSCRIPTIONS_KEY, None)


def _enqueue_after_commit(session: Session, delivery_ids: list[str]) -> None:
    if not delivery_ids:
        return
    session.info.setdefault(_PENDING_KEY, []).extend(delivery_ids)
    if not sa.event.contains(session, "after_commit", _hand_off):
        sa.event.listen(session, "after_commit", _hand_off)
        sa.event.listen(session, "after_rollback", _forget)


def _hand_off(session: Session) -> None:
    ids: list[str] = session.info.pop(_PENDING_KEY, [])
    if not ids or _enqueuer is None:
        return
    try:
        _enqueuer(ids)
    except Exception:
        # Committed is safe: the relay re-sends these once requeue_after_seconds have passed.
        logger.exception("broker hand-off failed for %d deliveries; the relay will retry", len(ids))


def _forget(session: Session) -> None:
    session.info.pop(_PENDING_KEY, None)
    session.info.pop(_ROWS_KEY, None)
