"""Agents authenticated as OpenBotAuth signs: the request built exactly as its signer builds it
(``packages/bot-cli/src/request-signer.ts``: the signature base written line by line, signed with
the raw Ed25519 key, nothing of ours), both ``Signature-Agent`` forms, and every refusal with its
reason; the rate limit."""

from __future__ import annotations

import base64
import secrets
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from tests.dispatcher.conftest import MakeClient
from tests.dispatcher.ucap.conftest import Agent as SignedAgent
from tests.dispatcher.ucap.conftest import Registry, signed
from usp_dispatcher.access.signatures import web_bot_auth_headers
from usp_dispatcher.errors import UcapError
from usp_dispatcher.ucap.agents import Agent, RateLimiter
from usp_dispatcher.ucap.seed import DEMO_PAID_POST, DEMO_PUBLICATION
from usp_receiver import SigningKey, jwk_thumbprint


def openbotauth_base(method: str, url: str, covered: list[str], fields: dict[str, str], params: str) -> bytes:
    """The signature base as OpenBotAuth builds it, signing (``request-signer.ts``) and verifying
    (verifier-service ``buildSignatureBase``): a ``;key`` member of ``signature-agent`` is written
    ``"signature-agent": <key>="<url>"``, a whole field with its raw value. ``covered`` as it
    writes them (``signature-agent;key="sig1"``), ``fields`` by lower-case name."""
    parts = urlsplit(url)
    lines = []
    for component in covered:
        if component == "@method":
            lines.append(f'"@method": {method.upper()}')
        elif component == "@path":
            lines.append(f'"@path": {parts.path}')
        elif component == "@authority":
            lines.append(f'"@authority": {parts.netloc}')
        elif component.startswith("signature-agent;key="):
            member = component.split('"')[1]
            value = fields["signature-agent"].split('="', 1)[1].rstrip('"')
            lines.append(f'"signature-agent": {member}="{value}"')
        else:
            lines.append(f'"{component}": {fields[component]}')
    lines.append(f'"@signature-params": {params}')
    return "\n".join(lines).encode()


class OpenBotAuthAgent:
    """An agent whose requests are made the way OpenBotAuth's bot CLI makes them."""

    def __init__(self, registry: Registry, name: str, *, kid: str | None = None) -> None:
        self.private = Ed25519PrivateKey.generate()
        raw = self.private.public_key().public_bytes_raw()
        x = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        self.kid = kid or f"oba-{name}"
        registry.keys[name] = [
            {"kty": "OKP", "crv": "Ed25519", "x": x, "kid": self.kid, "alg": "EdDSA", "use": "sig"}
        ]
        self.jwks_url = f"{registry.url}/jwks/{name}.json"

    def headers(
        self,
        method: str,
        url: str,
        body: str | None = None,
        *,
        form: str = "dict",
        created: int | None = None,
        nonce: str | None = None,
    ) -> dict[str, str]:
        agent = f'sig1="{self.jwks_url}"' if form == "dict" else self.jwks_url
        covered = [
            "@method",
            "@path",
            "@authority",
            'signature-agent;key="sig1"' if form == "dict" else "signature-agent",
        ]
        if body:
            covered.append("content-type")
        now = int(time.time()) if created is None else created
        nonce = nonce or base64.urlsafe_b64encode(secrets.token_bytes(64)).decode().rstrip("=")
        formatted = " ".join(
            f'"{c}"' if ";" not in c else '"{}";{}'.format(*c.split(";", 1)) for c in covered
        )
        params = (
            f'({formatted});created={now};expires={now + 300};nonce="{nonce}";keyid="{self.kid}";'
            'alg="ed25519";tag="web-bot-auth"'
        )
        fields = {"signature-agent": agent, "content-type": "application/json"}
        base = openbotauth_base(method, url, covered, fields, params)
        signature = base64.b64encode(self.private.sign(base)).decode()
        headers = {
            "Signature-Input": f"sig1={params}",
            "Signature": f"sig1=:{signature}:",
            "Signature-Agent": agent,
            "User-Agent": "OpenBotAuth-CLI/0.1.0",
        }
        if body:
            headers["Content-Type"] = "application/json"
        return headers


def call(api: TestClient, method: str, path: str, headers: dict[str, str], body: str | None = None) -> Any:
    return api.request(method, str(api.base_url) + path, content=(body or "").encode(), headers=headers)


@pytest.mark.parametrize("form", ["dict", "legacy"])
def test_openbotauths_own_request_format_verifies(api: TestClient, registry: Registry, form: str) -> None:
    bot = OpenBotAuthAgent(registry, f"oba-{form}")
    url = str(api.base_url) + "/v1/catalog/search"
    body = '{"query":"tarte tatin"}'
    found = call(api, "POST", "/v1/catalog/search", bot.headers("POST", url, body, form=form), body)
    assert found.status_code == 200, found.text
    assert found.json()["results"][0]["post"]["id"] == "post_tarte_tatin"
    path = f"/v1/content/{DEMO_PUBLICATION}/{DEMO_PAID_POST}"
    wall = call(api, "GET", path, bot.headers("GET", str(api.base_url) + path, form=form))
    assert wall.status_code == 402


