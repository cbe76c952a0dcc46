"""What goes on the wire for one delivery try: the body for the transport, and signed headers.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_workers.engine.payloads``.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence

from usp_receiver import PROFILE_COMPONENTS, SigningKey, sign_request, standard_webhooks
from usp_schemas import WEBHOOK_METHOD
from usp_workers.engine.custom_headers import CustomHeaders
from usp_workers.storage.models import EventView, SubscriptionView, Transport

__all__ = ["CONTENT_TYPE", "USER_AGENT", "BodyCache", "build_delivery_request", "encode_body"]

CONTENT_TYPE = "application/json"
USER_AGENT = "usp-webhooks/0.1"

#: Encoded bodies by (event id, transport), shared across the deliveries of one batch.
BodyCache = MutableMapping[tuple[str, Transport], bytes]

_JSONRPC_PREFIX = f'{{"jsonrpc":"2.0","method":"{WEBHOOK_METHOD}","params":'.encode()


def build_delivery_request(
    event: EventView,
    subscription: SubscriptionView,
    keys: Sequence[SigningKey],
    *,
    created: int,
    delivery_id: str | None = None,
    bodies: BodyCache | None = None,
    standard: tuple[Sequence[str], Sequence[str]] | None = None,
    custom: CustomHeaders | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of one try of ``event`` to ``subscription``, signed by ``keys``
    (newest first: ``sig1`` is the newest key) at ``created`` (Unix seconds); with ``standard``
    (``whsec_`` secrets, ``whsk_`` keys), Standard Webhooks headers too, ``webhook-id`` the
    event's id (the same on every retry) and ``webhook-timestamp`` ``created``; with ``custom``,
    the subscription's own headers, covered by the RFC 9421 signature when it asked for that.

    ``USP-Event-Id`` and ``USP-Delivery-Id`` are informational (handy in receivers' logs) and not
    covered by the signature; receivers deduplicate on the signed body's ``event_id``.
    """
    transport = Transport(subscription.transport)
    body = None if bodies is None else bodies.get((event.id, transport))
    if body is None:
        body = encode_body(event, transport)
        if bodies is not None:
            bodies[(event.id, transport)] = body
    headers = {"Content-Type": CONTENT_TYPE}
    components = PROFILE_COMPONENTS
    if custom is not None:
        headers |= custom.as_dict()
        components += custom.components
    headers |= sign_request(
        "POST", subscription.url, headers, body, keys, created=created, components=components
    )
    if standard is not None:
        headers |= standard_webhooks.sign(
            event.id, created, body, secrets=standard[0], signing_keys=standard[1]
        )
    headers["User-Agent"] = USER_AGENT
    headers["USP-Event-Id"] = event.id
    if delivery_id is not None:
        headers["USP-Delivery-Id"] = delivery_id
    return body, headers


def encode_body(event: EventView, transport: Transport) -> bytes:
    """The request body carrying ``event`` over ``transport``.

    >>> from usp_workers.engine.store import LoadedEvent
    >>> encode_body(LoadedEvent("evt_1", None, '{"a":1}'), Transport.JSONRPC)
    b'{"jsonrpc":"2.0","method":"usp_webhook","params":{"a":1}}'
    """
    envelope = event.payload.encode("utf-8")
    if transport is Transport.REST:
        return envelope
    if transport is Transport.JSONRPC:
        return _JSONRPC_PREFIX + envelope + b"}"
    raise ValueError(f"unknown transport {transport!r}")
