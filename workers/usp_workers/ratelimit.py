"""A per-subscription rate limit enforced across the whole fleet: at most ``rate_limit``
deliveries *start* in any one-second window, however many workers run.

**The mechanism: N start slots per subscription, in the database** (``usp_rate_slots``). A
subscription limited to N/s owns N rows, each stamped with the moment a delivery last started
on it. A delivery may start only on a slot whose stamp is at least ``window`` old (1 s plus
``rate_limit_margin_seconds``), and taking it re-stamps it, in one conditional ``UPDATE``
(``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so concurrent takers never wait on each other, and two
can never take one slot). Each slot starts at most one delivery per window, so any window holds
at most N starts: a *sliding* window, exact, not the fixed-window counter that lets 2N through
across a second boundary.

Why the database rather than a Redis script: it is the one store every deployment has (the
embedded default has no Redis, and a RabbitMQ broker is not a store), so one code path is
enforced, and tested, everywhere; and its cost is paid only by rate-limited subscriptions,
which by definition send few deliveries (one short transaction per start). Unlimited
subscriptions, the hot path, never touch it.

The slot is taken right before the request is sent (not when the batch is claimed): a batch
may wait for an endpoint slot, and a stamp taken early would let two starts reach the receiver
closer together than the window. The margin covers what remains: the jitter between the stamp
and the request's arrival (signing, connecting). Stamps use the workers' clocks: keep them in
NTP sync (skew between machines adds to the jitter).

A delivery over the limit is *deferred*, not failed: back to ``pending``, due when a slot frees,
no attempt spent (:mod:`usp_workers.delivery`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel

from .models import RateSlot

__all__ = ["take_slot", "window_of"]

_slots: sa.Table = SQLModel.metadata.tables[RateSlot.__tablename__]


def window_of(margin: float) -> timedelta:
    """The window one slot is held for: a second plus ``margin``."""
    return timedelta(seconds=1.0 + margin)


def take_slot(
    engine: Engine, subscription_id: str, limit: int, *, now: datetime, window: timedelta
) -> datetime | None:
    """Start a delivery to ``subscription_id`` at ``now`` if its limit allows: ``None`` when it
    may start (a slot was taken), else the moment the next slot frees."""
    with engine.begin() as connection:
        if _take(connection, subscription_id, limit, now=now, window=window):
            return None
        count, oldest = connection.execute(
            sa.select(sa.func.count(), sa.func.min(_slots.c.last_start_at)).where(
                _slots.c.subscription_id == subscription_id, _slots.c.slot < limit
            )
        ).one()
        if count < limit:
            _ensure_slots(connection, subscription_id, limit)
            if _take(connection, subscription_id, limit, now=now, window=window):
                return None
        if oldest is None:
            return now + window
        return max(_slot_time(oldest, now) + window, now)


def _take(
    connection: sa.Connection, subscription_id: str, limit: int, *, now: datetime, window: timedelta
) -> bool:
    c = _slots.c
    free = sa.or_(c.last_start_at.is_(None), c.last_start_at <= now - window)
    pick = (
        sa.select(c.slot)
        .where(c.subscription_id == subscription_id, c.slot < limit, free)
        .order_by(c.slot)
        .limit(1)
        .with_for_update(skip_locked=True)  # PostgreSQL; SQLite renders nothing (it locks the file)
    )
    statement = (
        sa.update(_slots)
        .where(c.subscription_id == subscription_id, c.slot.in_(pick.scalar_subquery()), free)
        .values(last_start_at=now)
        .returning(c.slot)
    )
    return connection.execute(statement).first() is not None


def _ensure_slots(connection: sa.Connection, subscription_id: str, limit: int) -> None:
    """Create the subscription's missing slots 0..limit-1 (a limit just set, or raised)."""
    rows = [
        {"subscription_id": subscription_id, "slot": slot, "last_start_at": None} for slot in range(limit)
    ]
    dialect = connection.dialect.name
    if dialect == "postgresql":
        connection.execute(postgresql.insert(_slots).on_conflict_do_nothing(), rows)
    elif dialect == "sqlite":
        connection.execute(sqlite.insert(_slots).on_conflict_do_nothing(), rows)
    else:  # pragma: no cover - the engine supports SQLite and PostgreSQL
        existing = set(
            connection.execute(
                sa.select(_slots.c.slot).where(_slots.c.subscription_id == subscription_id)
            ).scalars()
        )
        missing = [row for row in rows if row["slot"] not in existing]
        if missing:
            connection.execute(sa.insert(_slots), missing)


def _slot_time(value: datetime, now: datetime) -> datetime:
    """Aggregates (``min``) come back without the column's type on SQLite: naive UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=now.tzinfo)
