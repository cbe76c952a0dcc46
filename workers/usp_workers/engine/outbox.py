"""The transactional outbox: an event and its deliveries are written in the caller's transaction.

``emit(session, event, audience=...)`` adds them; nothing leaves the process until the caller
commits, and a crash after the commit loses nothing (docs/architecture.md, "The outbox and the
hand-off"). The audience is a privacy boundary: see :func:`reaches`.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple, Protocol

import sqlalchemy as sa
from sqlalchemy.orm import Session as ORMSession
from sqlmodel import Session, SQLModel

from usp_core.clock import utcnow
from usp_core.ids import new_id
from usp_schemas import OPERATIONAL_EVENT_TYPES, WebhookEvent, parse_event
from usp_workers.engine import tracing
from usp_workers.engine.filters import Filter, parse_filter
from usp_workers.engine.ordering import subject_of
from usp_workers.storage.models import Delivery, DeliveryStatus, EventRecord, Subscription, SubscriptionState

__all__ = [
    "EVENTS_CHANNEL",
    "EVENTS_CHANNEL_SQL",
    "Enqueue",
    "emit",
    "event_matches",
    "new_delivery_row",
    "reaches",
    "refusal",
    "set_enqueuer",
    "stored_filter",
    "subject_id_of",
]

logger = logging.getLogger("usp_workers")

#: Hands delivery ids to the broker. Set by the Celery app (``usp_workers.runtime.tasks``); tests may set
#: their own. ``None`` means "no broker here": the relay will pick the deliveries up.
Enqueue = Callable[[Sequence[str]], None]
_enqueuer: Enqueue | None = None
_PENDING_KEY = "usp_workers.enqueue_after_commit"
_SUBSCRIPTIONS_KEY = "usp_workers.active_subscriptions"
_ROWS_KEY = "usp_workers.deliveries_to_insert"
_NOTIFY_KEY = "usp_workers.notify_events"
#: On PostgreSQL, a transaction that emits signals this channel (``NOTIFY``, delivered at its
#: commit): whoever tails the events table elsewhere (the MCP live hub of every API process)
#: wakes at once instead of at its next poll. The payload is the JSON list of the ``[event type,
#: audience]`` of the events flushed, or empty when that would not fit (then: "something").
EVENTS_CHANNEL = "usp_events"
#: The channel of this schema's events: deployments (and test runs) that share a database in
#: schemas of their own do not wake each other. A digest keeps it under PostgreSQL's 63 bytes.
EVENTS_CHANNEL_SQL = f"'{EVENTS_CHANNEL}:' || left(md5(current_schema()), 16)"
_NOTIFY = sa.text(f"SELECT pg_notify({EVENTS_CHANNEL_SQL}, :payload)")
#: PostgreSQL refuses a payload of 8,000 bytes or more.
_MAX_PAYLOAD = 7900
_deliveries: sa.Table = SQLModel.metadata.tables[Delivery.__tablename__]
_subscriptions: sa.Table = SQLModel.metadata.tables[Subscription.__tablename__]
#: A Core statement, not an ORM query: the ORM's compile and row processing cost ~0.3 ms more
#: per transaction, which an API emitting one event per request pays on every request.
_ACTIVE_SUBSCRIPTIONS = sa.select(
    _subscriptions.c.id,
    _subscriptions.c.event_types,
    _subscriptions.c.platform_profile,
    _subscriptions.c.ordering,
    _subscriptions.c.payload_filter,
).where(_subscriptions.c.state == SubscriptionState.ACTIVE.value)


def set_enqueuer(enqueue: Enqueue | None) -> None:
    """Choose how freshly committed deliveries reach the broker (process-wide)."""
    global _enqueuer
    _enqueuer = enqueue


def emit(
    session: Session,
    event: WebhookEvent | Mapping[str, Any] | bytes | str,
    *,
    audience: str | None = None,
    to: str | None = None,
) -> EventRecord:
    """Record ``event`` and one delivery per active subscription that it matches and that
    ``audience`` :func:`reaches`, in ``session``'s transaction; hand the deliveries to the broker
    once it commits. Returns the event row.

    ``audience`` (stored as :attr:`EventRecord.audience`, so replays and back-fills route the
    same way): ``None`` for a public event (the catalog), ``""`` for one only the business may
    see, a platform's profile URI for one about that platform's booking or waitlist entry.
    ``to``: that subscription only (a test event a platform asked for), under the same rules.

    The caller owns the transaction: call this inside the same unit of work as the state change
    the event reports, then commit both together.

    >>> with session(engine) as s:                                    # doctest: +SKIP
    ...     booking.state = "confirmed"
    ...     emit(s, booking_confirmed_event(booking), audience=booking.platform_profile or "")
    ...     s.commit()
    """
    if not tracing.enabled():
        return _emit(session, event, audience=audience, to=to)
    with tracing.span("usp.emit") as span:  # the outbox insert: deliveries continue this trace
        record = _emit(session, event, audience=audience, to=to)
        if span is not None:
            span.set_attributes({"usp.event_id": record.id, "usp.event_type": record.event_type})
        return record


def _emit(
    session: Session,
    event: WebhookEvent | Mapping[str, Any] | bytes | str,
    *,
    audience: str | None,
    to: str | None,
) -> EventRecord:
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
        audience=audience,
        traceparent=tracing.traceparent(),
    )
    subscriptions = _active_subscriptions(session)
    session.add(record)
    session.info.setdefault(_NOTIFY_KEY, []).append((record.event_type, audience))
    rows = []
    body: dict[str, Any] | None = None  # the event as JSON, parsed once if a filter asks
    for subscription in subscriptions:
        if not (
            (to is None or subscription.id == to)
            and reaches(subscription.platform_profile, audience)
            and event_matches(model.event, subscription.patterns)
        ):
            continue
        if subscription.filter is not None:
            if body is None:
                body = json.loads(payload)
            if not subscription.filter.matches(body):
                continue
        subject = subject_of(subscription.ordering, record.subject_id, now, record.id)
        rows.append(
            new_delivery_row(new_id("dlv"), record.id, subscription.id, now, enqueued_at=now, subject=subject)
        )
    if rows:
        _insert_after_flush(session, rows)
        _enqueue_after_commit(session, [str(row["id"]) for row in rows])
    return record


def new_delivery_row(
    delivery_id: str,
    event_id: str,
    subscription_id: str,
    moment: datetime,
    *,
    enqueued_at: datetime | None,
    subject: tuple[str | None, str | None] = (None, None),
) -> dict[str, Any]:
    """A new pending delivery, due at ``moment``, as a row for one multi-row ``INSERT`` (emit,
    replays, recover and redrive). ``enqueued_at``: when it was handed to the broker (``None``:
    the scheduler sends it). ``subject``: its ``(subject_key, subject_order)`` under subject
    ordering (:func:`usp_workers.engine.ordering.subject_of`), so it takes its event's place."""
    return {
        "id": delivery_id,
        "event_id": event_id,
        "subscription_id": subscription_id,
        "status": DeliveryStatus.PENDING.value,
        "attempt_count": 0,
        "next_attempt_at": moment,
        "enqueued_at": enqueued_at,
        "created_at": moment,
        "updated_at": moment,
        "subject_key": subject[0],
        "subject_order": subject[1],
    }


