"""Prometheus metrics read from the database at scrape time (why not counters:
docs/architecture.md, "Retention, metrics, the heap"; the series: README, "Endpoint health,
retention, metrics").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel

from usp_core.clock import utcnow
from usp_workers.engine.ordering import blocked_counts, unblocked
from usp_workers.operations import DELETED
from usp_workers.storage.models import (
    Attempt,
    BreakerState,
    Delivery,
    DeliveryStatus,
    EventRecord,
    Subscription,
)

__all__ = ["LATENCY_BUCKETS", "DatabaseCollector", "Snapshot", "delivery_counts", "render", "snapshot"]

#: Upper bounds (seconds) of the attempt latency histogram's buckets; +Inf is added.
LATENCY_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0)

_deliveries: sa.Table = SQLModel.metadata.tables[Delivery.__tablename__]
_events: sa.Table = SQLModel.metadata.tables[EventRecord.__tablename__]
_attempts: sa.Table = SQLModel.metadata.tables[Attempt.__tablename__]
_subscriptions: sa.Table = SQLModel.metadata.tables[Subscription.__tablename__]


@dataclass(frozen=True, slots=True)
class LatencyRow:
    outcome: str
    buckets: tuple[int, ...]  #: cumulative counts, one per :data:`LATENCY_BUCKETS` bound
    count: int
    total_seconds: float


@dataclass(frozen=True, slots=True)
class SubscriptionHealth:
    id: str
    active: bool
    breaker_state: str
    consecutive_failures: int
    blocked_subjects: int = 0


@dataclass(slots=True)
class Snapshot:
    """Everything one scrape reports, read in one transaction."""

    deliveries: dict[tuple[str, str], int] = field(default_factory=dict)  #: (status, event type)
    due: int = 0
    held: int = 0  #: due, but waiting behind an earlier delivery of its subject (subject ordering)
    scheduled: int = 0
    in_flight: int = 0
    oldest_due_age: float = 0.0
    oldest_pending_age: float = 0.0
    dead: int = 0
    latency: list[LatencyRow] = field(default_factory=list)
    subscriptions: list[SubscriptionHealth] = field(default_factory=list)


def snapshot(engine: Engine, window_seconds: float, *, now: datetime | None = None) -> Snapshot:
    """Read the metrics' numbers at ``now`` (default: the present); latency over the last
    ``window_seconds``."""
    moment = now or utcnow()
    result = Snapshot()
    d = _deliveries.c
    with engine.connect() as connection:
        result.deliveries = delivery_counts(connection)
        # The dead letter: a dead delivery delivered again is "superseded", counted apart.
        result.dead = sum(n for (status, _), n in result.deliveries.items() if status == DeliveryStatus.DEAD)
        result.in_flight = sum(
            n for (status, _), n in result.deliveries.items() if status == DeliveryStatus.IN_FLIGHT
        )
        pending = d.status == DeliveryStatus.PENDING.value
        # One pass over the due rows: ``free`` is whether each may go now (not held back).
        due_rows = (
            sa.select(d.next_attempt_at, unblocked(_deliveries).label("free"))
            .where(pending, d.next_attempt_at <= moment)
            .subquery()
        )
        free = due_rows.c.free
        all_due, due_count, oldest_due = connection.execute(
            sa.select(
                sa.func.count(),
                sa.func.count(sa.case((free, 1))),
                sa.func.min(sa.case((free, due_rows.c.next_attempt_at))),
            )
        ).one()
        result.due = int(due_count)
        result.held = int(all_due) - result.due
        pending_total = sum(
            n for (status, _), n in result.deliveries.items() if status == DeliveryStatus.PENDING
        )
        result.scheduled = max(0, pending_total - result.due - result.held)
        if oldest_due is not None:
            result.oldest_due_age = max(0.0, (moment - oldest_due).total_seconds())
        oldest_pending = connection.execute(
            sa.select(sa.func.min(d.created_at)).where(
                d.status.in_([DeliveryStatus.PENDING.value, DeliveryStatus.IN_FLIGHT.value])
            )
        ).scalar()
        if oldest_pending is not None:
            result.oldest_pending_age = max(0.0, (moment - oldest_pending).total_seconds())
        result.latency = _latency(connection, moment - timedelta(seconds=window_seconds))
        s = _subscriptions.c
        blocked = blocked_counts(connection)
        result.subscriptions = [
            SubscriptionHealth(
                row.id,
                row.state == "active",
                row.breaker_state,
                int(row.consecutive_failures),
                blocked.get(row.id, 0),
            )
            for row in connection.execute(
                sa.select(s.id, s.state, s.breaker_state, s.consecutive_failures)
                # A deleted subscription keeps its row for good: exported, every create/delete
                # cycle of a platform would add series forever.
                .where(sa.or_(s.disabled_reason.is_(None), s.disabled_reason != DELETED))
                .order_by(s.id)
            )
        ]
    return result


def delivery_counts(connection: sa.Connection) -> dict[tuple[str, str], int]:
    """Delivery rows per (status, event type): ``usp_deliveries``, and what the console's dead
    letter page totals, so the two always agree."""
    d = _deliveries.c
    rows = connection.execute(
        sa.select(d.status, _events.c.event_type, sa.func.count())
        .select_from(_deliveries.join(_events, _events.c.id == d.event_id))
        .group_by(d.status, _events.c.event_type)
    ).all()
    return {(row[0], row[1]): int(row[2]) for row in rows}


class DatabaseCollector:
    """A ``prometheus_client`` collector: each ``collect()`` takes a fresh :func:`snapshot`."""

    def __init__(self, engine: Engine, window_seconds: float) -> None:
        self.engine = engine
        self.window_seconds = window_seconds

    def collect(self) -> Iterator[Metric]:
        yield from families(snapshot(self.engine, self.window_seconds))


def render(engine: Engine, window_seconds: float) -> bytes:
    """The Prometheus text exposition of the metrics, latency over the last ``window_seconds``
    (blocking: run it off the event loop)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(engine, window_seconds))
    return generate_latest(registry)


