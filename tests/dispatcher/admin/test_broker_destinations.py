"""Broker destinations end to end, with the real worker and scheduler and the brokers running on
this machine (RabbitMQ, NATS JetStream, Redis Streams): each receives 1,000 events in order with
none lost, a broker down for 20 s loses nothing, and a consumer verifies every message with
``usp_receiver.verify_message``; the target is checked like a webhook URL, and its credentials
never shown."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import Engine

from tests.dispatcher.admin.live import Live, running_service, wait_until
from tests.dispatcher.conftest import ADMIN, MakeSettings, Serve
from tests.workers.brokers import NATS, RABBITMQ, REDIS, Destination, Outage, destinations
from usp_dispatcher.webhooks.samples import sample_event
from usp_receiver import verify_message

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
PATH = "/services/feed/subscriptions"
PORTS = {"amqp": RABBITMQ[1], "nats": NATS[1], "redis": REDIS[1]}
UPSTREAM = {"amqp": RABBITMQ, "nats": NATS, "redis": REDIS}


@pytest.fixture
def live(make_settings: MakeSettings, serve: Serve, engine: Engine, tmp_path: Path) -> Iterator[Live]:
    with running_service(make_settings, serve, engine, tmp_path, scheduler=True) as service:
        yield service


def subscribe(live: Live, url: str, **extra: object) -> dict[str, object]:
    created = httpx.post(
        live.base + PATH, json={"url": url, "event_types": ["booking.*"], **extra}, headers=ADMIN
    )
    assert created.status_code == 201, created.text
    body: dict[str, object] = created.json()
    return body


def post_events(live: Live, count: int, booking_id: str) -> list[str]:
    """``count`` events about one booking (one subject), in this order; their ids."""
    sent = []
    with httpx.Client(base_url=live.base, headers=ADMIN) as client:
        for _ in range(count):
            body = json.loads(sample_event("booking.confirmed"))
            body["booking_id"] = body["data"]["id"] = booking_id
            answer = client.post("/events", json=body)
            assert answer.status_code == 202, answer.text
            sent.append(str(answer.json()["event_id"]))
    return sent


def arrived(destination: Destination, count: int) -> bool:
    return len(destination.read()) >= count


def verified_ids(live: Live, destination: Destination, url: str) -> list[str]:
    """The event ids of every message at the destination, oldest first, each verified."""
    ids = []
    for headers, body in destination.read():
        verified = verify_message(url, headers, body, live.jwks, max_age=3600)
        assert verified.label == "sig1"
        event = json.loads(body)
        assert event["event_id"] in (
            headers.get("message_id"),
            headers.get("Nats-Msg-Id"),
            headers.get("event_id"),
        )
        ids.append(event["event_id"])
    return ids


def test_each_broker_receives_1000_events_in_order_signed(live: Live) -> None:
    with destinations() as made:
        urls = {kind: d.url(PORTS[kind]) for kind, d in made.items()}
        for kind, url in urls.items():
            shown = subscribe(live, url, ordering="subject")
            if kind == "amqp":
                assert "guest:guest" not in str(shown["url"]), "credentials are never shown"
        sent = post_events(live, 1000, "bkg_ordered")
        for kind, destination in made.items():
            deadline = time.monotonic() + 240
            while len(destination.read()) < 1000 and time.monotonic() < deadline:
                time.sleep(1)
            assert verified_ids(live, destination, urls[kind]) == sent, f"{kind}: all 1,000, in order"


def test_a_broker_down_for_20_s_loses_nothing(live: Live) -> None:
    with destinations() as made:
        outages = {kind: Outage(UPSTREAM[kind]) for kind in made}
        try:
            urls = {kind: made[kind].url(outages[kind].port) for kind in made}
            for url in urls.values():
                subscribe(live, url, retry_schedule={"delays": [1.0] * 25})
            before = post_events(live, 10, "bkg_before")
            for outage in outages.values():
                outage.down()
            during = post_events(live, 20, "bkg_during")
            time.sleep(20)
            for outage in outages.values():
                outage.up()
            for kind, destination in made.items():
                wait_until(partial(arrived, destination, 30), f"{kind}: every event after the outage", live)
                got = verified_ids(live, destination, urls[kind])
                assert sorted(set(got)) == sorted(before + during), kind
        finally:
            for outage in outages.values():
                outage.close()


def test_a_broker_target_is_checked(live: Live) -> None:
    refused = httpx.post(
        live.base + PATH, json={"url": "nats://127.0.0.1:4222?topic=x", "event_types": ["*"]}, headers=ADMIN
    )
    assert (refused.status_code, refused.json()["reason"]) == (422, "target_refused")
    assert "subject" in refused.json()["detail"]
    metadata = httpx.post(
        live.base + PATH,
        json={"url": "redis://169.254.169.254:6379/0?stream=s", "event_types": ["*"]},
        headers=ADMIN,
    )
    assert metadata.json()["target_reason"] == "metadata_address"


def test_replay_and_recover_reach_a_broker_destination(live: Live) -> None:
    """The operator's verbs work for a broker as for an endpoint: a replay publishes the event
    again (same event id), and recover back-fills what the subscription missed while disabled."""
    with destinations() as made:
        stream = made["redis"]
        url = stream.url(REDIS[1])
        subscription_id = str(subscribe(live, url)["id"])
        (first,) = post_events(live, 1, "bkg_replayed")
        wait_until(partial(arrived, stream, 1), "the first message", live)
        live.ok("replay", first)
        wait_until(partial(arrived, stream, 2), "the replayed message", live)
        assert verified_ids(live, stream, url) == [first, first]

        live.ok("subscriptions", "disable", subscription_id)
        (missed,) = post_events(live, 1, "bkg_missed")
        time.sleep(1)
        assert len(stream.read()) == 2, "nothing while disabled"
        live.ok("recover", "--subscription", subscription_id, "--since", "1h", "--enable")
        wait_until(partial(arrived, stream, 3), "the back-filled message", live)
        assert verified_ids(live, stream, url)[-1] == missed
