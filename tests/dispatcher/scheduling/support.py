"""Helpers the domain tests share: a fixed clock, a small catalog, and reading back events."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, func, select

from usp_core import db
from usp_dispatcher.scheduling import Outcome, ServiceSpec, add_slot, create_service
from usp_dispatcher.scheduling.tables import SlotRow
from usp_schemas import Buyer, Message, Money, WebhookEvent, parse_event
from usp_workers.storage.models import Delivery, EventRecord

#: The tests' "now": every slot below lies after it.
NOW = datetime(2030, 3, 14, 16, 0, tzinfo=UTC)
ALICE = Buyer(first_name="Alice", email="alice@example.com")
BOB = Buyer(first_name="Bob", email="bob@example.com")
CAROL = Buyer(first_name="Carol", phone="+1 555 0100")

T = TypeVar("T")


@dataclass(frozen=True)
class Catalog:
    """``cut`` (one seat, slots at ``NOW`` + 1 d, + 1 d 1 h, + 2 d) and ``yoga`` (four seats)."""

    engine: Engine
    cut: str
    cut_slots: list[str]
    yoga: str
    yoga_slot: str


def build_catalog(engine: Engine) -> Catalog:
    with db.session(engine) as session:
        cut = create_service(
            session,
            ServiceSpec(
                name="Cut",
                duration_minutes=60,
                price=Money(amount=4500, currency="USD"),
                timezone="America/New_York",
            ),
            now=NOW,
            announce=False,
        )
        yoga = create_service(
            session, ServiceSpec(name="Yoga", duration_minutes=60, capacity=4), now=NOW, announce=False
        )
        session.flush()
        starts = [NOW + timedelta(days=1), NOW + timedelta(days=1, hours=1), NOW + timedelta(days=2)]
        cut_slots = [ok(add_slot(session, cut.id, start, now=NOW, announce=False)).id for start in starts]
        yoga_slot = ok(add_slot(session, yoga.id, NOW + timedelta(days=1), now=NOW, announce=False)).id
        session.commit()
    return Catalog(engine, cut.id, cut_slots, yoga.id, yoga_slot)


def ok(result: T | Outcome) -> T:
    """The result, failing the test with the messages when it is an outcome."""
    assert not isinstance(result, Outcome), result.messages
    return result


def refused(result: object, code: str) -> Message:
    """The result is an outcome with this code; returns its message."""
    assert isinstance(result, Outcome), f"expected {code}, got {result!r}"
    (message,) = result.messages
    assert message.code == code
    assert message.type == "error"
    assert message.severity is not None
    return message


def call(engine: Engine, run: Callable[[Session], T]) -> T:
    """Run one service function in its own session and commit, as a front end does."""
    with db.session(engine) as session:
        result = run(session)
        session.commit()
        return result


def run(engine: Engine, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``function(session, *args, **kwargs)`` in its own session, committed."""
    return call(engine, lambda session: function(session, *args, **kwargs))


def events(engine: Engine) -> list[WebhookEvent]:
    """Every recorded event, oldest first, each validated by ``usp_schemas.parse_event``."""
    with db.session(engine) as session:
        records = session.exec(select(EventRecord).order_by(col(EventRecord.id))).all()
    parsed = [parse_event(record.payload) for record in records]
    for record, event in zip(records, parsed, strict=True):
        assert record.event_type == event.event
        assert record.correlation_id == event.correlation_id
    return parsed


def event_types(engine: Engine) -> list[str]:
    return [event.event for event in events(engine)]


def slot_counts(engine: Engine, slot_id: str) -> tuple[int, int]:
    """(booked, held) of a slot as stored."""
    with db.session(engine) as session:
        slot = session.get(SlotRow, slot_id)
        assert slot is not None
        return slot.booked, slot.held


def deliveries_for(engine: Engine, subscription_id: str) -> dict[str, str]:
    """event id → event type of every delivery made for a subscription."""
    with db.session(engine) as session:
        rows = session.exec(
            select(Delivery.event_id, EventRecord.event_type)
            .join(EventRecord, col(EventRecord.id) == col(Delivery.event_id))
            .where(col(Delivery.subscription_id) == subscription_id)
        ).all()
    return dict(rows)


def count(engine: Engine, table: type[Any]) -> int:
    with db.session(engine) as session:
        return int(session.exec(select(func.count()).select_from(table)).one())


def payload(engine: Engine, event_id: str) -> dict[str, Any]:
    with db.session(engine) as session:
        record = session.get(EventRecord, event_id)
        assert record is not None
        loaded: dict[str, Any] = json.loads(record.payload)
        return loaded
