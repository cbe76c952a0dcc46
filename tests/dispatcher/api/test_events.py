"""``POST /events``: validation, one delivery per matching subscription, idempotent replays."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import col, func, select

from tests.dispatcher.conftest import ADMIN
from tests.dispatcher.support import assert_problem, event, subscribe
from tests.schemas.samples import booking
from usp_core import db
from usp_dispatcher.api.events import MAX_BATCH_EVENTS, MAX_EVENT_BYTES
from usp_dispatcher.webhooks import intake
from usp_dispatcher.webhooks.intake import Outcome, Status, accept_events
from usp_workers.storage.models import Delivery, EventRecord

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
        assert accept_events(first, [raw])[0].status is Status.ACCEPTED
    real_look = intake._stored_payloads
    looks: list[list[str]] = []

    def stale_first_look(session: Any, event_ids: list[str]) -> dict[str, str]:
        looks.append(event_ids)
        return {} if len(looks) == 1 else real_look(session, event_ids)

    monkeypatch.setattr(intake, "_stored_payloads", stale_first_look)
    with db.session(engine) as loser:
        outcome = accept_events(loser, [raw])[0]
    assert outcome == Outcome(Status.DUPLICATE, body["event_id"], deliveries=1)
    assert len(looks) == 2
    assert len(deliveries_of(engine, body["event_id"])) == 1
    assert event_count(engine) == 1


# -- POST /events/batch -------------------------------------------------------------------------


def test_batch_records_good_events_and_reports_each_bad_one(client: TestClient, engine: Engine) -> None:
    subscribe(client, HOOK + "bookings", ["booking.*"])
    subscribe(client, HOOK + "all", ["*"])
    known = event("booking.confirmed")
    assert client.post("/events", json=known, headers=ADMIN).status_code == 202
    fresh = [event("booking.confirmed"), event("waitlist.joined")]
    invalid = event("booking.confirmed") | {"timestamp": "PII-in-timestamp-77"}
    conflicting = known | {"timestamp": "2030-01-01T00:00:00Z"}
    batch = [fresh[0], known, invalid, conflicting, fresh[1], "not an object", fresh[0]]

    response = client.post("/events/batch", json=batch, headers=ADMIN)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert [r["status"] for r in answer["results"]] == [
        "accepted",
        "duplicate",
        "invalid",
        "conflict",
        "accepted",
        "invalid",
        "duplicate",  # the same event twice in one batch is recorded once
    ]
    assert (answer["accepted"], answer["duplicates"], answer["rejected"]) == (2, 2, 3)
    results = answer["results"]
    assert results[0] == {
        "status": "accepted",
        "event_id": fresh[0]["event_id"],
        "deliveries": 2,
        "error": None,
    }
    assert results[1]["deliveries"] == 2  # the known event's deliveries, as a single replay answers
    assert results[4]["deliveries"] == 1  # waitlist.joined reaches only the "*" subscription
    assert results[2]["error"]["type"] == "invalid_event"
    assert "booking.exploded" not in results[2]["error"]["detail"]  # never echoes the input
    assert results[3]["error"]["type"] == "event_id_conflict"
    assert results[3]["event_id"] == known["event_id"]
    assert results[5]["error"]["type"] == "invalid_event"
    assert event_count(engine) == 3
    assert len(deliveries_of(engine, fresh[0]["event_id"])) == 2
    assert len(deliveries_of(engine, known["event_id"])) == 2  # the conflict added nothing

    again = client.post("/events/batch", json=[fresh[0], fresh[1]], headers=ADMIN).json()
    assert [r["status"] for r in again["results"]] == ["duplicate", "duplicate"]  # a retried batch
    assert event_count(engine) == 3


@pytest.mark.parametrize(
    ("content", "status", "reason"),
    [
        (b"[{", 400, "malformed_json"),
        (b'{"event": "booking.confirmed"}', 422, "invalid_batch"),
        (b"[]", 422, "invalid_batch"),
    ],
)
def test_batch_refuses_what_is_not_a_batch(
    client: TestClient, content: bytes, status: int, reason: str
) -> None:
    response = client.post(
        "/events/batch", content=content, headers=ADMIN | {"Content-Type": "application/json"}
    )
    assert_problem(response, status, reason)


def test_batch_size_is_bounded_and_admin_only(client: TestClient, engine: Engine) -> None:
    too_many = [event("booking.confirmed") for _ in range(MAX_BATCH_EVENTS + 1)]
    assert_problem(client.post("/events/batch", json=too_many, headers=ADMIN), 422, "invalid_batch")
    assert client.post("/events/batch", json=too_many[:1]).status_code == 401
    assert event_count(engine) == 0


def test_a_value_too_long_to_store_fails_only_its_own_event(client: TestClient, engine: Engine) -> None:
    """The schema lets a 300-character correlation id through; the column holds 128. On
    PostgreSQL the group's insert fails and each event is tried alone: only that one is refused."""
    good = event("booking.confirmed")
    long = event("booking.confirmed") | {"correlation_id": "c" * 300}
    answer = client.post("/events/batch", json=[good, long], headers=ADMIN).json()
    if engine.dialect.name == "sqlite":  # SQLite stores any length
        assert [r["status"] for r in answer["results"]] == ["accepted", "accepted"]
        return
    assert [r["status"] for r in answer["results"]] == ["accepted", "invalid"]
    assert event_count(engine) == 1
    assert_problem(client.post("/events", json=long, headers=ADMIN), 422, "invalid_event")


# -- group commit -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_concurrent_single_posts_share_transactions(
    client: TestClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Posts that arrive while a transaction runs wait for the next one, which takes them all;
    every post still gets its own outcome."""
    subscribe(client, HOOK + "a", ["booking.*"])
    groups: list[int] = []
    real = intake.accept_events

    def counting(session: Any, items: Any) -> Any:
        groups.append(len(items))
        return real(session, items)

    monkeypatch.setattr(intake, "accept_events", counting)
    gate = intake.Intake(engine, max_transactions=1)
    alone = await gate.accept(json.dumps(event("booking.confirmed")).encode())
    assert alone.status is Status.ACCEPTED
    assert groups == [1]  # a lone post does not wait for company

    bodies = [json.dumps(event("booking.confirmed")).encode() for _ in range(39)]
    bodies.append(bodies[0])  # the same event twice at once: one is recorded, one is a duplicate
    bodies.append(b"{}")
    outcomes = await asyncio.gather(*(gate.accept(body) for body in bodies))
    statuses = [outcome.status for outcome in outcomes]
    assert statuses == [Status.ACCEPTED] * 39 + [Status.DUPLICATE, Status.INVALID]
    assert {outcome.deliveries for outcome in outcomes[:40]} == {1}
    assert [outcome.event_id for outcome in outcomes[:39]] == [json.loads(b)["event_id"] for b in bodies[:39]]
    assert groups == [1, len(bodies)]  # posts that came together share one transaction
    assert event_count(engine) == 40
