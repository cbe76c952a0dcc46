"""Operational webhooks, end to end with the real worker and scheduler: an endpoint registered for
the service's own events hears, signed and through the same pipeline, that a delivery went dead,
that a subscription was disabled, failing and recovered, and that a probe failed; each verified
and parsed by ``usp-receiver``; a subscription to ``*`` hears none of them; the console's
subscription page lists what was announced about it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import Engine

from tests.dispatcher.admin.live import Live, event_id_in, running_service, wait_until
from tests.dispatcher.conftest import ADMIN, ADMIN_TOKEN, MakeSettings, Serve
from tests.workers.endpoints import Answer, UspReceiver
from usp_receiver import Verifier
from usp_schemas import DeliveryDead, SubscriptionDisabled, parse_event
from usp_workers.engine import health

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
PATH = "/services/feed/subscriptions"
OPERATIONAL = ["subscription.*", "delivery.dead", "probe.failed"]


@pytest.fixture
def live(make_settings: MakeSettings, serve: Serve, engine: Engine, tmp_path: Path) -> Iterator[Live]:
    with running_service(make_settings, serve, engine, tmp_path, scheduler=True) as service:
        yield service


def subscribe(live: Live, url: str, event_types: list[str], **extra: object) -> str:
    body = {"url": url, "event_types": event_types, **extra}
    created = httpx.post(live.base + PATH, json=body, headers=ADMIN)
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def test_an_operator_hears_the_service_s_own_events(live: Live) -> None:
    ops = UspReceiver(live.jwks)
    ops_url, ops_path = live.endpoint("ops", ops)
    subscribe(live, ops_url, OPERATIONAL)
    everything_url, everything_path = live.endpoint("everything", Answer(200))
    subscribe(live, everything_url, ["*"])
    failing_url, _ = live.endpoint("failing", Answer(503))
    failing = subscribe(live, failing_url, ["booking.*"], retry_schedule={"delays": [0.2]})

    booking = event_id_in(live.ok("trigger", "booking.confirmed"))

    def heard(event_type: str) -> list[dict[str, Any]]:
        bodies = [json.loads(seen.body) for seen in live.hub.seen(ops_path)]
        return [body for body in bodies if body["event"] == event_type]

    wait_until(lambda: len(heard("delivery.dead")) == 1, "the delivery.dead event", live)
    (dead,) = heard("delivery.dead")
    parsed = parse_event(json.dumps(dead))
    assert isinstance(parsed, DeliveryDead)
    assert (parsed.subscription_id, parsed.data.event_id, parsed.data.attempts) == (failing, booking, 2)
    assert parsed.data.event_type == "booking.confirmed"
    assert "gave up after 2 tries" in (parsed.data.last_error or "")
    (seen,) = [s for s in live.hub.seen(ops_path) if json.loads(s.body)["event"] == "delivery.dead"]
    assert Verifier(live.jwks).verify("POST", ops_url, seen.headers, seen.body).kid, "signed as any delivery"
    # The hub logs a request before the receiver's handler runs: wait for the handler.
    wait_until(lambda: parsed.event_id in ops.handled, "the receiver library taking it as an event", live)

    live.ok("subscriptions", "disable", failing)
    wait_until(lambda: len(heard("subscription.disabled")) == 1, "the subscription.disabled event", live)
    disabled = parse_event(json.dumps(heard("subscription.disabled")[0]))
    assert isinstance(disabled, SubscriptionDisabled)
    assert (disabled.data.subscription_id, disabled.data.state) == (failing, "disabled")

    # The breaker's notices, as the worker writes them: failing, then recovered.
    with live.engine.begin() as connection:
        now = datetime.now(UTC)
        health.record_notice(
            connection, failing, health.NOTICE_BREAKER_OPENED, "10 failures in a row", now=now
        )
        health.record_notice(connection, failing, health.NOTICE_BREAKER_CLOSED, "answered 2xx", now=now)
    wait_until(
        lambda: bool(heard("subscription.failing") and heard("subscription.recovered")),
        "the breaker events",
        live,
    )
    assert heard("subscription.failing")[0]["data"]["reason"] == "10 failures in a row"

    # A probe of an endpoint that accepts everything finds problems: probe.failed.
    careless_url, _ = live.endpoint("careless", Answer(200))
    live.run("probe", careless_url)
    wait_until(lambda: len(heard("probe.failed")) == 1, "the probe.failed event", live)
    failed = heard("probe.failed")[0]["data"]
    assert failed["problems"] >= 10
    assert {"case": "unsigned", "finding": "accepted no signature at all"} in failed["findings"]

    kinds = {json.loads(s.body)["event"] for s in live.hub.seen(everything_path)}
    assert kinds == {"booking.confirmed"}, "a subscription to * hears the protocol's events alone"

    with httpx.Client(base_url=live.base) as browser:
        browser.post("/console/login", data={"token": ADMIN_TOKEN})
        page = browser.get(f"/console/subscriptions/{failing}").text
    for event_type in (
        "delivery.dead",
        "subscription.disabled",
        "subscription.failing",
        "subscription.recovered",
    ):
        assert f">{event_type}</a>" in page, event_type
