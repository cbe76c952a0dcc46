"""The scheduling tables: services, slots, bookings, waitlist entries, idempotency keys.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.scheduling.tables``.
"""

from __future__ import annotations

import enum
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field

from usp_core.clock import UtcDateTime, utcnow
from usp_core.ids import new_id
from usp_dispatcher.tables import DispatcherTable

__all__ = [
    "BookingRow",
    "BookingStatus",
    "IdempotencyRecord",
    "ServiceRow",
    "SlotRow",
    "WaitlistRow",
    "WaitlistStatus",
]


class BookingStatus(enum.StrEnum):
    """``usp_schemas.BookingState`` values; transitions are in :mod:`.bookings`."""

    PENDING = "pending"
    CONFIRMED = "confirmed"
    CANCELLED = "cancelled"
    COMPLETED = "completed"
    NO_SHOW = "no_show"


class WaitlistStatus(enum.StrEnum):
    """``usp_schemas.WaitlistState`` values; transitions are in :mod:`.waitlist`."""

    JOINED = "joined"
    OFFERED = "offered"
    CONVERTED = "converted"
    EXPIRED = "expired"
    LEFT = "left"


class ServiceRow(DispatcherTable, table=True):
    """A bookable service. Never deleted (bookings reference it): ``active = False`` retires it."""

    __tablename__ = "sched_services"

    id: str = Field(default_factory=lambda: new_id("svc"), primary_key=True, max_length=128)
    name: str = Field(max_length=200)
    description: str | None = Field(default=None, sa_type=sa.Text)
    duration_minutes: int = Field(gt=0)
    price_amount: int | None = Field(default=None, description="minor units (cents)")
    price_currency: str | None = Field(default=None, max_length=3)
    capacity: int = Field(default=1, description="seats a new slot gets")
    timezone: str = Field(default="UTC", max_length=64, description="IANA zone slots are shown in")
    active: bool = Field(default=True, index=True)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)


class SlotRow(DispatcherTable, table=True):
    """A time a service can be booked at, with its seats: ``booked`` taken by bookings, ``held``
    kept for waitlist offers. ``remaining = capacity - booked - held``.

    The counters only ever change through the conditional ``UPDATE`` statements in
    :mod:`.seats`; the check constraint is the last line of defence, not the mechanism.
    """

    __tablename__ = "sched_slots"
    __table_args__ = (
        sa.CheckConstraint("booked >= 0 AND held >= 0 AND booked + held <= capacity", name="seats"),
        sa.Index("ix_sched_slots_service_start", "service_id", "start"),
    )

    id: str = Field(default_factory=lambda: new_id("slot"), primary_key=True, max_length=128)
    service_id: str = Field(foreign_key="sched_services.id", max_length=128)
    start: datetime = Field(sa_type=UtcDateTime)
    end: datetime = Field(sa_type=UtcDateTime)
    capacity: int = Field(default=1)
    booked: int = Field(default=0)
    held: int = Field(default=0)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)


class BookingRow(DispatcherTable, table=True):
    """A buyer's seat in a slot. ``start``/``end`` are copied from the slot (and follow a
    reschedule) so a booking reads whole without a join. ``correlation_id`` is the one it was
    created with: events caused by someone else (the business confirming) carry it."""

    __tablename__ = "sched_bookings"

    id: str = Field(default_factory=lambda: new_id("bkg"), primary_key=True, max_length=128)
    service_id: str = Field(foreign_key="sched_services.id", index=True, max_length=128)
    slot_id: str = Field(foreign_key="sched_slots.id", index=True, max_length=128)
    state: BookingStatus = Field(default=BookingStatus.PENDING, sa_type=sa.String(16))
    buyer: str = Field(sa_type=sa.Text, description="usp_schemas.Buyer as JSON")
    start: datetime = Field(sa_type=UtcDateTime)
    end: datetime = Field(sa_type=UtcDateTime)
    order_id: str | None = Field(default=None, max_length=128)
    correlation_id: str | None = Field(default=None, max_length=128)
    platform_profile: str | None = Field(
        default=None,
        index=True,
        max_length=2048,
        description="the profile of the platform that made it (null: the business): its events go"
        " to that platform's subscriptions only, and only that platform may read or change it",
    )
    cancellation_reason: str | None = Field(default=None, max_length=500)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)


class WaitlistRow(DispatcherTable, table=True):
    """A buyer waiting for a seat of a service within ``window_start``..``window_end``.

    An ``offered`` entry holds one seat of ``offered_slot_id`` (the slot's ``held``) until
    ``offer_expires_at``; a ``converted`` one names the booking it became.
    """

    __tablename__ = "sched_waitlist_entries"
    __table_args__ = (sa.Index("ix_sched_waitlist_queue", "service_id", "state", "created_at"),)

    id: str = Field(default_factory=lambda: new_id("wl"), primary_key=True, max_length=128)
    service_id: str = Field(foreign_key="sched_services.id", max_length=128)
    window_start: datetime = Field(sa_type=UtcDateTime)
    window_end: datetime = Field(sa_type=UtcDateTime)
    buyer: str = Field(sa_type=sa.Text, description="usp_schemas.Buyer as JSON")
    state: WaitlistStatus = Field(default=WaitlistStatus.JOINED, sa_type=sa.String(16))
    offered_slot_id: str | None = Field(default=None, foreign_key="sched_slots.id", max_length=128)
    offer_expires_at: datetime | None = Field(default=None, sa_type=UtcDateTime, index=True)
    booking_id: str | None = Field(default=None, foreign_key="sched_bookings.id", max_length=128)
    correlation_id: str | None = Field(default=None, max_length=128)
    platform_profile: str | None = Field(
        default=None, index=True, max_length=2048, description="as for bookings"
    )
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)


class IdempotencyRecord(DispatcherTable, table=True):
    """The first answer to a state-changing call made with an idempotency key.

    Keyed by (``principal``, ``key``): keys are the caller's namespace, so two callers may pick the
    same one. ``request_hash`` tells a retry (same request: replay ``response``) from a reuse
    (different request: ``idempotency_conflict``). The row is written in the same transaction as
    the change it answers for, so a key is never recorded for a change that rolled back.
    """

    __tablename__ = "sched_idempotency_keys"

    principal: str = Field(primary_key=True, max_length=256)
    key: str = Field(primary_key=True, max_length=255)
    request_hash: str = Field(max_length=64)
    status_code: int
    response: str = Field(sa_type=sa.Text, description="the structured content answered, as JSON")
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime, index=True)
