"""x402 with the official Python SDK (``x402[evm,httpx]``, keys from eth-account): an agent pays a
tier in version 2 (reading paid content in one exchange, or paying a checkout) and in version 1,
through the built-in sandbox facilitator and one over HTTP; forged, mismatched and replayed
payments grant nothing."""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import pytest
from eth_account import Account
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import select
from x402 import x402Client
from x402.http.clients.httpx import x402AsyncTransport
from x402.http.x402_http_client import x402HTTPClient
from x402.mechanisms.evm.exact.register import register_exact_evm_client
from x402.schemas import PaymentRequiredV1, PaymentRequirements

from tests.dispatcher.conftest import MakeClient, MakeSettings, Serve
from tests.dispatcher.ucap.conftest import Agent, MakeAgent, signed
from tests.dispatcher.ucap.support import PRO, pay, start_usdc, subscribe_usdc, x402_payment
from usp_core import db
from usp_dispatcher.api.app import create_app
from usp_dispatcher.ucap.payments import sandbox_facilitator_app
from usp_dispatcher.ucap.seed import DEMO_PAID_POST, DEMO_PUBLICATION
from usp_dispatcher.ucap.settings import UcapSettings
from usp_dispatcher.ucap.tables import EntitlementRow, SubscriptionRow

READ = f"/v1/content/{DEMO_PUBLICATION}/{DEMO_PAID_POST}"


