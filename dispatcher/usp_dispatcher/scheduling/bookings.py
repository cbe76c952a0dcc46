"""Bookings: a buyer's seat in a slot, and its life.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.scheduling.bookings``.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from usp_core.clock import utcnow
from usp_core.ids import new_id
from usp_dispatcher.scheduling.events import (
    BookingEventType,
    emit_availability_changed,
    emit_booking_event,
    emit_waitlist_event,
)
from usp_dispatcher.scheduling.outcomes import (
    Outcome,
    booking_not_found,
    invalid_state_transition,
    service_not_found,
    slot_unavailable,
)
from usp_dispatcher.scheduling.seats import lock_slots, release_seat, take_seat
from usp_dispatcher.scheduling.tables import BookingRow, BookingStatus, ServiceRow, SlotRow
from usp_dispatcher.scheduling.views import booking_view
from usp_dispatcher.scheduling.waitlist import claim_offer, live_offer_for, reuse_freed_seat
from usp_schemas import (
    Booking,
    BookingCancelled,
    BookingCompleted,
    BookingConfirmed,
    BookingCreated,
    BookingNoShow,
    BookingRescheduled,
    Buyer,
    WaitlistConverted,
)

__all__ = [
    "booking_platform",
    "cancel_booking",
    "complete_booking",
    "confirm_booking",
    "create_booking",
    "get_booking",
    "mark_no_show",
    "reschedule_booking",
]

_ACTIVE = (BookingStatus.PENDING, BookingStatus.CONFIRMED)


def create_booking(
    session: Session,
    service_id: str,
    slot_id: str,
    buyer: Buyer,
    *,
    correlation_id: str | None = None,
    order_id: str | None = None,
    platform_profile: str | None = None,
    now: datetime | None = None,
) -> Booking | Outcome:
    """Book a seat of ``slot_id`` for ``buyer``: a ``pending`` booking (``usp_bookings_create``)
    owned by ``platform_profile`` (``None``: the business's own).

    When the slot's seat is held by a waitlist offer made to this buyer, the offer is taken: the
    held seat becomes the booking and the entry ``converted`` (``booking.created`` then
    ``waitlist.converted``); the booking belongs to the entry's platform. A platform can take only
    an offer made to its own entry, the business any: otherwise a booking made through platform B
    for a buyer with the same e-mail would become platform A's, unseen by the platform that made
    it. Otherwise a free seat is taken (``booking.created`` and ``catalog.availability.changed``),
    or the answer is ``slot_unavailable``.
    """
    now = now or utcnow()
    found = _service_and_slot(session, service_id, slot_id)
    if found is None:
        return service_not_found(service_id)
    service, candidate = found
    slot = _bookable(service, candidate, slot_id, now)
    if isinstance(slot, Outcome):
        return slot
    # Every live offer holds a seat of its slot: with none held, there is no offer to look for
    # (one made after the slot was read is a race the offer lookup itself would lose too).
    offer = (
        live_offer_for(session, slot, buyer, platform_profile=platform_profile, now=now)
        if slot.held
        else None
    )
    taken = claim_offer(session, offer, now=now) if offer is not None else None
    converted = offer if taken is not None else None
    if taken is None:
        taken = take_seat(session, slot.id, now)
    if taken is None:
        return slot_unavailable(slot.id)
    booking = BookingRow(
        id=new_id("bkg"),
        service_id=service.id,
        slot_id=taken.id,
        state=BookingStatus.PENDING,
        buyer=buyer.model_dump_json(),
        start=taken.start,
        end=taken.end,
        order_id=order_id,
        correlation_id=correlation_id,
        platform_profile=converted.platform_profile if converted is not None else platform_profile,
        created_at=now,
        updated_at=now,
    )
    # Core, not a flush: the unit of work would cost twice the statement (bench/statements.py).
    session.exec(sa.insert(BookingRow).values(booking.model_dump()))
    _emit(session, BookingCreated, booking, service, now, correlation_id)
    if converted is not None:
        converted.booking_id = booking.id
        converted.updated_at = now
        session.add(converted)
        session.flush()
        session.refresh(converted)
        emit_waitlist_event(
            session, WaitlistConverted, converted, service, now=now, correlation_id=correlation_id
        )
    else:
        emit_availability_changed(session, service, [taken], now=now)
    return booking_view(booking, service)


def get_booking(session: Session, booking_id: str) -> Booking | Outcome:
    """The booking as it is now (``usp_bookings_get``)."""
    booking = session.get(BookingRow, booking_id)
    if booking is None:
        return booking_not_found(booking_id)
    return booking_view(booking, _service(session, booking))


def booking_platform(session: Session, booking_id: str) -> tuple[bool, str | None]:
    """Whether the booking exists, and the profile of the platform that owns it (``None``: the
    business). For the access layer, which must answer ``booking_not_found`` alike for a booking
    that does not exist and one the caller may not see; reads the two columns only."""
    row = session.exec(
        select(BookingRow.id, BookingRow.platform_profile).where(col(BookingRow.id) == booking_id)
    ).first()
    return (False, None) if row is None else (True, row[1])


def confirm_booking(
    session: Session, booking_id: str, *, correlation_id: str | None = None, now: datetime | None = None
) -> Booking | Outcome:
    """pending → confirmed (``usp_bookings_confirm``: the business's call, never the buyer's)."""
    return _transition(
        session,
        booking_id,
        (BookingStatus.PENDING,),
        BookingStatus.CONFIRMED,
        BookingConfirmed,
        action="confirmed",
        correlation_id=correlation_id,
        now=now,
    )


def complete_booking(
    session: Session, booking_id: str, *, correlation_id: str | None = None, now: datetime | None = None
) -> Booking | Outcome:
    """confirmed → completed: the appointment took place."""
    return _transition(
        session,
        booking_id,
        (BookingStatus.CONFIRMED,),
        BookingStatus.COMPLETED,
        BookingCompleted,
        action="completed",
        correlation_id=correlation_id,
        now=now,
    )


def mark_no_show(
    session: Session, booking_id: str, *, correlation_id: str | None = None, now: datetime | None = None
) -> Booking | Outcome:
    """confirmed → no_show: the buyer did not come. The seat is not given back (its time is gone)."""
    return _transition(
        session,
        booking_id,
        (BookingStatus.CONFIRMED,),
        BookingStatus.NO_SHOW,
        BookingNoShow,
        action="marked as a no-show",
        correlation_id=correlation_id,
        now=now,
    )


def cancel_booking(
    session: Session,
    booking_id: str,
    reason: str | None = None,
    *,
    correlation_id: str | None = None,
    now: datetime | None = None,
) -> Booking | Outcome:
    """pending/confirmed → cancelled (``usp_bookings_cancel``). The seat is offered to the next
    buyer on the waitlist (``waitlist.offered``) or, with nobody waiting, back on sale
    (``catalog.availability.changed``)."""
    now = now or utcnow()
    changed = _transition(
        session,
        booking_id,
        _ACTIVE,
        BookingStatus.CANCELLED,
        BookingCancelled,
        action="cancelled",
        correlation_id=correlation_id,
        now=now,
        cancellation_reason=reason,
    )
    if isinstance(changed, Outcome):
        return changed
    booking = _reload(session, booking_id)
    service = _service(session, booking)
    slot = release_seat(session, booking.slot_id, now)
    emit_availability_changed(session, service, reuse_freed_seat(session, service, slot, now=now), now=now)
    return changed


def reschedule_booking(
    session: Session,
    booking_id: str,
    slot_id: str,
    *,
    correlation_id: str | None = None,
    now: datetime | None = None,
) -> Booking | Outcome:
    """Move a pending or confirmed booking to another slot of its service, keeping its state
    (``usp_bookings_reschedule``). The old seat goes to the waitlist or back on sale. Asking for
    the slot the booking already has changes nothing and emits nothing."""
    now = now or utcnow()
    # The lock order of seats.py: the booking, then both slots by id (PostgreSQL; SQLite runs one
    # writer at a time). Taking the new seat before freeing the old one would otherwise lock two
    # slots in an order that depends on the request, and two swapping reschedules deadlock.
    booking = session.exec(
        select(BookingRow)
        .where(col(BookingRow.id) == booking_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).first()
    if booking is None:
        return booking_not_found(booking_id)
    service = _service(session, booking)
    if booking.state not in _ACTIVE:
        return invalid_state_transition("booking", booking.state, "rescheduled")
    if slot_id == booking.slot_id:
        return booking_view(booking, service)
    target = _bookable_slot(session, service, slot_id, now)
    if isinstance(target, Outcome):
        return target
    lock_slots(session, (booking.slot_id, target.id))
    taken = take_seat(session, target.id, now)
    if taken is None:
        return slot_unavailable(target.id)
    old_slot_id = booking.slot_id
    moved = _update(
        session,
        booking_id,
        (col(BookingRow.state).in_(_ACTIVE), col(BookingRow.slot_id) == old_slot_id),
        now,
        slot_id=taken.id,
        start=taken.start,
        end=taken.end,
    )
    if not moved:  # SQLite: cancelled or moved since we read it; give the seat we took back
        release_seat(session, taken.id, now)
        current = _reload(session, booking_id)
        return invalid_state_transition("booking", current.state, "rescheduled")
    booking = _reload(session, booking_id)
    _emit(session, BookingRescheduled, booking, service, now, correlation_id)
    old = release_seat(session, old_slot_id, now)
    changed = [taken, *reuse_freed_seat(session, service, old, now=now)]
    emit_availability_changed(session, service, changed, now=now)
    return booking_view(booking, service)


def _service_and_slot(
    session: Session, service_id: str, slot_id: str
) -> tuple[ServiceRow, SlotRow | None] | None:
    """The bookable service (as :func:`find_service`) and its slot ``slot_id`` if it has one, in
    one statement; ``None`` without such a service."""
    found = session.exec(
        select(ServiceRow, SlotRow)
        .outerjoin(
            SlotRow, sa.and_(col(SlotRow.id) == slot_id, col(SlotRow.service_id) == col(ServiceRow.id))
        )
        .where(col(ServiceRow.id) == service_id, col(ServiceRow.active))
    ).first()
    return None if found is None else (found[0], found[1])


def _bookable_slot(session: Session, service: ServiceRow, slot_id: str, now: datetime) -> SlotRow | Outcome:
    return _bookable(service, session.get(SlotRow, slot_id), slot_id, now)


def _bookable(service: ServiceRow, slot: SlotRow | None, slot_id: str, now: datetime) -> SlotRow | Outcome:
    if slot is None or slot.service_id != service.id:
        return slot_unavailable(slot_id, why=f"is not a slot of {service.id}")
    if slot.start <= now:
        return slot_unavailable(slot_id, why="has already started")
    return slot


def _transition(
    session: Session,
    booking_id: str,
    allowed: Collection[BookingStatus],
    target: BookingStatus,
    kind: BookingEventType,
    *,
    action: str,
    correlation_id: str | None,
    now: datetime | None,
    **values: Any,
) -> Booking | Outcome:
    """Move a booking from one of ``allowed`` to ``target`` (setting ``values``) and emit ``kind``."""
    now = now or utcnow()
    booking = session.get(BookingRow, booking_id)
    if booking is None:
        return booking_not_found(booking_id)
    if booking.state not in allowed or not _update(
        session, booking_id, (col(BookingRow.state).in_(allowed),), now, state=target, **values
    ):
        current = _reload(session, booking_id)
        return invalid_state_transition("booking", current.state, action)
    booking = _reload(session, booking_id)
    service = _service(session, booking)
    _emit(session, kind, booking, service, now, correlation_id)
    return booking_view(booking, service)


def _update(
    session: Session, booking_id: str, conditions: tuple[Any, ...], now: datetime, **values: Any
) -> bool:
    statement = (
        sa.update(BookingRow)
        .where(col(BookingRow.id) == booking_id, *conditions)
        .values(updated_at=now, **values)
        .execution_options(synchronize_session=False)
    )
    return session.exec(statement).rowcount == 1


def _emit(
    session: Session,
    kind: BookingEventType,
    booking: BookingRow,
    service: ServiceRow,
    now: datetime,
    correlation_id: str | None,
) -> None:
    emit_booking_event(session, kind, booking, service, now=now, correlation_id=correlation_id)


def _reload(session: Session, booking_id: str) -> BookingRow:
    booking = session.get(BookingRow, booking_id, populate_existing=True)
    if booking is None:
        raise RuntimeError(f"booking {booking_id} vanished inside its transaction")
    return booking


def _service(session: Session, booking: BookingRow) -> ServiceRow:
    # Not find_service: a retired service's bookings still read, and still change state.
    service = session.get(ServiceRow, booking.service_id)
    if service is None:
        raise RuntimeError(f"booking {booking.id} names a missing service")
    return service
