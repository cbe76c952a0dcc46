"""A slot's seats, changed only by conditional ``UPDATE`` statements: the capacity guarantee.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.scheduling.seats``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from usp_dispatcher.scheduling.tables import SlotRow

__all__ = ["claim_hold", "hold_free_seat", "lock_slots", "release_hold", "release_seat", "take_seat"]

_booked = col(SlotRow.booked)
_held = col(SlotRow.held)
_capacity = col(SlotRow.capacity)


def lock_slots(session: Session, slot_ids: Iterable[str]) -> None:
    """Lock these slots' rows in id order until the transaction ends (PostgreSQL; SQLite has one
    writer at a time, and SQLAlchemy renders no ``FOR UPDATE`` there)."""
    ordered = sorted(set(slot_ids))
    session.exec(
        select(SlotRow.id).where(col(SlotRow.id).in_(ordered)).order_by(col(SlotRow.id)).with_for_update()
    ).all()


def take_seat(session: Session, slot_id: str, now: datetime) -> SlotRow | None:
    """Book one free seat of a slot that has not started; ``None`` when there is none."""
    return _update(
        session,
        slot_id,
        now,
        (_booked + _held < _capacity, col(SlotRow.start) > now),
        booked=_booked + 1,
    )


def release_seat(session: Session, slot_id: str, now: datetime) -> SlotRow:
    """Give back a booked seat (a cancellation, the old slot of a reschedule)."""
    return _require(_update(session, slot_id, now, (_booked > 0,), booked=_booked - 1), slot_id)


def hold_free_seat(session: Session, slot_id: str, now: datetime) -> SlotRow | None:
    """Keep a free seat for a waitlist offer; ``None`` when no seat is free."""
    return _update(session, slot_id, now, (_booked + _held < _capacity,), held=_held + 1)


def release_hold(session: Session, slot_id: str, now: datetime) -> SlotRow:
    """An offer lapsed or was withdrawn: its held seat is free again."""
    return _require(_update(session, slot_id, now, (_held > 0,), held=_held - 1), slot_id)


def claim_hold(session: Session, slot_id: str, now: datetime) -> SlotRow:
    """An offer was taken: its held seat becomes a booked one."""
    return _require(_update(session, slot_id, now, (_held > 0,), held=_held - 1, booked=_booked + 1), slot_id)


def _update(
    session: Session, slot_id: str, now: datetime, conditions: tuple[Any, ...], **values: Any
) -> SlotRow | None:
    # One statement: the conditional UPDATE hands back the row it changed (the slot as loaded
    # earlier in the session is refreshed in place), or nothing when the condition failed.
    statement = (
        sa.update(SlotRow)
        .where(col(SlotRow.id) == slot_id, *conditions)
        .values(updated_at=now, **values)
        .returning(SlotRow)
        .execution_options(synchronize_session=False, populate_existing=True)
    )
    return session.scalars(statement).first()


def _require(slot: SlotRow | None, slot_id: str) -> SlotRow:
    # The caller changed the booking or offer that accounts for this seat in the same transaction
    # (with its own conditional update), so the counter must be there to give back.
    if slot is None:
        raise RuntimeError(f"seat accounting of slot {slot_id} is inconsistent")
    return slot
