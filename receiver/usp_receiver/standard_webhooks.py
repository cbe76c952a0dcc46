"""Standard Webhooks 1.0 signatures (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``),
which a subscription may ask for beside the RFC 9421 ones: signing for the sender, verifying here.

``v1`` is HMAC-SHA256 under a ``whsec_`` secret, ``v1a`` Ed25519 under a ``whpk_`` public key; the
signed content is ``{webhook-id}.{webhook-timestamp}.{body}``. Why both schemes, and which a
platform should verify: docs/protocol.md, "Two signature schemes".

>>> secret = new_secret()
>>> headers = sign("evt_1", 1_700_000_000, b"{}", secrets=[secret])
>>> verify(headers, b"{}", secrets=[secret], now=1_700_000_010)
'evt_1'
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from usp_receiver._errors import (
    BadSignature,
    FutureSignature,
    MalformedSignature,
    MissingSignature,
    StaleSignature,
    VerificationError,
)
from usp_receiver._message import HeadersInput, normalize_fields

if TYPE_CHECKING:
    from usp_receiver._verify import Verified, Verifier

__all__ = [
    "PUBLIC_KEY_PREFIX",
    "SECRET_KEY_PREFIX",
    "SECRET_PREFIX",
    "TOLERANCE",
    "StandardVerified",
    "StandardWebhooksVerifier",
    "new_secret",
    "new_signing_key",
    "public_key_of",
    "sign",
    "verify",
]

SECRET_PREFIX = "whsec_"  # noqa: S105 (a prefix, not a secret)
SECRET_KEY_PREFIX = "whsk_"  # noqa: S105
PUBLIC_KEY_PREFIX = "whpk_"
#: Seconds a ``webhook-timestamp`` may be off, either way: the spec's libraries use five minutes.
TOLERANCE = 300
#: Signatures one header may carry before it is refused unread (a rotation sends two per scheme).
MAX_SIGNATURES = 8


def new_secret() -> str:
    """A fresh ``whsec_`` secret: 32 random bytes (the spec asks for 24 to 64)."""
    return SECRET_PREFIX + base64.b64encode(os.urandom(32)).decode("ascii")


def new_signing_key() -> str:
    """A fresh Ed25519 private key as ``whsk_`` + base64 of its 32-byte seed."""
    seed = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return SECRET_KEY_PREFIX + base64.b64encode(seed).decode("ascii")


def public_key_of(signing_key: str) -> str:
    """The ``whpk_`` public key of a ``whsk_`` signing key: what a platform verifies ``v1a`` with."""
    public = (
        _private(signing_key)
        .public_key()
        .public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    )
    return PUBLIC_KEY_PREFIX + base64.b64encode(public).decode("ascii")


def sign(
    msg_id: str,
    timestamp: int,
    body: bytes,
    *,
    secrets: Sequence[str] = (),
    signing_keys: Sequence[str] = (),
) -> dict[str, str]:
    """The three headers for one send: a ``v1`` signature per secret, a ``v1a`` per signing key
    (during a rotation, the new and the old one each)."""
    if "." in msg_id:
        raise ValueError("a webhook-id must not contain '.': it delimits the signed content")
    content = _content(msg_id, str(timestamp), body)
    signatures = [f"v1,{_b64(hmac.digest(_secret_bytes(s), content, hashlib.sha256))}" for s in secrets]
    signatures += [f"v1a,{_b64(_private(k).sign(content))}" for k in signing_keys]
    if not signatures:
        raise ValueError("no secret and no signing key to sign with")
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signatures),
    }


def verify(
    headers: Mapping[str, str],
    body: bytes,
    *,
    secrets: Sequence[str] = (),
    public_keys: Sequence[str] = (),
    tolerance: int = TOLERANCE,
    now: float | None = None,
) -> str:
    """The ``webhook-id`` of a request one of whose signatures holds under ``secrets`` (``v1``)
    or ``public_keys`` (``v1a``); else raise :class:`MissingSignature`,
    :class:`MalformedSignature`, :class:`StaleSignature`, :class:`FutureSignature` or
    :class:`BadSignature`. Header names are matched case-insensitively."""
    return _verified(headers, body, secrets, public_keys, tolerance, now)[0]


def _verified(
    headers: Mapping[str, str],
    body: bytes,
    secrets: Sequence[str],
    public_keys: Sequence[str],
    tolerance: int,
    now: float | None,
) -> tuple[str, str]:
    """:func:`verify`'s work: the ``webhook-id`` and the scheme (``v1``, ``v1a``) that held."""
    fields = {name.lower(): value for name, value in headers.items()}
    msg_id, stamp, header = (fields.get(f"webhook-{n}") for n in ("id", "timestamp", "signature"))
    if msg_id is None or stamp is None or header is None:
        raise MissingSignature("webhook-id, webhook-timestamp and webhook-signature must all be present")
    if not stamp.isascii() or not stamp.isdigit() or len(stamp) > 12:
        raise MalformedSignature(f"webhook-timestamp is not Unix seconds: {stamp[:40]!r}")
    moment = time.time() if now is None else now
    if int(stamp) < moment - tolerance:
        raise StaleSignature(f"webhook-timestamp is {moment - int(stamp):.0f} s old")
    if int(stamp) > moment + tolerance:
        raise FutureSignature(f"webhook-timestamp is {int(stamp) - moment:.0f} s in the future")
    entries = header.split()
    if len(entries) > MAX_SIGNATURES:
        raise MalformedSignature(
            f"webhook-signature carries {len(entries)} signatures, more than {MAX_SIGNATURES}"
        )
    content = _content(msg_id, stamp, body)
    macs = [hmac.digest(_secret_bytes(s), content, hashlib.sha256) for s in secrets]
    keys = [_public(k) for k in public_keys]
    for entry in entries:
        version, _, value = entry.partition(",")
        try:
            signature = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            continue
        if version == "v1" and any(hmac.compare_digest(signature, mac) for mac in macs):
            return msg_id, version
        if version == "v1a" and any(_holds(key, signature, content) for key in keys):
            return msg_id, version
    raise BadSignature("no webhook-signature entry holds under the secrets and keys given")


