"""The delivery engine's database work: claim a batch, load what it needs, record what happened.

Two short transactions per batch, each one statement on PostgreSQL, the record fenced by the
lease (docs/architecture.md, "The delivery engine").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel

from usp_core.clock import UtcDateTime
from usp_workers.engine import health
from usp_workers.engine.ordering import unblocked
from usp_workers.storage.models import (
    Attempt,
    BreakerState,
    Delivery,
    DeliveryStatus,
    EventRecord,
    Notice,
    Subscription,
    SubscriptionState,
    Transport,
)

__all__ = [
    "AttemptRow",
    "Claimed",
    "DeliveryUpdate",
    "LoadedEvent",
    "LoadedSubscription",
    "claim",
    "claim_and_load",
    "record",
]

_deliveries: sa.Table = SQLModel.metadata.tables[Delivery.__tablename__]
_events: sa.Table = SQLModel.metadata.tables[EventRecord.__tablename__]
_subscriptions: sa.Table = SQLModel.metadata.tables[Subscription.__tablename__]
_attempts: sa.Table = SQLModel.metadata.tables[Attempt.__tablename__]
_notices: sa.Table = SQLModel.metadata.tables[Notice.__tablename__]

_LAST_ERROR_MAX = 512
_DISABLED_REASON_MAX = 256


@dataclass(frozen=True, slots=True)
class Claimed:
    """A delivery this worker now holds until ``lease_until``."""

    id: str
    event_id: str
    subscription_id: str
    attempt_count: int  #: tries made before this one
    subject_key: str | None = None  #: set under subject ordering (:mod:`usp_workers.engine.ordering`)
    created_at: datetime | None = None  #: when the delivery was made (a maximum age counts from it)


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One :class:`~usp_workers.storage.models.Attempt` to insert."""

    delivery_id: str
    attempt_number: int
    started_at: datetime
    duration_ms: float
    status_code: int | None
    response_excerpt: str | None
    error_class: str | None
    outcome: str
    key_ids: str | None = None  #: the kids that signed it, comma-separated (none: never sent)


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


@dataclass(frozen=True, slots=True)
class LoadedEvent:
    """What a try needs of its event (an :class:`~usp_workers.storage.models.EventView`)."""

    id: str
    correlation_id: str | None
    payload: str
    traceparent: str | None = None  #: the emitting call's trace, which the tries continue


@dataclass(frozen=True, slots=True)
class LoadedSubscription:
    """What a try and its health checks need of its subscription, as read at claim time (a
    :class:`~usp_workers.storage.models.SubscriptionView`)."""

    id: str
    url: str
    transport: Transport
    state: SubscriptionState
    rate_limit: int | None
    consecutive_failures: int
    failing_since: datetime | None
    last_success_at: datetime | None
    breaker_state: BreakerState
    breaker_until: datetime | None
    webhook_secrets: str | None = None  #: sealed; set when it asked for Standard Webhooks signatures
    custom_headers: str | None = None  #: as stored (usp_workers.engine.custom_headers)
    retry_schedule: str | None = None  #: its own, as stored (usp_workers.engine.schedule)
    endpoint_auth: str | None = None  #: as stored (usp_workers.engine.endpoint_auth)


def claim(engine: Engine, ids: Sequence[str], *, now: datetime, lease_until: datetime) -> list[Claimed]:
    """Take the due ones among ``ids``; the others (done, not due, held by another worker) are
    left alone and not returned."""
    return claim_and_load(engine, ids, now=now, lease_until=lease_until)[0]