def reaches(subscription_profile: str | None, audience: str | None) -> bool:
    """Whether an event with ``audience`` may go to a subscription of ``subscription_profile``:
    the one rule, shared by :func:`emit`, admin replays and back-fills, and live MCP sessions.

    A public event (``None``) reaches everyone; the business's own subscriptions (no profile)
    get every event; a platform's subscription gets only public events and those whose audience
    is exactly its profile. ``""`` (business only) therefore reaches no platform at all, and
    neither does anything addressed to a profile that is merely similar (no prefix or case
    folding: profile URIs are compared as opaque strings, failing closed).

    >>> reaches(None, "https://a.example/p"), reaches("https://b.example/p", "https://a.example/p")
    (True, False)
    """
    if audience is None or subscription_profile is None:
        return True
    return audience != "" and subscription_profile == audience


def event_matches(event_type: str, patterns: Iterable[str]) -> bool:
    """Whether ``event_type`` matches any pattern: exact, ``*`` for all, or ``booking.*`` style.
    The service's own operational events match only patterns that name them (``delivery.dead``,
    ``subscription.*``): a subscription to ``*`` keeps getting the protocol's events alone.

    >>> event_matches("booking.confirmed", ["booking.*"]), event_matches("waitlist.left", ["booking.*"])
    (True, False)
    >>> event_matches("delivery.dead", ["*"]), event_matches("delivery.dead", ["delivery.*"])
    (False, True)
    """
    if event_type in OPERATIONAL_EVENT_TYPES:
        return any(
            not pattern.startswith("*") and fnmatch.fnmatchcase(event_type, pattern) for pattern in patterns
        )
    return any(pattern == "*" or fnmatch.fnmatchcase(event_type, pattern) for pattern in patterns)


