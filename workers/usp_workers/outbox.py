"""The transactional outbox: an event and its deliveries are written in the caller's transaction.

``emit(session, event)`` adds the event and one delivery per matching active subscription to the
caller's session. Nothing leaves the process until that transaction commits; if it rolls back,
nothing was ever sent. After the commit the deliveries are handed to the broker at once (low
latency), and because each delivery is written already marked ``enqueued_at = now``, a crash
between commit and hand-off loses nothing: the relay re-sends any due delivery still pending
``requeue_after_seconds`` after it was marked (see :mod:`usp_workers.relay`).
"""

from __future__ import annotations

import fnmatch
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, select

from usp_schemas import WebhookEvent, parse_event

from .models import Delivery, EventRecord, Subscription, SubscriptionState, utcnow

__all__ = ["Enqueue", "emit", "event_matches", "set_enqueuer", "subject_id_of"]

logger = logging.getLogger("usp_workers")

#: Hands delivery ids to the broker. Set by the Celery app (``usp_workers.tasks``); tests may set
#: their own. ``None`` means "no broker here": the relay will pick the deliveries up.
Enqueue = Callable[[Sequence[str]], None]
_enqueuer: Enqueue | None = None
_PENDING_KEY = "usp_workers.enqueue_after_commit"


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
    session.add(record)
    subscriptions = session.exec(
        select(Subscription).where(Subscription.state == SubscriptionState.ACTIVE)
    ).all()
    deliveries = [
        Delivery(event_id=record.id, subscription_id=sub.id, next_attempt_at=now, enqueued_at=now)
        for sub in subscriptions
        if event_matches(model.event, json.loads(sub.event_types))
    ]
    session.add_all(deliveries)
    _enqueue_after_commit(session, [d.id for d in deliveries])
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
