"""Running the endpoint verification battery (:mod:`usp_workers.operations.probe`) for the admin API and
the platform portal: the target checked like a subscription's, one run per target every
:data:`INTERVAL_SECONDS` (per API process), the run recorded."""

from __future__ import annotations

import json
import time
from typing import Any, Final

from fastapi.concurrency import run_in_threadpool
from sqlmodel import Session

from usp_core.clock import utcnow
from usp_core.keycache import current_signing_keys
from usp_core.ssrf import Resolver
from usp_dispatcher.errors import Conflict, TooSoon
from usp_dispatcher.settings import ApiSettings
from usp_dispatcher.webhooks.feed import check_url
from usp_schemas import new_event_id
from usp_workers import (
    ProbeRun,
    SecretsUnavailable,
    Subscription,
    Transport,
    custom_headers,
    emit,
    make_client,
    operations,
    unseal,
)
from usp_workers import endpoint_probe as probe

__all__ = ["INTERVAL_SECONDS", "cases_of", "run"]

#: Each run is fourteen requests: a target is probed at most this often.
INTERVAL_SECONDS: Final = 10.0
_last: dict[str, float] = {}


async def run(
    session: Session,
    settings: ApiSettings,
    url: str,
    transport: Transport,
    *,
    actor: str,
    resolver: Resolver | None = None,
    subscription: Subscription | None = None,
) -> ProbeRun:
    """Probe ``url`` and record the run; refusals (target refused, too soon) are problems. For a
    ``subscription`` with Standard Webhooks signatures, the cases carry those too, and its own
    headers (a gateway in front of the endpoint may need them)."""
    target = await check_url(url, settings, resolver=resolver, what="probe target")
    moment = time.monotonic()
    last = _last.get(url)
    if last is not None and moment - last < INTERVAL_SECONDS:
        raise TooSoon(
            "probe_rate_limited",
            f"this target was probed {moment - last:.0f} s ago",
            retry_after=int(INTERVAL_SECONDS - (moment - last)) + 1,
        )
    _last[url] = moment
    keys = await run_in_threadpool(current_signing_keys, session.get_bind().engine, settings)
    standard = None
    extra: dict[str, str] = {}
    try:
        if subscription is not None and subscription.webhook_secrets is not None:
            sealed = unseal(subscription.webhook_secrets, settings.secrets_key, subscription.id)
            standard = sealed.signing(utcnow())
        if subscription is not None and subscription.custom_headers is not None:
            own = custom_headers.load(subscription.custom_headers, settings.secrets_key, subscription.id)
            extra = own.as_dict()
    except SecretsUnavailable as exc:
        raise Conflict("secrets_unavailable", f"cannot probe as the subscription sends: {exc}") from None
    async with make_client(settings) as client:
        results = await probe.probe_endpoint(
            client, target, keys, transport=transport, standard=standard, extra=extra
        )
    recorded = ProbeRun(
        actor=actor,
        target=url,
        transport=transport.value,
        problems=sum(not r.ok for r in results),
        results=json.dumps(probe.as_json(results)),
    )
    failed = _failed_event(recorded, results, subscription) if recorded.problems else None
    await run_in_threadpool(_save, session, recorded, failed)
    return recorded


def _failed_event(
    recorded: ProbeRun, results: list[probe.CaseResult], subscription: Subscription | None
) -> dict[str, Any]:
    """The ``probe.failed`` operational event of a run that found problems."""
    return {
        "event": "probe.failed",
        "event_id": new_event_id(),
        "timestamp": utcnow().strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "subscription_id": None if subscription is None else subscription.id,
        "data": {
            "probe_id": recorded.id,
            "target": operations.masked_url(recorded.target),
            "transport": recorded.transport,
            "problems": recorded.problems,
            "findings": [{"case": r.case.name, "finding": r.finding} for r in results if not r.ok],
        },
    }


def cases_of(recorded: ProbeRun) -> tuple[list[dict[str, Any]], str]:
    """A recorded run's cases (as :func:`usp_workers.operations.probe.as_json` wrote them) and its verdict."""
    cases: list[dict[str, Any]] = json.loads(recorded.results)
    return cases, probe.verdict([(c["case"], c["finding"]) for c in cases if not c["ok"]])


def _save(session: Session, recorded: ProbeRun, failed: dict[str, Any] | None) -> None:
    """The run, and its ``probe.failed`` event when it found problems, in one transaction."""
    session.add(recorded)
    if failed is not None:
        emit(session, failed, audience=operations.BUSINESS_ONLY)
    session.commit()
    session.refresh(recorded)
