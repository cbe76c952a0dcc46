"""One typed error hierarchy with stable, machine-readable reason codes.

Receivers map ``reason`` to HTTP answers and metrics; the human ``str()`` may change between
releases, the ``reason`` never does. Every failure the verifier can meet on hostile input is one of
these: a fuzzer feeding any bytes to the verifier sees nothing else.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "BadSignature",
    "DigestMismatch",
    "DuplicateEvent",
    "ExpiredSignature",
    "FutureSignature",
    "InvalidEvent",
    "KeyFetchError",
    "MalformedSignature",
    "MissingComponent",
    "MissingSignature",
    "ReceiverError",
    "StaleSignature",
    "TagMismatch",
    "UnknownKey",
    "VerificationError",
]


class ReceiverError(Exception):
    """Base of every error this library raises on purpose.

    ``reason`` is a stable snake_case code, e.g. ``"bad_signature"``.

    >>> try:
    ...     raise BadSignature("signature sig1 does not verify")
    ... except ReceiverError as exc:
    ...     exc.reason
    'bad_signature'
    """

    reason: ClassVar[str] = "receiver_error"

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail or self.reason)
        self.detail = detail or self.reason


class VerificationError(ReceiverError):
    """The message is not provably from a trusted key, or breaks the replay policy (HTTP 401)."""

    reason: ClassVar[str] = "verification_failed"


class MissingSignature(VerificationError):
    """No ``Signature``/``Signature-Input`` (or no in-band JWS) was presented."""

    reason: ClassVar[str] = "missing_signature"


class MalformedSignature(VerificationError):
    """A signature field or JWS is present but cannot be parsed or has the wrong types."""

    reason: ClassVar[str] = "malformed_signature"


class UnknownKey(VerificationError):
    """No trusted key has the signature's ``keyid``, even after refreshing the JWKS."""

    reason: ClassVar[str] = "unknown_key"


class BadSignature(VerificationError):
    """The cryptographic check failed, or the algorithm does not match the key."""

    reason: ClassVar[str] = "bad_signature"


class DigestMismatch(VerificationError):
    """``Content-Digest`` is absent, malformed or does not match the body bytes."""

    reason: ClassVar[str] = "digest_mismatch"


class MissingComponent(VerificationError):
    """The signature does not cover a component or parameter the policy requires."""

    reason: ClassVar[str] = "missing_component"


class StaleSignature(VerificationError):
    """``created`` is older than the replay window allows."""

    reason: ClassVar[str] = "stale"


class ExpiredSignature(VerificationError):
    """``expires`` is in the past."""

    reason: ClassVar[str] = "expired"


class FutureSignature(VerificationError):
    """``created`` is further ahead than the allowed clock skew."""

    reason: ClassVar[str] = "future"


class TagMismatch(VerificationError):
    """The signature's ``tag`` is not the application tag the policy expects."""

    reason: ClassVar[str] = "tag_mismatch"


class DuplicateEvent(ReceiverError):
    """The ``event_id`` was already processed; answer 2xx and do not run the handler again."""

    reason: ClassVar[str] = "duplicate"


class InvalidEvent(ReceiverError):
    """The signed body is not a valid USP event envelope (HTTP 400)."""

    reason: ClassVar[str] = "invalid_event"


class KeyFetchError(ReceiverError):
    """The remote JWKS could not be fetched or parsed and no cached copy is usable."""

    reason: ClassVar[str] = "key_fetch_failed"
