"""One AuthorizationPolicy for both bindings: the REST scheduling routes take what the MCP tools
take (platform API keys bound to a profile, agent HTTP message signatures, booking-scoped
credentials with their ``platform_key_pop`` proof), through the same ``authorize``."""

from __future__ import annotations

import json
from datetime import date, timedelta
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from tests.dispatcher.conftest import ADMIN
from tests.dispatcher.support import assert_problem
from tests.dispatcher.ucap.conftest import Agent, alice, make_agent, registry  # noqa: F401 - fixtures
from usp_core import db
from usp_dispatcher import access
from usp_dispatcher.access.credentials import make_pop_proof

HAIRCUT = "svc_haircut_001"
ACME = "https://acme.example/profiles/scheduling.json"
GLOBEX = "https://globex.example/profiles/scheduling.json"
ALICE = {"first_name": "Alice"}


def keys(engine: Engine) -> tuple[str, str]:
    with db.session(engine) as session:
        return access.issue_api_key(session, "acme", profile=ACME), access.issue_api_key(session, "globex")


def free_slots(client: TestClient) -> list[dict[str, Any]]:
    today = date.today()
    window = {"service_id": HAIRCUT, "start_date": str(today), "end_date": str(today + timedelta(days=4))}
    slots: list[dict[str, Any]] = client.get("/services/availability", params=window).json()["slots"]
    assert len(slots) >= 3
    return slots


def as_platform(key: str, profile: str = ACME) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", "USP-Agent": f'profile="{profile}"'}


def test_a_platform_api_key_books_and_reads_its_own_bookings_over_rest(
    client: TestClient, engine: Engine
) -> None:
    acme, globex = keys(engine)
    slot = free_slots(client)[0]
    booked = client.post(
        "/services/bookings",
        json={"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": ALICE},
        headers=as_platform(acme),
    )
    assert booked.status_code == 201, booked.text
    booking = booked.json()["booking"]
    assert booked.json()["booking_scoped_credential"]["mechanism"] == "booking_scoped_credential"
    path = f"/services/bookings/{booking['id']}"
    assert client.get(path, headers=as_platform(acme)).json()["booking"] == booking
    # Another platform does not see it; a key bound to ACME may not speak for another profile.
    other = client.get(path, headers=as_platform(globex, GLOBEX)).json()
    assert other["messages"][0]["code"] == "booking_not_found"
    assert_problem(client.get(path, headers=as_platform(acme, GLOBEX)), 403, "forbidden")
    # Platforms may not confirm; the business may.
    assert_problem(client.post(f"{path}/confirm", headers=as_platform(acme)), 403, "forbidden")
    assert client.post(f"{path}/confirm", headers=ADMIN).json()["booking"]["state"] == "confirmed"
    # A privileged call without its profile names the header to send.
    missing = assert_problem(
        client.get(path, headers={"Authorization": f"Bearer {acme}"}), 422, "invalid_request"
    )
    assert "USP-Agent" in missing["detail"]
    assert_problem(client.get(path, headers=as_platform("usp_sk_wrong")), 401, "invalid_token")


def test_a_booking_scoped_credential_opens_its_booking_and_nothing_else(
    client: TestClient, engine: Engine
) -> None:
    acme, _ = keys(engine)
    first, second = free_slots(client)[:2]
    made = [
        client.post(
            "/services/bookings",
            json={"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": ALICE},
            headers=as_platform(acme),
        ).json()
        for slot in (first, second)
    ]
    credential = made[0]["booking_scoped_credential"]["credential"]
    scoped = {"Authorization": f"Bearer {credential}", "USP-Agent": ACME}
    mine, theirs = (f"/services/bookings/{m['booking']['id']}" for m in made)
    assert client.get(mine, headers=scoped).json()["booking"]["id"] == made[0]["booking"]["id"]
    assert_problem(client.get(theirs, headers=scoped), 403, "forbidden")
    assert_problem(client.post(f"{mine}/confirm", headers=scoped), 403, "forbidden")
    cancelled = client.post(f"{mine}/cancel", json={"reason": "plans changed"}, headers=scoped)
    assert cancelled.json()["booking"]["state"] == "cancelled"


def test_an_agent_signature_books_and_its_key_bound_credential_needs_the_proof(
    client: TestClient,
    alice: Agent,  # noqa: F811
) -> None:
    slot = free_slots(client)[0]
    url = str(client.base_url).rstrip("/") + "/services/bookings"
    body = json.dumps({"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": ALICE}).encode()
    headers = {"Content-Type": "application/json", "USP-Agent": ACME}
    booked = client.post(url, content=body, headers=headers | alice.sign("POST", url, body))
    assert booked.status_code == 201, booked.text
    issued = booked.json()["booking_scoped_credential"]
    path = f"/services/bookings/{booked.json()['booking']['id']}"
    scoped = {"Authorization": f"Bearer {issued['credential']}", "USP-Agent": ACME}
    # Bound to the agent's key (cnf.jkt): without a proof it counts as absent.
    refused = assert_problem(client.get(path, headers=scoped), 401, "unauthenticated")
    assert "platform_key_pop" in refused["detail"]
    proof = make_pop_proof({"method": "GET", "target": path, "body": None}, alice.key)
    answer = client.get(path, headers=scoped | {"USP-Key-Proof": proof})
    assert answer.json()["booking"]["state"] == "pending", answer.text
    # A proof over another request does not hold.
    elsewhere = make_pop_proof({"method": "GET", "target": path + "x", "body": None}, alice.key)
    assert_problem(client.get(path, headers=scoped | {"USP-Key-Proof": elsewhere}), 401, "unauthenticated")


def test_rest_and_mcp_answer_from_one_policy(make_client: Any, engine: Engine) -> None:
    """Bearer keys switched off: REST refuses the platform key exactly as MCP does."""
    client = make_client(auth_mechanisms=["http_message_signatures", "booking_scoped_credential"])
    acme, _ = keys(engine)
    response = client.get("/services/bookings/bkg_x", headers=as_platform(acme))
    assert_problem(response, 401, "invalid_token")
    policy = client.get("/.well-known/usp").json()["authorization"]
    assert policy["mechanisms"] == ["http_message_signatures", "booking_scoped_credential"]
    assert "rest" in policy["booking_scoped_credential"]
