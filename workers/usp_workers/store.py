"""The delivery engine's database work: claim a batch, load what it needs, record what happened.

Two short transactions per batch (claim and load share one: :func:`claim_and_load`), none held
open across the network:

1. **claim** — due ``pending`` deliveries (and ``in_flight`` ones whose lease has expired: their
   worker vanished) become ``in_flight`` with a lease. On SQLite, which serialises writers, one
   conditional ``UPDATE … RETURNING``: only one of two workers handed the same id can match the
   row. On PostgreSQL the batch's rows are first locked by primary key ``FOR UPDATE SKIP
   LOCKED`` and the due ones updated (:func:`_lock_due` says why not one statement), so
   concurrent claims never wait on (or deadlock with) each other.
2. **load** — the batch's events and subscriptions, one query each.
3. **record** — every try's :class:`~usp_workers.models.Attempt` row, and every delivery's new
   state, in one transaction. The state update is fenced: it applies only while the row is still
   ``in_flight`` under *our* lease. A worker that overran its lease (and whose delivery another
   worker has since claimed) still records its attempt, but cannot overwrite the newer state.
   The same transaction writes the subscriptions' health (:func:`usp_workers.health.apply`),
   which the caller has already cut down to the rows that must change: transitions, and at most
   one refresh per subscription every few seconds, never a write per success.

The lease is the fencing token, so a claim's lease must differ from the one it replaces; it
does whenever the clock moves between the two claims (any real clock does).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Engine
from sqlmodel import Session, SQLModel, col, select

from . import health
from .db import session
from .models import (
    Attempt,
    Delivery,
    DeliveryStatus,
    EventRecord,
    Subscription,
)

__all__ = ["AttemptRow", "Claimed", "DeliveryUpdate", "claim", "claim_and_load", "load", "record"]

_deliveries: sa.Table = SQLModel.metadata.tables[Delivery.__tablename__]
_attempts: sa.Table = SQLModel.metadata.tables[Attempt.__tablename__]

_LAST_ERROR_MAX = 512
_DISABLED_REASON_MAX = 256


@dataclass(frozen=True, slots=True)
class Claimed:
    """A delivery this worker now holds until ``lease_until``."""

    id: str
    event_id: str
    subscription_id: str
    attempt_count: int  #: tries made before this one


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One :class:`~usp_workers.models.Attempt` to insert."""

    delivery_id: str
    attempt_number: int
    started_at: datetime
    duration_ms: float
    status_code: int | None
    response_excerpt: str | None
    error_class: str | None
    outcome: str


@dataclass(frozen=True, slots=True)
class DeliveryUpdate:
    """A delivery's new state. ``tried``: a try happened, so ``attempt_count`` goes up by one.
    A final state (succeeded, dead) gets ``completed_at`` = the moment it is recorded.
    ``deferred``: no try was made (the endpoint was busy); it goes back to ``pending``, due at
    ``next_attempt_at``, keeping its last status and error."""

    delivery_id: str
    status: DeliveryStatus
    tried: bool
    deferred: bool = False
    next_attempt_at: datetime | None = None  #: the next try (``pending`` only)
    last_status_code: int | None = None
    last_error: str | None = None
    disable_subscription: tuple[str, str] | None = field(default=None)  #: (subscription id, reason)


def claim(engine: Engine, ids: Sequence[str], *, now: datetime, lease_until: datetime) -> list[Claimed]:
    """Take the due ones among ``ids``; the others (done, not due, held by another worker) are
    left alone and not returned."""
    if not ids:
        return []
    with engine.begin() as connection:
        return _claim(connection, ids, now=now, lease_until=lease_until)


def claim_and_load(
    engine: Engine, ids: Sequence[str], *, now: datetime, lease_until: datetime
) -> tuple[list[Claimed], dict[str, EventRecord], dict[str, Subscription]]:
    """:func:`claim` and :func:`load` in one transaction on one connection.

    Why: a batch's fixed database cost is mostly per transaction, not per row (a connection
    checkout with its pre-ping round trip, ``BEGIN``, ``COMMIT``: ~0.3 ms of CPU each on
    PostgreSQL here), and small batches (an API emitting a few events per request) pay it per
    handful of deliveries. Reading the rows in the claiming transaction sees the same rows.
    """
    if not ids:
        return [], {}, {}
    with session(engine) as s:
        claimed = _claim(s.connection(), ids, now=now, lease_until=lease_until)
        events, subscriptions = _load(s, claimed) if claimed else ({}, {})
        s.commit()
    return claimed, events, subscriptions