def families(snap: Snapshot) -> Iterator[Metric]:
    """The metric families of ``snap`` (see the module doc for what each means)."""
    deliveries = GaugeMetricFamily(
        "usp_deliveries",
        "Deliveries by status and event type (retained rows).",
        labels=["status", "event_type"],
    )
    for (status, event_type), count in sorted(snap.deliveries.items()):
        deliveries.add_metric([status, event_type], count)
    yield deliveries
    depth = GaugeMetricFamily(
        "usp_queue_depth",
        "Unfinished deliveries: due (pending, time passed), held (due, behind an earlier delivery"
        " of its subject), scheduled (pending, later), in_flight.",
        labels=["state"],
    )
    depth.add_metric(["due"], snap.due)
    depth.add_metric(["held"], snap.held)
    depth.add_metric(["scheduled"], snap.scheduled)
    depth.add_metric(["in_flight"], snap.in_flight)
    yield depth
    yield GaugeMetricFamily(
        "usp_oldest_due_delivery_age_seconds",
        "How long the most overdue pending delivery has been due (0: none).",
        value=snap.oldest_due_age,
    )
    yield GaugeMetricFamily(
        "usp_oldest_pending_delivery_age_seconds",
        "Age of the oldest pending or in-flight delivery (0: none).",
        value=snap.oldest_pending_age,
    )
    yield GaugeMetricFamily("usp_dead_letter_size", "Dead deliveries (the dead letter).", value=snap.dead)
    latency = HistogramMetricFamily(
        "usp_attempt_duration_seconds",
        "Duration of the delivery attempts started within the metrics window (USP_METRICS_WINDOW_SECONDS).",
        labels=["outcome"],
    )
    for row in snap.latency:
        buckets = [(_bound(b), float(c)) for b, c in zip(LATENCY_BUCKETS, row.buckets, strict=True)]
        buckets.append(("+Inf", float(row.count)))
        latency.add_metric([row.outcome], buckets, row.total_seconds)
    yield latency
    breaker = GaugeMetricFamily(
        "usp_subscription_breaker_state",
        "1 for the subscription's current circuit-breaker state.",
        labels=["subscription_id", "state"],
    )
    failures = GaugeMetricFamily(
        "usp_subscription_consecutive_failures",
        "Failed tries since the subscription's last success.",
        labels=["subscription_id"],
    )
    active = GaugeMetricFamily(
        "usp_subscription_active",
        "1 while the subscription is active, 0 once disabled.",
        labels=["subscription_id"],
    )
    blocked = GaugeMetricFamily(
        "usp_subjects_blocked",
        "Subjects of an ordered subscription waiting behind a dead delivery (on_dead=block).",
        labels=["subscription_id"],
    )
    for sub in snap.subscriptions:
        for state in BreakerState:
            breaker.add_metric([sub.id, state.value], 1.0 if sub.breaker_state == state.value else 0.0)
        failures.add_metric([sub.id], sub.consecutive_failures)
        active.add_metric([sub.id], 1.0 if sub.active else 0.0)
        blocked.add_metric([sub.id], sub.blocked_subjects)
    yield breaker
    yield failures
    yield active
    yield blocked


def _latency(connection: sa.Connection, since: datetime) -> list[LatencyRow]:
    """One aggregate query: cumulative bucket counts, count and sum per outcome."""
    a = _attempts.c
    seconds = a.duration_ms / 1000.0
    columns: list[sa.ColumnElement[int]] = [
        sa.func.sum(sa.case((seconds <= bound, 1), else_=0)) for bound in LATENCY_BUCKETS
    ]
    statement = (
        sa.select(a.outcome, sa.func.count(), sa.func.coalesce(sa.func.sum(seconds), 0.0), *columns)
        .where(a.started_at >= since)
        .group_by(a.outcome)
        .order_by(a.outcome)
    )
    rows: list[tuple[Any, ...]] = [tuple(row) for row in connection.execute(statement)]
    return [
        LatencyRow(
            outcome=str(row[0]),
            count=int(row[1]),
            total_seconds=float(row[2]),
            buckets=tuple(int(value or 0) for value in row[3:]),
        )
        for row in rows
    ]


def _bound(value: float) -> str:
    return repr(float(value))
