"""Per-subject FIFO: a subscription with ``ordering = "subject"`` gets each subject's events in
the order they were emitted, while different subjects flow in parallel.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_workers.engine.ordering``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import SQLModel

from usp_workers.storage.models import Delivery, DeliveryStatus, EventRecord, OnDead, Ordering, Subscription

__all__ = [
    "BlockedSubject",
    "blocked_counts",
    "blocked_subjects",
    "place",
    "subject_of",
    "successors",
    "unblocked",
]

_deliveries: sa.Table = SQLModel.metadata.tables[Delivery.__tablename__]
_subscriptions: sa.Table = SQLModel.metadata.tables[Subscription.__tablename__]
_events: sa.Table = SQLModel.metadata.tables[EventRecord.__tablename__]
_UNSETTLED = (DeliveryStatus.PENDING.value, DeliveryStatus.IN_FLIGHT.value)


def place(created_at: datetime, event_id: str) -> str:
    """An event's place among its subject's events: sorts as ``(created_at, event_id)``.

    >>> place(datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC), "evt_1")
    '20260102T030405.000006Z evt_1'
    """
    return f"{created_at.astimezone(UTC):%Y%m%dT%H%M%S.%fZ} {event_id}"


def subject_of(
    ordering: Ordering | str, subject_id: str | None, created_at: datetime, event_id: str
) -> tuple[str | None, str | None]:
    """``(subject_key, subject_order)`` for a new delivery: set only when the subscription orders
    by subject and the event has one (an event without a subject is never held back)."""
    if ordering != Ordering.SUBJECT or subject_id is None:
        return None, None
    return subject_id, place(created_at, event_id)


def unblocked(rows: Any) -> sa.ColumnElement[bool]:
    """Whether each delivery among ``rows`` (the deliveries table, or an alias of it) may go now:
    unordered, or no earlier delivery of its subject to its subscription is pending, in flight,
    or dead while the subscription blocks on dead ones.

    Why the ``IS NULL`` first: PostgreSQL and SQLite stop at the first true branch of an ``OR``,
    so an unordered delivery never runs the lookup (the claim of unordered subscriptions costs
    what it did), and an ordered one runs it on ``ix_usp_deliveries_subject``.
    """
    earlier = _deliveries.alias("earlier")
    blocks_on_dead = (
        sa.select(_subscriptions.c.on_dead)
        .where(_subscriptions.c.id == earlier.c.subscription_id)
        .scalar_subquery()
        == OnDead.BLOCK.value
    )
    holding = sa.exists().where(
        earlier.c.subscription_id == rows.c.subscription_id,
        earlier.c.subject_key == rows.c.subject_key,
        earlier.c.subject_order < rows.c.subject_order,
        _holds_back(earlier, blocks_on_dead),
    )
    return sa.or_(rows.c.subject_key.is_(None), ~holding)


def _holds_back(rows: Any, blocks_on_dead: sa.ColumnElement[bool]) -> sa.ColumnElement[bool]:
    """Whether a delivery among ``rows`` holds back the later ones of its subject: pending, in
    flight, or dead while its subscription blocks on dead ones (``blocks_on_dead``)."""
    return sa.or_(
        rows.c.status.in_(_UNSETTLED),
        sa.and_(rows.c.status == DeliveryStatus.DEAD.value, blocks_on_dead),
    )


def successors(connection: sa.Connection, finished: list[str], *, now: datetime, handed: bool) -> list[str]:
    """The deliveries that ``finished`` (ordered deliveries just settled) were holding back and
    that may go now. With ``handed`` they are marked handed to the broker at ``now`` and the
    caller hands them over after the commit (if that fails, the scheduler re-sends them once
    ``requeue_after_seconds`` have passed); without, they are left for the scheduler's next pass."""
    if not finished:
        return []
    marked = now if handed else None
    rows = connection.execute(_RELEASE, {"finished": finished, "now": now, "marked": marked})
    return sorted(rows.scalars())


