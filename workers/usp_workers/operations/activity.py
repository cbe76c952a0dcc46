"""One subscription's recent attempts: how many per minute by outcome, and how long they took.

What the console's endpoint page charts. One aggregate query over the window (the minutes and
the duration buckets are ``CASE`` sums against bound values), the same on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

import sqlalchemy as sa
from sqlmodel import Session, SQLModel

from usp_core.clock import utcnow
from usp_workers.storage.models import Attempt, Delivery

__all__ = ["DURATION_BOUNDS_MS", "Activity", "subscription_activity"]

_attempts: sa.Table = SQLModel.metadata.tables[Attempt.__tablename__]
_deliveries: sa.Table = SQLModel.metadata.tables[Delivery.__tablename__]
_MINUTE: Final = timedelta(minutes=1)

#: Upper bounds (ms) of the duration buckets the percentiles are read from.
DURATION_BOUNDS_MS: Final = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000)


@dataclass(frozen=True, slots=True)
class Activity:
    """``minutes`` are the window's minute starts, oldest first; ``per_minute[outcome][i]`` the
    attempts of that outcome started in minute ``i``. The percentiles are interpolated within
    :data:`DURATION_BOUNDS_MS` buckets, as Prometheus' ``histogram_quantile`` does (``None``
    without attempts)."""

    minutes: list[datetime]
    per_minute: dict[str, list[int]]
    attempts: int
    p50_ms: float | None
    p99_ms: float | None


def subscription_activity(
    session: Session, subscription_id: str, *, minutes: int = 60, now: Callable[[], datetime] = utcnow
) -> Activity:
    """The last ``minutes`` whole minutes of ``subscription_id``'s attempts, and the current one."""
    moment = now()
    current = moment.replace(second=0, microsecond=0)
    starts = [current - timedelta(minutes=minutes - i) for i in range(minutes + 1)]
    a = _attempts.c
    # Both cumulative: attempts started before each minute's end, and no longer than each bound.
    minute_columns = [_count(a.started_at < start + _MINUTE) for start in starts]
    bucket_columns = [_count(a.duration_ms <= bound) for bound in DURATION_BOUNDS_MS]
    statement = (
        sa.select(a.outcome, sa.func.count(), *minute_columns, *bucket_columns)
        .select_from(_attempts.join(_deliveries, _deliveries.c.id == a.delivery_id))
        .where(_deliveries.c.subscription_id == subscription_id, a.started_at >= starts[0])
        .group_by(a.outcome)
    )
    per_minute: dict[str, list[int]] = {}
    total = 0
    buckets = [0] * len(DURATION_BOUNDS_MS)
    for row in session.connection().execute(statement):
        values: list[Any] = [int(v or 0) for v in row[1:]]
        total += values[0]
        before = values[1 : 1 + len(starts)]
        per_minute[str(row[0])] = [n - p for n, p in zip(before, [0, *before[:-1]], strict=True)]
        for i, n in enumerate(values[1 + len(starts) :]):
            buckets[i] += n
    p50, p99 = _quantile(0.5, buckets, total), _quantile(0.99, buckets, total)
    return Activity(starts, per_minute, total, p50, p99)


def _count(condition: sa.ColumnElement[bool]) -> sa.ColumnElement[Any]:
    return sa.func.sum(sa.case((condition, 1), else_=0))


def _quantile(q: float, cumulative: list[int], total: int) -> float | None:
    """The ``q`` quantile from cumulative bucket counts, linear within the bucket it falls in;
    beyond the last bound, that bound."""
    if total == 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0
    for bound, count in zip(DURATION_BOUNDS_MS, cumulative, strict=True):
        if count >= rank:
            if count == lower_count:
                return float(bound)
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = float(bound), count
    return float(DURATION_BOUNDS_MS[-1])
