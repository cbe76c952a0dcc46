"""``/services/…``: the scheduling API (catalog, availability, bookings, waitlist) over REST.

Each route is a thin adapter onto one :mod:`usp_dispatcher.domain` function, the same one the
matching USP MCP tool calls (the tool's name is in each route's summary), and answers with the
same ``structuredContent`` JSON (:func:`usp_dispatcher.domain.structured`):

* success: the object (``booking``, ``waitlist_entry``, ``slots`` …) and ``messages: []``; 201
  for a creation, else 200;
* a business outcome (``slot_unavailable``, ``invalid_state_transition`` …): HTTP 200 with
  ``messages[]``, as the binding's REST side does;
* malformed input: a 422 RFC 9457 problem (``invalid_request``), like every other route here.

Headers: ``USP-Correlation-Id`` is carried into the events the call emits; ``Idempotency-Key``
makes a state change safe to retry (same key and request: the first answer again, with
``Idempotent-Replayed: true``, and nothing emitted again; another request: ``idempotency_conflict``).

Authentication, for now: the catalog and availability are public (``x-usp-access: public``);
everything else requires the admin bearer token (``USP_ADMIN_TOKEN``). The platform credentials
of the binding (``privileged_platform``, ``privileged_scoped`` with a booking-scoped credential,
``business_only`` for confirm) arrive with the MCP work, which will also scope idempotency keys by
the calling platform instead of the single :data:`ADMIN_PRINCIPAL`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import date
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from usp_schemas import Buyer, StructuredContent, TimeWindow

from .. import domain
from ..auth import AdminDep
from ..deps import SessionDep
from ..domain.content import AvailabilityContent, BookingContent, CatalogContent, WaitlistContent
from ..problems import HTTPProblem

__all__ = ["ADMIN_PRINCIPAL", "public_router", "router"]

#: Whose namespace idempotency keys live in while the admin token is the only credential.
ADMIN_PRINCIPAL = "admin"

public_router = APIRouter(prefix="/services", tags=["catalog"])
router = APIRouter(prefix="/services", tags=["bookings"], dependencies=[AdminDep])

CorrelationId = Annotated[
    str | None,
    Header(
        alias="USP-Correlation-Id",
        min_length=1,
        max_length=128,
        pattern=r"^[\x21-\x7e]+$",
        description="the USP join id, carried into the events this call emits",
    ),
]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=domain.idempotency.MAX_KEY_LENGTH,
        description="retrying with the same key and request replays the first answer (UUID v4 advised)",
    ),
]
_OUTCOME = {"model": StructuredContent, "description": "a business outcome: messages[] says which"}


class BookingIn(BaseModel):
    """``usp_bookings_create``'s arguments."""

    model_config = ConfigDict(extra="forbid")

    service_id: str = Field(min_length=1, max_length=128)
    slot_id: str = Field(min_length=1, max_length=128)
    buyer: Buyer
    order_id: str | None = Field(default=None, min_length=1, max_length=128, description="the UCP order")


class CancelIn(BaseModel):
    """``usp_bookings_cancel``'s arguments besides the booking id."""

    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, min_length=1, max_length=500)


class RescheduleIn(BaseModel):
    """``usp_bookings_reschedule``'s arguments besides the booking id."""

    model_config = ConfigDict(extra="forbid")

    slot_id: str = Field(min_length=1, max_length=128)


class WaitlistIn(BaseModel):
    """``usp_waitlist_join``'s arguments."""

    model_config = ConfigDict(extra="forbid")

    service_id: str = Field(min_length=1, max_length=128)
    desired_window: TimeWindow
    buyer: Buyer


# ------------------------------------------------------------------------------------ public


@public_router.get("/catalog", response_model=CatalogContent, summary="List the catalog (usp_catalog_list)")
def list_catalog(session: SessionDep) -> JSONResponse:
    """The active services."""
    return _read(lambda: domain.list_catalog(session))


