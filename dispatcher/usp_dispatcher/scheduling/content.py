"""Results as ``structuredContent``: the one shape REST answers and MCP tools return.

The binding's MCP results carry ``structuredContent`` (``usp``, the data, ``messages[]``) and its
REST binding answers business outcomes as HTTP 200 with ``messages[]``. Using the very same JSON
for both means the MCP tools can wrap the service functions (or the REST API) without a second
mapping, and an idempotent replay stored by one front end reads right in the other.
"""

from __future__ import annotations

from datetime import date
from typing import Any

from usp_dispatcher.scheduling.catalog import Availability
from usp_dispatcher.scheduling.outcomes import Outcome
from usp_schemas import Booking, Service, Slot, StructuredContent, WaitlistEntry

__all__ = [
    "AvailabilityContent",
    "BookingContent",
    "CatalogContent",
    "Result",
    "WaitlistContent",
    "structured",
]

#: What the service functions return.
Result = Booking | WaitlistEntry | Availability | list[Service] | Outcome


class CatalogContent(StructuredContent):
    """``usp_catalog_list``: the active services."""

    services: list[Service]


class AvailabilityContent(StructuredContent):
    """``usp_availability_query``: the bookable slots between two dates, soonest first."""

    service_id: str
    start_date: date
    end_date: date
    slots: list[Slot]


class BookingContent(StructuredContent):
    """Every ``usp_bookings_*`` tool: the booking after the call."""

    booking: Booking


class WaitlistContent(StructuredContent):
    """``usp_waitlist_join`` / ``usp_waitlist_leave``: the entry after the call."""

    waitlist_entry: WaitlistEntry


def structured(result: Result) -> dict[str, Any]:
    """The JSON object of ``result``: its data beside ``usp`` and ``messages`` (empty on success;
    an :class:`Outcome` has only the messages).

    >>> from .outcomes import booking_not_found
    >>> structured(booking_not_found("bkg_x"))["messages"][0]["code"]
    'booking_not_found'
    """
    content: StructuredContent
    if isinstance(result, Outcome):
        content = StructuredContent(messages=list(result.messages))
    elif isinstance(result, Booking):
        content = BookingContent(booking=result)
    elif isinstance(result, WaitlistEntry):
        content = WaitlistContent(waitlist_entry=result)
    elif isinstance(result, Availability):
        content = AvailabilityContent(
            service_id=result.service_id,
            start_date=result.start_date,
            end_date=result.end_date,
            slots=result.slots,
        )
    else:
        content = CatalogContent(services=result)
    dumped: dict[str, Any] = content.model_dump(mode="json")
    return dumped
