"""A subscription's recent attempts per minute and their latency (``usp_workers.operations.activity``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy.engine import Engine
from sqlmodel import Session

from tests.workers.support import add_subscription, emit_event
from usp_workers.operations.activity import subscription_activity
from usp_workers.storage.models import Attempt, AttemptOutcome, Delivery

NOW = datetime(2026, 12, 5, 12, 30, 40, tzinfo=UTC)


def record(engine: Engine, delivery_id: str, started_at: datetime, duration_ms: float, outcome: str) -> None:
    with Session(engine) as s:
        s.add(
            Attempt(
                delivery_id=delivery_id,
                attempt_number=1,
                started_at=started_at,
                duration_ms=duration_ms,
                outcome=AttemptOutcome(outcome),
            )
        )
        s.commit()


def test_attempts_are_counted_per_minute_by_outcome_and_only_the_subscription_s(database: Engine) -> None:
    mine = add_subscription(database, "https://mine.example/hooks")
    theirs = add_subscription(database, "https://theirs.example/hooks")
    _, ids = emit_event(database)
    by_subscription: dict[str, str] = {}
    with Session(database) as s:
        for delivery_id in ids:
            row = s.get(Delivery, delivery_id)
            assert row is not None
            by_subscription[row.subscription_id] = delivery_id
    here, there = by_subscription[mine.id], by_subscription[theirs.id]
    record(database, here, NOW - timedelta(minutes=2, seconds=10), 10, "retry")  # 12:28
    record(database, here, NOW - timedelta(minutes=2, seconds=1), 40, "retry")  # 12:28
    record(database, here, NOW - timedelta(seconds=30), 4, "succeeded")  # 12:30
    record(database, here, NOW - timedelta(minutes=90), 4, "succeeded")  # before the window
    record(database, there, NOW - timedelta(seconds=5), 4, "succeeded")  # another subscription

    with Session(database) as s:
        activity = subscription_activity(s, mine.id, minutes=5, now=lambda: NOW)

    assert activity.minutes[0] == datetime(2026, 12, 5, 12, 25, tzinfo=UTC)
    assert activity.minutes[-1] == datetime(2026, 12, 5, 12, 30, tzinfo=UTC)
    assert activity.per_minute == {"retry": [0, 0, 0, 2, 0, 0], "succeeded": [0, 0, 0, 0, 0, 1]}
    assert activity.attempts == 3
    assert activity.p50_ms is not None
    assert 5 < activity.p50_ms <= 20, "the middle attempt took 10 ms: the 5-10 or 10-20 ms bucket"
    assert activity.p99_ms is not None
    assert 20 < activity.p99_ms <= 50


def test_no_attempts_no_percentiles(database: Engine) -> None:
    quiet = add_subscription(database, "https://quiet.example/hooks")
    with Session(database) as s:
        activity = subscription_activity(s, quiet.id, minutes=3, now=lambda: NOW)
    assert (activity.attempts, activity.per_minute, activity.p50_ms, activity.p99_ms) == (0, {}, None, None)
    assert len(activity.minutes) == 4
