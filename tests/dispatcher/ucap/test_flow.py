"""An agent holding only an Ed25519 key finds a paid post, learns its price, subscribes with USDC
(x402, the sandbox facilitator), pays, reads it, and cancels; every step is an event in the outbox."""

from __future__ import annotations

import base64
import json
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import col, select

from tests.dispatcher.ucap.conftest import Agent, MakeAgent, signed
from tests.dispatcher.ucap.support import PRO, pay, start_usdc, x402_payment
from usp_core import db
from usp_dispatcher.ucap.seed import DEMO_PAID_POST, DEMO_PUBLICATION
from usp_workers.storage.models import EventRecord


def event_types(engine: Engine) -> list[str]:
    with db.session(engine) as session:
        return list(
            session.exec(
                select(EventRecord.event_type).order_by(col(EventRecord.created_at), col(EventRecord.id))
            )
        )


def test_find_pay_and_read_a_paid_post(api: TestClient, alice: Agent, engine: Engine) -> None:
    found = signed(
        api, alice, "POST", "/v1/catalog/search", {"query": "agents that pay", "pagination": {"limit": 5}}
    )
    assert found.status_code == 200, found.text
    hit = found.json()["results"][0]
    assert (hit["type"], hit["post"]["id"]) == ("post", DEMO_PAID_POST)
    assert 0 < hit["relevance_score"] <= 1

    wall = signed(api, alice, "GET", f"/v1/content/{DEMO_PUBLICATION}/{DEMO_PAID_POST}")
    assert wall.status_code == 402
    assert wall.json()["error"]["code"] == "payment_required"
    assert {o["tier_id"] for o in wall.json()["offers"]} == {PRO, "tier_ai_weekly_annual"}
    assert "agents" not in wall.text.split("teaser")[0]  # the body is not in the answer
    assert all(o["checkout_url"].startswith("http") for o in wall.json()["offers"])

    started = signed(
        api,
        alice,
        "POST",
        "/v1/subscribe",
        {"publisher_id": DEMO_PUBLICATION, "tier_id": PRO, "payment_method": "usdc"},
    )
    assert started.status_code == 402, started.text  # x402 asks: the body and PAYMENT-REQUIRED
    assert "PAYMENT-REQUIRED" in started.headers
    body = started.json()
    assert body["status"] == "pending_payment"
    assert body["x402Version"] == 1
    requirements = body["accepts"][0]
    assert requirements["maxAmountRequired"] == "8000000"  # $8.00 in USDC base units
    assert requirements["extra"] == {"name": "USDC", "version": "2", "tier": PRO}
    assert requirements["scheme"] == "exact"

    pay_path = urlsplit(requirements["resource"]).path
    paid = signed(api, alice, "POST", pay_path, headers={"X-PAYMENT": x402_payment(requirements)})
    assert paid.status_code == 200, paid.text
    assert paid.json()["status"] == "active"
    receipt = json.loads(base64.b64decode(paid.headers["X-PAYMENT-RESPONSE"]))
    assert receipt["success"] is True

    read = signed(api, alice, "GET", f"/v1/content/{DEMO_PUBLICATION}/{DEMO_PAID_POST}")
    assert read.status_code == 200, read.text
    assert "Agents that pay" in read.json()["content"]["html"]
    assert read.json()["publisher"]["id"] == DEMO_PUBLICATION

    listed = signed(api, alice, "GET", "/v1/entitlements").json()["entitlements"]
    assert [(e["tier_id"], e["status"]) for e in listed] == [(PRO, "active")]

    cancelled = signed(api, alice, "DELETE", f"/v1/entitlements/{listed[0]['id']}")
    assert cancelled.status_code == 200, cancelled.text
    assert signed(api, alice, "GET", f"/v1/content/{DEMO_PUBLICATION}/{DEMO_PAID_POST}").status_code == 402

    assert event_types(engine) == [
        "content.subscription.created",
        "content.subscription.activated",
        "content.entitlement.granted",
        "content.subscription.canceled",
        "content.entitlement.revoked",
    ]


def test_two_agents_of_one_registry_do_not_share_entitlements(api: TestClient, make_agent: MakeAgent) -> None:
    bob, carol = make_agent("bob"), make_agent("carol")
    assert pay(api, bob, start_usdc(api, bob)).status_code == 200
    assert signed(api, bob, "GET", f"/v1/content/{DEMO_PUBLICATION}/{DEMO_PAID_POST}").status_code == 200
    assert signed(api, carol, "GET", f"/v1/content/{DEMO_PUBLICATION}/{DEMO_PAID_POST}").status_code == 402
    assert signed(api, carol, "GET", "/v1/entitlements").json() == {"entitlements": []}
    bobs = signed(api, bob, "GET", "/v1/entitlements").json()["entitlements"][0]["id"]
    assert signed(api, carol, "DELETE", f"/v1/entitlements/{bobs}").status_code == 404


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"value": "7999999"}, "invalid_exact_evm_payload_authorization_value_mismatch"),
        (
            {"to": "0x0000000000000000000000000000000000000001"},
            "invalid_exact_evm_payload_recipient_mismatch",
        ),
        ({"validBefore": "1000"}, "invalid_exact_evm_payload_authorization_valid_before"),
    ],
)
def test_a_payment_that_does_not_pay_is_refused_with_its_reason(
    api: TestClient, alice: Agent, change: dict[str, str], reason: str
) -> None:
    requirements = start_usdc(api, alice)
    refused = pay(api, alice, requirements, x402_payment(requirements, changes=change))
    assert refused.status_code == 402
    assert refused.json()["error"] == reason
    assert signed(api, alice, "GET", f"/v1/content/{DEMO_PUBLICATION}/{DEMO_PAID_POST}").status_code == 402


def test_a_reused_authorization_pays_once(api: TestClient, alice: Agent, engine: Engine) -> None:
    first, second = start_usdc(api, alice), start_usdc(api, alice)
    payment = x402_payment(first)
    assert pay(api, alice, first, payment).status_code == 200
    again = pay(api, alice, first, payment)
    assert again.status_code == 200
    assert again.json()["message"] == "Already paid."
    assert pay(api, alice, second, payment).status_code == 402  # one authorization pays one session
    assert event_types(engine).count("content.entitlement.granted") == 1
