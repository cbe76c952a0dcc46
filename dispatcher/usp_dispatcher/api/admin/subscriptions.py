"""``/admin``: subscriptions: their health, notices, blocked subjects, state, rate limit, recovery."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from usp_dispatcher.api.admin.common import Cursor, Limit, problems, run, started
from usp_dispatcher.api.admin.models import (
    BlockedSubjectList,
    BlockedSubjectOut,
    JobOut,
    NoticeOut,
    NoticePage,
    RateLimitIn,
    RecoverIn,
    SubscriptionHealthOut,
    SubscriptionPage,
)
from usp_dispatcher.web.deps import SessionDep
from usp_workers import SubscriptionState, operations

__all__ = ["router"]

router = APIRouter()


@router.get("/subscriptions", response_model=SubscriptionPage)
async def list_subscriptions(
    session: SessionDep, state: SubscriptionState | None = None, cursor: Cursor = None, limit: Limit = 50
) -> SubscriptionPage:
    """Subscriptions, oldest first, with their health."""
    page = await run(operations.list_subscriptions, session, state=state, cursor=cursor, limit=limit)
    return SubscriptionPage(
        items=[SubscriptionHealthOut.model_validate(item) for item in page.items],
        next_cursor=page.next_cursor,
    )


@router.get("/notices", response_model=NoticePage)
async def list_notices(
    session: SessionDep,
    subscription_id: Annotated[str | None, Query(max_length=40)] = None,
    kind: Annotated[str | None, Query(max_length=64)] = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> NoticePage:
    """Health notices, newest first: subscriptions disabled (410, failing too long, an operator)
    or enabled, breakers opened, re-opened after a failed probe, closed."""
    page = await run(
        operations.list_notices,
        session,
        subscription_id=subscription_id,
        kind=kind,
        cursor=cursor,
        limit=limit,
    )
    items = [NoticeOut.model_validate(item) for item in page.items]
    return NoticePage(items=items, next_cursor=page.next_cursor)


@router.get("/subscriptions/{subscription_id}", response_model=SubscriptionHealthOut, responses=problems(404))
async def get_subscription(subscription_id: str, session: SessionDep) -> SubscriptionHealthOut:
    return SubscriptionHealthOut.model_validate(
        await run(operations.subscription_health, session, subscription_id)
    )


@router.get(
    "/subscriptions/{subscription_id}/blocked-subjects",
    response_model=BlockedSubjectList,
    responses=problems(404),
)
async def list_blocked_subjects(subscription_id: str, session: SessionDep) -> BlockedSubjectList:
    """The subjects of an ordered subscription that wait behind a dead delivery (``on_dead``
    block), longest blocked first; every other subject keeps flowing."""
    items = await run(operations.blocked_subjects, session, subscription_id)
    return BlockedSubjectList(items=[BlockedSubjectOut.model_validate(item) for item in items])


@router.post(
    "/subscriptions/{subscription_id}/disable", response_model=SubscriptionHealthOut, responses=problems(404)
)
async def disable_subscription(subscription_id: str, session: SessionDep) -> SubscriptionHealthOut:
    """Stop delivering to the subscription (its pending deliveries go to the dead letter unsent)."""
    health = await run(operations.set_subscription_state, session, subscription_id, enabled=False)
    return SubscriptionHealthOut.model_validate(health)


@router.post(
    "/subscriptions/{subscription_id}/enable",
    response_model=SubscriptionHealthOut,
    responses=problems(404, 409),
)
async def enable_subscription(subscription_id: str, session: SessionDep) -> SubscriptionHealthOut:
    """Deliver to the subscription again, with its failure streak cleared and its breaker closed
    (then ``recover`` what it missed). 409 for a deleted subscription."""
    health = await run(operations.set_subscription_state, session, subscription_id, enabled=True)
    return SubscriptionHealthOut.model_validate(health)


@router.put(
    "/subscriptions/{subscription_id}/rate-limit",
    response_model=SubscriptionHealthOut,
    responses=problems(404),
)
async def set_rate_limit(
    subscription_id: str, body: RateLimitIn, session: SessionDep
) -> SubscriptionHealthOut:
    """Limit how many deliveries to the subscription start in any one second, whatever the
    number of workers (null: no limit). Deliveries over the limit wait for a free second without
    spending an attempt. 422 (``invalid_rate_limit``) below 1 or above the maximum."""
    health = await run(operations.set_rate_limit, session, subscription_id, body.per_second)
    return SubscriptionHealthOut.model_validate(health)


@router.post(
    "/subscriptions/{subscription_id}/recover",
    status_code=202,
    response_model=JobOut,
    responses=problems(404, 409, 503),
)
async def recover_subscription(subscription_id: str, body: RecoverIn, session: SessionDep) -> JobOut:
    """Re-deliver every failed or dead delivery of the subscription for events accepted in
    ``[since, until)``, and back-fill the events it missed while disabled (they have no
    delivery), as a job (no cap: it streams in batches). 409 when it is disabled, unless
    ``enable`` asks to enable it first."""
    job = await run(
        operations.start_recover,
        session,
        subscription_id,
        since=body.since,
        until=body.until,
        enable=body.enable,
    )
    return await started(job)
