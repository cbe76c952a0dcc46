"""A per-subscription rate limit enforced across the whole fleet: a GCRA bucket per subscription
in the database, so deliveries *start* at the configured rate, evenly spaced, however many
workers run (docs/architecture.md, "Rate limits").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel

from usp_workers.storage.models import RateBucket

__all__ = ["Reservation", "burst_of", "reserve"]

_buckets: sa.Table = SQLModel.metadata.tables[RateBucket.__tablename__]


@dataclass(frozen=True, slots=True)
class Reservation:
    """``granted``: the delivery may start at ``at`` (now or within the wait asked for); else
    the bucket's next start is ``at``, and nothing was taken."""

    granted: bool
    at: datetime


def burst_of(rate: int) -> int:
    """The starts a bucket allows back to back: a tenth of a second's worth, at least one.

    >>> burst_of(5), burst_of(50), burst_of(1000)
    (1, 5, 100)
    """
    return max(1, math.ceil(rate / 10))


def reserve(
    engine: Engine, subscription_id: str, rate: int, *, clock: Callable[[], datetime], max_wait: float
) -> Reservation:
    """Reserve a start for a delivery to ``subscription_id`` (limited to ``rate`` per second) at
    ``clock()`` or at most ``max_wait`` seconds later.

    The clock is read once the bucket is locked, so the reservations of one bucket see time in the
    order they are made: a clock read before waiting for the lock made a later reservation look
    earlier than the one before it, and refused it the start that the next one then got.
    """
    interval = timedelta(seconds=1.0 / rate)
    tolerance = interval * (burst_of(rate) - 1)
    with engine.begin() as connection:
        first = clock()
        locked = _locked_tat(connection, subscription_id, first)
        now = max(first, clock())
        tat = _aware(locked, now)
        tat = max(tat, now)
        start = max(now, tat - tolerance)
        if (start - now).total_seconds() > max_wait:
            return Reservation(False, start)
        bucket = _buckets.c.subscription_id == subscription_id
        connection.execute(sa.update(_buckets).where(bucket).values(tat=tat + interval))
    return Reservation(True, start)


def _locked_tat(connection: sa.Connection, subscription_id: str, now: datetime) -> datetime:
    """The bucket's ``tat``, locked until the transaction ends; a new bucket starts full.

    The insert comes first, whether or not the row exists: on SQLite it is what takes the write
    lock, so a second reservation reads only after the first committed (a ``SELECT`` would let
    both read the same ``tat``); on PostgreSQL the row is then locked ``FOR UPDATE``.
    """
    values = {"subscription_id": subscription_id, "tat": now}
    insert = postgresql.insert if connection.dialect.name == "postgresql" else sqlite.insert
    connection.execute(insert(_buckets).values(values).on_conflict_do_nothing())
    row = connection.execute(
        sa.select(_buckets.c.tat).where(_buckets.c.subscription_id == subscription_id).with_for_update()
    ).one()
    tat: datetime = row.tat
    return tat


def _aware(value: datetime, now: datetime) -> datetime:
    """A locked row read back without the column's type on some paths: naive UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=now.tzinfo)
