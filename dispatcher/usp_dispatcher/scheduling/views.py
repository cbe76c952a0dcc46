"""Rows as the wire sees them: ``usp_schemas`` models built from the domain's tables.

Every answer and every event's ``data`` goes through here, so a booking reads the same in a REST
response, an MCP result and a ``booking.*`` webhook. Times are stored in UTC and shown in the
service's time zone (the binding's slots carry the business's local offset, e.g. ``-04:00``).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, tzinfo
from functools import cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from usp_dispatcher.scheduling.tables import BookingRow, ServiceRow, SlotRow, WaitlistRow
from usp_schemas import Booking, Buyer, Money, Service, Slot, SlotState, TimeWindow, WaitlistEntry

__all__ = ["booking_view", "iso_duration", "service_view", "slot_state", "slot_view", "waitlist_view", "zone"]

logger = logging.getLogger("usp_dispatcher")


@cache
def zone(name: str) -> tzinfo:
    """The IANA zone ``name``; UTC (with a warning in the log) when this system lacks the zone
    database: times are then still right, only shown with ``Z`` instead of the local offset."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        logger.warning("time zone %r is unknown here (no tz database?); showing times in UTC", name)
        return UTC


def iso_duration(minutes: int) -> str:
    """``PT60M`` style: minutes only, as the binding's examples write durations.

    >>> iso_duration(90)
    'PT90M'
    """
    return f"PT{minutes}M"


def service_view(row: ServiceRow) -> Service:
    price = None
    if row.price_amount is not None and row.price_currency is not None:
        price = Money(amount=row.price_amount, currency=row.price_currency)
    return Service(
        id=row.id,
        name=row.name,
        description=row.description,
        duration=iso_duration(row.duration_minutes),
        price=price,
        capacity=row.capacity,
        active=row.active,
    )


def slot_state(row: SlotRow, now: datetime) -> SlotState:
    """``available`` while a seat is free; ``held`` when the last seats wait on waitlist offers;
    ``booked`` when full; ``unavailable`` once it has started (it can no longer be booked)."""
    if row.start <= now:
        return "unavailable"
    if row.capacity - row.booked - row.held > 0:
        return "available"
    return "held" if row.held > 0 else "booked"


def slot_view(row: SlotRow, service: ServiceRow, now: datetime) -> Slot:
    local = zone(service.timezone)
    return Slot(
        id=row.id,
        service_id=row.service_id,
        start=row.start.astimezone(local),
        end=row.end.astimezone(local),
        duration=iso_duration(int((row.end - row.start).total_seconds()) // 60),
        state=slot_state(row, now),
        capacity=row.capacity,
        remaining=max(0, row.capacity - row.booked - row.held),
    )


def booking_view(row: BookingRow, service: ServiceRow) -> Booking:
    local = zone(service.timezone)
    return Booking(
        id=row.id,
        service_id=row.service_id,
        slot_id=row.slot_id,
        state=row.state,
        buyer=Buyer.model_validate_json(row.buyer),
        start=row.start.astimezone(local),
        end=row.end.astimezone(local),
        created_at=row.created_at,
        updated_at=row.updated_at,
        cancellation_reason=row.cancellation_reason,
        order_id=row.order_id,
    )


def waitlist_view(row: WaitlistRow, service: ServiceRow) -> WaitlistEntry:
    local = zone(service.timezone)
    return WaitlistEntry(
        id=row.id,
        service_id=row.service_id,
        state=row.state,
        buyer=Buyer.model_validate_json(row.buyer),
        desired_window=TimeWindow(
            start=row.window_start.astimezone(local), end=row.window_end.astimezone(local)
        ),
        created_at=row.created_at,
        updated_at=row.updated_at,
        offered_slot_id=row.offered_slot_id,
        offer_expires_at=row.offer_expires_at,
        booking_id=row.booking_id,
    )
