"""The business objects carried in ``data`` and in MCP results: buyer, service, slot, booking, waitlist.

Every payload allows unknown fields (see ``WireModel``). Enumerations are closed: a new booking
state changes what receivers must do, so it arrives with a new protocol version, not silently.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, Self

from pydantic import Field, model_validator

from usp_schemas._base import WireModel
from usp_schemas._types import BookingId, IsoDuration, Rfc3339Datetime, ServiceId, SlotId, WaitlistEntryId

__all__ = [
    "AvailabilityChange",
    "Booking",
    "BookingState",
    "Buyer",
    "Message",
    "MessageType",
    "Money",
    "Service",
    "Severity",
    "Slot",
    "SlotState",
    "TimeWindow",
    "WaitlistEntry",
    "WaitlistState",
]

SlotState = Literal["available", "held", "booked", "unavailable"]
BookingState = Literal["pending", "confirmed", "cancelled", "completed", "no_show"]
WaitlistState = Literal["joined", "offered", "converted", "expired", "left"]
MessageType = Literal["error", "warning", "info"]
Severity = Literal["recoverable", "requires_buyer_input", "unrecoverable"]


class Buyer(WireModel):
    """The person a booking or waitlist entry is for. Only ``first_name`` is required (see the
    binding's ``usp_bookings_create`` example).

    >>> Buyer(first_name="Alice", email="alice@example.com").model_dump()
    {'first_name': 'Alice', 'email': 'alice@example.com'}
    """

    first_name: str = Field(min_length=1, max_length=200, description="the buyer's first name (required)")
    last_name: str | None = Field(default=None, max_length=200, description="the buyer's last name")
    # A light check only: full address validation needs a dependency and belongs to the business.
    email: str | None = Field(
        default=None, pattern=r"^[^@\s]+@[^@\s]+$", max_length=320, description="where the business may write"
    )
    phone: str | None = Field(default=None, max_length=40, description="a phone number, as the buyer gave it")


class Money(WireModel):
    """An amount in minor units (cents), never a float: JCS canonicalization of non-integer
    numbers is ambiguous and the binding asks senders to avoid them.

    >>> Money(amount=4500, currency="USD").amount
    4500
    """

    amount: int = Field(ge=0)
    currency: str = Field(pattern=r"^[A-Z]{3}$", description="ISO 4217 code")


class Service(WireModel):
    """A bookable service from the business's catalog.

    >>> Service(id="svc_haircut_001", name="Haircut", duration="PT60M").capacity
    1
    """

    id: ServiceId
    name: str = Field(min_length=1)
    description: str | None = None
    duration: IsoDuration
    price: Money | None = None
    capacity: int = Field(default=1, ge=1, description="buyers one slot can take")
    active: bool = True


class Slot(WireModel):
    """A time a service can be booked at. ``start``/``end`` keep the business's local offset.

    >>> Slot(id="slot_20260315_0900", service_id="svc_haircut_001", start="2026-03-15T09:00:00-04:00",
    ...      end="2026-03-15T10:00:00-04:00", duration="PT60M", state="available").state
    'available'
    """

    id: SlotId
    service_id: ServiceId
    start: Rfc3339Datetime
    end: Rfc3339Datetime
    duration: IsoDuration
    state: SlotState
    capacity: int | None = Field(default=None, ge=1)
    remaining: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        _require_ordered(self.start, self.end)
        if self.capacity is not None and self.remaining is not None and self.remaining > self.capacity:
            raise ValueError("remaining cannot exceed capacity")
        return self


class Booking(WireModel):
    """A reservation of a slot by a buyer; the ``data`` of every ``booking.*`` event."""

    id: BookingId
    service_id: ServiceId
    slot_id: SlotId
    state: BookingState
    buyer: Buyer
    start: Rfc3339Datetime
    end: Rfc3339Datetime
    created_at: Rfc3339Datetime
    updated_at: Rfc3339Datetime
    cancellation_reason: str | None = None
    order_id: str | None = Field(default=None, min_length=1, description="the UCP order, when known")

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        _require_ordered(self.start, self.end)
        return self


class TimeWindow(WireModel):
    """The span a waitlisted buyer would accept a slot in."""

    start: Rfc3339Datetime
    end: Rfc3339Datetime

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        _require_ordered(self.start, self.end)
        return self


class WaitlistEntry(WireModel):
    """A buyer waiting for a slot; the ``data`` of every ``waitlist.*`` event.

    An ``offered`` entry names the slot and when the offer lapses; a ``converted`` one names the
    booking it became, so a receiver can act on the event without another call.
    """

    id: WaitlistEntryId
    service_id: ServiceId
    state: WaitlistState
    buyer: Buyer
    desired_window: TimeWindow
    created_at: Rfc3339Datetime
    updated_at: Rfc3339Datetime
    offered_slot_id: SlotId | None = None
    offer_expires_at: Rfc3339Datetime | None = None
    booking_id: BookingId | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.state == "offered" and (self.offered_slot_id is None or self.offer_expires_at is None):
            raise ValueError("an offered entry needs offered_slot_id and offer_expires_at")
        if self.state == "converted" and self.booking_id is None:
            raise ValueError("a converted entry needs booking_id")
        return self


class AvailabilityChange(WireModel):
    """The ``data`` of ``catalog.availability.changed``: the service's slots as they now are."""

    service_id: ServiceId
    slots: list[Slot]

    @model_validator(mode="after")
    def _slots_belong_to_service(self) -> Self:
        for index, slot in enumerate(self.slots):
            if slot.service_id != self.service_id:
                raise ValueError(f"slots[{index}].service_id is not {self.service_id}")
        return self


class Message(WireModel):
    """A business outcome in ``structuredContent.messages[]`` (not a JSON-RPC error).

    ``severity`` tells the agent what to do next, so an ``error`` must carry one; warnings and
    infos may omit it.

    >>> Message(type="error", code="slot_unavailable", content="Taken.", severity="recoverable").code
    'slot_unavailable'
    """

    type: MessageType
    code: str = Field(min_length=1)
    content: str
    severity: Severity | None = None
    path: str | None = Field(default=None, description="JSONPath of the offending input, e.g. $.slot_id")

    @model_validator(mode="after")
    def _error_has_severity(self) -> Self:
        if self.type == "error" and self.severity is None:
            raise ValueError("an error message needs a severity")
        return self


def _require_ordered(start: datetime, end: datetime) -> None:
    if end <= start:
        raise ValueError("end must be after start")
