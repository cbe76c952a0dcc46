"""``/admin``: endpoint probes: run one against a subscription's target, list past runs."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Body, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field
from sqlmodel import col, select

from usp_dispatcher.api.admin.common import Limit, problems
from usp_dispatcher.errors import HTTPProblem
from usp_dispatcher.web.deps import ResolverDep, SessionDep, SettingsDep
from usp_dispatcher.webhooks import probes
from usp_workers import ProbeRun, Subscription, Transport

__all__ = ["router"]

router = APIRouter()


class ProbeIn(BaseModel):
    url: str | None = Field(default=None, max_length=2048, description="the endpoint to probe")
    subscription_id: str | None = Field(
        default=None, max_length=40, description="probe this subscription's URL (instead of url)"
    )
    format: Transport | None = Field(
        default=None, description="rest or jsonrpc; default: the subscription's, else rest"
    )


class ProbeCaseOut(BaseModel):
    case: str
    sent: str = Field(description="what the delivery got wrong on purpose (or right)")
    expected: str = Field(description="2xx (a verifying receiver accepts) or 4xx (it refuses)")
    status: int | None = Field(description="what the endpoint answered (null: no answer)")
    error: str | None
    ok: bool
    finding: str


class ProbeRunOut(BaseModel):
    id: str
    created_at: datetime
    actor: str
    target: str
    transport: str
    problems: int
    verdict: str
    results: list[ProbeCaseOut]


class ProbeRunPage(BaseModel):
    items: list[ProbeRunOut]


@router.post("/probes", status_code=201, response_model=ProbeRunOut, responses=problems(404, 429))
async def run_probe(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    resolver: ResolverDep,
    body: Annotated[ProbeIn, Body()],
) -> ProbeRunOut:
    """Send the verification battery (``usp-webhooks probe``) to an endpoint, signed with the
    current key: does it accept what it should and refuse, with a 4xx, what it should? Nothing is
    recorded as a delivery; the run is, and ``GET /admin/probes`` lists it."""
    url, transport = body.url, body.format or Transport.REST
    subscription = None
    if (url is None) == (body.subscription_id is None):
        raise HTTPProblem(422, "invalid_probe", "Invalid request", "give either url or subscription_id")
    if body.subscription_id is not None:
        subscription = await run_in_threadpool(session.get, Subscription, body.subscription_id)
        if subscription is None:
            raise HTTPProblem(
                404, "subscription_not_found", "Not found", f"no subscription {body.subscription_id!r}"
            )
        url, transport = subscription.url, body.format or Transport(subscription.transport)
    assert url is not None
    who = f"admin token, from {request.client.host if request.client else 'an unknown address'}"
    run = await probes.run(
        session, settings, url, transport, actor=who, resolver=resolver, subscription=subscription
    )
    return _probe_out(run)


@router.get("/probes", response_model=ProbeRunPage)
async def list_probes(session: SessionDep, limit: Limit = 50) -> ProbeRunPage:
    """Probe runs, newest first: who ran them, against what, and every case's answer."""
    statement = select(ProbeRun).order_by(col(ProbeRun.created_at).desc()).limit(limit)
    runs = await run_in_threadpool(lambda: list(session.exec(statement).all()))
    return ProbeRunPage(items=[_probe_out(run) for run in runs])


def _probe_out(run: ProbeRun) -> ProbeRunOut:
    cases, verdict = probes.cases_of(run)
    return ProbeRunOut(
        id=run.id,
        created_at=run.created_at,
        actor=run.actor,
        target=run.target,
        transport=run.transport,
        problems=run.problems,
        verdict=verdict,
        results=[ProbeCaseOut(**case) for case in cases],
    )