def claim_and_load(
    engine: Engine, ids: Sequence[str], *, now: datetime, lease_until: datetime
) -> tuple[list[Claimed], dict[str, LoadedEvent], dict[str, LoadedSubscription]]:
    """Claim the due ones among ``ids`` and read their events and subscriptions, in one
    transaction; in id order. A delivery whose event or subscription is gone is claimed all the
    same (the engine gives it up), so it is missing from the maps.

    Why one statement on PostgreSQL (lock, claim and read joined, see :class:`_Statements`) and
    rows rather than ORM objects: a batch's database cost was mostly per round trip and per ORM
    query, not per row. Measured on a batch of 13: 1.8-2.5 ms of CPU for the lock, the claim and
    two ORM loads, 0.5-0.6 ms for this one statement, and half the wall time.
    """
    if not ids:
        return [], {}, {}
    params: dict[str, Any] = {"ids": list(dict.fromkeys(ids)), "claimed_at": now, "new_lease": lease_until}
    with engine.begin() as connection:
        statements = _statements(connection.dialect.name)
        if statements.claim is not None:
            params = {"ids": connection.execute(statements.claim, params).scalars().all()}
        rows = connection.execute(statements.read, params).all() if params["ids"] else []
    claims: list[Claimed] = []
    events: dict[str, LoadedEvent] = {}
    subscriptions: dict[str, LoadedSubscription] = {}
    for row in rows:
        claims.append(
            Claimed(
                row.id, row.event_id, row.subscription_id, row.attempt_count, row.subject_key, row.created_at
            )
        )
        if row.payload is not None and row.event_id not in events:  # null: the event is gone
            events[row.event_id] = LoadedEvent(row.event_id, row.correlation_id, row.payload, row.traceparent)
        if row.url is not None and row.subscription_id not in subscriptions:
            subscriptions[row.subscription_id] = LoadedSubscription(
                id=row.subscription_id,
                url=row.url,
                transport=Transport(row.transport),
                state=SubscriptionState(row.state),
                rate_limit=row.rate_limit,
                consecutive_failures=row.consecutive_failures,
                failing_since=row.failing_since,
                last_success_at=row.last_success_at,
                breaker_state=BreakerState(row.breaker_state),
                breaker_until=row.breaker_until,
                webhook_secrets=row.webhook_secrets,
                custom_headers=row.custom_headers,
                retry_schedule=row.retry_schedule,
                endpoint_auth=row.endpoint_auth,
            )
    return claims, events, subscriptions


@dataclass(frozen=True)
class _Statements:
    """The claim's statements, built once per dialect, their parameters (``ids``, ``claimed_at``,
    ``new_lease``) bound at execution.

    Why built once: constructing a statement and computing its cache key cost more Python than
    executing it, per batch. Why ``= ANY(:ids)`` on PostgreSQL, not ``IN (…)``: one statement
    text and one bound array whatever the batch's size, where an ``IN`` list is re-rendered with
    one parameter per id at every execution. (Server-side prepared statements stay off, see
    :func:`usp_core.db.make_engine`.)

    On PostgreSQL, ``read`` is the whole claim in one statement: the batch's rows are
    locked by primary key ``FOR UPDATE SKIP LOCKED`` (a row another worker is claiming or
    recording is skipped, never waited for), the due ones among the *locked* rows are updated,
    joined to the locked rows by primary key, and the updated rows are read with their events
    and subscriptions. Why "due" is decided on the locked rows and not in the ``UPDATE``'s own
    condition: PostgreSQL may then plan the scan on the due index (``status,
    next_attempt_at``), which matches every pending delivery, instead of the primary key, which
    matches the batch. It does whenever its statistics are stale (a new or fast-growing table,
    before autovacuum analyses it): measured under bench/pipeline.py, claims of 50 ids re-ran
    that scan per row and took 3 to 4 s each.

    On SQLite, which serialises writers, the condition in the ``UPDATE`` is the whole claim (a
    ``SELECT`` first would make the transaction a reader that later fails to upgrade): ``claim``
    returns the claimed ids, and ``read`` joins them to their events and subscriptions.
    """

    claim: sa.Update | None  #: SQLite only
    read: sa.Select[Any]


