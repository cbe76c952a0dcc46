"""The scheduling domain: services, slots, bookings and the waitlist, behind plain functions.

Every function takes a ``Session`` and typed inputs and returns a ``usp_schemas`` object or an
:class:`Outcome` (a business refusal with ``messages[]``); none raises for a business outcome and
none commits. Each state change emits its event through ``usp_workers.engine.outbox.emit`` in the same
session, so the caller's commit writes the change and its webhooks together. The REST routes
(:mod:`usp_dispatcher.api.scheduling`) call them through :func:`perform` (idempotency keys,
commit); each USP MCP tool maps to exactly one of them:

========================== ==========================
``usp_catalog_list``       :func:`list_catalog`
``usp_availability_query`` :func:`query_availability`
``usp_bookings_create``    :func:`create_booking`
``usp_bookings_get``       :func:`get_booking`
``usp_bookings_confirm``   :func:`confirm_booking`
``usp_bookings_cancel``    :func:`cancel_booking`
``usp_bookings_reschedule`` :func:`reschedule_booking`
``usp_waitlist_join``      :func:`join_waitlist`
``usp_waitlist_leave``     :func:`leave_waitlist`
========================== ==========================

The business's own operations (no MCP tool): :func:`complete_booking`, :func:`mark_no_show`,
:func:`create_service`, :func:`add_slot`, :func:`expire_offers` (the scheduler's),
:func:`seed_demo_catalog`.

Bookings and waitlist entries belong to the platform that made them (``platform_profile`` of
:func:`create_booking` and :func:`join_waitlist`; ``None``: the business), and their events reach
that platform and the business only. :func:`booking_platform` and :func:`waitlist_entry_platform`
tell the access layer who owns one; these functions do not check who calls them.
"""

from usp_dispatcher.domain.bookings import (
    booking_platform,
    cancel_booking,
    complete_booking,
    confirm_booking,
    create_booking,
    get_booking,
    mark_no_show,
    reschedule_booking,
)
from usp_dispatcher.domain.catalog import (
    MAX_AVAILABILITY_DAYS,
    Availability,
    ServiceSpec,
    add_slot,
    create_service,
    list_catalog,
    query_availability,
)
from usp_dispatcher.domain.content import Result, structured
from usp_dispatcher.domain.idempotency import Answer, forget_idempotency_keys, perform
from usp_dispatcher.domain.outcomes import (
    WAITLIST_ENTRY_NOT_FOUND,
    WAITLIST_LIMIT_REACHED,
    InvalidRequest,
    Outcome,
)
from usp_dispatcher.domain.seed import ensure_demo_catalog, seed_demo_catalog
from usp_dispatcher.domain.waitlist import (
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
