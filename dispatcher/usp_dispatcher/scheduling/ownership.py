"""Whose bookings and waitlist entries a caller may read or change."""

from __future__ import annotations

from sqlmodel import Session

from usp_dispatcher.access import Caller
from usp_dispatcher.scheduling.bookings import booking_platform
from usp_dispatcher.scheduling.waitlist import waitlist_entry_platform

__all__ = ["may_touch_booking", "may_touch_waitlist_entry"]


def may_touch_booking(session: Session, caller: Caller, booking_id: str) -> bool:
    """Whether ``caller`` may read or change the booking (``False`` also when it does not exist,
    so the tool answers ``booking_not_found`` alike): the business any; a scoped credential its
    own booking only; an authenticated platform the bookings its profile owns (an anonymous one,
    when the policy lets it in, proves no profile: it reaches its bookings by their credentials)."""
    exists, owner = booking_platform(session, booking_id)
    if not exists:
        return False
    if caller.scoped_booking_id is not None:
        return booking_id == caller.scoped_booking_id
    if caller.is_business:
        return True
    return caller.principal is not None and caller.profile is not None and owner == caller.profile


def may_touch_waitlist_entry(session: Session, caller: Caller, entry_id: str) -> bool:
    """As :func:`may_touch_booking`, for waitlist entries; a booking-scoped credential opens none."""
    exists, owner = waitlist_entry_platform(session, entry_id)
    if not exists or caller.scoped_booking_id is not None:
        return False
    if caller.is_business:
        return True
    return caller.principal is not None and caller.profile is not None and owner == caller.profile
