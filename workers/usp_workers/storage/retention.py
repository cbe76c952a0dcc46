"""Retention: events (with their deliveries), attempts and notices older than ``retention_days``,
deleted in small batches by the scheduler; an event with work in flight is never pruned
(docs/architecture.md, "Retention, metrics, the heap").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel

from usp_core.clock import utcnow
from usp_workers.settings import SchedulerSettings
from usp_workers.storage.models import Attempt, Delivery, DeliveryStatus, EventRecord, Notice

__all__ = ["BATCH", "MAX_BATCHES_PER_PASS", "RetentionReport", "RetentionSchedule", "prune_once"]

logger = logging.getLogger("usp_workers")

#: Rows per table per transaction (events: their deliveries count, see :func:`_within_rows`).
BATCH = 500
#: Batches per pass (per table); the rest waits for the next pass.
MAX_BATCHES_PER_PASS = 20
#: How often the scheduler prunes when the previous pass finished everything.
INTERVAL = timedelta(minutes=10)

_events: sa.Table = SQLModel.metadata.tables[EventRecord.__tablename__]
_deliveries: sa.Table = SQLModel.metadata.tables[Delivery.__tablename__]
_attempts: sa.Table = SQLModel.metadata.tables[Attempt.__tablename__]
_notices: sa.Table = SQLModel.metadata.tables[Notice.__tablename__]
_UNFINISHED = (DeliveryStatus.PENDING.value, DeliveryStatus.IN_FLIGHT.value)


@dataclass(frozen=True, slots=True)
class RetentionReport:
    """What one :func:`prune_once` pass deleted; ``more``: it stopped at its batch budget."""

    attempts: int = 0
    events: int = 0
    deliveries: int = 0
    notices: int = 0
    more: bool = False

    @property
    def busy(self) -> bool:
        return bool(self.attempts or self.events or self.deliveries or self.notices)


def prune_once(
    engine: Engine,
    settings: SchedulerSettings,
    *,
    now: datetime | None = None,
    batch: int = BATCH,
    max_batches: int = MAX_BATCHES_PER_PASS,
) -> RetentionReport:
    """One pass: delete what is older than ``retention_days`` at ``now`` (nothing when it is 0)."""
    if settings.retention_days <= 0:
        return RetentionReport()
    cutoff = (now or utcnow()) - timedelta(days=settings.retention_days)
    attempts, more_attempts = _repeat(lambda: _prune_attempts(engine, cutoff, batch), batch, max_batches)
    events = deliveries = 0
    more_events = False
    for _ in range(max_batches):
        pruned_events, pruned_deliveries, full = _prune_events(engine, cutoff, batch)
        events += pruned_events
        deliveries += pruned_deliveries
        if not full:
            break
    else:
        more_events = True
    notices, more_notices = _repeat(lambda: _prune_notices(engine, cutoff, batch), batch, max_batches)
    return RetentionReport(
        attempts, events, deliveries, notices, more_attempts or more_events or more_notices
    )


class RetentionSchedule:
    """When the scheduler prunes: at once, then every :data:`INTERVAL`; again at the next pass
    while a pass ends with work left (``more``)."""

    def __init__(self) -> None:
        self.next_at: datetime | None = None

    def due(self, now: datetime) -> bool:
        return self.next_at is None or now >= self.next_at

    def done(self, report: RetentionReport, now: datetime) -> None:
        self.next_at = now if report.more else now + INTERVAL


def _repeat(step: Callable[[], int], batch: int, max_batches: int) -> tuple[int, bool]:
    total = 0
    for _ in range(max_batches):
        count = step()
        total += count
        if count < batch:
            return total, False
    return total, True


def _prune_attempts(engine: Engine, cutoff: datetime, batch: int) -> int:
    old = sa.select(_attempts.c.id).where(_attempts.c.started_at < cutoff).limit(batch)
    with engine.begin() as connection:
        ids = list(connection.execute(old).scalars())
        if not ids:
            return 0
        connection.execute(sa.delete(_attempts).where(_attempts.c.id.in_(ids)))
    return len(ids)


def _prune_events(engine: Engine, cutoff: datetime, batch: int) -> tuple[int, int, bool]:
    """Prune the oldest prunable events, at most ``batch`` of them and no more of them than keeps
    their deliveries within ``batch`` rows (one event at least: an event is never split); return
    the events and deliveries deleted, and whether the batch was full (more may be left)."""
    unfinished = (
        sa.select(_deliveries.c.id)
        .where(_deliveries.c.event_id == _events.c.id, _deliveries.c.status.in_(_UNFINISHED))
        .exists()
    )
    candidates = (
        sa.select(_events.c.id)
        .where(_events.c.created_at < cutoff, ~unfinished)
        .order_by(_events.c.created_at)
        .limit(batch)
        .with_for_update(skip_locked=True)  # PostgreSQL; SQLite renders nothing (it locks the file)
    )
    with engine.begin() as connection:
        ids = list(connection.execute(candidates).scalars())
        if not ids:
            return 0, 0, False
        full = len(ids) == batch
        ids, cut = _within_rows(connection, ids, batch)
        full = full or cut
        # Lock their deliveries and look again: a redrive may have made one pending since. A
        # delivery locked elsewhere (a recover or redrive batch, which then inserts a delivery
        # whose foreign key needs the event row we hold) is skipped, its event kept: waiting for
        # it would deadlock.
        locked = connection.execute(
            sa.select(_deliveries.c.id, _deliveries.c.event_id, _deliveries.c.status)
            .where(_deliveries.c.event_id.in_(ids))
            .with_for_update(skip_locked=True)
        ).all()
        taken = {row.id for row in locked}
        busy = {row.event_id for row in locked if row.status in _UNFINISHED}
        busy.update(
            row.event_id
            for row in connection.execute(
                sa.select(_deliveries.c.id, _deliveries.c.event_id).where(_deliveries.c.event_id.in_(ids))
            )
            if row.id not in taken
        )
        ids = [event_id for event_id in ids if event_id not in busy]
        if not ids:
            return 0, 0, False  # no progress possible now: the next pass looks again
        their_deliveries = sa.select(_deliveries.c.id).where(_deliveries.c.event_id.in_(ids))
        connection.execute(sa.delete(_attempts).where(_attempts.c.delivery_id.in_(their_deliveries)))
        deliveries = connection.execute(
            sa.delete(_deliveries).where(_deliveries.c.event_id.in_(ids))
        ).rowcount
        connection.execute(sa.delete(_events).where(_events.c.id.in_(ids)))
    return len(ids), deliveries, full


def _within_rows(connection: sa.Connection, ids: list[str], rows: int) -> tuple[list[str], bool]:
    """The longest prefix of ``ids`` (oldest first) whose deliveries number at most ``rows``, one
    event at least; and whether it is shorter than ``ids``.

    Why: an event fans out to every matching subscription and to each replay, so a batch of
    events bounds nothing; a batch of 500 events with 200 deliveries each would delete 100,000
    rows in one transaction, holding their locks (on SQLite the whole database's write lock)
    while every worker's ``record`` waits.
    """
    counts: dict[str, int] = {
        event_id: count
        for event_id, count in connection.execute(
            sa.select(_deliveries.c.event_id, sa.func.count())
            .where(_deliveries.c.event_id.in_(ids))
            .group_by(_deliveries.c.event_id)
        )
    }
    kept: list[str] = []
    total = 0
    for event_id in ids:
        total += counts.get(event_id, 0)
        if kept and total > rows:
            return kept, True
        kept.append(event_id)
    return kept, False


def _prune_notices(engine: Engine, cutoff: datetime, batch: int) -> int:
    old = sa.select(_notices.c.id).where(_notices.c.created_at < cutoff).limit(batch)
    with engine.begin() as connection:
        ids = list(connection.execute(old).scalars())
        if not ids:
            return 0
        connection.execute(sa.delete(_notices).where(_notices.c.id.in_(ids)))
    return len(ids)
