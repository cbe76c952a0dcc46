"""Payments behind one interface: Stripe Checkout (the official library against a local stand-in
of Stripe's API; webhooks signed as Stripe signs them), the sandbox checkout page and the 402's
offer links, an x402 facilitator over HTTP, and fulfilment that loses nothing when it fails
half-way."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy.engine import Engine
from sqlmodel import col, select
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.dispatcher.conftest import MakeClient, MakeSettings, Serve
from tests.dispatcher.ucap.conftest import Agent, signed
from tests.dispatcher.ucap.support import pay, start_usdc, x402_payment
from usp_core import db
from usp_dispatcher.api.app import create_app
from usp_dispatcher.ucap import subscriptions
from usp_dispatcher.ucap.payments import sandbox_facilitator_app
from usp_dispatcher.ucap.seed import DEMO_PAID_POST, DEMO_PUBLICATION
from usp_dispatcher.ucap.settings import UcapSettings
from usp_dispatcher.ucap.tables import CheckoutRow, EntitlementRow, TierRow
from usp_workers.storage.models import EventRecord

PRO = "tier_ai_weekly_pro"
WEBHOOK_SECRET = "whsec_test_7f1c"
READ = f"/v1/content/{DEMO_PUBLICATION}/{DEMO_PAID_POST}"


class StripeStandIn:
    """Stripe's ``POST /v1/checkout/sessions``, answering as Stripe does (form-encoded in, JSON out)."""

    def __init__(self) -> None:
        self.created: list[dict[str, list[str]]] = []

    async def create(self, request: Request) -> JSONResponse:
        form = parse_qs((await request.body()).decode())
        self.created.append(form)
        assert request.headers["authorization"] == "Bearer sk_test_standin"
        number = len(self.created)
        return JSONResponse(
            {
                "id": f"cs_test_{number}",
                "object": "checkout.session",
                "mode": form["mode"][0],
                "url": f"https://checkout.stripe.test/c/pay/cs_test_{number}",
                "client_reference_id": form["client_reference_id"][0],
                "payment_status": "unpaid",
                "status": "open",
            }
        )


def stripe_signed(payload: bytes, secret: str = WEBHOOK_SECRET, at: int | None = None) -> str:
    """A ``Stripe-Signature`` header as Stripe computes it: HMAC-SHA256 of ``t.payload``."""
    stamp = int(time.time()) if at is None else at
    mac = hmac.new(secret.encode(), f"{stamp}.".encode() + payload, hashlib.sha256).hexdigest()
    return f"t={stamp},v1={mac}"


def completed(session_id: str, *, paid: bool = True) -> bytes:
    event = {
        "id": "evt_1StripeTest",
        "object": "event",
        "type": "checkout.session.completed",
        "data": {
            "object": {
                "id": session_id,
                "object": "checkout.session",
                "payment_status": "paid" if paid else "unpaid",
                "status": "complete",
            }
        },
    }
    return json.dumps(event).encode()


@pytest.fixture
def stripe_api(
    make_settings: MakeSettings, make_client: MakeClient, serve: Serve, engine: Engine
) -> tuple[TestClient, StripeStandIn]:
    standin = StripeStandIn()
    base = serve(Starlette(routes=[Route("/v1/checkout/sessions", standin.create, methods=["POST"])]))
    ucap = UcapSettings(
        _env_file=None,
        stripe_api_key=SecretStr("sk_test_standin"),
        stripe_webhook_secret=SecretStr(WEBHOOK_SECRET),
        stripe_api_base=base,
    )
    api = make_client(app=create_app(make_settings(), ucap=ucap))
    with db.session(engine) as session:
        tier = session.get(TierRow, PRO)
        assert tier is not None
        tier.stripe_price_id = "price_1ProMonthly"
        session.add(tier)
        session.commit()
    return api, standin


