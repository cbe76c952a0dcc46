"""A subscription's own headers, end to end: set through REST (and replaced), sent by the real
worker on every try, covered by the RFC 9421 signature only when the subscription says so, a
secret value sealed at rest, masked in every view and absent from the logs; the protocol's own
headers refused by name."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlmodel import Session

from tests.dispatcher.admin.live import Live, event_id_in, wait_until
from tests.dispatcher.conftest import ADMIN
from tests.workers.endpoints import Answer
from usp_receiver import PROFILE_COMPONENTS, BadSignature, VerificationPolicy, Verifier
from usp_workers.engine.custom_headers import MASK
from usp_workers.storage.models import Subscription

PATH = "/services/feed/subscriptions"
TOKEN = "gw-key-4f1c9a77d02b"  #: a test value: what the gateway would check


def test_custom_headers_are_sent_signed_when_asked_and_a_secret_stays_secret(live: Live) -> None:
    url, path = live.endpoint("gateway", Answer(200))
    headers = [
        {"name": "X-Tenant", "value": "acme"},
        {"name": "X-Gateway-Key", "value": TOKEN, "secret": True},
    ]
    created = httpx.post(
        live.base + PATH, json={"url": url, "headers": headers, "sign_headers": True}, headers=ADMIN
    ).json()
    assert created["headers"] == [
        {"name": "X-Tenant", "value": "acme", "secret": False},
        {"name": "X-Gateway-Key", "value": MASK, "secret": True},
    ]
    assert created["sign_headers"] is True
    shown = httpx.get(f"{live.base}{PATH}/{created['id']}", headers=ADMIN).text
    assert TOKEN not in shown
    with Session(live.engine) as session:
        stored = session.get(Subscription, created["id"])
        assert stored is not None
        assert stored.custom_headers is not None
        assert TOKEN not in stored.custom_headers, "sealed at rest"

    first = event_id_in(live.ok("trigger", "booking.confirmed"))
    wait_until(lambda: len(live.hub.seen(path)) == 1, "the delivery", live)
    (seen,) = live.hub.seen(path)
    assert (seen.headers["x-tenant"], seen.headers["x-gateway-key"]) == ("acme", TOKEN)
    assert '"x-tenant" "x-gateway-key"' in seen.headers["signature-input"]
    covering = VerificationPolicy(required_components=(*PROFILE_COMPONENTS, "x-tenant", "x-gateway-key"))
    assert Verifier(live.jwks, covering).verify("POST", url, seen.headers, seen.body).kid
    tampered = dict(seen.headers) | {"x-tenant": "globex"}
    with pytest.raises(BadSignature):
        Verifier(live.jwks).verify("POST", url, tampered, seen.body)
    assert json.loads(seen.body)["event_id"] == first
    assert TOKEN not in live.worker.output(), "never logged"

    # Replaced from the CLI: unsigned now (a gateway may rewrite them), and the secret one gone.
    printed = live.ok("subscriptions", "headers", created["id"], "--header", "X-Tenant=acme-eu")
    assert printed.strip() == f"{created['id']}: X-Tenant: acme-eu"
    replaced = httpx.get(f"{live.base}{PATH}/{created['id']}", headers=ADMIN)
    assert replaced.json()["headers"] == [{"name": "X-Tenant", "value": "acme-eu", "secret": False}]
    assert replaced.json()["sign_headers"] is False
    live.ok("trigger", "booking.confirmed")
    wait_until(lambda: len(live.hub.seen(path)) == 2, "the second delivery", live)
    second = live.hub.seen(path)[1]
    assert second.headers["x-tenant"] == "acme-eu"
    assert "x-gateway-key" not in second.headers
    assert "x-tenant" not in second.headers["signature-input"]
    assert Verifier(live.jwks).verify("POST", url, second.headers, second.body).kid


@pytest.mark.parametrize(
    ("header", "where"),
    [
        ({"name": "Content-Type", "value": "text/plain"}, "headers[0].name"),
        ({"name": "Signature", "value": "sig1=:AA==:"}, "headers[0].name"),
        ({"name": "webhook-id", "value": "x"}, "headers[0].name"),
        ({"name": "Host", "value": "evil.example"}, "headers[0].name"),
        ({"name": "X Bad", "value": "x"}, "headers[0].name"),
        ({"name": "X-Split", "value": "a\r\nInjected: yes"}, "headers[0].value"),
    ],
)
def test_the_protocol_s_headers_and_malformed_ones_are_refused(
    live: Live, header: dict[str, str], where: str
) -> None:
    url, _ = live.endpoint("refused", Answer(200))
    answer = httpx.post(live.base + PATH, json={"url": url, "headers": [header]}, headers=ADMIN)
    assert (answer.status_code, answer.json()["reason"], answer.json()["where"]) == (
        422,
        "invalid_header",
        where,
    )
