"""USP events published to a message broker (RabbitMQ, NATS JetStream, Redis Streams): the
message profile of RFC 9421 signatures, for consumers of a business's own broker.

A message carries the event JSON as its body and, in its headers (AMQP headers, NATS headers,
the stream entry's fields), ``Content-Type``, ``Content-Digest`` (RFC 9530) and a
``Signature``/``Signature-Input`` pair over ``@target-uri`` (the destination URL without its
credentials), ``content-digest`` and ``content-type``, by the same keys as every delivery. Why,
and the profile in full: docs/protocol.md, "Broker destinations".

>>> from usp_receiver import JWKS, SigningKey
>>> key = SigningKey.generate()
>>> url = "nats://nats.internal:4222?subject=usp.events"
>>> body = b'{"event_id": "evt_1"}'
>>> headers = sign_message_headers(url, body, [key], created=1_800_000_000)
>>> verify_message(url, headers, body, JWKS([key.public]), now=1_800_000_000).kid == key.kid
True
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Final

from usp_receiver._digest import content_digest
from usp_receiver._keys import KeyResolver, SigningKey
from usp_receiver._sign import sign_message
from usp_receiver._verify import USP_TAG, VerificationPolicy, Verified, Verifier

__all__ = ["MESSAGE_COMPONENTS", "destination", "sign_message_headers", "verify_message"]

#: What a message's signature covers.
MESSAGE_COMPONENTS: Final = ("@target-uri", "content-digest", "content-type")
_CONTENT_TYPE: Final = "application/json"
_USERINFO = re.compile(r"^([a-z][a-z0-9+.\-]*://)[^/@]*@", re.IGNORECASE)


def destination(url: str, *, mask: str | None = None) -> str:
    """The destination URL as signed: without the credentials in it (or, given ``mask``, with
    them replaced by it, as views show a URL).

    >>> destination("amqp://usp:s3cret@rabbit.internal:5672/%2F?exchange=usp")
    'amqp://rabbit.internal:5672/%2F?exchange=usp'
    >>> destination("amqp://usp:s3cret@rabbit.internal:5672/%2F", mask="***")
    'amqp://***@rabbit.internal:5672/%2F'
    """
    return _USERINFO.sub(r"\1" if mask is None else rf"\1{mask}@", url)


def sign_message_headers(
    url: str, body: bytes, keys: Sequence[SigningKey], *, created: int | None = None
) -> dict[str, str]:
    """The headers a message to ``url`` carries: content type, digest, and one signature per key
    (``sig1`` the newest, as on every delivery)."""
    target = destination(url)
    headers = {"Content-Type": _CONTENT_TYPE, "Content-Digest": content_digest(body)}
    moment = int(time.time()) if created is None else created
    inputs, signatures = [], []
    for index, key in enumerate(keys, start=1):
        member = sign_message(
            "POST",
            target,
            headers,
            key,
            label=f"sig{index}",
            components=MESSAGE_COMPONENTS,
            created=moment,
            tag=USP_TAG,
        )
        inputs.append(member.signature_input)
        signatures.append(member.signature)
    return headers | {"Signature-Input": ", ".join(inputs), "Signature": ", ".join(signatures)}


def verify_message(
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    keys: KeyResolver,
    *,
    max_age: float = 300.0,
    now: float | None = None,
) -> Verified:
    """Verify a message read from ``url`` (the destination the consumer reads, credentials or
    not): the digest, the signature of a trusted key over the message profile, the replay
    window. Raises the same typed errors as :meth:`usp_receiver.Verifier.verify`. A consumer that
    reads a backlog older than ``max_age`` raises it (and deduplicates on ``event_id`` as ever)."""
    policy = VerificationPolicy(required_components=MESSAGE_COMPONENTS, max_age=max_age)
    return Verifier(keys, policy).verify("POST", destination(url), headers, body, now=now)