@cache
def _statements(dialect: str) -> _Statements:
    claim = sa.update(_deliveries).values(
        status=DeliveryStatus.IN_FLIGHT.value,
        lease_until=sa.bindparam("new_lease"),
        updated_at=sa.bindparam("claimed_at"),
        held=False,  # claimable means unblocked: back to pending, it is the relay's again
    )
    by_id = _among(_deliveries.c.id, dialect)
    if dialect != "postgresql":
        claim = claim.where(by_id, _due(_deliveries, sa.bindparam("claimed_at")), unblocked(_deliveries))
        return _Statements(claim.returning(_deliveries.c.id), _read(_deliveries).where(by_id))
    locked = (
        sa.select(
            _deliveries.c.id,
            _deliveries.c.status,
            _deliveries.c.next_attempt_at,
            _deliveries.c.lease_until,
        )
        .where(by_id)
        .with_for_update(skip_locked=True)
        .cte("locked")
    )
    updated = (
        claim.where(
            _deliveries.c.id == locked.c.id, _due(locked, sa.bindparam("claimed_at")), unblocked(_deliveries)
        )
        .returning(
            _deliveries.c.id,
            _deliveries.c.event_id,
            _deliveries.c.subscription_id,
            _deliveries.c.attempt_count,
            _deliveries.c.subject_key,
            _deliveries.c.created_at,
        )
        .cte("claimed")
    )
    return _Statements(None, _read(updated))


def _read(claimed: Any) -> sa.Select[Any]:
    """``claimed``'s rows (``id``, ``event_id``, ``subscription_id``, ``attempt_count``,
    ``subject_key``) with what a try needs of their events and subscriptions (null where those are
    gone), in id order."""
    events, subscriptions = _events.c, _subscriptions.c
    return (
        sa.select(
            claimed.c.id,
            claimed.c.event_id,
            claimed.c.subscription_id,
            claimed.c.attempt_count,
            claimed.c.subject_key,
            claimed.c.created_at,
            events.correlation_id,
            events.payload,
            events.traceparent,
            subscriptions.url,
            subscriptions.transport,
            subscriptions.state,
            subscriptions.rate_limit,
            subscriptions.consecutive_failures,
            subscriptions.failing_since,
            subscriptions.last_success_at,
            subscriptions.breaker_state,
            subscriptions.breaker_until,
            subscriptions.webhook_secrets,
            subscriptions.custom_headers,
            subscriptions.retry_schedule,
            subscriptions.endpoint_auth,
        )
        .select_from(
            claimed.outerjoin(_events, events.id == claimed.c.event_id).outerjoin(
                _subscriptions, subscriptions.id == claimed.c.subscription_id
            )
        )
        .order_by(claimed.c.id)
    )


def _among(column: Any, dialect: str) -> sa.ColumnElement[bool]:
    """``column`` is one of the list bound as ``ids`` at execution: ``= ANY(array)`` on
    PostgreSQL (one statement text for any count), an expanding ``IN`` elsewhere."""
    if dialect == "postgresql":
        return cast(sa.ColumnElement[bool], column == sa.any_(sa.bindparam("ids", type_=ARRAY(sa.String))))
    return cast(sa.ColumnElement[bool], column.in_(sa.bindparam("ids", expanding=True)))


def _due(rows: Any, now: Any) -> sa.ColumnElement[bool]:
    """The deliveries among ``rows`` (the table, or the locked rows) that a worker may claim at
    ``now``: pending and due, or in flight with their lease expired (their worker vanished)."""
    return sa.or_(
        sa.and_(rows.c.status == DeliveryStatus.PENDING.value, rows.c.next_attempt_at <= now),
        sa.and_(rows.c.status == DeliveryStatus.IN_FLIGHT.value, rows.c.lease_until < now),
    )


