"""What goes on the wire: REST and JSON-RPC bodies, and headers a receiver verifies."""

from __future__ import annotations

import json

import pytest

from usp_core.clock import utcnow
from usp_receiver import JWKS, DigestMismatch, SigningKey, Verifier
from usp_schemas import BOOKING_CONFIRMED_EXAMPLE, notification_for, parse_event
from usp_workers.engine.payloads import USER_AGENT, BodyCache, build_delivery_request, encode_body
from usp_workers.storage.models import EventRecord, Subscription, Transport

URL = "https://platform.example/hooks/usp?tenant=7"
KEY = SigningKey.generate()


def _event() -> EventRecord:
    event = parse_event(BOOKING_CONFIRMED_EXAMPLE)
    return EventRecord(
        id=event.event_id, event_type=event.event, occurred_at=utcnow(), payload=event.model_dump_json()
    )


def _subscription(transport: Transport) -> Subscription:
    return Subscription(url=URL, transport=transport)


def test_rest_body_is_the_stored_envelope_byte_for_byte() -> None:
    event = _event()
    body, _ = build_delivery_request(event, _subscription(Transport.REST), [KEY], created=1_800_000_000)
    assert body == event.payload.encode("utf-8")


def test_jsonrpc_body_is_a_compact_notification_without_id() -> None:
    event = _event()
    body, _ = build_delivery_request(event, _subscription(Transport.JSONRPC), [KEY], created=1_800_000_000)
    message = json.loads(body)
    assert message == {"jsonrpc": "2.0", "method": "usp_webhook", "params": json.loads(event.payload)}
    assert message == notification_for(parse_event(event.payload))  # the schema package agrees
    assert body == json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()


@pytest.mark.parametrize("transport", list(Transport))
def test_headers_carry_a_signature_the_receiver_verifies(transport: Transport) -> None:
    created = int(utcnow().timestamp())
    body, headers = build_delivery_request(
        _event(), _subscription(transport), [KEY], created=created, delivery_id="dlv_1"
    )
    assert headers["Content-Type"] == "application/json"
    assert headers["User-Agent"] == USER_AGENT
    assert headers["USP-Delivery-Id"] == "dlv_1"
    assert f";created={created};" in headers["Signature-Input"]
    verified = Verifier(JWKS([KEY.public])).verify("POST", URL, headers, body)
    assert verified.kid == KEY.kid
    assert verified.created == created


def test_a_tampered_body_does_not_verify() -> None:
    body, headers = build_delivery_request(
        _event(), _subscription(Transport.REST), [KEY], created=int(utcnow().timestamp())
    )
    with pytest.raises(DigestMismatch):
        Verifier(JWKS([KEY.public])).verify("POST", URL, headers, body.replace(b"Alice", b"Mallory"))


def test_two_keys_give_sig1_and_sig2_in_order() -> None:
    new = SigningKey.generate()
    _, headers = build_delivery_request(
        _event(), _subscription(Transport.REST), [new, KEY], created=1_800_000_000
    )
    first, second = headers["Signature-Input"].split(", ")
    assert first.startswith("sig1=")
    assert f'keyid="{new.kid}"' in first
    assert second.startswith("sig2=")
    assert f'keyid="{KEY.kid}"' in second


def test_a_shared_cache_encodes_each_event_once_per_transport() -> None:
    event = _event()
    bodies: BodyCache = {}
    a, _ = build_delivery_request(event, _subscription(Transport.REST), [KEY], created=1, bodies=bodies)
    b, _ = build_delivery_request(event, _subscription(Transport.REST), [KEY], created=2, bodies=bodies)
    c, _ = build_delivery_request(event, _subscription(Transport.JSONRPC), [KEY], created=3, bodies=bodies)
    assert a is b
    assert c is not a
    assert sorted(bodies) == [(event.id, Transport.JSONRPC), (event.id, Transport.REST)]


def test_encode_body_refuses_an_unknown_transport() -> None:
    with pytest.raises(ValueError, match="transport"):
        encode_body(_event(), "smtp")  # type: ignore[arg-type]
