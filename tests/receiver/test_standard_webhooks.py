"""``usp_receiver.standard_webhooks``: Standard Webhooks 1.0 signing and verifying, judged against
the spec's own ``standardwebhooks`` package in both directions, and a ``WebhookReceiver`` that
takes either scheme."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook

from tests.schemas.samples import sample
from usp_receiver import (
    JWKS,
    BadSignature,
    FutureSignature,
    MalformedSignature,
    MissingSignature,
    SigningKey,
    StaleSignature,
    Verifier,
    WebhookReceiver,
    sign_request,
)
from usp_receiver.standard_webhooks import (
    StandardVerified,
    StandardWebhooksVerifier,
    new_secret,
    new_signing_key,
    public_key_of,
    sign,
    verify,
)

NOW = 1_800_000_000
BODY = b'{"event":"booking.confirmed","event_id":"evt_1"}'


def test_v1_and_v1a_verify_and_each_refusal_is_typed() -> None:
    secret, key = new_secret(), new_signing_key()
    headers = sign("evt_1", NOW, BODY, secrets=[secret], signing_keys=[key])
    assert verify(headers, BODY, secrets=[secret], now=NOW) == "evt_1"
    assert verify(headers, BODY, public_keys=[public_key_of(key)], now=NOW + 299) == "evt_1"
    upper = {name.upper(): value for name, value in headers.items()}
    assert verify(upper, BODY, secrets=[secret], now=NOW) == "evt_1", "names are case-insensitive"
    refusals: list[tuple[type[Exception], dict[str, str], bytes, float]] = [
        (BadSignature, headers, BODY + b" ", NOW),
        (BadSignature, headers | {"webhook-id": "evt_2"}, BODY, NOW),
        (StaleSignature, headers, BODY, NOW + 301),
        (FutureSignature, headers, BODY, NOW - 301),
        (MissingSignature, {k: v for k, v in headers.items() if k != "webhook-signature"}, BODY, NOW),
        (MalformedSignature, headers | {"webhook-timestamp": "soon"}, BODY, NOW),
        (MalformedSignature, headers | {"webhook-signature": " ".join(["v1,AAAA"] * 9)}, BODY, NOW),
    ]
    for error, fields, body, now in refusals:
        with pytest.raises(error):
            verify(fields, body, secrets=[secret], now=now)
    with pytest.raises(BadSignature):
        verify(headers, BODY, secrets=[new_secret()], now=NOW)


def test_the_spec_s_own_library_and_ours_agree_both_ways() -> None:
    secret = new_secret()
    now = int(datetime.now(UTC).timestamp())
    ours = sign("evt_1", now, BODY, secrets=[secret])
    assert Webhook(secret).verify(BODY, ours) == json.loads(BODY)
    theirs = Webhook(secret).sign(
        "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", datetime.fromtimestamp(now, UTC), BODY.decode()
    )
    fields = {"webhook-id": "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W", "webhook-timestamp": str(now)}
    assert verify(fields | {"webhook-signature": theirs}, BODY, secrets=[secret]) == fields["webhook-id"]


def test_during_a_rotation_either_secret_verifies() -> None:
    old, new = new_secret(), new_secret()
    headers = sign("evt_1", NOW, BODY, secrets=[new, old])
    assert headers["webhook-signature"].count("v1,") == 2
    for secret in (old, new):
        assert verify(headers, BODY, secrets=[secret], now=NOW) == "evt_1"


def test_a_receiver_takes_standard_webhooks_and_falls_back_to_rfc9421() -> None:
    """A platform moving from one scheme to the other loses nothing: with both configured, a
    delivery carrying either verifies; with Standard Webhooks alone, an RFC 9421-only one is
    refused."""
    secret, key = new_secret(), SigningKey.generate()
    handled: list[str] = []
    body = json.dumps(sample("booking.confirmed")).encode()
    event_id = json.loads(body)["event_id"]
    url = "https://platform.example/hooks"
    standard = sign(event_id, int(datetime.now(UTC).timestamp()), body, secrets=[secret])
    rfc9421 = {"Content-Type": "application/json"}
    rfc9421 |= sign_request("POST", url, rfc9421, body, [key])

    both = WebhookReceiver(
        StandardWebhooksVerifier(secrets=[secret], rfc9421=Verifier(JWKS([key.public]))),
        lambda hook: handled.append(hook.verified.kid),
    )
    first = asyncio.run(both.receive("POST", url, standard | {"Content-Type": "application/json"}, body))
    assert (first.status, first.body["status"]) == (200, "accepted")
    again = asyncio.run(both.receive("POST", url, rfc9421, body))
    assert (again.status, again.body["status"]) == (200, "duplicate"), "one event, whichever scheme"
    assert handled == ["standard-webhooks v1"]

    alone = WebhookReceiver(StandardWebhooksVerifier(secrets=[secret]), lambda hook: None)
    refused = asyncio.run(alone.receive("POST", url, rfc9421, body))
    assert (refused.status, refused.body["reason"]) == (401, "missing_signature")
    tampered = asyncio.run(alone.receive("POST", url, standard, body.replace(b"booking", b"bookinG")))
    assert (tampered.status, tampered.body["reason"]) == (401, "bad_signature")
    assert isinstance(
        StandardWebhooksVerifier(secrets=[secret]).verify("POST", url, standard, body), StandardVerified
    )