def record(
    engine: Engine,
    *,
    attempts: Sequence[AttemptRow],
    updates: Sequence[DeliveryUpdate],
    lease_until: datetime,
    now: datetime,
    health_tallies: Sequence[health.Tally] = (),
    policy: health.HealthPolicy | None = None,
    then: Callable[[sa.Connection, set[str]], None] | None = None,
) -> set[str]:
    """Insert ``attempts`` and apply ``updates`` under our lease, in one transaction; disable the
    subscriptions a 410 asked to (with a ``subscription.disabled`` notice), write
    ``health_tallies`` under ``policy``, and run ``then`` with the applied ids last (what must
    commit with the outcomes or not at all: an ordered subject's hand-over). Returns the ids
    whose update applied (the others had been taken over by another worker after our lease
    expired)."""
    with engine.begin() as connection:
        write = _record_in_one_statement if connection.dialect.name == "postgresql" else _record_by_statements
        applied = write(connection, attempts, updates, lease_until=lease_until, now=now)
        if health_tallies:
            health.apply(connection, health_tallies, policy or health.HealthPolicy(), now=now)
        for subscription_id, reason in sorted(
            {u.disable_subscription for u in updates if u.disable_subscription is not None}
        ):
            health.disable(connection, subscription_id, reason[:_DISABLED_REASON_MAX], now=now)
        dead = [
            u.delivery_id for u in updates if u.status is DeliveryStatus.DEAD and u.delivery_id in applied
        ]
        if dead:
            _note_dead(connection, dead, now)
        if then is not None:
            then(connection, applied)
    return applied


def _note_dead(connection: sa.Connection, delivery_ids: list[str], now: datetime) -> None:
    """A ``delivery.dead`` notice per delivery that just went dead, in the same transaction (the
    scheduler announces each as an operational event)."""
    rows = sa.select(
        _deliveries.c.subscription_id,
        sa.literal(health.NOTICE_DELIVERY_DEAD),
        _deliveries.c.id,
        sa.literal(now, UtcDateTime()),
    ).where(_deliveries.c.id.in_(delivery_ids))
    columns = ["subscription_id", "kind", "detail", "created_at"]
    connection.execute(sa.insert(_notices).from_select(columns, rows))


def _record_in_one_statement(
    connection: sa.Connection,
    attempts: Sequence[AttemptRow],
    updates: Sequence[DeliveryUpdate],
    *,
    lease_until: datetime,
    now: datetime,
) -> set[str]:
    if not attempts and not updates:
        return set()
    params = _record_params(attempts, updates, lease_until=lease_until, now=now)
    return set(connection.execute(_RECORD_POSTGRESQL, params).scalars())


def _record_by_statements(
    connection: sa.Connection,
    attempts: Sequence[AttemptRow],
    updates: Sequence[DeliveryUpdate],
    *,
    lease_until: datetime,
    now: datetime,
) -> set[str]:
    applied: set[str] = set()
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
    return applied