def test_refusals_say_why(api: TestClient, registry: Registry, alice: SignedAgent) -> None:
    bot = OpenBotAuthAgent(registry, "bot")
    path = "/v1/entitlements"
    url = str(api.base_url) + path

    unsigned = call(api, "GET", path, {})
    assert (unsigned.status_code, unsigned.json()["reason"]) == (403, "agent_unauthorized")
    assert unsigned.json()["error"]["code"] == "agent_unauthorized"
    assert "not signed" in unsigned.json()["detail"]

    stale = call(api, "GET", path, bot.headers("GET", url, created=int(time.time()) - 900))
    assert stale.status_code == 403
    assert "expired" in stale.json()["detail"] or "stale" in stale.json()["detail"]

    tampered = bot.headers("GET", url)
    other = call(api, "GET", "/v1/catalog/item/pub_ai_weekly", tampered)
    assert other.status_code == 403
    assert "does not verify" in other.json()["detail"] or "bad_signature" in other.json()["detail"]

    stranger = OpenBotAuthAgent(registry, "stranger")
    forged = stranger.headers("GET", url)
    forged["Signature-Agent"] = f'sig1="{bot.jwks_url}"'
    unknown = call(api, "GET", path, forged)
    assert unknown.status_code == 403
    assert "unknown_key" in unknown.json()["detail"] or "does not verify" in unknown.json()["detail"]

    once = bot.headers("GET", url, nonce="the-same-nonce-twice")
    assert call(api, "GET", path, once).status_code == 200
    replayed = call(api, "GET", path, once)
    assert replayed.status_code == 403
    assert "nonce" in replayed.json()["detail"]

    missing_directory = bot.headers("GET", url)
    missing_directory["Signature-Agent"] = f'sig1="{registry.url}/jwks/nobody.json"'
    assert call(api, "GET", path, missing_directory).status_code == 403

    # ours, with a Content-Digest that does not match the body: refused as tampered
    body = b'{"query":"x"}'
    fields = alice.sign("POST", str(api.base_url) + "/v1/catalog/search", body, digest=True)
    altered = api.request(
        "POST", str(api.base_url) + "/v1/catalog/search", content=b'{"query":"y"}', headers=fields
    )
    assert altered.status_code == 403
    assert "digest" in altered.json()["detail"]


def test_the_rate_limit_answers_429_with_retry_after(make_client: MakeClient, alice: SignedAgent) -> None:
    import os

    os.environ["USP_RATE_LIMIT_PER_MINUTE"] = "3"
    try:
        api = make_client()
    finally:
        del os.environ["USP_RATE_LIMIT_PER_MINUTE"]
    statuses = [signed(api, alice, "GET", "/v1/entitlements").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    limited = signed(api, alice, "GET", "/v1/entitlements")
    assert limited.json()["reason"] == "rate_limited"
    assert 1 <= int(limited.headers["Retry-After"]) <= 60


def test_a_nonce_store_that_does_not_answer_is_a_503_not_an_accepted_request(
    make_client: MakeClient, alice: SignedAgent
) -> None:
    """On a Redis broker the nonces are kept there; with Redis unreachable a signed request can
    be checked for replay by nobody, so it is refused with 503 and Retry-After (fail closed)."""
    api = make_client(broker_url="redis://127.0.0.1:1/0?socket_connect_timeout=0.5")
    answer = signed(api, alice, "GET", "/v1/entitlements")
    assert answer.status_code == 503
    assert answer.json()["reason"] == "replay_store_unavailable"
    assert answer.headers["Retry-After"] == "5"


def test_the_rate_limit_is_a_sliding_minute_per_agent() -> None:
    limiter = RateLimiter(3)
    one, other = Agent("https://a.example/jwks", "kA"), Agent("https://b.example/jwks", "kB")
    for moment in (0.0, 10.0, 20.0):
        limiter.check(one, now=moment)
    with pytest.raises(UcapError) as refused:
        limiter.check(one, now=30.0)
    assert refused.value.headers == {"Retry-After": "30"}, "the first request leaves the window at 60"
    limiter.check(other, now=30.0)  # each agent has its own window
    with pytest.raises(UcapError):
        limiter.check(one, now=59.9)
    limiter.check(one, now=60.5)  # the request at 0 has left the window
    with pytest.raises(UcapError):
        limiter.check(one, now=61.0)  # 10, 20 and 60.5 are in it


def test_our_agent_signer_verifies_in_openbotauths_base_form() -> None:
    """What our agent signs (``web_bot_auth_headers``), rebuilt as OpenBotAuth's verifier rebuilds
    it, holds under the key: its verifier accepts it."""
    key = SigningKey.generate()
    url = "https://pub.example/v1/catalog/search"
    fields = web_bot_auth_headers("POST", url, b"{}", key, signature_agent="https://registry.example/a.json")
    params = fields["Signature-Input"].removeprefix("sig1=")
    covered = [c.strip('"') for c in params[1 : params.index(")")].split(" ")]
    assert covered == ["@method", "@path", "@authority", "signature-agent", "content-type"]
    assert f'keyid="{jwk_thumbprint(key.public.jwk)}"' in params
    assert all(f";{name}=" in params for name in ("created", "expires", "nonce", "alg", "tag"))
    lowered = {name.lower(): value for name, value in fields.items()}
    signature = base64.b64decode(fields["Signature"].removeprefix("sig1=:").rstrip(":"))
    assert key.public.verify(signature, openbotauth_base("POST", url, covered, lowered, params))