def _release() -> sa.Update:
    """Each finished delivery's subject's head (its earliest delivery still pending, in flight, or
    dead while the subscription blocks on dead ones), marked when it is pending and due: one walk
    of ``ix_usp_deliveries_subject`` per subject (docs/architecture.md, ``usp_workers.engine.ordering``)."""
    done, later = _deliveries.alias("done"), _deliveries.alias("later")
    head = (
        sa.select(later.c.id)
        .where(
            later.c.subscription_id == done.c.subscription_id,
            later.c.subject_key == done.c.subject_key,
            _holds_back(later, _subscriptions.c.on_dead == OnDead.BLOCK.value),
        )
        .order_by(later.c.subject_order)
        .limit(1)
        .scalar_subquery()
    )
    heads = (
        sa.select(head)
        .select_from(done.join(_subscriptions, _subscriptions.c.id == done.c.subscription_id))
        .where(done.c.id.in_(sa.bindparam("finished", expanding=True)), done.c.subject_key.is_not(None))
    )
    return (
        sa.update(_deliveries)
        .where(
            _deliveries.c.id.in_(heads),
            _deliveries.c.status == DeliveryStatus.PENDING.value,
            _deliveries.c.next_attempt_at <= sa.bindparam("now"),
        )
        .values(enqueued_at=sa.bindparam("marked"), held=False)
        .returning(_deliveries.c.id)
    )


_RELEASE = _release()


@dataclass(frozen=True, slots=True)
class BlockedSubject:
    """A subject whose later events wait behind a dead delivery (``on_dead = "block"``)."""

    subscription_id: str
    subject: str
    delivery_id: str  #: the dead delivery holding it
    event_id: str
    event_type: str
    dead_since: datetime | None
    waiting: int  #: later deliveries of the subject held back


def _dead_holding() -> sa.Select[Any]:
    return (
        sa.select(_deliveries)
        .join(_subscriptions, _subscriptions.c.id == _deliveries.c.subscription_id)
        .where(
            _deliveries.c.status == DeliveryStatus.DEAD.value,
            _deliveries.c.subject_key.is_not(None),
            _subscriptions.c.on_dead == OnDead.BLOCK.value,
        )
    )


def blocked_subjects(
    connection: sa.Connection, subscription_id: str, *, limit: int = 200
) -> list[BlockedSubject]:
    """One subscription's blocked subjects, the longest blocked first, each with its dead
    delivery (the earliest, when several) and how many deliveries wait behind it."""
    dead = _dead_holding().where(_deliveries.c.subscription_id == subscription_id).subquery("dead")
    waiting = _deliveries.alias("waiting")
    count = (
        sa.select(sa.func.count())
        .where(
            waiting.c.subscription_id == dead.c.subscription_id,
            waiting.c.subject_key == dead.c.subject_key,
            waiting.c.subject_order > dead.c.subject_order,
            waiting.c.status.in_(_UNSETTLED),
        )
        .scalar_subquery()
    )
    rows = connection.execute(
        sa.select(dead, _events.c.event_type, count.label("waiting"))
        .join(_events, _events.c.id == dead.c.event_id)
        .order_by(dead.c.subject_key, dead.c.subject_order)
    ).all()
    subjects: dict[str, BlockedSubject] = {}
    for row in rows:
        if row.subject_key in subjects:
            continue  # a later dead one of the same subject: the earliest is what holds it
        subjects[row.subject_key] = BlockedSubject(
            subscription_id=row.subscription_id,
            subject=row.subject_key,
            delivery_id=row.id,
            event_id=row.event_id,
            event_type=row.event_type,
            dead_since=row.completed_at,
            waiting=int(row.waiting),
        )
    ordered = sorted(subjects.values(), key=lambda b: (b.dead_since is None, b.dead_since or datetime.min))
    return ordered[:limit]


def blocked_counts(connection: sa.Connection, subscription_ids: list[str] | None = None) -> dict[str, int]:
    """Blocked subjects per subscription (of those given, or all): the admin view's count and
    the ``usp_subjects_blocked`` gauge."""
    holding = _dead_holding()
    if subscription_ids is not None:
        holding = holding.where(_deliveries.c.subscription_id.in_(subscription_ids))
    dead = holding.subquery("dead")
    rows = connection.execute(
        sa.select(dead.c.subscription_id, sa.func.count(sa.distinct(dead.c.subject_key))).group_by(
            dead.c.subscription_id
        )
    ).all()
    return {subscription_id: int(count) for subscription_id, count in rows}