#: :func:`record` on PostgreSQL: the attempts and every delivery's new state in one statement
#: (one round trip, and no statement built per call), the rows bound as two JSON documents.
#: Why: the general path (SQLite) costs an ``INSERT`` and an ``UPDATE`` per distinct new state,
#: each built, compiled and sent on its own; and why JSON rather than one array per column:
#: psycopg's array dumper checks every element of every array with a regular expression, which
#: cost more than the rest of the record (``json.dumps`` is C). What each update writes is
#: :func:`_new_values`, as on SQLite: a column it leaves out arrives null, and the ``CASE`` and
#: ``COALESCE`` keep the delivery's own value there.
#: The fence is our lease alone: ``lease_until`` is set only while a delivery is ``in_flight``
#: (every way out of ``in_flight`` clears it), so it implies the status. Why not test the status
#: as well: PostgreSQL may then plan the ``UPDATE`` on the due index (``status,
#: next_attempt_at``: every in-flight row) instead of the primary key, as :class:`_Statements`
#: explains for the claim.
_RECORD_POSTGRESQL = sa.text(
    """
WITH attempts AS (
    INSERT INTO usp_attempts (delivery_id, attempt_number, started_at, duration_ms, status_code,
                              response_excerpt, error_class, outcome, key_ids)
    SELECT delivery_id, attempt_number, started_at, duration_ms, status_code, response_excerpt,
           error_class, outcome, key_ids
    FROM json_to_recordset(CAST(:attempts AS json)) AS a (
        delivery_id varchar, attempt_number integer, started_at timestamptz, duration_ms float8,
        status_code integer, response_excerpt varchar, error_class varchar, outcome varchar,
        key_ids varchar)
), updated AS (
    UPDATE usp_deliveries AS d
    SET status = u.status,
        attempt_count = d.attempt_count + CASE WHEN u.tried THEN 1 ELSE 0 END,
        lease_until = NULL,
        enqueued_at = NULL,
        updated_at = :now,
        next_attempt_at = COALESCE(u.next_attempt_at, d.next_attempt_at),
        last_status_code = CASE WHEN u.deferred THEN d.last_status_code ELSE u.last_status_code END,
        last_error = CASE WHEN u.deferred THEN d.last_error ELSE u.last_error END,
        completed_at = CASE WHEN u.deferred THEN d.completed_at ELSE u.completed_at END
    FROM json_to_recordset(CAST(:updates AS json)) AS u (
        id varchar, status varchar, tried boolean, deferred boolean, next_attempt_at timestamptz,
        last_status_code integer, last_error varchar, completed_at timestamptz)
    WHERE d.id = u.id AND d.lease_until = :lease_until
    RETURNING d.id
)
SELECT id FROM updated
"""
)


def _record_params(
    attempts: Sequence[AttemptRow], updates: Sequence[DeliveryUpdate], *, lease_until: datetime, now: datetime
) -> dict[str, Any]:
    """:data:`_RECORD_POSTGRESQL`'s parameters: each update's :func:`_new_values` as one JSON row
    (in id order, so concurrent records lock rows in one order). A column the values leave out
    is null in the row, and the statement keeps the delivery's own there."""
    rows = []
    for update in sorted(updates, key=lambda u: u.delivery_id):
        values = _new_values(update, now)
        rows.append(
            {
                "id": update.delivery_id,
                "status": values["status"],
                "tried": update.tried,
                "deferred": update.deferred,
                "next_attempt_at": _iso(values.get("next_attempt_at")),
                "last_status_code": values.get("last_status_code"),
                "last_error": values.get("last_error"),
                "completed_at": _iso(values.get("completed_at")),
            }
        )
    tries = [{**_attempt_params(a), "started_at": a.started_at.isoformat()} for a in attempts]
    return {
        "now": now,
        "lease_until": lease_until,
        "attempts": json.dumps(tries),
        "updates": json.dumps(rows),
    }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


_GroupKey = tuple[bool, tuple[tuple[str, Any], ...]]


def _grouped(updates: Sequence[DeliveryUpdate], now: datetime) -> dict[_GroupKey, list[str]]:
    """Updates with identical new values share one statement, keyed by (tried, values). Every
    time written is the batch's ``now`` (not each try's own end) so that, typically, all the
    successes of a batch are one UPDATE, not fifty."""
    groups: dict[_GroupKey, list[str]] = {}
    for update in sorted(updates, key=lambda u: u.delivery_id):
        values = tuple(_new_values(update, now).items())
        groups.setdefault((update.tried, values), []).append(update.delivery_id)
    return groups


def _new_values(update: DeliveryUpdate, now: datetime) -> dict[str, Any]:
    """The columns ``update`` writes (both dialects' record): a deferral (no try made) leaves the
    last status, error and ``completed_at`` alone, and ``next_attempt_at`` is written only when a
    new one is given."""
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
    return values


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
        "key_ids": row.key_ids,
    }
