"""The scheduling operations' inputs, shared by the REST routes and the MCP tools (one model per
operation, so both bindings accept and refuse the same arguments)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from usp_schemas import Buyer, TimeWindow

__all__ = ["BookingIn", "CancelIn", "RescheduleIn", "WaitlistIn"]


class BookingIn(BaseModel):
    """``usp_bookings_create``'s arguments."""

    model_config = ConfigDict(extra="forbid")

    service_id: str = Field(min_length=1, max_length=128, description="a service id from the catalog")
    slot_id: str = Field(min_length=1, max_length=128, description="a slot id from usp_availability_query")
    buyer: Buyer = Field(description="who the booking is for: first_name required; last_name, email, phone")
    order_id: str | None = Field(default=None, min_length=1, max_length=128, description="the UCP order")


class CancelIn(BaseModel):
    """``usp_bookings_cancel``'s arguments besides the booking id."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, min_length=1, max_length=500)


class RescheduleIn(BaseModel):
    """``usp_bookings_reschedule``'s arguments besides the booking id."""

    model_config = ConfigDict(extra="forbid")

    slot_id: str = Field(min_length=1, max_length=128, description="the new slot, of the same service")


class WaitlistIn(BaseModel):
    """``usp_waitlist_join``'s arguments."""

    model_config = ConfigDict(extra="forbid")

    service_id: str = Field(min_length=1, max_length=128, description="a service id from the catalog")
    desired_window: TimeWindow = Field(description="start and end (RFC 3339) of the times the buyer can do")
    buyer: Buyer = Field(description="who the entry is for: first_name required; last_name, email, phone")
