"""Agents built from other people's npm packages, in their default configuration, against the
content API under uvicorn (``tests/node/ucap.test.mjs``, run by Node's test runner): Cloudflare's
``web-bot-auth`` signer on GET content, POST search and POST subscribe, and ``@x402/fetch`` with
``@x402/evm`` paying a tier in x402 version 2; and ``web-bot-auth``'s verifier accepting what our
agent signer signs."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from sqlalchemy.engine import Engine
from sqlmodel import select

from tests.dispatcher.conftest import MakeSettings, Serve
from tests.dispatcher.ucap.conftest import Registry
from tests.nodejs import node_test
from usp_core import db
from usp_dispatcher.access.signatures import web_bot_auth_headers
from usp_dispatcher.api.app import create_app
from usp_dispatcher.ucap.seed import DEMO_PAID_POST, DEMO_PUBLICATION
from usp_dispatcher.ucap.tables import EntitlementRow
from usp_receiver import SigningKey

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def test_web_bot_auth_and_x402_fetch_from_node(
    make_settings: MakeSettings, serve: Serve, registry: Registry, engine: Engine
) -> None:
    private = ed25519.Ed25519PrivateKey.generate()
    raw = serialization.Encoding.Raw
    public = b64url(private.public_key().public_bytes(raw, serialization.PublicFormat.Raw))
    secret = b64url(private.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()))
    registry.keys["node-agent"] = [{"kty": "OKP", "crv": "Ed25519", "x": public}]
    api = serve(create_app(make_settings()))
    ours = SigningKey.generate()
    body = b'{"query": "agents"}'
    search = f"{api}/v1/catalog/search"
    signed = web_bot_auth_headers(
        "POST", search, body, ours, signature_agent=f"{registry.url}/jwks/ours.json"
    )
    report = node_test(
        "ucap.test.mjs",
        {
            "USP_API_URL": api,
            "USP_AGENT_JWKS_URL": f"{registry.url}/jwks/node-agent.json",
            "USP_AGENT_JWK": json.dumps({"kty": "OKP", "crv": "Ed25519", "x": public, "d": secret}),
            "USP_PUBLICATION": DEMO_PUBLICATION,
            "USP_PAID_POST": DEMO_PAID_POST,
            "USP_OUR_SIGNED": json.dumps(
                {
                    "method": "POST",
                    "url": search,
                    "headers": signed,
                    "body": body.decode(),
                    "jwk": ours.public.jwk,
                }
            ),
        },
    )
    assert "# pass 6" in report, report
    with db.session(engine) as session:
        assert len(session.exec(select(EntitlementRow)).all()) == 1
