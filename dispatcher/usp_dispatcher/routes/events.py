"""``POST /events``: the business hands over an event to deliver (admin)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from usp_schemas import EventValidationError

from ..auth import AdminDep
from ..deps import SessionDep
from ..intake import accept_event
from ..problems import HTTPProblem, validation_summary

__all__ = ["MAX_EVENT_BYTES", "router"]

#: Largest event body accepted. Events carry one object (a booking, a service); a megabyte is
#: generous, and the bound keeps a broken caller from filling memory and the outbox.
MAX_EVENT_BYTES = 1024 * 1024

router = APIRouter(tags=["events"], dependencies=[AdminDep])


class EventAccepted(BaseModel):
    event_id: str
    deliveries: int


@router.post(
    "/events",
    status_code=202,
    response_model=EventAccepted,
    responses={200: {"model": EventAccepted, "description": "the same event was already accepted"}},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"type": "object", "description": "a USP event"}}},
        }
    },
)
async def post_event(request: Request, session: SessionDep) -> JSONResponse:
    """Record a USP event envelope and one delivery per matching subscription.

    202 when recorded; 200 with the same answer when this exact event was already recorded;
    409 ``event_id_conflict`` when its id was used for a different payload.
    """
    raw = await _read_capped(request, MAX_EVENT_BYTES)
    try:
        accepted = await run_in_threadpool(accept_event, session, raw)
    except EventValidationError as exc:
        malformed = any(error["type"] == "json_invalid" for error in exc.errors)
        raise HTTPProblem(
            400 if malformed else 422,
            "malformed_json" if malformed else "invalid_event",
            "Not a valid USP event",
            validation_summary(exc.errors),
        ) from None
    body = EventAccepted(event_id=accepted.event_id, deliveries=accepted.deliveries)
    return JSONResponse(body.model_dump(), status_code=202 if accepted.created else 200)


async def _read_capped(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) once it grows past ``limit`` instead of buffering it all."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPProblem(
                413, "payload_too_large", "Payload too large", f"events are at most {limit} bytes"
            )
        chunks.append(chunk)
    return b"".join(chunks)
