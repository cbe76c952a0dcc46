"""``POST /events``: validation, one delivery per matching subscription, idempotent replays."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import col, func, select

from usp_dispatcher.intake import AcceptedEvent, accept_event
from usp_dispatcher.routes.events import MAX_EVENT_BYTES
from usp_workers import db
from usp_workers.models import Delivery, EventRecord

from ..schemas.samples import booking
from .conftest import ADMIN
from .support import assert_problem, event, subscribe

HOOK = "http://127.0.0.1:9/hooks/"


def deliveries_of(engine: Engine, event_id: str) -> list[Delivery]:
    with db.session(engine) as session:
        return list(session.exec(select(Delivery).where(col(Delivery.event_id) == event_id)).all())


def event_count(engine: Engine) -> int:
    with db.session(engine) as session:
        return int(session.exec(select(func.count()).select_from(EventRecord)).one())


def test_emits_one_delivery_per_matching_subscription(client: TestClient, engine: Engine) -> None:
    bookings = subscribe(client, HOOK + "bookings", ["booking.*"])
    everything = subscribe(client, HOOK + "all", ["*"])
    waitlist = subscribe(client, HOOK + "waitlist", ["waitlist.joined"])
    gone = subscribe(client, HOOK + "gone", ["*"])
    assert client.delete(f"/services/feed/subscriptions/{gone['id']}", headers=ADMIN).status_code == 204

    confirmed = event("booking.confirmed")
    response = client.post("/events", json=confirmed, headers=ADMIN)
    assert response.status_code == 202, response.text
    assert response.json() == {"event_id": confirmed["event_id"], "deliveries": 2}
    targets = {d.subscription_id for d in deliveries_of(engine, confirmed["event_id"])}
    assert targets == {bookings["id"], everything["id"]}

    joined = event("waitlist.joined")
    response = client.post("/events", json=joined, headers=ADMIN)
    assert response.status_code == 202
    assert response.json()["deliveries"] == 2
    targets = {d.subscription_id for d in deliveries_of(engine, joined["event_id"])}
    assert targets == {waitlist["id"], everything["id"]}


def test_the_binding_example_envelope_is_accepted_as_written(client: TestClient, engine: Engine) -> None:
    """The binding's REST webhook body, its top-level fields verbatim (``evt_789abc`` included),
    with a whole booking as ``data`` where the example elides it."""
    subscribe(client, HOOK + "bookings", ["booking.*"])
    body = {
        "event": "booking.confirmed",
        "event_id": "evt_789abc",
        "booking_id": "bkg_456def",
        "order_id": "ord_ucp_001",
        "timestamp": "2026-03-14T22:06:00Z",
        "data": booking("confirmed"),
    }
    response = client.post("/events", json=body, headers=ADMIN)
    assert response.status_code == 202, response.text
    assert response.json() == {"event_id": "evt_789abc", "deliveries": 1}
    assert client.post("/events", json=body, headers=ADMIN).status_code == 200  # deduped on the id
    assert len(deliveries_of(engine, "evt_789abc")) == 1
    listed = client.get("/admin/events", headers=ADMIN).json()
    assert [e["id"] for e in listed["items"]] == ["evt_789abc"]


def test_event_without_subscribers_is_recorded(client: TestClient, engine: Engine) -> None:
    body = event("catalog.service.updated")
    response = client.post("/events", json=body, headers=ADMIN)
    assert response.status_code == 202
    assert response.json() == {"event_id": body["event_id"], "deliveries": 0}
    assert event_count(engine) == 1


def test_same_event_twice_is_idempotent(client: TestClient, engine: Engine) -> None:
    subscribe(client, HOOK + "a", ["booking.*"])
    body = event("booking.cancelled")
    first = client.post("/events", json=body, headers=ADMIN)
    assert first.status_code == 202
    # Same event, different JSON spelling (key order, whitespace): still the same event.
    respelled = json.dumps(dict(reversed(list(body.items()))), indent=2)
    again = client.post("/events", content=respelled, headers=ADMIN | {"Content-Type": "application/json"})
    assert again.status_code == 200, again.text
    assert again.json() == first.json() == {"event_id": body["event_id"], "deliveries": 1}
    assert len(deliveries_of(engine, body["event_id"])) == 1
    assert event_count(engine) == 1


def test_reused_event_id_with_other_payload_conflicts(client: TestClient, engine: Engine) -> None:
    body = event("booking.confirmed")
    assert client.post("/events", json=body, headers=ADMIN).status_code == 202
    changed = body | {"correlation_id": "corr_other"}
    problem = assert_problem(client.post("/events", json=changed, headers=ADMIN), 409, "event_id_conflict")
    assert body["event_id"] in problem["detail"]
    with db.session(engine) as session:
        stored = session.get(EventRecord, body["event_id"])
        assert stored is not None
        assert json.loads(stored.payload)["correlation_id"] == body["correlation_id"]


def test_invalid_event_is_a_problem_with_the_summary(client: TestClient, engine: Engine) -> None:
    body = event("booking.confirmed")
    del body["booking_id"]
    problem = assert_problem(client.post("/events", json=body, headers=ADMIN), 422, "invalid_event")
    assert "booking_id" in problem["detail"]
    assert_problem(
        client.post("/events", json=body | {"event": "booking.exploded"}, headers=ADMIN), 422, "invalid_event"
    )
    assert event_count(engine) == 0


def test_invalid_event_detail_does_not_echo_the_input(client: TestClient) -> None:
    body = event("booking.confirmed")
    body["data"]["buyer"]["email"] = "not-an-email-PII-9f3"
    body["timestamp"] = "PII-in-timestamp-77"
    problem = assert_problem(client.post("/events", json=body, headers=ADMIN), 422, "invalid_event")
    assert "timestamp" in problem["detail"]
    assert "PII-in-timestamp-77" not in problem["detail"]


def test_body_that_is_not_json(client: TestClient) -> None:
    response = client.post(
        "/events", content=b"{not json", headers=ADMIN | {"Content-Type": "application/json"}
    )
    assert_problem(response, 400, "malformed_json")


def test_oversized_body_is_refused(client: TestClient) -> None:
    body = b" " * (MAX_EVENT_BYTES + 1)
    response = client.post("/events", content=body, headers=ADMIN | {"Content-Type": "application/json"})
    assert_problem(response, 413, "payload_too_large")


def test_concurrent_post_of_the_same_event_is_answered_as_a_replay(
    client: TestClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two posts race: both look, neither sees the event, both insert. The loser's commit fails on
    the primary key and it must answer like a replay, not with a 500."""
    subscribe(client, HOOK + "a", ["booking.*"])
    body = event("booking.confirmed")
    raw = json.dumps(body).encode()
    with db.session(engine) as first:
        assert accept_event(first, raw).created
    with db.session(engine) as loser:
        real_get = loser.get
        looks: list[object] = []

        def stale_first_look(entity: Any, ident: Any, **kwargs: Any) -> Any:
            looks.append(ident)
            return None if len(looks) == 1 else real_get(entity, ident, **kwargs)

        monkeypatch.setattr(loser, "get", stale_first_look)
        outcome = accept_event(loser, raw)
    assert outcome == AcceptedEvent(body["event_id"], deliveries=1, created=False)
    assert len(looks) == 2
    assert len(deliveries_of(engine, body["event_id"])) == 1
    assert event_count(engine) == 1
