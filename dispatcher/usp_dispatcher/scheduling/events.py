"""The domain's events: built from the full object after the change, emitted in its transaction.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.scheduling.events``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlmodel import Session

from usp_dispatcher.scheduling.tables import BookingRow, ServiceRow, SlotRow, WaitlistRow
from usp_dispatcher.scheduling.views import booking_view, service_view, slot_view, waitlist_view
from usp_schemas import (
    AvailabilityChange,
    AvailabilityChanged,
    BookingCancelled,
    BookingCompleted,
    BookingConfirmed,
    BookingCreated,
    BookingNoShow,
    BookingRescheduled,
    ServiceCreated,
    ServiceDeleted,
    ServiceUpdated,
    WaitlistConverted,
    WaitlistExpired,
    WaitlistJoined,
    WaitlistLeft,
    WaitlistOffered,
    new_event_id,
)
from usp_workers import emit

__all__ = [
    "BookingEventType",
    "ServiceEventType",
    "WaitlistEventType",
    "audience_of",
    "emit_availability_changed",
    "emit_booking_event",
    "emit_service_event",
    "emit_waitlist_event",
]

#: The concrete event classes (not their bases: only these have an ``event`` value to send).
BookingEventType = type[
    BookingCreated
    | BookingConfirmed
    | BookingRescheduled
    | BookingCancelled
    | BookingCompleted
    | BookingNoShow
]
WaitlistEventType = type[
    WaitlistJoined | WaitlistOffered | WaitlistConverted | WaitlistExpired | WaitlistLeft
]
ServiceEventType = type[ServiceCreated | ServiceUpdated | ServiceDeleted]


def emit_booking_event(
    session: Session,
    kind: BookingEventType,
    booking: BookingRow,
    service: ServiceRow,
    *,
    now: datetime,
    correlation_id: str | None,
) -> None:
    """Emit ``kind`` (``BookingCreated`` …) for ``booking`` as it is now, to its platform and the
    business."""
    emit(
        session,
        kind(
            event_id=new_event_id(),
            timestamp=now,
            booking_id=booking.id,
            service_id=booking.service_id,
            order_id=booking.order_id,
            correlation_id=correlation_id or booking.correlation_id,
            data=booking_view(booking, service),
        ),
        audience=audience_of(booking),
    )


def emit_waitlist_event(
    session: Session,
    kind: WaitlistEventType,
    entry: WaitlistRow,
    service: ServiceRow,
    *,
    now: datetime,
    correlation_id: str | None,
) -> None:
    """Emit ``kind`` (``WaitlistJoined`` …) for ``entry`` as it is now, to its platform and the
    business."""
    emit(
        session,
        kind(
            event_id=new_event_id(),
            timestamp=now,
            waitlist_entry_id=entry.id,
            service_id=entry.service_id,
            booking_id=entry.booking_id,
            correlation_id=correlation_id or entry.correlation_id,
            data=waitlist_view(entry, service),
        ),
        audience=audience_of(entry),
    )


def audience_of(owned: BookingRow | WaitlistRow) -> str:
    """The audience of an event about ``owned``: its platform, or ``""`` (the business alone)
    when the business made it. Never ``None``: a buyer's details are never public."""
    return owned.platform_profile or ""


def emit_availability_changed(
    session: Session, service: ServiceRow, slots: Sequence[SlotRow], *, now: datetime
) -> None:
    """Emit ``catalog.availability.changed`` listing the slots whose free seats changed, as they
    are now (not the whole calendar: a service can have thousands of slots)."""
    if not slots:
        return
    change = AvailabilityChange(
        service_id=service.id, slots=[slot_view(slot, service, now) for slot in slots]
    )
    emit(
        session,
        AvailabilityChanged(event_id=new_event_id(), timestamp=now, service_id=service.id, data=change),
    )


def emit_service_event(
    session: Session, kind: ServiceEventType, service: ServiceRow, *, now: datetime
) -> None:
    """Emit ``kind`` (``ServiceCreated`` …) with the whole service."""
    emit(
        session,
        kind(event_id=new_event_id(), timestamp=now, service_id=service.id, data=service_view(service)),
    )
