"""``POST /events`` and ``POST /events/batch``: the business hands over events to deliver (admin)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from usp_dispatcher.errors import Conflict, HTTPProblem
from usp_dispatcher.web.auth import AdminDep
from usp_dispatcher.web.deps import SessionDep
from usp_dispatcher.web.problems import validation_summary
from usp_dispatcher.webhooks.intake import Intake, Outcome, Status, accept_events
from usp_schemas import EventValidationError

__all__ = ["MAX_BATCH_EVENTS", "MAX_EVENT_BYTES", "router"]

#: Largest event body accepted. Events carry one object (a booking, a service); a megabyte is
#: generous, and the bound keeps a broken caller from filling memory and the outbox.
MAX_EVENT_BYTES = 1024 * 1024

#: Most events one ``POST /events/batch`` takes (one transaction), and its largest body.
MAX_BATCH_EVENTS = 1000
MAX_BATCH_BYTES = 16 * 1024 * 1024

router = APIRouter(tags=["events"], dependencies=[AdminDep])


class EventAccepted(BaseModel):
    event_id: str
    deliveries: int


class BatchError(BaseModel):
    type: str  #: ``invalid_event`` or ``event_id_conflict``
    detail: str


class BatchResult(BaseModel):
    """One event of a batch, at the same index as in the request."""

    status: Status
    event_id: str | None = None
    deliveries: int = 0
    error: BatchError | None = None


class BatchAccepted(BaseModel):
    results: list[BatchResult]
    accepted: int
    duplicates: int
    rejected: int


async def get_intake(request: Request) -> Intake:
    return cast(Intake, request.app.state.intake)


IntakeDep = Annotated[Intake, Depends(get_intake)]


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
async def post_event(request: Request, intake: IntakeDep) -> JSONResponse:
    """Record a USP event envelope and one delivery per matching subscription.

    202 when recorded; 200 with the same answer when this exact event was already recorded;
    409 ``event_id_conflict`` when its id was used for a different payload.
    """
    raw = await _read_capped(request, MAX_EVENT_BYTES)
    outcome = await intake.accept(raw)
    if isinstance(outcome.problem, EventValidationError):
        malformed = any(error["type"] == "json_invalid" for error in outcome.problem.errors)
        raise HTTPProblem(
            400 if malformed else 422,
            "malformed_json" if malformed else "invalid_event",
            "Not a valid USP event",
            validation_summary(outcome.problem.errors),
        )
    if outcome.problem is not None:
        raise outcome.problem
    assert outcome.event_id is not None
    body = EventAccepted(event_id=outcome.event_id, deliveries=outcome.deliveries)
    return JSONResponse(body.model_dump(), status_code=202 if outcome.status is Status.ACCEPTED else 200)


@router.post(
    "/events/batch",
    response_model=BatchAccepted,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "array",
                        "maxItems": MAX_BATCH_EVENTS,
                        "items": {"type": "object", "description": "a USP event"},
                    }
                }
            },
        }
    },
)
async def post_events(request: Request, session: SessionDep) -> BatchAccepted:
    """Record many events in one transaction: a JSON array of USP events, at most
    ``MAX_BATCH_EVENTS``, answered with a result per event at its index.

    A bad event does not stop the others: ``invalid`` (not a USP event) and ``conflict`` (its id
    was used for a different payload) are reported and the rest recorded; ``duplicate`` is an
    event already recorded with this very payload (a retried batch is harmless).
    """
    raw = await _read_capped(request, MAX_BATCH_BYTES)
    try:
        items = json.loads(raw)
    except ValueError:
        raise HTTPProblem(
            400, "malformed_json", "Not JSON", "the body must be a JSON array of events"
        ) from None
    if not isinstance(items, list):
        raise HTTPProblem(422, "invalid_batch", "Not a batch", "the body must be a JSON array of events")
    if not 1 <= len(items) <= MAX_BATCH_EVENTS:
        raise HTTPProblem(
            422, "invalid_batch", "Bad batch size", f"a batch holds 1 to {MAX_BATCH_EVENTS} events"
        )
    outcomes = await run_in_threadpool(accept_events, session, [_as_event(item) for item in items])
    results = [_result(outcome) for outcome in outcomes]
    counted = Counter(outcome.status for outcome in outcomes)
    return BatchAccepted(
        results=results,
        accepted=counted[Status.ACCEPTED],
        duplicates=counted[Status.DUPLICATE],
        rejected=counted[Status.INVALID] + counted[Status.CONFLICT],
    )


def _as_event(item: Any) -> Mapping[str, Any] | str:
    # A non-object item is handed on as JSON text, so the event parser refuses it like any other
    # invalid event (with its own message) instead of failing the batch.
    return item if isinstance(item, dict) else json.dumps(item)


def _result(outcome: Outcome) -> BatchResult:
    error = None
    if isinstance(outcome.problem, EventValidationError):
        error = BatchError(type="invalid_event", detail=validation_summary(outcome.problem.errors))
    elif isinstance(outcome.problem, Conflict):
        error = BatchError(type=outcome.problem.reason, detail=str(outcome.problem))
    return BatchResult(
        status=outcome.status, event_id=outcome.event_id, deliveries=outcome.deliveries, error=error
    )


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