class AgentSigning(httpx.AsyncBaseTransport):
    """Signs every request it sends as the agent (Web Bot Auth), so the x402 transport's paid
    retry carries a signature of its own (a fresh nonce): x402 outside, signing inside."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        for name, value in self.agent.sign(request.method, str(request.url), body).items():
            request.headers[name] = value
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def sdk_client(cap: str = "$20") -> x402Client:
    """The SDK's client with a fresh key; its default spend cap ($1 a payment) is raised to ``cap``
    for the demo's $8 tier, as the README's agent section says to."""
    client = x402Client()
    register_exact_evm_client(client, Account.create())
    client.set_spend_controls({"max_amount_per_payment": cap})
    return client


def paying(agent: Agent, client: x402Client) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=x402AsyncTransport(client, transport=AgentSigning(agent)), timeout=10)


@pytest.fixture
def served(make_settings: MakeSettings, serve: Serve) -> str:
    """The API under uvicorn on 127.0.0.1, with the built-in sandbox facilitator."""
    return serve(create_app(make_settings()))


def entitlements(engine: Engine) -> list[EntitlementRow]:
    with db.session(engine) as session:
        return list(session.exec(select(EntitlementRow)).all())


def receipt(response: httpx.Response, header: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(base64.b64decode(response.headers[header]))
    return document


def test_the_sdk_reads_paid_content_in_one_exchange_in_version_2(
    served: str, alice: Agent, engine: Engine
) -> None:
    async def main() -> httpx.Response:
        async with paying(alice, sdk_client()) as http:
            return await http.get(served + READ)

    read = anyio.run(main)
    assert read.status_code == 200, read.text
    assert "Agents that pay" in read.json()["content"]["html"]
    settled = receipt(read, "PAYMENT-RESPONSE")
    assert settled["success"] is True
    assert settled["network"] == "eip155:84532"
    assert settled["transaction"].startswith("0x")
    granted = entitlements(engine)
    assert len(granted) == 1
    assert granted[0].tier_id in {PRO, "tier_ai_weekly_annual"}


def test_the_402_of_paid_content_asks_in_version_2(served: str, alice: Agent) -> None:
    async def main() -> httpx.Response:
        async with httpx.AsyncClient(transport=AgentSigning(alice)) as http:
            return await http.get(served + READ)

    wall = anyio.run(main)
    assert wall.status_code == 402
    assert wall.json()["error"]["code"] == "payment_required"  # UCAP's body, offers and all
    asked = json.loads(base64.b64decode(wall.headers["PAYMENT-REQUIRED"]))
    assert asked["x402Version"] == 2
    assert asked["resource"]["url"].endswith(READ)
    offers = {r["extra"]["tier"]: r for r in asked["accepts"]}
    assert offers[PRO] == {
        "scheme": "exact",
        "network": "eip155:84532",
        "amount": "8000000",
        "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e",
        "payTo": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C",
        "maxTimeoutSeconds": 300,
        "extra": {"name": "USDC", "version": "2", "tier": PRO},
    }


def test_the_sdk_pays_a_checkout_in_version_2(served: str, alice: Agent, engine: Engine) -> None:
    async def main() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(transport=AgentSigning(alice)) as plain:
            started = await plain.post(
                served + "/v1/subscribe",
                json={"publisher_id": DEMO_PUBLICATION, "tier_id": PRO, "payment_method": "usdc"},
            )
        path = urlsplit(started.json()["accepts"][0]["resource"]).path
        async with paying(alice, sdk_client()) as http:
            paid = await http.post(served + path)
        async with httpx.AsyncClient(transport=AgentSigning(alice)) as plain:
            return paid, await plain.get(served + READ)

    paid, read = anyio.run(main)
    assert paid.status_code == 200, paid.text
    assert paid.json()["status"] == "active"
    assert receipt(paid, "PAYMENT-RESPONSE")["success"] is True
    assert read.status_code == 200
    assert [e.tier_id for e in entitlements(engine)] == [PRO]


@pytest.mark.parametrize("where", ["the resource", "the subscribe request again"])
def test_the_sdk_pays_in_version_1(api: TestClient, alice: Agent, engine: Engine, where: str) -> None:
    """The SDK's v1 path, from the 402 body's ``accepts``, sent where a v1 client sends it."""
    started = subscribe_usdc(api, alice)
    asked = PaymentRequiredV1.model_validate({k: started[k] for k in ("x402Version", "error", "accepts")})
    payload = anyio.run(sdk_client().create_payment_payload, asked)
    assert payload.x402_version == 1
    fields = x402HTTPClient(sdk_client()).encode_payment_signature_header(payload)
    assert set(fields) == {"X-PAYMENT"}
    if where == "the resource":
        paid = pay(api, alice, started["accepts"][0], fields["X-PAYMENT"])
    else:
        body = {"publisher_id": DEMO_PUBLICATION, "tier_id": PRO, "payment_method": "usdc"}
        paid = signed(api, alice, "POST", "/v1/subscribe", body, headers=fields)
    assert paid.status_code == 200, paid.text
    assert json.loads(base64.b64decode(paid.headers["X-PAYMENT-RESPONSE"]))["success"] is True
    assert [e.tier_id for e in entitlements(engine)] == [PRO]


def test_the_sdk_pays_through_a_facilitator_over_http(
    make_settings: MakeSettings, serve: Serve, alice: Agent, engine: Engine
) -> None:
    facilitator = serve(sandbox_facilitator_app())
    api = serve(
        create_app(make_settings(), ucap=UcapSettings(_env_file=None, x402_facilitator_url=facilitator))
    )

    async def main() -> httpx.Response:
        async with paying(alice, sdk_client()) as http:
            return await http.get(api + READ)

    read = anyio.run(main)
    assert read.status_code == 200, read.text
    assert receipt(read, "PAYMENT-RESPONSE")["success"] is True
    assert len(entitlements(engine)) == 1


@pytest.fixture
def stranger() -> Any:
    return Account.create()


@pytest.mark.parametrize("forgery", ["another_key", "someone_elses_from", "deadbeef"])
def test_a_forged_payment_grants_nothing(
    api: TestClient, alice: Agent, engine: Engine, stranger: Any, forgery: str
) -> None:
    requirements = start_usdc(api, alice)
    payer = Account.create()
    header = {
        "another_key": lambda: x402_payment(requirements, payer=payer, signer=stranger),
        "someone_elses_from": lambda: x402_payment(
            requirements, payer=payer, changes={"from": stranger.address}
        ),
        "deadbeef": lambda: x402_payment(requirements, payer=payer, signature="0xdeadbeef"),
    }[forgery]()
    refused = pay(api, alice, requirements, header)
    assert refused.status_code == 402
    assert refused.json()["error"] == "invalid_exact_evm_payload_signature"
    assert "PAYMENT-RESPONSE" not in refused.headers
    assert "X-PAYMENT-RESPONSE" not in refused.headers
    assert json.loads(base64.b64decode(refused.headers["PAYMENT-REQUIRED"]))["error"] == (
        "invalid_exact_evm_payload_signature"
    )
    assert entitlements(engine) == []
    assert signed(api, alice, "GET", READ).status_code == 402


def test_a_version_2_payment_must_pay_what_was_asked(served: str, alice: Agent, engine: Engine) -> None:
    """A v2 payment signed over a cheaper ``accepted`` than the offer, and one replayed by another
    agent, are refused; the honest one pays once."""
    client = sdk_client()

    async def main() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(transport=AgentSigning(alice)) as plain:
            wall = await plain.get(served + READ)
            asked = x402HTTPClient(client).get_payment_required_response(wall.headers.get)
            cheap = asked.model_copy(deep=True)
            for requirement in cheap.accepts:
                assert isinstance(requirement, PaymentRequirements)
                requirement.amount = "1"
            forged = await client.create_payment_payload(cheap)
            cheaper = await plain.get(
                served + READ, headers=x402HTTPClient(client).encode_payment_signature_header(forged)
            )
            honest = await client.create_payment_payload(asked)
            first = await plain.get(
                served + READ, headers=x402HTTPClient(client).encode_payment_signature_header(honest)
            )
            assert first.status_code == 200, first.text
            return cheaper, first

    cheaper, first = anyio.run(main)
    assert cheaper.status_code == 402
    assert json.loads(base64.b64decode(cheaper.headers["PAYMENT-REQUIRED"]))["error"] == (
        "invalid_payment_requirements"
    )
    assert "PAYMENT-RESPONSE" in first.headers
    assert len(entitlements(engine)) == 1


def test_one_authorization_pays_once(api: TestClient, make_agent: MakeAgent, engine: Engine) -> None:
    bob, carol = make_agent("bob"), make_agent("carol")
    requirements = start_usdc(api, bob)
    payment = x402_payment(requirements)
    assert pay(api, bob, requirements, payment).status_code == 200
    theirs = start_usdc(api, carol)
    replayed = pay(api, carol, theirs, payment)
    assert replayed.status_code == 402
    assert len(entitlements(engine)) == 1


def test_a_v1_network_name_in_settings_is_translated() -> None:
    assert UcapSettings(_env_file=None, x402_network="base").x402_network == "eip155:8453"
    with pytest.raises(ValueError, match="CAIP-2"):
        UcapSettings(_env_file=None, x402_network="solana-devnet")


def test_a_payment_header_that_is_not_a_payment_is_a_402_with_its_reason(
    api: TestClient, alice: Agent, make_client: MakeClient
) -> None:
    requirements = start_usdc(api, alice)
    path = urlsplit(str(requirements["resource"])).path
    garbled = signed(api, alice, "POST", path, headers={"PAYMENT-SIGNATURE": "not base64!"})
    assert garbled.status_code == 402
    assert garbled.json()["error"] == "invalid_payload"
    wrong_version = base64.b64encode(json.dumps({"x402Version": 1}).encode()).decode()
    refused = signed(api, alice, "POST", path, headers={"PAYMENT-SIGNATURE": wrong_version})
    assert refused.json()["error"] == "invalid_x402_version"


def test_the_sdk_subscribes_and_pays_in_one_exchange(served: str, alice: Agent, engine: Engine) -> None:
    """``POST /v1/subscribe`` with ``usdc`` answers 402 as x402 asks; the SDK sends it again with
    its payment, which pays the checkout the first one opened: one subscription, active."""

    async def main() -> tuple[httpx.Response, httpx.Response]:
        async with paying(alice, sdk_client()) as http:
            subscribed = await http.post(
                served + "/v1/subscribe",
                json={"publisher_id": DEMO_PUBLICATION, "tier_id": PRO, "payment_method": "usdc"},
            )
        async with httpx.AsyncClient(transport=AgentSigning(alice)) as plain:
            return subscribed, await plain.get(served + READ)

    subscribed, read = anyio.run(main)
    assert subscribed.status_code == 200, subscribed.text
    assert subscribed.json()["status"] == "active"
    assert receipt(subscribed, "PAYMENT-RESPONSE")["success"] is True
    assert read.status_code == 200
    assert [e.tier_id for e in entitlements(engine)] == [PRO]
    with db.session(engine) as session:
        statuses = session.exec(select(SubscriptionRow.status)).all()
    assert statuses == ["active"]  # the retry paid the first request's checkout, opened no other