def _claim(
    connection: sa.Connection, ids: Sequence[str], *, now: datetime, lease_until: datetime
) -> list[Claimed]:
    statements = _statements(connection.dialect.name)
    if statements.lock is not None:
        locked = connection.execute(statements.lock, {"ids": list(ids)})
        ids = [row.id for row in locked if _is_due(row, now)]  # ours, locked, and due
        if not ids:
            return []
    params = {"ids": list(ids), "claimed_at": now, "new_lease": lease_until}
    rows = connection.execute(statements.claim, params).all()
    return [Claimed(row.id, row.event_id, row.subscription_id, row.attempt_count) for row in rows]


@dataclass(frozen=True)
class _Statements:
    """The claim's and the load's statements, built once per dialect, their parameters (``ids``,
    ``claimed_at``, ``new_lease``) bound at execution.

    Why built once: constructing a statement and computing its cache key cost more Python than
    executing it, per batch. Why ``= ANY(:ids)`` on PostgreSQL, not ``IN (…)``: one statement
    text and one bound array whatever the batch's size, where an ``IN`` list is re-rendered with
    one parameter per id at every execution. (Server-side prepared statements stay off, see
    :func:`usp_workers.db.make_engine`.)

    On PostgreSQL the batch is first locked by primary key (``lock``, ``FOR UPDATE SKIP
    LOCKED``: a row another worker is claiming or recording is skipped, never waited for), "due"
    is decided in Python on the locked rows (:func:`_is_due`), and ``claim`` updates them by
    primary key alone. Why not one ``UPDATE … WHERE id IN (…) AND <due>``: PostgreSQL may then
    plan the scan on the due index (``status, next_attempt_at``), which matches every pending
    delivery, instead of the primary key, which matches the batch. It does whenever its
    statistics are stale (a new or fast-growing table, before autovacuum analyses it): measured
    under bench/pipeline.py, claims of 50 ids re-ran that scan per row and took 3 to 4 s each.

    On SQLite, which serialises writers, the condition in the UPDATE is the whole claim (a
    SELECT first would make the transaction a reader that later fails to upgrade).
    """

    lock: sa.Select[Any] | None
    claim: sa.Update
    events: Any  #: ``select(EventRecord)`` by ``ids``
    subscriptions: Any  #: ``select(Subscription)`` by ``ids``


@cache
def _statements(dialect: str) -> _Statements:
    returned = (
        _deliveries.c.id,
        _deliveries.c.event_id,
        _deliveries.c.subscription_id,
        _deliveries.c.attempt_count,
    )
    claim = sa.update(_deliveries).values(
        status=DeliveryStatus.IN_FLIGHT.value,
        lease_until=sa.bindparam("new_lease"),
        updated_at=sa.bindparam("claimed_at"),
    )
    by_id = _among(_deliveries.c.id, dialect)
    lock = None
    if dialect == "postgresql":
        lock = (
            sa.select(
                _deliveries.c.id,
                _deliveries.c.status,
                _deliveries.c.next_attempt_at,
                _deliveries.c.lease_until,
            )
            .where(by_id)
            .with_for_update(skip_locked=True)
        )
        claim = claim.where(by_id)
    else:
        claim = claim.where(by_id, _due(sa.bindparam("claimed_at")))
    return _Statements(
        lock=lock,
        claim=claim.returning(*returned),
        events=select(EventRecord).where(_among(col(EventRecord.id), dialect)),
        subscriptions=select(Subscription).where(_among(col(Subscription.id), dialect)),
    )


def _among(column: Any, dialect: str) -> sa.ColumnElement[bool]:
    """``column`` is one of the list bound as ``ids`` at execution: ``= ANY(array)`` on
    PostgreSQL (one statement text for any count), an expanding ``IN`` elsewhere."""
    if dialect == "postgresql":
        return cast(sa.ColumnElement[bool], column == sa.any_(sa.bindparam("ids", type_=ARRAY(sa.String))))
    return cast(sa.ColumnElement[bool], column.in_(sa.bindparam("ids", expanding=True)))


def _due(now: Any) -> sa.ColumnElement[bool]:
    """A delivery a worker may claim at ``now``, in SQL (:func:`_is_due` in Python)."""
    return sa.or_(
        sa.and_(
            _deliveries.c.status == DeliveryStatus.PENDING.value,
            _deliveries.c.next_attempt_at <= now,
        ),
        sa.and_(
            _deliveries.c.status == DeliveryStatus.IN_FLIGHT.value,
            _deliveries.c.lease_until < now,
        ),
    )


