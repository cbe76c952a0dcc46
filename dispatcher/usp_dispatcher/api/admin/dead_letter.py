"""``/admin``: the dead letter: list what exhausted its schedule, redrive it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query

from usp_dispatcher.api.admin.common import Cursor, Limit, Since, Until, problems, run, started
from usp_dispatcher.api.admin.models import DeliveryOut, DeliveryPage, JobOut, RedriveIn
from usp_dispatcher.web.deps import SessionDep
from usp_workers import operations
from usp_workers.operations import DeadLetterFilter

__all__ = ["router"]

router = APIRouter()


@router.get("/dead-letter", response_model=DeliveryPage)
async def list_dead_letter(
    session: SessionDep,
    subscription_id: Annotated[str | None, Query(max_length=40)] = None,
    event_type: Annotated[str | None, Query(max_length=64)] = None,
    since: Since = None,
    until: Until = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> DeliveryPage:
    """Dead deliveries, newest first."""
    filters = DeadLetterFilter(subscription_id, event_type, since, until)
    page = await run(operations.dead_letter, session, filters, cursor=cursor, limit=limit)
    return DeliveryPage(
        items=[DeliveryOut.model_validate(item) for item in page.items], next_cursor=page.next_cursor
    )


@router.post("/dead-letter/redrive", status_code=202, response_model=JobOut, responses=problems(404, 503))
async def redrive_dead_letter(
    session: SessionDep, body: Annotated[RedriveIn | None, Body()] = None
) -> JobOut:
    """Re-deliver the dead letter (all of it, or filtered) to active subscriptions, as a job."""
    request = body if body is not None else RedriveIn()
    filters = DeadLetterFilter(request.subscription_id, request.event_type, request.since, request.until)
    return await started(await run(operations.start_redrive, session, filters))
