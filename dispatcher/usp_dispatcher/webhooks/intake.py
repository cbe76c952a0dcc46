"""Accepting events from the business: validate, record with their deliveries, answer idempotently.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.webhooks.intake``.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, func, select

from usp_core import db
from usp_dispatcher.errors import Conflict
from usp_schemas import EventValidationError, WebhookEvent, parse_event
from usp_workers import Delivery, EventRecord, emit, unflushed_deliveries

__all__ = ["Intake", "Outcome", "Status", "accept_events"]

logger = logging.getLogger(__name__)

#: Times a group is tried again after a concurrent post of one of its ids committed first.
_RACE_RETRIES = 3


class Status(enum.Enum):
    ACCEPTED = "accepted"  #: recorded now, with its deliveries
    DUPLICATE = "duplicate"  #: already recorded with this very payload: nothing new was done
    INVALID = "invalid"  #: not a valid USP event (``problem`` says why)
    CONFLICT = "conflict"  #: its id was recorded with a different payload


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one posted event."""

    status: Status
    event_id: str | None = None
    deliveries: int = 0
    problem: EventValidationError | Conflict | None = None


def accept_events(session: Session, items: Sequence[bytes | str | Mapping[str, Any]]) -> list[Outcome]:
    """Validate every item, ``emit`` the new ones, commit once; an outcome per item, in order.

    A bad item never costs the others: invalid and conflicting ones get their outcome and the
    rest commit. If a concurrent post of one of these ids commits first, the group is tried again
    (that id is then a duplicate); if the database refuses the group for one item's data, each
    item is tried in a transaction of its own.
    """
    parsed: list[WebhookEvent | EventValidationError] = []
    for item in items:
        try:
            parsed.append(parse_event(item))
        except EventValidationError as exc:
            parsed.append(exc)
    for attempt in range(_RACE_RETRIES + 1):
        try:
            return _record(session, parsed)
        except sa.exc.IntegrityError:
            session.rollback()
            if attempt == _RACE_RETRIES:
                raise
        except sa.exc.DataError:
            session.rollback()
            if len(parsed) == 1:
                return [Outcome(Status.INVALID, problem=_UNSTORABLE)]
            break
    logger.warning("the database refused one of a group of %d events; trying them one by one", len(parsed))
    return [outcome for item in items for outcome in accept_events(session, [item])]


#: What an event gets whose values pass the schema but not the columns they are stored in (an id
#: is at most 80 characters, a subject, correlation or order id at most 128).
_UNSTORABLE = EventValidationError(
    "event values too long to store",
    [
        {
            "type": "string_too_long",
            "loc": (),
            "msg": "a value is longer than the service stores (subject, correlation and order ids: "
            "128 characters)",
            "input": None,
        }
    ],
)


def _record(session: Session, parsed: Sequence[WebhookEvent | EventValidationError]) -> list[Outcome]:
    models = [model for model in parsed if not isinstance(model, EventValidationError)]
    stored = _stored_payloads(session, [model.event_id for model in models])
    first_seen: dict[str, str] = {}  # the payload of each id first seen in this group
    emitted: dict[str, int] = {}  # deliveries of each event recorded now
    outcomes: list[Outcome] = []
    for model in parsed:
        if isinstance(model, EventValidationError):
            outcomes.append(Outcome(Status.INVALID, problem=model))
            continue
        payload = model.model_dump_json()
        earlier = stored.get(model.event_id, first_seen.get(model.event_id))
        if earlier is None:
            before = unflushed_deliveries(session)
            emit(session, model)
            first_seen[model.event_id] = payload
            emitted[model.event_id] = unflushed_deliveries(session) - before
            outcomes.append(Outcome(Status.ACCEPTED, model.event_id))
        elif earlier == payload:
            outcomes.append(Outcome(Status.DUPLICATE, model.event_id))
        else:
            conflict = Conflict(
                "event_id_conflict",
                f"event {model.event_id} was already accepted with a different payload; "
                "an event_id names one event forever (send a new event_id for a new change)",
            )
            outcomes.append(Outcome(Status.CONFLICT, model.event_id, problem=conflict))
    # The deliveries of events recorded before (a duplicate's answer repeats them): one query.
    known = [o.event_id for o in outcomes if o.event_id is not None and o.event_id not in emitted]
    counts = emitted | _delivery_counts(session, known)
    session.commit()
    return [
        Outcome(o.status, o.event_id, counts.get(o.event_id, 0), o.problem) if o.event_id else o
        for o in outcomes
    ]


def _stored_payloads(session: Session, event_ids: list[str]) -> dict[str, str]:
    if not event_ids:
        return {}
    statement = select(EventRecord.id, EventRecord.payload).where(col(EventRecord.id).in_(set(event_ids)))
    return dict(session.exec(statement).all())


def _delivery_counts(session: Session, event_ids: list[str]) -> dict[str, int]:
    if not event_ids:
        return {}
    statement = (
        select(Delivery.event_id, func.count())
        .where(col(Delivery.event_id).in_(set(event_ids)))
        .group_by(col(Delivery.event_id))
    )
    return {event_id: int(count) for event_id, count in session.exec(statement).all()}


class Intake:
    """Group commit for single posts: each post waits for a transaction that takes every post
    waiting at its start (up to ``max_group``), with ``max_transactions`` at a time.

    A lone post starts its transaction at once, so an idle API adds no delay; under load the
    transaction's round trips (connection check, subscriptions, the commit and its hand-off to
    the broker) are paid once per group instead of once per event.
    """

    def __init__(self, engine: Engine, *, max_group: int = 500, max_transactions: int = 1) -> None:
        self._engine = engine
        self._max_group = max_group
        self._max_transactions = max_transactions
        self._waiting: list[tuple[bytes, asyncio.Future[Outcome]]] = []
        self._running: set[asyncio.Task[None]] = set()

    async def accept(self, raw: bytes) -> Outcome:
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._waiting.append((raw, future))
        if len(self._running) < self._max_transactions:
            task = asyncio.create_task(self._drain())
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        # Shielded: a caller that goes away does not cancel the transaction the others share.
        return await asyncio.shield(future)

    async def _drain(self) -> None:
        while self._waiting:
            group = self._waiting[: self._max_group]
            del self._waiting[: self._max_group]
            try:
                outcomes = await run_in_threadpool(self._commit, [raw for raw, _ in group])
            except Exception as exc:
                for _, future in group:
                    future.set_exception(exc)
                continue
            for (_, future), outcome in zip(group, outcomes, strict=True):
                future.set_result(outcome)

    def _commit(self, raws: list[bytes]) -> list[Outcome]:
        with db.session(self._engine) as session:
            return accept_events(session, raws)
