"""The scheduling domain: services, slots, bookings and the waitlist, behind plain functions.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.scheduling``.
"""

from usp_dispatcher.errors import InvalidRequest
from usp_dispatcher.scheduling.bookings import (
    booking_platform,
    cancel_booking,
    complete_booking,
    confirm_booking,
    create_booking,
    get_booking,
    mark_no_show,
    reschedule_booking,
)
from usp_dispatcher.scheduling.catalog import (
    MAX_AVAILABILITY_DAYS,
    Availability,
    ServiceSpec,
    add_slot,
    create_service,
    list_catalog,
    query_availability,
)
from usp_dispatcher.scheduling.content import Result, structured
from usp_dispatcher.scheduling.idempotency import Answer, forget_idempotency_keys, perform
from usp_dispatcher.scheduling.outcomes import WAITLIST_ENTRY_NOT_FOUND, WAITLIST_LIMIT_REACHED, Outcome
from usp_dispatcher.scheduling.seed import ensure_demo_catalog, seed_demo_catalog
from usp_dispatcher.scheduling.waitlist import (
    OFFER_TTL,
    expire_offers,
    get_waitlist_entry,
    join_waitlist,
    leave_waitlist,
    waitlist_entry_platform,
)

__all__ = [
    "MAX_AVAILABILITY_DAYS",
    "OFFER_TTL",
    "WAITLIST_ENTRY_NOT_FOUND",
    "WAITLIST_LIMIT_REACHED",
    "Answer",
    "Availability",
    "InvalidRequest",
    "Outcome",
    "Result",
    "ServiceSpec",
    "add_slot",
    "booking_platform",
    "cancel_booking",
    "complete_booking",
    "confirm_booking",
    "create_booking",
    "create_service",
    "ensure_demo_catalog",
    "expire_offers",
    "forget_idempotency_keys",
    "get_booking",
    "get_waitlist_entry",
    "join_waitlist",
    "leave_waitlist",
    "list_catalog",
    "mark_no_show",
    "perform",
    "query_availability",
    "reschedule_booking",
    "seed_demo_catalog",
    "structured",
    "waitlist_entry_platform",
]
