"""Accepting an event from the business: validate, record with its deliveries, answer idempotently.

An event is identified by its ``event_id`` (receivers deduplicate on it), so posting the same
event twice must not deliver it twice. A second post of the *same* payload is a harmless retry
and gets the first answer again; a *different* payload under a used id is a bug on the caller's
side and is refused, because delivering either version would be silently wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlmodel import Session, col, func, select

from usp_schemas import parse_event
from usp_workers.models import Delivery, EventRecord
from usp_workers.outbox import emit

from .errors import Conflict

__all__ = ["AcceptedEvent", "accept_event"]


@dataclass(frozen=True, slots=True)
class AcceptedEvent:
    """What became of a posted event: its id, how many deliveries it has, and whether this call
    recorded it (``False``: it was already there, identical)."""

    event_id: str
    deliveries: int
    created: bool


def accept_event(session: Session, raw: bytes | str) -> AcceptedEvent:
    """Validate ``raw`` (the request body), ``emit`` it and commit, or recognise a replay.

    Raises :class:`usp_schemas.EventValidationError` for an invalid event and :class:`Conflict`
    when the id is taken by a different payload.
    """
    event = parse_event(raw)
    payload = event.model_dump_json()
    existing = session.get(EventRecord, event.event_id)
    if existing is not None:
        return _replay(session, existing, payload)
    try:
        emit(session, event)  # the event row is written at flush or commit: both inside the try
        session.commit()
    except sa.exc.IntegrityError:
        # A concurrent post of the same event_id committed first: answer as for a replay.
        session.rollback()
        existing = session.get(EventRecord, event.event_id)
        if existing is None:
            raise
        return _replay(session, existing, payload)
    return AcceptedEvent(event.event_id, _delivery_count(session, event.event_id), created=True)


def _replay(session: Session, existing: EventRecord, payload: str) -> AcceptedEvent:
    if existing.payload != payload:
        raise Conflict(
            "event_id_conflict",
            f"event {existing.id} was already accepted with a different payload; "
            "an event_id names one event forever (send a new event_id for a new change)",
        )
    return AcceptedEvent(existing.id, _delivery_count(session, existing.id), created=False)


def _delivery_count(session: Session, event_id: str) -> int:
    statement = select(func.count()).select_from(Delivery).where(col(Delivery.event_id) == event_id)
    return int(session.exec(statement).one())
