"""``/admin``: events: list, find by a shortened id, read one, replay."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query
from pydantic import BaseModel, Field

from usp_dispatcher.api.admin.common import Cursor, Limit, Since, Until, problems, run
from usp_dispatcher.api.admin.models import (
    DeliveryRef,
    EventDetailOut,
    EventPage,
    EventSummaryOut,
    ReplayIn,
    ReplayOut,
)
from usp_dispatcher.web.deps import SessionDep
from usp_workers import DeliveryStatus, operations
from usp_workers.operations import EventFilter

__all__ = ["router"]

router = APIRouter()


@router.get("/events", response_model=EventPage)
async def list_events(
    session: SessionDep,
    event_type: Annotated[str | None, Query(max_length=64)] = None,
    subject_id: Annotated[
        str | None, Query(max_length=128, description="booking, service or entry id")
    ] = None,
    correlation_id: Annotated[str | None, Query(max_length=128)] = None,
    since: Since = None,
    until: Until = None,
    delivery_status: Annotated[
        DeliveryStatus | None, Query(description="only events with a delivery in this status")
    ] = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> EventPage:
    """Events, newest first, with how their deliveries stand."""
    filters = EventFilter(event_type, subject_id, correlation_id, since, until, delivery_status)
    page = await run(operations.list_events, session, filters, cursor=cursor, limit=limit)
    return EventPage(
        items=[EventSummaryOut.model_validate(item) for item in page.items], next_cursor=page.next_cursor
    )


class IdsOut(BaseModel):
    ids: list[str] = Field(description="oldest first: one is the id meant, several make it ambiguous")


@router.get("/ids", response_model=IdsOut, responses=problems(422))
async def find_ids(
    short: Annotated[str, Query(max_length=64, description="an id as a table shows it: evt_…7203eef7")],
    session: SessionDep,
) -> IdsOut:
    """The full ids (events, subscriptions, deliveries, jobs) a shortened one may stand for, at
    most five: what lets the CLI take the ids its tables print."""
    return IdsOut(ids=await run(operations.find_ids, session, short))


@router.get("/events/{event_id}", response_model=EventDetailOut, responses=problems(404))
async def get_event(event_id: str, session: SessionDep) -> EventDetailOut:
    """One event, its payload, every delivery of it and every attempt of each."""
    return EventDetailOut.model_validate(await run(operations.event_detail, session, event_id))


@router.post(
    "/events/{event_id}/replay", status_code=202, response_model=ReplayOut, responses=problems(404, 409)
)
async def replay_event(
    event_id: str, session: SessionDep, body: Annotated[ReplayIn | None, Body()] = None
) -> ReplayOut:
    """Deliver the event again (same ``event_id``, signed afresh) as new deliveries: to one
    subscription, or to every active subscription it matches and reaches. Earlier deliveries and
    their attempts are kept. 409 when the named subscription is disabled, not subscribed to the
    type, or not in the event's audience."""
    subscription_id = body.subscription_id if body is not None else None
    replayed = await run(operations.replay_event, session, event_id, subscription_id=subscription_id)
    return ReplayOut(
        event_id=replayed.event_id,
        deliveries=[DeliveryRef(id=d, subscription_id=s) for d, s in replayed.deliveries],
    )