def stored_filter(text: str | None) -> Filter | None:
    """A subscription's saved filter, compiled once per text (checked when it was saved)."""
    return None if text is None else _compiled(text)


@functools.lru_cache(maxsize=1024)
def _compiled(text: str) -> Filter | None:
    return parse_filter(text)


class Stored(Protocol):
    """What :func:`refusal` reads of an event (an :class:`EventRecord`)."""

    event_type: str
    audience: str | None
    payload: str


class Subscribing(Protocol):
    """What :func:`refusal` reads of a subscription (a :class:`Subscription` or a row of it)."""

    event_types: str
    platform_profile: str | None
    payload_filter: str | None


def refusal(event: Stored, subscription: Subscribing) -> str | None:
    """Why ``subscription`` (its stored ``event_types``, profile and filter) does not take
    ``event``, in a sentence; ``None`` when it does. What :func:`emit` decides, for replays,
    back-fills and the console's account of an event."""
    if not event_matches(event.event_type, json.loads(subscription.event_types)):
        return f"not subscribed to {event.event_type}"
    if not reaches(subscription.platform_profile, event.audience):
        return "the event is not for this subscription's platform"
    compiled = stored_filter(subscription.payload_filter)
    if compiled is None:
        return None
    judged = compiled.judge(json.loads(event.payload))
    return None if judged.passed else f"its filter: {judged.why}"


def subject_id_of(event: WebhookEvent) -> str | None:
    """The id of the object the event is about (booking, service, waitlist entry; for content:
    entitlement, subscription, post, publication)."""
    for name in (
        "booking_id",
        "waitlist_entry_id",
        "service_id",
        "entitlement_id",
        "subscription_id",
        "post_id",
        "publisher_id",
    ):
        value = getattr(event, name, None)
        if isinstance(value, str):
            return value
    return None


def _insert_after_flush(session: Session, rows: list[dict[str, Any]]) -> None:
    """Queue delivery rows for one multi-row INSERT right after the session's next flush (every
    commit flushes), in the same transaction.

    Why not ``session.add(Delivery(...))``: without a relationship between the two models the
    ORM does not order a delivery's INSERT after its event's, so a flush holding both could
    break the foreign key; flushing each event on its own (as a per-event query's autoflush did)
    costs round trips per event. After the flush, every event of the flush is in, and the
    deliveries of them all go in one statement.
    """
    session.info.setdefault(_ROWS_KEY, []).extend(rows)


def unflushed_deliveries(session: Session) -> int:
    """Deliveries ``emit`` added in ``session`` that its next flush will insert: the difference
    across one ``emit`` is that event's delivery count, known without a query."""
    return len(session.info.get(_ROWS_KEY, ()))


