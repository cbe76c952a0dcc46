"""``/services/…``: the scheduling API (catalog, availability, bookings, waitlist) over REST.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.api.scheduling``.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import date
from functools import partial
from typing import Annotated, Any, Final

import anyio.to_thread
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlmodel import Session

from usp_core import db
from usp_dispatcher import access, scheduling
from usp_dispatcher.access import AccessError
from usp_dispatcher.access.credentials import MECHANISM, looks_like_booking_credential
from usp_dispatcher.access.nonces import nonces_for
from usp_dispatcher.errors import HTTPProblem, Refused, Unauthenticated
from usp_dispatcher.scheduling.content import (
    AvailabilityContent,
    BookingContent,
    CatalogContent,
    WaitlistContent,
)
from usp_dispatcher.scheduling.inputs import BookingIn, CancelIn, RescheduleIn, WaitlistIn
from usp_dispatcher.scheduling.service import OPERATIONS, Call, UspMeta, read_meta, release
from usp_dispatcher.text import validation_text
from usp_schemas import StructuredContent

__all__ = ["BookingIn", "CancelIn", "RescheduleIn", "WaitlistIn", "public_router", "router"]

public_router = APIRouter(prefix="/services", tags=["catalog"])
router = APIRouter(prefix="/services", tags=["bookings"])

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
        max_length=scheduling.idempotency.MAX_KEY_LENGTH,
        description="retrying with the same key and request replays the first answer (UUID v4 advised)",
    ),
]
UspAgent = Annotated[
    str | None,
    Header(
        alias="USP-Agent", description="your platform profile URI (privileged calls); the business needs none"
    ),
]
_OUTCOME = {"model": StructuredContent, "description": "a business outcome: messages[] says which"}
_PROFILE_PARAMETER: Final = re.compile(r'^\s*profile\s*=\s*"([^"]*)"\s*$')
_CHALLENGE: Final = 'Bearer realm="usp"'


# ------------------------------------------------------------------------------------ public


@public_router.get("/catalog", response_model=CatalogContent, summary="List the catalog (usp_catalog_list)")
async def list_catalog(
    request: Request, authorized: Annotated[_Authorized, _authorized("usp_catalog_list")]
) -> JSONResponse:
    """The active services."""
    return await _serve(request, authorized, "usp_catalog_list", {})


@public_router.get(
    "/availability",
    response_model=AvailabilityContent,
    responses={200: _OUTCOME},
    summary="Bookable slots (usp_availability_query)",
)
async def query_availability(
    request: Request,
    authorized: Annotated[_Authorized, _authorized("usp_availability_query")],
    service_id: Annotated[str, Query(min_length=1, max_length=128)],
    start_date: date,
    end_date: date,
) -> JSONResponse:
    """Slots with a free seat from ``start_date`` through ``end_date`` (the business's dates)."""
    arguments = {"service_id": service_id, "start_date": start_date, "end_date": end_date}
    return await _serve(request, authorized, "usp_availability_query", arguments)


# ------------------------------------------------------------------------------------ bookings


@router.post(
    "/bookings",
    status_code=201,
    response_model=BookingContent,
    responses={200: _OUTCOME},
    summary="Book a slot (usp_bookings_create)",
)
async def create_booking(
    request: Request,
    authorized: Annotated[_Authorized, _authorized("usp_bookings_create")],
    body: BookingIn,
    profile: UspAgent = None,
    correlation_id: CorrelationId = None,
    key: IdempotencyKey = None,
) -> JSONResponse:
    """A pending booking (201) with a ``booking_scoped_credential`` for it; ``slot_unavailable``
    when its last seat is gone."""
    return await _serve(
        request, authorized, "usp_bookings_create", body.model_dump(exclude_none=True), created=True
    )


@router.get(
    "/bookings/{booking_id}",
    response_model=BookingContent,
    responses={200: _OUTCOME},
    summary="Read a booking (usp_bookings_get)",
)
async def get_booking(
    request: Request,
    authorized: Annotated[_Authorized, _authorized("usp_bookings_get")],
    booking_id: str,
    profile: UspAgent = None,
) -> JSONResponse:
    return await _serve(request, authorized, "usp_bookings_get", {"booking_id": booking_id})


@router.post(
    "/bookings/{booking_id}/confirm",
    response_model=BookingContent,
    responses={200: _OUTCOME},
    summary="Confirm a booking (usp_bookings_confirm, business only)",
)
async def confirm_booking(
    request: Request,
    authorized: Annotated[_Authorized, _authorized("usp_bookings_confirm")],
    booking_id: str,
    correlation_id: CorrelationId = None,
    key: IdempotencyKey = None,
) -> JSONResponse:
    return await _serve(request, authorized, "usp_bookings_confirm", {"booking_id": booking_id})


@router.post(
    "/bookings/{booking_id}/cancel",
    response_model=BookingContent,
    responses={200: _OUTCOME},
    summary="Cancel a booking (usp_bookings_cancel)",
)
async def cancel_booking(
    request: Request,
    authorized: Annotated[_Authorized, _authorized("usp_bookings_cancel")],
    booking_id: str,
    body: CancelIn | None = None,
    profile: UspAgent = None,
    correlation_id: CorrelationId = None,
    key: IdempotencyKey = None,
) -> JSONResponse:
    """Cancel; the seat goes to the next buyer on the waitlist, or back on sale."""
    reason = body.reason if body is not None else None
    arguments: dict[str, Any] = {"booking_id": booking_id}
    if reason is not None:
        arguments["reason"] = reason
    return await _serve(request, authorized, "usp_bookings_cancel", arguments)


@router.post(
    "/bookings/{booking_id}/reschedule",
    response_model=BookingContent,
    responses={200: _OUTCOME},
    summary="Move a booking to another slot (usp_bookings_reschedule)",
)
async def reschedule_booking(
    request: Request,
    authorized: Annotated[_Authorized, _authorized("usp_bookings_reschedule")],
    booking_id: str,
    body: RescheduleIn,
    profile: UspAgent = None,
    correlation_id: CorrelationId = None,
    key: IdempotencyKey = None,
) -> JSONResponse:
    arguments = {"booking_id": booking_id, "slot_id": body.slot_id}
    return await _serve(request, authorized, "usp_bookings_reschedule", arguments)


@router.post(
    "/bookings/{booking_id}/complete",
    response_model=BookingContent,
    responses={200: _OUTCOME},
    summary="Mark a booking completed (business only)",
)
async def complete_booking(
    request: Request,
    authorized: Annotated[_Authorized, _authorized("usp_bookings_complete")],
    booking_id: str,
    correlation_id: CorrelationId = None,
    key: IdempotencyKey = None,
) -> JSONResponse:
    return await _serve(request, authorized, "usp_bookings_complete", {"booking_id": booking_id})


@router.post(
    "/bookings/{booking_id}/no-show",
    response_model=BookingContent,
    responses={200: _OUTCOME},
    summary="Mark a booking as a no-show (business only)",
)
async def mark_no_show(
    request: Request,
    authorized: Annotated[_Authorized, _authorized("usp_bookings_no_show")],
    booking_id: str,
    correlation_id: CorrelationId = None,
    key: IdempotencyKey = None,
) -> JSONResponse:
    return await _serve(request, authorized, "usp_bookings_no_show", {"booking_id": booking_id})


# ------------------------------------------------------------------------------------ waitlist


@router.post(
    "/waitlist",
    status_code=201,
    response_model=WaitlistContent,
    responses={200: _OUTCOME},
    summary="Join a service's waitlist (usp_waitlist_join)",
)
async def join_waitlist(
    request: Request,
    authorized: Annotated[_Authorized, _authorized("usp_waitlist_join")],
    body: WaitlistIn,
    profile: UspAgent = None,
    correlation_id: CorrelationId = None,
    key: IdempotencyKey = None,
) -> JSONResponse:
    """A joined entry (201): offered a seat when one inside ``desired_window`` is freed."""
    return await _serve(request, authorized, "usp_waitlist_join", body.model_dump(mode="json"), created=True)


@router.get(
    "/waitlist/{waitlist_entry_id}",
    response_model=WaitlistContent,
    responses={200: _OUTCOME},
    summary="Read a waitlist entry",
)
async def get_waitlist_entry(
    request: Request,
    authorized: Annotated[_Authorized, _authorized("usp_waitlist_get")],
    waitlist_entry_id: str,
    profile: UspAgent = None,
) -> JSONResponse:
    return await _serve(request, authorized, "usp_waitlist_get", {"waitlist_entry_id": waitlist_entry_id})


@router.delete(
    "/waitlist/{waitlist_entry_id}",
    response_model=WaitlistContent,
    responses={200: _OUTCOME},
    summary="Leave the waitlist (usp_waitlist_leave)",
)
async def leave_waitlist(
    request: Request,
    authorized: Annotated[_Authorized, _authorized("usp_waitlist_leave")],
    waitlist_entry_id: str,
    profile: UspAgent = None,
    correlation_id: CorrelationId = None,
    key: IdempotencyKey = None,
) -> JSONResponse:
    """The entry, now ``left``; a seat held for it goes to the next in line."""
    return await _serve(request, authorized, "usp_waitlist_leave", {"waitlist_entry_id": waitlist_entry_id})


# ------------------------------------------------------------------------------------ the adapter


@dataclass(frozen=True)
class _Authorized:
    """A request the policy let through: who calls, its ``_meta.usp``, and the session it was
    authorized on (the call's work goes on in its transaction)."""

    caller: access.Caller
    meta: UspMeta
    session: Session


def _authorized(operation: str) -> Any:
    """The dependency authorizing ``operation``: it runs before the body is validated, so an
    unauthenticated caller learns that first (as from every other protected route). The key
    lookup, the authorization and the call's work are one transaction, on one session it closes."""
    spec = OPERATIONS[operation]

    async def dependency(request: Request) -> AsyncIterator[_Authorized]:
        engine = request.app.state.engine
        settings = request.app.state.settings
        body = await request.body()
        session = db.session(engine)
        try:
            try:
                identity = await access.authenticate_http(
                    request.method,
                    str(request.url),
                    request.headers,
                    body,
                    engine=engine,
                    settings=settings,
                    resolver=getattr(request.app.state, "target_resolver", None),
                    nonces=nonces_for(engine, settings),
                    session=session,
                )
            except AccessError as exc:
                raise _problem(exc.reason, exc.detail, presented=True) from None
            arguments = {**request.path_params, "_meta": {"usp": _usp_meta(request)}}
            try:
                meta = read_meta(arguments)
            except ValidationError as exc:
                raise HTTPProblem(
                    422, "invalid_request", "Invalid request", _rest_words(validation_text(exc))
                ) from None
            params = {"method": request.method, "target": _target(request), "body": _json_or_none(body)}
            authorize = partial(
                access.authorize,
                session,
                settings,
                tool=spec.name,
                access=spec.access,
                arguments=arguments,
                params=params,
                identity=identity,
            )
            try:
                caller = await anyio.to_thread.run_sync(authorize)
            except AccessError as exc:
                raise _problem(exc.reason, exc.detail) from None
            yield _Authorized(caller, meta, session)
        finally:
            await release(session)

    return Depends(dependency)


async def _serve(
    request: Request,
    authorized: _Authorized,
    operation: str,
    arguments: dict[str, Any],
    *,
    created: bool = False,
) -> JSONResponse:
    """Run ``operation`` (as its MCP tool does) for the caller ``authorized`` admitted."""
    spec = OPERATIONS[operation]
    state = request.app.state
    meta = authorized.meta
    call = Call(
        state.engine,
        state.settings,
        authorized.caller,
        meta,
        meta.correlation_id,
        getattr(state, "target_resolver", None),
        held=[authorized.session],
    )
    try:
        answer = await spec.handler(call, spec.arguments.model_validate(arguments))
    except ValidationError as exc:
        raise HTTPProblem(422, "invalid_request", "Invalid request", validation_text(exc)) from None
    except Refused as exc:
        raise _problem("invalid_params", exc.detail) from None
    except Unauthenticated as exc:
        raise _problem("unauthenticated", exc.detail) from None
    status = 201 if created and not answer.get("messages") else 200
    headers = {"Idempotent-Replayed": "true"} if call.replayed and call.replayed[-1] else None
    return JSONResponse(answer, status_code=status, headers=headers)


def _usp_meta(request: Request) -> dict[str, Any]:
    """``_meta.usp`` from the request's headers (the table in the module docstring)."""
    headers = request.headers
    usp: dict[str, Any] = {}
    agent = headers.get("usp-agent")
    if agent is not None:
        matched = _PROFILE_PARAMETER.match(agent)
        usp["profile"] = matched.group(1) if matched else agent.strip()
    if (key := headers.get("idempotency-key")) is not None:
        usp["idempotency_key"] = key
    if (correlation := headers.get("usp-correlation-id")) is not None:
        usp["correlation_id"] = correlation
    scheme, _, token = (headers.get("authorization") or "").strip().partition(" ")
    if scheme.lower() == "bearer" and looks_like_booking_credential(token.strip()):
        usp["authorization"] = {
            "mechanism": MECHANISM,
            "credential": token.strip(),
            "proof": headers.get("usp-key-proof"),
        }
    return usp


def _target(request: Request) -> str:
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


def _json_or_none(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


def _rest_words(text: str) -> str:
    """An access or argument message in REST's words: headers where MCP has ``_meta.usp``."""
    return (
        text.replace("_meta.usp.profile", "the USP-Agent header (your platform profile URI)")
        .replace("_meta.usp.idempotency_key", "Idempotency-Key")
        .replace("_meta: usp.idempotency_key", "Idempotency-Key")
        .replace("_meta: usp.correlation_id", "USP-Correlation-Id")
        .replace("_meta: usp.profile", "USP-Agent")
    )


def _problem(reason: str, detail: str, *, presented: bool = False) -> HTTPProblem:
    """A refusal in REST's words: ``reason`` is an access check's (``unauthenticated``,
    ``forbidden``, ``invalid_params``), which is also what an operation's ``Unauthenticated`` and
    ``Refused`` stand for; ``presented``: the caller sent a credential that does not hold."""
    detail = _rest_words(detail)
    if reason == "unauthenticated":
        if presented:
            challenge = _CHALLENGE + ', error="invalid_token"'
            return HTTPProblem(
                401, "invalid_token", "Unauthorized", detail, headers={"WWW-Authenticate": challenge}
            )
        return HTTPProblem(
            401, "unauthenticated", "Unauthorized", detail, headers={"WWW-Authenticate": _CHALLENGE}
        )
    if reason == "forbidden":
        return HTTPProblem(403, "forbidden", "Forbidden", detail)
    return HTTPProblem(422, "invalid_request", "Invalid request", detail)