@public_router.get(
    "/availability",
    response_model=AvailabilityContent,
    responses={200: _OUTCOME},
    summary="Bookable slots (usp_availability_query)",
)
def query_availability(
    session: SessionDep,
    service_id: Annotated[str, Query(min_length=1, max_length=128)],
    start_date: date,
    end_date: date,
) -> JSONResponse:
    """Slots with a free seat from ``start_date`` through ``end_date`` (the business's dates)."""
    return _read(lambda: domain.query_availability(session, service_id, start_date, end_date))


# ------------------------------------------------------------------------------------ bookings


@router.post(
    "/bookings",
    status_code=201,
    response_model=BookingContent,
    responses={200: _OUTCOME},
    summary="Book a slot (usp_bookings_create)",
)
def create_booking(
    body: BookingIn, session: SessionDep, correlation_id: CorrelationId = None, key: IdempotencyKey = None
) -> JSONResponse:
    """A pending booking (201); ``slot_unavailable`` when its last seat is gone."""
    return _change(
        session,
        lambda: domain.create_booking(
            session,
            body.service_id,
            body.slot_id,
            body.buyer,
            correlation_id=correlation_id,
            order_id=body.order_id,
        ),
        operation="bookings.create",
        arguments=body.model_dump(mode="json"),
        key=key,
        created=True,
    )


@router.get(
    "/bookings/{booking_id}",
    response_model=BookingContent,
    responses={200: _OUTCOME},
    summary="Read a booking (usp_bookings_get)",
)
def get_booking(booking_id: str, session: SessionDep) -> JSONResponse:
    return _read(lambda: domain.get_booking(session, booking_id))


@router.post(
    "/bookings/{booking_id}/confirm",
    response_model=BookingContent,
    responses={200: _OUTCOME},
    summary="Confirm a booking (usp_bookings_confirm)",
)
def confirm_booking(
    booking_id: str, session: SessionDep, correlation_id: CorrelationId = None, key: IdempotencyKey = None
) -> JSONResponse:
    return _change(
        session,
        lambda: domain.confirm_booking(session, booking_id, correlation_id=correlation_id),
        operation="bookings.confirm",
        arguments={"booking_id": booking_id},
        key=key,
    )


@router.post(
    "/bookings/{booking_id}/cancel",
    response_model=BookingContent,
    responses={200: _OUTCOME},
    summary="Cancel a booking (usp_bookings_cancel)",
)
def cancel_booking(
    booking_id: str,
    session: SessionDep,
    body: CancelIn | None = None,
    correlation_id: CorrelationId = None,
    key: IdempotencyKey = None,
) -> JSONResponse:
    """Cancel; the seat goes to the next buyer on the waitlist, or back on sale."""
    reason = body.reason if body is not None else None
    return _change(
        session,
        lambda: domain.cancel_booking(session, booking_id, reason, correlation_id=correlation_id),
        operation="bookings.cancel",
        arguments={"booking_id": booking_id, "reason": reason},
        key=key,
    )


@router.post(
    "/bookings/{booking_id}/reschedule",
    response_model=BookingContent,
    responses={200: _OUTCOME},
    summary="Move a booking to another slot (usp_bookings_reschedule)",
)
def reschedule_booking(
    booking_id: str,
    body: RescheduleIn,
    session: SessionDep,
    correlation_id: CorrelationId = None,
    key: IdempotencyKey = None,
) -> JSONResponse:
    return _change(
        session,
        lambda: domain.reschedule_booking(session, booking_id, body.slot_id, correlation_id=correlation_id),
        operation="bookings.reschedule",
        arguments={"booking_id": booking_id, "slot_id": body.slot_id},
        key=key,
    )