def _is_due(row: Any, now: datetime) -> bool:
    """:func:`_due` for a row read under lock (PostgreSQL): pending and due, or in flight with its lease
    expired (its worker vanished)."""
    if row.status == DeliveryStatus.PENDING.value:
        return bool(row.next_attempt_at <= now)
    if row.status == DeliveryStatus.IN_FLIGHT.value:
        return row.lease_until is not None and bool(row.lease_until < now)
    return False


def load(
    engine: Engine, claimed: Iterable[Claimed]
) -> tuple[dict[str, EventRecord], dict[str, Subscription]]:
    """The events and subscriptions of ``claimed``, by id (one query each)."""
    with session(engine) as s:
        return _load(s, list(claimed))


def _load(s: Session, claimed: Sequence[Claimed]) -> tuple[dict[str, EventRecord], dict[str, Subscription]]:
    statements = _statements(s.get_bind().dialect.name)
    event_ids = sorted({c.event_id for c in claimed})
    subscription_ids = sorted({c.subscription_id for c in claimed})
    events = {e.id: e for e in s.exec(statements.events, params={"ids": event_ids})}
    found = s.exec(statements.subscriptions, params={"ids": subscription_ids})
    subscriptions = {sub.id: sub for sub in found}
    return events, subscriptions


def record(
    engine: Engine,
    *,
    attempts: Sequence[AttemptRow],
    updates: Sequence[DeliveryUpdate],
    lease_until: datetime,
    now: datetime,
    health_tallies: Sequence[health.Tally] = (),
    policy: health.HealthPolicy | None = None,
) -> set[str]:
    """Insert ``attempts`` and apply ``updates`` under our lease, in one transaction; disable the
    subscriptions a 410 asked to (with a ``subscription.disabled`` notice), and write
    ``health_tallies`` under ``policy``. Returns the ids whose update applied (the others had
    been taken over by another worker after our lease expired)."""
    applied: set[str] = set()
    with engine.begin() as connection:
        if attempts:
            connection.execute(sa.insert(_attempts), [_attempt_params(a) for a in attempts])
        for (tried, values), ids in _grouped(updates, now).items():
            statement = (
                sa.update(_deliveries)
                .where(
                    _among(_deliveries.c.id, connection.dialect.name),
                    _deliveries.c.status == DeliveryStatus.IN_FLIGHT.value,
                    _deliveries.c.lease_until == lease_until,
                )
                .values(dict(values))
                .returning(_deliveries.c.id)
            )
            if tried:
                statement = statement.values(attempt_count=_deliveries.c.attempt_count + 1)
            applied.update(connection.execute(statement, {"ids": ids}).scalars())
        if health_tallies:
            health.apply(connection, health_tallies, policy or health.HealthPolicy(), now=now)
        for subscription_id, reason in sorted(
            {u.disable_subscription for u in updates if u.disable_subscription is not None}
        ):
            health.disable(connection, subscription_id, reason[:_DISABLED_REASON_MAX], now=now)
    return applied


_GroupKey = tuple[bool, tuple[tuple[str, Any], ...]]


def _grouped(updates: Sequence[DeliveryUpdate], now: datetime) -> dict[_GroupKey, list[str]]:
    """Updates with identical new values share one statement, keyed by (tried, values). Every
    time written is the batch's ``now`` (not each try's own end) so that, typically, all the
    successes of a batch are one UPDATE, not fifty."""
    groups: dict[_GroupKey, list[str]] = {}
    for update in sorted(updates, key=lambda u: u.delivery_id):
        values: dict[str, Any] = {
            "status": update.status.value,
            "lease_until": None,
            "enqueued_at": None,  # a retry is re-sent by the relay when due
            "updated_at": now,
        }
        if not update.deferred:
            values["last_status_code"] = update.last_status_code
            values["last_error"] = None if update.last_error is None else update.last_error[:_LAST_ERROR_MAX]
            values["completed_at"] = None if update.status is DeliveryStatus.PENDING else now
        if update.next_attempt_at is not None:
            values["next_attempt_at"] = update.next_attempt_at
        groups.setdefault((update.tried, tuple(values.items())), []).append(update.delivery_id)
    return groups


def _attempt_params(row: AttemptRow) -> Mapping[str, Any]:
    return {
        "delivery_id": row.delivery_id,
        "attempt_number": row.attempt_number,
        "started_at": row.started_at,
        "duration_ms": row.duration_ms,
        "status_code": row.status_code,
        "response_excerpt": row.response_excerpt,
        "error_class": row.error_class,
        "outcome": row.outcome,
    }
