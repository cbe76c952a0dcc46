"""``/services/catalog``, ``/availability``, ``/bookings``, ``/waitlist``: the scheduling API over
REST on the seeded demo catalog, with the events reaching a subscription's deliveries."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from tests.dispatcher.conftest import ADMIN, MakeClient
from tests.dispatcher.scheduling.support import count, deliveries_for, event_types, events, payload
from tests.dispatcher.support import assert_problem, subscribe
from usp_dispatcher.scheduling.tables import BookingRow
from usp_schemas import parse_event

HAIRCUT = "svc_haircut_001"
HOOK = "http://127.0.0.1:9/hooks/usp"
ALICE = {"first_name": "Alice", "email": "alice@example.com"}
BOB = {"first_name": "Bob", "email": "bob@example.com"}
NONE: Mapping[str, str] = {}


def slots(client: TestClient, service_id: str = HAIRCUT) -> list[dict[str, Any]]:
    """Bookable slots of the next few days (the demo catalog starts tomorrow)."""
    today = date.today()
    response = client.get(
        "/services/availability",
        params={
            "service_id": service_id,
            "start_date": str(today),
            "end_date": str(today + timedelta(days=4)),
        },
    )
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["slots"]
    assert found
    return found


def post(
    client: TestClient, path: str, body: dict[str, Any] | None = None, *, headers: Mapping[str, str] = NONE
) -> Any:
    return client.post(path, json=body, headers=ADMIN | dict(headers))


def book(
    client: TestClient, slot_id: str, buyer: dict[str, str] = ALICE, *, headers: Mapping[str, str] = NONE
) -> dict[str, Any]:
    request = {"service_id": HAIRCUT, "slot_id": slot_id, "buyer": buyer}
    response = post(client, "/services/bookings", request, headers=headers)
    assert response.status_code == 201, response.text
    answer: dict[str, Any] = response.json()
    assert answer["messages"] == []
    booking: dict[str, Any] = answer["booking"]
    return booking


def outcome(response: Any, code: str) -> dict[str, Any]:
    """A business outcome: HTTP 200, messages[] with the code, no data."""
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["usp"] == {"version": "2026-08-20"}
    ((message),) = body["messages"]
    assert message["code"] == code
    assert message["type"] == "error"
    assert message["severity"] in ("recoverable", "requires_buyer_input", "unrecoverable")
    assert set(body) == {"usp", "messages"}
    found: dict[str, Any] = message
    return found


# ------------------------------------------------------------------------------------ public reads


def test_catalog_and_availability_are_public(client: TestClient) -> None:
    catalog = client.get("/services/catalog")
    assert catalog.status_code == 200
    body = catalog.json()
    assert body["messages"] == []
    haircut = next(s for s in body["services"] if s["id"] == HAIRCUT)
    assert (haircut["duration"], haircut["price"]) == ("PT60M", {"amount": 4500, "currency": "USD"})
    first = slots(client)[0]
    assert (first["service_id"], first["state"], first["duration"]) == (HAIRCUT, "available", "PT60M")
    assert first["start"].endswith(("-04:00", "-05:00"))  # New York time


@pytest.mark.empty_database
def test_demo_catalog_can_be_turned_off(make_client: MakeClient) -> None:
    """An existing deployment that upgrades must not grow demo services it never asked for."""
    catalog = make_client(seed_demo_catalog=False).get("/services/catalog")
    assert catalog.status_code == 200
    assert catalog.json()["services"] == []


def test_availability_outcomes_and_problems(client: TestClient) -> None:
    today = str(date.today())
    params = {"service_id": "svc_nope", "start_date": today, "end_date": today}
    outcome(client.get("/services/availability", params=params), "service_not_found")
    backwards = {
        "service_id": HAIRCUT,
        "start_date": today,
        "end_date": str(date.today() - timedelta(days=1)),
    }
    problem = assert_problem(client.get("/services/availability", params=backwards), 422, "invalid_request")
    assert "end_date" in problem["detail"]
    assert_problem(
        client.get("/services/availability", params={"service_id": HAIRCUT}), 422, "invalid_request"
    )
    assert_problem(
        client.get("/services/availability", params=params | {"start_date": "15/03/2026"}),
        422,
        "invalid_request",
    )


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/services/bookings"),
        ("GET", "/services/bookings/bkg_x"),
        ("POST", "/services/bookings/bkg_x/confirm"),
        ("POST", "/services/bookings/bkg_x/cancel"),
        ("POST", "/services/bookings/bkg_x/reschedule"),
        ("POST", "/services/bookings/bkg_x/complete"),
        ("POST", "/services/bookings/bkg_x/no-show"),
        ("POST", "/services/waitlist"),
        ("GET", "/services/waitlist/wl_x"),
        ("DELETE", "/services/waitlist/wl_x"),
    ],
)
def test_everything_else_needs_the_admin_token(client: TestClient, method: str, path: str) -> None:
    assert_problem(client.request(method, path), 401, "unauthenticated")
    wrong = {"Authorization": "Bearer nope"}
    assert_problem(client.request(method, path, headers=wrong), 401, "invalid_token")


# ------------------------------------------------------------------------------------ bookings


def test_booking_lifecycle_with_deliveries(client: TestClient, engine: Engine) -> None:
    subscription = subscribe(client, HOOK, ["booking.*", "catalog.*"])
    first, second = slots(client)[:2]
    booking = book(client, first["id"], headers={"USP-Correlation-Id": "flow-42"})
    assert (booking["state"], booking["slot_id"], booking["buyer"]) == ("pending", first["id"], ALICE)
    assert client.get(f"/services/bookings/{booking['id']}", headers=ADMIN).json()["booking"] == booking

    path = f"/services/bookings/{booking['id']}"
    confirmed = post(client, f"{path}/confirm")
    assert (confirmed.status_code, confirmed.json()["booking"]["state"]) == (200, "confirmed")
    moved = post(client, f"{path}/reschedule", {"slot_id": second["id"]})
    assert moved.json()["booking"]["slot_id"] == second["id"]
    assert moved.json()["booking"]["state"] == "confirmed"
    completed = post(client, f"{path}/complete", headers={"USP-Correlation-Id": "close-1"})
    assert completed.json()["booking"]["state"] == "completed"

    recorded = events(engine)
    assert [e.event for e in recorded] == [
        "booking.created",
        "catalog.availability.changed",
        "booking.confirmed",
        "booking.rescheduled",
        "catalog.availability.changed",
        "booking.completed",
    ]
    assert [e.correlation_id for e in recorded if e.event.startswith("booking.")] == [
        "flow-42",  # the header
        "flow-42",  # the business confirmed: the booking's own flow
        "flow-42",
        "close-1",  # its own header wins
    ]
    assert deliveries_for(engine, subscription["id"]) == {e.event_id: e.event for e in recorded}
    assert payload(engine, recorded[-1].event_id)["data"] == completed.json()["booking"]


def test_cancel_and_no_show(client: TestClient, engine: Engine) -> None:
    first, second = slots(client)[:2]
    cancelled = post(
        client, f"/services/bookings/{book(client, first['id'])['id']}/cancel", {"reason": "ill"}
    )
    assert (cancelled.json()["booking"]["state"], cancelled.json()["booking"]["cancellation_reason"]) == (
        "cancelled",
        "ill",
    )
    no_body = post(client, f"/services/bookings/{book(client, first['id'], BOB)['id']}/cancel")
    assert no_body.json()["booking"]["state"] == "cancelled"
    other = book(client, second["id"])
    post(client, f"/services/bookings/{other['id']}/confirm")
    assert post(client, f"/services/bookings/{other['id']}/no-show").json()["booking"]["state"] == "no_show"
    assert event_types(engine).count("booking.cancelled") == 2
    assert event_types(engine)[-1] == "booking.no_show"


def test_business_outcomes_are_http_200_with_messages(client: TestClient, engine: Engine) -> None:
    slot = slots(client)[0]
    booking = book(client, slot["id"])
    before = event_types(engine)
    taken = post(client, "/services/bookings", {"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": BOB})
    assert outcome(taken, "slot_unavailable")["path"] == "$.slot_id"
    outcome(
        post(client, "/services/bookings", {"service_id": "svc_x", "slot_id": slot["id"], "buyer": BOB}),
        "service_not_found",
    )
    outcome(client.get("/services/bookings/bkg_missing", headers=ADMIN), "booking_not_found")
    outcome(post(client, f"/services/bookings/{booking['id']}/complete"), "invalid_state_transition")
    outcome(
        post(client, "/services/bookings/bkg_missing/reschedule", {"slot_id": slot["id"]}),
        "booking_not_found",
    )
    outcome(client.get("/services/waitlist/wl_missing", headers=ADMIN), "waitlist_entry_not_found")
    assert event_types(engine) == before


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        ({"service_id": HAIRCUT, "slot_id": "slot_x"}, {}),  # no buyer
        (
            {"service_id": HAIRCUT, "slot_id": "slot_x", "buyer": {"email": "a@b.example"}},
            {},
        ),  # no first name
        ({"service_id": HAIRCUT, "slot_id": "slot_x", "buyer": {"first_name": "A", "email": "nope"}}, {}),
        ({"service_id": HAIRCUT, "slot_id": "slot_x", "buyer": ALICE, "price": 1}, {}),  # unknown field
        ({"service_id": HAIRCUT, "slot_id": "slot_x", "buyer": ALICE}, {"USP-Correlation-Id": "has space"}),
        ({"service_id": HAIRCUT, "slot_id": "slot_x", "buyer": ALICE}, {"USP-Correlation-Id": "x" * 129}),
        ({"service_id": HAIRCUT, "slot_id": "slot_x", "buyer": ALICE}, {"Idempotency-Key": "k" * 256}),
    ],
)
def test_malformed_requests_are_problems(
    client: TestClient, engine: Engine, body: dict[str, Any], headers: dict[str, str]
) -> None:
    assert_problem(post(client, "/services/bookings", body, headers=headers), 422, "invalid_request")
    assert count(engine, BookingRow) == 0


# ------------------------------------------------------------------------------------ idempotency


def test_same_key_same_request_is_replayed_without_new_events(client: TestClient, engine: Engine) -> None:
    subscription = subscribe(client, HOOK)
    slot = slots(client)[0]
    body = {"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": ALICE}
    key = {"Idempotency-Key": "550e8400-e29b-41d4-a716-446655440000"}
    first = post(client, "/services/bookings", body, headers=key)
    assert first.status_code == 201
    assert "idempotent-replayed" not in first.headers
    recorded = event_types(engine)
    delivered = deliveries_for(engine, subscription["id"])

    again = post(client, "/services/bookings", body, headers=key)
    # The same answer; the booking-scoped credential in it is issued afresh (the first may be lost).
    assert again.status_code == 201
    assert _without_credential(again.json()) == _without_credential(first.json())
    assert again.headers["idempotent-replayed"] == "true"
    assert count(engine, BookingRow) == 1
    assert event_types(engine) == recorded
    assert deliveries_for(engine, subscription["id"]) == delivered

    # Same key, another request: refused, nothing done.
    other = post(client, "/services/bookings", body | {"buyer": BOB}, headers=key)
    assert outcome(other, "idempotency_conflict")["severity"] == "unrecoverable"
    booking_id = first.json()["booking"]["id"]
    outcome(post(client, f"/services/bookings/{booking_id}/cancel", headers=key), "idempotency_conflict")
    assert (
        client.get(f"/services/bookings/{booking_id}", headers=ADMIN).json()["booking"]["state"] == "pending"
    )
    assert event_types(engine) == recorded


def _without_credential(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "booking_scoped_credential"}


def test_outcomes_are_replayed_too(client: TestClient, engine: Engine) -> None:
    slot = slots(client)[0]
    booking = book(client, slot["id"])
    key = {"Idempotency-Key": "confirm-1"}
    confirmed = post(client, f"/services/bookings/{booking['id']}/confirm", headers=key)
    assert confirmed.json()["booking"]["state"] == "confirmed"
    again = post(client, f"/services/bookings/{booking['id']}/confirm", headers=key)
    assert again.json() == confirmed.json()  # not invalid_state_transition: it is the same call
    assert event_types(engine).count("booking.confirmed") == 1
    outcome(post(client, f"/services/bookings/{booking['id']}/confirm"), "invalid_state_transition")


# ------------------------------------------------------------------------------------ waitlist


def test_cancel_offer_convert_end_to_end(client: TestClient, engine: Engine) -> None:
    subscription = subscribe(client, HOOK, ["booking.*", "waitlist.*"])
    slot = slots(client)[0]
    alice = book(client, slot["id"])
    window = {"start": slot["start"], "end": slot["end"]}
    joined = post(
        client,
        "/services/waitlist",
        {"service_id": HAIRCUT, "desired_window": window, "buyer": BOB},
        headers={"USP-Correlation-Id": "bob-1"},
    )
    assert joined.status_code == 201, joined.text
    entry = joined.json()["waitlist_entry"]
    assert entry["state"] == "joined"

    post(client, f"/services/bookings/{alice['id']}/cancel", {"reason": "moved away"})
    offered = client.get(f"/services/waitlist/{entry['id']}", headers=ADMIN).json()["waitlist_entry"]
    assert (offered["state"], offered["offered_slot_id"]) == ("offered", slot["id"])
    assert slot["id"] not in {s["id"] for s in slots(client)}  # held for Bob
    outcome(
        post(client, "/services/bookings", {"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": ALICE}),
        "slot_unavailable",
    )

    bob = book(client, slot["id"], BOB)
    converted = client.get(f"/services/waitlist/{entry['id']}", headers=ADMIN).json()["waitlist_entry"]
    assert (converted["state"], converted["booking_id"]) == ("converted", bob["id"])

    recorded = events(engine)
    flow = [e.event for e in recorded if not e.event.startswith("catalog.")]
    assert flow == [
        "booking.created",
        "waitlist.joined",
        "booking.cancelled",
        "waitlist.offered",
        "booking.created",
        "waitlist.converted",
    ]
    waitlist_events = [e for e in recorded if e.event.startswith("waitlist.")]
    assert {e.correlation_id for e in waitlist_events} == {"bob-1"}
    assert deliveries_for(engine, subscription["id"]) == {
        e.event_id: e.event for e in recorded if not e.event.startswith("catalog.")
    }
    for event in recorded:
        assert parse_event(payload(engine, event.event_id)) == event


def test_join_and_leave(client: TestClient, engine: Engine) -> None:
    slot = slots(client)[0]
    window = {"start": slot["start"], "end": slot["end"]}
    joined = post(
        client, "/services/waitlist", {"service_id": HAIRCUT, "desired_window": window, "buyer": BOB}
    )
    entry_id = joined.json()["waitlist_entry"]["id"]
    left = client.delete(f"/services/waitlist/{entry_id}", headers=ADMIN)
    assert (left.status_code, left.json()["waitlist_entry"]["state"]) == (200, "left")
    outcome(client.delete(f"/services/waitlist/{entry_id}", headers=ADMIN), "invalid_state_transition")
    outcome(client.delete("/services/waitlist/wl_missing", headers=ADMIN), "waitlist_entry_not_found")
    closed = {"start": "2020-01-01T09:00:00Z", "end": "2020-01-01T10:00:00Z"}
    outcome(
        post(client, "/services/waitlist", {"service_id": HAIRCUT, "desired_window": closed, "buyer": BOB}),
        "waitlist_closed",
    )
    backwards = {"start": slot["end"], "end": slot["start"]}
    assert_problem(
        post(
            client, "/services/waitlist", {"service_id": HAIRCUT, "desired_window": backwards, "buyer": BOB}
        ),
        422,
        "invalid_request",
    )
    assert event_types(engine) == ["waitlist.joined", "waitlist.left"]
