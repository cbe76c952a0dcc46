"""A subscription's own retry schedule, with the real worker and scheduler: its waits decide when
each retry is due (a Retry-After still honoured within them) and when the delivery goes dead,
beside a subscription on the service's schedule; bounds checked when saved; set and reset through
REST and the CLI, shown by the console."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import Engine

from tests.dispatcher.admin.live import Live, deliveries, event_id_in, running_service, wait_until
from tests.dispatcher.conftest import ADMIN, ADMIN_TOKEN, MakeSettings, Serve
from tests.workers.endpoints import Answer
from usp_workers.storage.models import Delivery, DeliveryStatus

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
PATH = "/services/feed/subscriptions"


@pytest.fixture
def live(make_settings: MakeSettings, serve: Serve, engine: Engine, tmp_path: Path) -> Iterator[Live]:
    """The service with its scheduler, which sends the retries when they fall due."""
    with running_service(make_settings, serve, engine, tmp_path, scheduler=True) as service:
        yield service


def subscribe(live: Live, url: str, schedule: dict[str, object] | None = None) -> str:
    body: dict[str, object] = {"url": url, "event_types": ["booking.*"]}
    if schedule is not None:
        body["retry_schedule"] = schedule
    created = httpx.post(live.base + PATH, json=body, headers=ADMIN)
    assert created.status_code == 201, created.text
    assert created.json()["retry_schedule"] == (
        None
        if schedule is None
        else {"delays": schedule["delays"], "max_age_seconds": schedule.get("max_age_seconds")}
    )
    return str(created.json()["id"])


def test_each_subscription_retries_on_its_own_schedule(live: Live) -> None:
    own = subscribe(live, live.endpoint("own", Answer(503))[0], {"delays": [0.3]})
    service = subscribe(live, live.endpoint("service", Answer(503))[0])
    hourly = subscribe(live, live.endpoint("hourly", Answer(503))[0], {"delays": [3600.0]})
    asked = subscribe(
        live, live.endpoint("asked", Answer(503, headers=[("Retry-After", "7000")]))[0], {"delays": [3600.0]}
    )
    event_id = event_id_in(live.ok("trigger", "booking.confirmed"))

    def of(subscription_id: str) -> Delivery:
        (found,) = [
            d
            for d in deliveries(live.engine)
            if d.event_id == event_id and d.subscription_id == subscription_id
        ]
        return found

    wait_until(
        lambda: of(own).status == DeliveryStatus.DEAD and of(service).status == DeliveryStatus.DEAD,
        "both dead",
        live,
    )
    assert (of(own).attempt_count, of(service).attempt_count) == (2, 3), (
        "1 + its own waits; 1 + the service's two"
    )
    assert "gave up after 2 tries" in (of(own).last_error or "")

    wait_until(
        lambda: of(hourly).attempt_count == 1 and of(asked).attempt_count == 1, "the first tries", live
    )
    now = datetime.now(UTC)
    assert 3590 < (of(hourly).next_attempt_at - now).total_seconds() <= 3600, "its own hour, no jitter here"
    assert 6990 < (of(asked).next_attempt_at - now).total_seconds() <= 7000, "Retry-After, within 2x its wait"
    shown = httpx.get(f"{live.base}/admin/events/{event_id}", headers=ADMIN).json()
    (pending,) = [d for d in shown["deliveries"] if d["subscription_id"] == hourly]
    assert pending["next_attempt_at"].startswith(of(hourly).next_attempt_at.strftime("%Y-%m-%dT%H:%M"))


def test_the_schedule_is_checked_changed_and_shown(live: Live) -> None:
    url, _ = live.endpoint("changing", Answer(200))
    refused = httpx.post(
        live.base + PATH, json={"url": url, "retry_schedule": {"delays": [0.0, 60]}}, headers=ADMIN
    )
    assert (refused.status_code, refused.json()["reason"], refused.json()["where"]) == (
        422,
        "invalid_retry_schedule",
        "delays[0]",
    )
    too_old = httpx.post(
        live.base + PATH,
        json={"url": url, "retry_schedule": {"delays": [60], "max_age_seconds": 90 * 86400}},
        headers=ADMIN,
    )
    assert too_old.json()["where"] == "max_age_seconds"
    subscription_id = subscribe(live, url)
    printed = live.ok(
        "subscriptions", "retry-schedule", subscription_id, "--delays", "5,30,300", "--max-age", "2h"
    )
    assert printed.strip() == f"{subscription_id}: waits 5s, 30s, 300s, no try after 7200s"
    with httpx.Client(base_url=live.base) as browser:
        browser.post("/console/login", data={"token": ADMIN_TOKEN})
        page = browser.get(f"/console/subscriptions/{subscription_id}").text
        assert "its own: waits 5 s, 30 s, 300 s; no try after 7200 s" in page
    reset = live.ok("subscriptions", "retry-schedule", subscription_id, "--default")
    assert reset.strip() == f"{subscription_id}: the service's retry schedule"
    assert httpx.get(f"{live.base}{PATH}/{subscription_id}", headers=ADMIN).json()["retry_schedule"] is None