def _insert_deliveries(session: Session, _context: Any) -> None:
    rows: list[dict[str, Any]] = session.info.pop(_ROWS_KEY, [])
    if rows:
        session.connection().execute(sa.insert(_deliveries), rows)
    emitted: list[tuple[str, str | None]] = session.info.pop(_NOTIFY_KEY, [])
    if emitted:
        connection = session.connection()
        if connection.dialect.name == "postgresql":
            payload = json.dumps(emitted, separators=(",", ":"))
            connection.execute(
                _NOTIFY,
                {"channel": EVENTS_CHANNEL, "payload": payload if len(payload) <= _MAX_PAYLOAD else ""},
            )


class _ActiveSubscription(NamedTuple):
    id: str
    patterns: list[str]
    platform_profile: str | None
    ordering: str
    filter: Filter | None


def _active_subscriptions(session: Session) -> list[_ActiveSubscription]:
    """The active subscriptions' ids, patterns and profiles, read once per transaction and kept
    until the session flushes, commits or rolls back, or a :class:`Subscription` is added to it.

    Why: a transaction that emits many events (a bulk import, a catalog sync) would otherwise
    query the subscriptions once per event, and each query autoflushes the previous event's
    rows first: three round trips per event (~2 ms of CPU on PostgreSQL), where one query per
    transaction and one batched INSERT at commit will do. The profile is read with the rest so
    that routing by audience costs no query of its own. A subscription changed in the same
    session after the first emit (not added: that is seen) is seen after ``session.flush()``.
    """
    cached: list[_ActiveSubscription] | None = session.info.get(_SUBSCRIPTIONS_KEY)
    if cached is not None:
        return cached
    if session.autoflush:
        session.flush()  # what an ORM query would do first: a subscription just added is seen
    rows = session.connection().execute(_ACTIVE_SUBSCRIPTIONS).all()
    subscriptions = [
        _ActiveSubscription(subscription_id, json.loads(patterns), profile, ordering, stored_filter(text))
        for subscription_id, patterns, profile, ordering, text in rows
    ]
    session.info[_SUBSCRIPTIONS_KEY] = subscriptions
    return subscriptions


def _forget_subscriptions(session: Session, *_: Any) -> None:
    session.info.pop(_SUBSCRIPTIONS_KEY, None)


def _forget_subscriptions_if_one_is_added(session: Session, instance: object) -> None:
    if isinstance(instance, Subscription):
        session.info.pop(_SUBSCRIPTIONS_KEY, None)


def _enqueue_after_commit(session: Session, delivery_ids: list[str]) -> None:
    if not delivery_ids:
        return
    session.info.setdefault(_PENDING_KEY, []).extend(delivery_ids)


def _hand_off(session: Session) -> None:
    ids: list[str] = session.info.pop(_PENDING_KEY, [])
    if not ids or _enqueuer is None:
        return
    try:
        with tracing.span("usp.handoff", attributes={"usp.deliveries": len(ids)}):
            _enqueuer(ids)
    except Exception:
        # Committed is safe: the relay re-sends these once requeue_after_seconds have passed.
        logger.exception("broker hand-off failed for %d deliveries; the relay will retry", len(ids))


def _forget(session: Session) -> None:
    session.info.pop(_PENDING_KEY, None)
    session.info.pop(_ROWS_KEY, None)
    session.info.pop(_NOTIFY_KEY, None)


# Registered once on the Session class (so on every session, sqlmodel's included), not per
# session on first emit: adding seven listeners to a session cost ~75 µs per transaction, and
# each of these is a dictionary lookup for a session that never emitted.
sa.event.listen(ORMSession, "after_flush", _insert_deliveries)
sa.event.listen(ORMSession, "after_flush", _forget_subscriptions)
sa.event.listen(ORMSession, "after_commit", _forget_subscriptions)
sa.event.listen(ORMSession, "after_commit", _hand_off)
sa.event.listen(ORMSession, "after_soft_rollback", _forget_subscriptions)
sa.event.listen(ORMSession, "after_rollback", _forget)
sa.event.listen(ORMSession, "transient_to_pending", _forget_subscriptions_if_one_is_added)