def test_stripe_checkout_and_its_webhook(
    stripe_api: tuple[TestClient, StripeStandIn], alice: Agent, engine: Engine
) -> None:
    api, standin = stripe_api
    started = signed(api, alice, "POST", "/v1/subscribe", {"publisher_id": DEMO_PUBLICATION, "tier_id": PRO})
    assert started.status_code == 200, started.text
    assert started.json()["checkout"]["url"] == "https://checkout.stripe.test/c/pay/cs_test_1"
    (form,) = standin.created
    assert form["mode"] == ["subscription"]
    assert form["line_items[0][price]"] == ["price_1ProMonthly"]
    assert form["client_reference_id"] == [started.json()["subscription"]["id"]]
    assert form["metadata[publisher_id]"] == [DEMO_PUBLICATION]
    assert form["metadata[tier_id]"] == [PRO]
    assert signed(api, alice, "GET", READ).status_code == 402

    body = completed("cs_test_1")
    forged = api.post(
        "/ucap/stripe/webhook", content=body, headers={"Stripe-Signature": stripe_signed(body, "whsec_other")}
    )
    assert forged.status_code == 400
    stale = api.post(
        "/ucap/stripe/webhook", content=body, headers={"Stripe-Signature": stripe_signed(body, at=1)}
    )
    assert stale.status_code == 400
    unpaid = completed("cs_test_1", paid=False)
    ignored = api.post(
        "/ucap/stripe/webhook", content=unpaid, headers={"Stripe-Signature": stripe_signed(unpaid)}
    )
    assert ignored.json()["handled"] is False
    assert signed(api, alice, "GET", READ).status_code == 402

    granted = api.post(
        "/ucap/stripe/webhook", content=body, headers={"Stripe-Signature": stripe_signed(body)}
    )
    assert granted.json() == {"received": True, "handled": True, "granted": True}
    again = api.post("/ucap/stripe/webhook", content=body, headers={"Stripe-Signature": stripe_signed(body)})
    assert again.json()["granted"] is False  # Stripe retries: granted once
    assert signed(api, alice, "GET", READ).status_code == 200
    with db.session(engine) as session:
        assert len(session.exec(select(EntitlementRow)).all()) == 1


def test_a_tier_without_a_stripe_price_is_a_clear_refusal(
    stripe_api: tuple[TestClient, StripeStandIn], alice: Agent
) -> None:
    api, _ = stripe_api
    answer = signed(
        api,
        alice,
        "POST",
        "/v1/subscribe",
        {"publisher_id": DEMO_PUBLICATION, "tier_id": "tier_ai_weekly_annual"},
    )
    assert answer.status_code == 400
    assert answer.json()["reason"] == "payment_unavailable"


def test_the_offer_link_and_the_sandbox_page(api: TestClient, alice: Agent) -> None:
    answer = signed(api, alice, "GET", READ)
    assert answer.status_code == 402, answer.text  # once seen failing with no offers: say why
    wall = answer.json()
    link = next(o["checkout_url"] for o in wall["offers"] if o["tier_id"] == PRO)
    opened = api.get(urlsplit(link).path, follow_redirects=False)
    assert opened.status_code == 303
    page_path = urlsplit(opened.headers["location"]).path
    page = api.get(page_path)
    assert page.status_code == 200
    assert "Pay" in page.text
    assert "8.00 USD / month" in page.text
    assert api.get(urlsplit(link).path[:-3] + "xyz", follow_redirects=False).status_code == 400  # forged
    paid = api.post(page_path + "/pay", follow_redirects=False)
    assert paid.status_code == 303
    assert "Paid" in api.get(page_path).text
    assert signed(api, alice, "GET", READ).status_code == 200


def test_usdc_through_a_facilitator_over_http(
    make_settings: MakeSettings, make_client: MakeClient, serve: Serve, alice: Agent
) -> None:
    facilitator = serve(sandbox_facilitator_app())
    api = make_client(
        app=create_app(make_settings(), ucap=UcapSettings(_env_file=None, x402_facilitator_url=facilitator))
    )
    requirements = start_usdc(api, alice)
    path = urlsplit(requirements["resource"]).path
    assert signed(api, alice, "POST", path).status_code == 402  # no X-PAYMENT: the requirements again
    short = pay(api, alice, requirements, x402_payment(requirements, changes={"value": "1"}))
    assert short.json()["error"] == "invalid_exact_evm_payload_authorization_value_mismatch"
    paid = pay(api, alice, requirements)
    assert paid.status_code == 200, paid.text
    assert paid.json()["transaction"].startswith("0x")
    assert signed(api, alice, "GET", READ).status_code == 200


def test_a_failure_half_way_through_fulfilment_loses_nothing(
    api: TestClient, alice: Agent, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = signed(
        api,
        alice,
        "POST",
        "/v1/subscribe",
        {"publisher_id": DEMO_PUBLICATION, "tier_id": PRO, "payment_method": "usdc"},
    ).json()
    session_id = started["checkout"]["session_id"]

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the process died between the payment and the entitlement event")

    monkeypatch.setattr(subscriptions, "emit_entitlement_event", crash)
    with db.session(engine) as session, pytest.raises(RuntimeError):
        subscriptions.fulfil(session, session_id)
    with db.session(engine) as session:
        checkout = session.get(CheckoutRow, session_id)
        assert checkout is not None
        assert checkout.status == "open"  # nothing of the half-done fulfilment was kept
        assert session.exec(select(EntitlementRow)).all() == []
        assert "content.subscription.activated" not in session.exec(select(EventRecord.event_type)).all()
    monkeypatch.undo()
    with db.session(engine) as session:
        assert subscriptions.fulfil(session, session_id).granted  # the retry grants it, with both events
        kinds = session.exec(select(EventRecord.event_type).order_by(col(EventRecord.created_at))).all()
    assert kinds.count("content.subscription.activated") == kinds.count("content.entitlement.granted") == 1
    assert signed(api, alice, "GET", READ).status_code == 200