@router.post(
    "/bookings/{booking_id}/complete",
    response_model=BookingContent,
    responses={200: _OUTCOME},
    summary="Mark a booking completed (business only)",
)
def complete_booking(
    booking_id: str, session: SessionDep, correlation_id: CorrelationId = None, key: IdempotencyKey = None
) -> JSONResponse:
    return _change(
        session,
        lambda: domain.complete_booking(session, booking_id, correlation_id=correlation_id),
        operation="bookings.complete",
        arguments={"booking_id": booking_id},
        key=key,
    )


@router.post(
    "/bookings/{booking_id}/no-show",
    response_model=BookingContent,
    responses={200: _OUTCOME},
    summary="Mark a booking as a no-show (business only)",
)
def mark_no_show(
    booking_id: str, session: SessionDep, correlation_id: CorrelationId = None, key: IdempotencyKey = None
) -> JSONResponse:
    return _change(
        session,
        lambda: domain.mark_no_show(session, booking_id, correlation_id=correlation_id),
        operation="bookings.no_show",
        arguments={"booking_id": booking_id},
        key=key,
    )


# ------------------------------------------------------------------------------------ waitlist


@router.post(
    "/waitlist",
    status_code=201,
    response_model=WaitlistContent,
    responses={200: _OUTCOME},
    summary="Join a service's waitlist (usp_waitlist_join)",
)
def join_waitlist(
    body: WaitlistIn, session: SessionDep, correlation_id: CorrelationId = None, key: IdempotencyKey = None
) -> JSONResponse:
    """A joined entry (201): offered a seat when one inside ``desired_window`` is freed."""
    return _change(
        session,
        lambda: domain.join_waitlist(
            session, body.service_id, body.desired_window, body.buyer, correlation_id=correlation_id
        ),
        operation="waitlist.join",
        arguments=body.model_dump(mode="json"),
        key=key,
        created=True,
    )


@router.get(
    "/waitlist/{waitlist_entry_id}",
    response_model=WaitlistContent,
    responses={200: _OUTCOME},
    summary="Read a waitlist entry",
)
def get_waitlist_entry(waitlist_entry_id: str, session: SessionDep) -> JSONResponse:
    return _read(lambda: domain.get_waitlist_entry(session, waitlist_entry_id))


@router.delete(
    "/waitlist/{waitlist_entry_id}",
    response_model=WaitlistContent,
    responses={200: _OUTCOME},
    summary="Leave the waitlist (usp_waitlist_leave)",
)
def leave_waitlist(
    waitlist_entry_id: str,
    session: SessionDep,
    correlation_id: CorrelationId = None,
    key: IdempotencyKey = None,
) -> JSONResponse:
    """The entry, now ``left``; a seat held for it goes to the next in line."""
    return _change(
        session,
        lambda: domain.leave_waitlist(session, waitlist_entry_id, correlation_id=correlation_id),
        operation="waitlist.leave",
        arguments={"waitlist_entry_id": waitlist_entry_id},
        key=key,
    )


# ------------------------------------------------------------------------------------ helpers


def _read(run: Callable[[], domain.Result]) -> JSONResponse:
    try:
        return JSONResponse(domain.structured(run()))
    except domain.InvalidRequest as exc:
        raise _invalid(exc) from None


def _change(
    session: SessionDep,
    run: Callable[[], domain.Result],
    *,
    operation: str,
    arguments: Mapping[str, Any],
    key: str | None,
    created: bool = False,
) -> JSONResponse:
    try:
        answer = domain.perform(
            session,
            run,
            operation=operation,
            arguments=arguments,
            idempotency_key=key,
            principal=ADMIN_PRINCIPAL,
            created_status=201 if created else 200,
        )
    except domain.InvalidRequest as exc:
        raise _invalid(exc) from None
    headers = {"Idempotent-Replayed": "true"} if answer.replayed else None
    return JSONResponse(answer.body, status_code=answer.status_code, headers=headers)


def _invalid(exc: domain.InvalidRequest) -> HTTPProblem:
    return HTTPProblem(422, "invalid_request", "Invalid request", str(exc))