def _content(msg_id: str, stamp: str, body: bytes) -> bytes:
    return f"{msg_id}.{stamp}.".encode() + body


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _secret_bytes(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


# Loading a key costs about as much as a signature (the private one derives its public half):
# a worker signs every try of a subscription with the same key, a receiver verifies with the same
# one, so each is loaded once. Measured with timeit on a 1 KB body (2026-12-07): a v1a sign took
# 100 µs loading the key each time and 53 µs with it cached, against a raw Ed25519 sign's 40 µs
# (loading alone: 36 µs).
@functools.lru_cache(maxsize=256)
def _private(signing_key: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(base64.b64decode(signing_key.removeprefix(SECRET_KEY_PREFIX)))


@functools.lru_cache(maxsize=256)
def _public(public_key: str) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key.removeprefix(PUBLIC_KEY_PREFIX)))


def _holds(key: Ed25519PublicKey, signature: bytes, content: bytes) -> bool:
    try:
        key.verify(signature, content)
    except InvalidSignature:
        return False
    return True


@dataclass(frozen=True, slots=True)
class StandardVerified:
    """A request whose Standard Webhooks signature held: ``scheme`` ``v1`` or ``v1a``."""

    scheme: str
    webhook_id: str

    @property
    def kid(self) -> str:
        """What signed, as handlers print it for an RFC 9421 key: the scheme."""
        return f"standard-webhooks {self.scheme}"


class StandardWebhooksVerifier:
    """The verifier a :class:`~usp_receiver.WebhookReceiver` takes for Standard Webhooks: ``v1``
    under ``secrets``, ``v1a`` under ``public_keys``; with ``rfc9421``, a request this scheme
    does not vouch for (no such headers, or none that holds) is judged by RFC 9421 instead, so a
    platform moving between the two loses no delivery.

    >>> from usp_receiver import WebhookReceiver
    >>> receiver = WebhookReceiver(StandardWebhooksVerifier(secrets=[new_secret()]), print)
    """

    def __init__(
        self,
        *,
        secrets: Sequence[str] = (),
        public_keys: Sequence[str] = (),
        tolerance: int = TOLERANCE,
        rfc9421: Verifier | None = None,
    ) -> None:
        if not secrets and not public_keys and rfc9421 is None:
            raise ValueError("give the whsec_ secrets, the whpk_ public keys, or both")
        self.secrets = tuple(secrets)
        self.public_keys = tuple(public_keys)
        self.tolerance = tolerance
        self.rfc9421 = rfc9421

    def verify(
        self, method: str, url: str, headers: HeadersInput, body: bytes, *, now: float | None = None
    ) -> StandardVerified | Verified:
        try:
            return self._standard(headers, body, now)
        except VerificationError:
            if self.rfc9421 is None:
                raise
        return self.rfc9421.verify(method, url, headers, body, now=now)

    async def averify(
        self, method: str, url: str, headers: HeadersInput, body: bytes, *, now: float | None = None
    ) -> StandardVerified | Verified:
        try:
            return self._standard(headers, body, now)
        except VerificationError:
            if self.rfc9421 is None:
                raise
        return await self.rfc9421.averify(method, url, headers, body, now=now)

    def _standard(self, headers: HeadersInput, body: bytes, now: float | None) -> StandardVerified:
        if not self.secrets and not self.public_keys:
            raise MissingSignature("no Standard Webhooks secret or key is configured")
        fields = {name: ", ".join(lines) for name, lines in normalize_fields(headers).items()}
        webhook_id, scheme = _verified(fields, body, self.secrets, self.public_keys, self.tolerance, now)
        return StandardVerified(scheme, webhook_id)
