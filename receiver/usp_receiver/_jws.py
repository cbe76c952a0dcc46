"""In-band signatures for ``usp_webhook`` notifications on a live MCP session.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_receiver._jws``.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import rfc8785

from usp_receiver._errors import (
    BadSignature,
    FutureSignature,
    MalformedSignature,
    MissingSignature,
    StaleSignature,
    UnknownKey,
)
from usp_receiver._keys import KeyResolver, PublicKey, SigningKey
from usp_receiver.jose import JOSE_ALGS, JWSError, ParsedJWS, parse_jws, sign_jws

__all__ = [
    "JWS_TYP",
    "VerifiedNotification",
    "averify_notification_params",
    "canonical_notification_payload",
    "sign_notification_params",
    "verify_notification_params",
]

#: The ``typ`` of the protected header (RFC 7515 §4.1.9; ``application/`` may be prefixed).
JWS_TYP: Final = "usp-webhook+jws"

#: Both algorithms produce 64-byte signatures (Ed25519; r‖s for P-256).
_SIGNATURE_LENGTH: Final = 64
_MAX_IAT: Final = 2**53


@dataclass(frozen=True)
class VerifiedNotification:
    """What a valid in-band signature proves: who signed (``kid``, ``alg``), when (``iat``), and
    exactly what (``params``: the signed params without the signature, a fresh copy rebuilt from
    the canonical bytes, so nothing unsigned can ride along).

    >>> key = SigningKey.generate()
    >>> signed = sign_notification_params({"event_id": "evt_1"}, key)
    >>> keys = _OneKey(key.public)  # any KeyResolver: a JWKS, a dict of trusted keys...
    >>> verify_notification_params(signed, keys).params
    {'event_id': 'evt_1'}
    """

    kid: str
    alg: str
    iat: int | float
    params: dict[str, Any]


def canonical_notification_payload(params: Mapping[str, Any]) -> bytes:
    """The bytes the JWS signs: JCS of ``params`` minus ``_meta.usp.signature`` (see module doc).

    Exposed so that other implementations can be checked against it byte for byte.

    >>> canonical_notification_payload({"b": 1, "a": [1.0, "x"], "_meta": {"usp": {"signature": "s"}}})
    b'{"a":[1,"x"],"b":1}'

    Raises ``ValueError`` when ``params`` is outside the JSON domain JCS accepts.
    """
    try:
        return rfc8785.dumps(_strip_signature(params))
    except (ValueError, TypeError, RecursionError) as exc:
        raise ValueError(f"params cannot be canonicalized (RFC 8785): {exc}") from None


def sign_notification_params(
    params: Mapping[str, Any], key: SigningKey, *, iat: int | None = None
) -> dict[str, Any]:
    """A deep copy of ``params`` with ``_meta.usp.signature`` set to a detached compact JWS.

    Any signature already present is replaced, and other ``_meta`` members are kept (and signed).
    ``iat`` defaults to now; pass it to make the output reproducible.

    >>> key = SigningKey.generate()
    >>> signed = sign_notification_params({"event": "booking.confirmed", "event_id": "evt_1"}, key)
    >>> header, payload, signature = signed["_meta"]["usp"]["signature"].split(".")
    >>> payload
    ''

    Raises ``ValueError`` for a key whose algorithm has no in-band form (only Ed25519 and P-256
    keys sign notifications), a non-object ``_meta``/``_meta.usp``, or params JCS cannot encode.
    """
    header: dict[str, Any] = {"kid": key.kid, "typ": JWS_TYP, "iat": int(time.time()) if iat is None else iat}
    token = sign_jws(header, canonical_notification_payload(params), key, detached=True)

    signed = copy.deepcopy(dict(params))
    meta = signed.setdefault("_meta", {})
    if not isinstance(meta, dict):
        raise ValueError("params._meta must be an object")
    usp = meta.setdefault("usp", {})
    if not isinstance(usp, dict):
        raise ValueError("params._meta.usp must be an object")
    usp["signature"] = token
    return signed


def verify_notification_params(
    params: Any,
    keys: KeyResolver,
    *,
    now: float | None = None,
    max_age: float = 300,
    max_future: float = 60,
) -> VerifiedNotification:
    """Check the in-band JWS of a notification's ``params``; return what it proves.

    ``iat`` may be at most ``max_age`` seconds old and ``max_future`` seconds ahead of ``now``
    (default: the current time), the same replay window as the HTTP profile.

    >>> key = SigningKey.generate()
    >>> signed = sign_notification_params({"event_id": "evt_1"}, key, iat=1_000)
    >>> keys = _OneKey(key.public)  # any KeyResolver: a JWKS, a dict of trusted keys...
    >>> verify_notification_params(signed, keys, now=1_010).kid == key.kid
    True

    Raises only :class:`~usp_receiver.ReceiverError` subclasses, whatever ``params`` holds:
    ``MissingSignature``, ``MalformedSignature``, ``UnknownKey``, ``BadSignature``,
    ``StaleSignature``, ``FutureSignature`` (and ``KeyFetchError`` from a remote resolver).
    """
    parsed = _parse(params)
    return _finish(parsed, keys.resolve(parsed.kid), now=now, max_age=max_age, max_future=max_future)


async def averify_notification_params(
    params: Any,
    keys: KeyResolver,
    *,
    now: float | None = None,
    max_age: float = 300,
    max_future: float = 60,
) -> VerifiedNotification:
    """:func:`verify_notification_params` for async callers: the key lookup uses
    ``keys.aresolve``, so a JWKS refresh never blocks the event loop.

    >>> import asyncio
    >>> key = SigningKey.generate()
    >>> signed = sign_notification_params({"event_id": "evt_1"}, key)
    >>> keys = _OneKey(key.public)  # any KeyResolver: a JWKS, a dict of trusted keys...
    >>> asyncio.run(averify_notification_params(signed, keys)).params["event_id"]
    'evt_1'
    """
    parsed = _parse(params)
    return _finish(parsed, await keys.aresolve(parsed.kid), now=now, max_age=max_age, max_future=max_future)


@dataclass(frozen=True)
class _Parsed:
    """The notification's JWS, the header fields this profile requires, and the signed params."""

    jws: ParsedJWS
    kid: str
    alg: str
    iat: int | float
    params: dict[str, Any]


def _parse(params: Any) -> _Parsed:
    """Everything that needs no key: locate, split and decode the JWS, canonicalize the payload."""
    if not isinstance(params, Mapping):
        raise MalformedSignature("notification params must be a JSON object")
    meta = params.get("_meta")
    if meta is None:
        raise MissingSignature("no _meta.usp.signature in the notification")
    if not isinstance(meta, Mapping):
        raise MalformedSignature("params._meta must be an object")
    usp = meta.get("usp")
    if usp is None:
        raise MissingSignature("no _meta.usp.signature in the notification")
    if not isinstance(usp, Mapping):
        raise MalformedSignature("params._meta.usp must be an object")
    token = usp.get("signature")
    if token is None:
        raise MissingSignature("no _meta.usp.signature in the notification")
    if not isinstance(token, str):
        raise MalformedSignature("_meta.usp.signature must be a string")

    try:
        payload = rfc8785.dumps(_strip_signature(params))
        # The handler gets what was signed, rebuilt from the signed bytes: a fresh deep copy in
        # which nothing unsigned (a tuple, a subclass with extra state...) can survive.
        canonical = json.loads(payload)
    except (ValueError, TypeError, RecursionError):
        raise MalformedSignature("notification params are not canonicalizable JSON (RFC 8785)") from None
    try:
        parsed = parse_jws(token, detached_payload=payload)
    except JWSError as exc:
        raise MalformedSignature(f"_meta.usp.signature: {exc}") from None
    header = _checked_header(parsed.header)
    if len(parsed.signature) != _SIGNATURE_LENGTH:
        raise MalformedSignature(
            f"JWS signature must be {_SIGNATURE_LENGTH} bytes, got {len(parsed.signature)}"
        )
    return _Parsed(jws=parsed, kid=header["kid"], alg=header["alg"], iat=header["iat"], params=canonical)


def _checked_header(header: dict[str, Any]) -> dict[str, Any]:
    """What this profile asks of the header beyond a well-formed JWS (``alg``, no ``crit``)."""
    kid, typ, iat = header.get("kid"), header.get("typ"), header.get("iat")
    if not isinstance(kid, str) or not kid:
        raise MalformedSignature("JWS kid must be a non-empty string")
    if not isinstance(typ, str) or typ.lower().removeprefix("application/") != JWS_TYP:
        raise MalformedSignature(f"JWS typ must be {JWS_TYP!r}")
    # NumericDate; bounded so that clock arithmetic on it can never overflow a float.
    if isinstance(iat, bool) or not isinstance(iat, int | float) or not abs(iat) < _MAX_IAT:
        raise MalformedSignature("JWS iat must be a number (NumericDate)")
    return header


def _finish(
    parsed: _Parsed, key: PublicKey | None, *, now: float | None, max_age: float, max_future: float
) -> VerifiedNotification:
    """The key-dependent checks, in an order that never lets forged input pick the error."""
    if key is None:
        raise UnknownKey(f"no trusted key has kid {_short(parsed.kid)}")
    if JOSE_ALGS[parsed.alg] != key.alg:
        # The key names its algorithm; a header that names another is refused, never obeyed.
        raise BadSignature(f"JWS alg {parsed.alg!r} does not match key {_short(key.kid)} ({key.jose_alg})")
    if not key.verify(parsed.jws.signature, parsed.jws.signing_input):
        raise BadSignature(f"in-band JWS by key {_short(key.kid)} does not verify")
    # Freshness only once the signature holds: an unauthenticated iat proves nothing.
    current = time.time() if now is None else now
    if current - parsed.iat > max_age:
        raise StaleSignature(f"JWS iat is {current - parsed.iat:.0f} s old (max {max_age:g} s)")
    if parsed.iat - current > max_future:
        raise FutureSignature(f"JWS iat is {parsed.iat - current:.0f} s ahead (max {max_future:g} s)")
    return VerifiedNotification(kid=parsed.kid, alg=parsed.alg, iat=parsed.iat, params=parsed.params)


def _strip_signature(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` without ``_meta.usp.signature``, then without an empty ``_meta.usp``, then
    without an empty ``_meta``: emptiness is judged whether or not a signature was there, so a
    sender's own empty ``_meta`` and the one left behind by the removal canonicalize alike.

    Copies only the containers on the path; everything else is shared with ``params``.
    """
    stripped = dict(params)
    meta = stripped.get("_meta")
    if not isinstance(meta, Mapping):
        return stripped
    meta = dict(meta)
    usp = meta.get("usp")
    if isinstance(usp, Mapping):
        usp = {name: value for name, value in usp.items() if name != "signature"}
        if usp:
            meta["usp"] = usp
        else:
            del meta["usp"]
    if meta:
        stripped["_meta"] = meta
    else:
        del stripped["_meta"]
    return stripped


def _short(text: str) -> str:
    """A bounded, quoted rendering of attacker-controlled text for messages and logs."""
    return repr(text[:64] + ("…" if len(text) > 64 else ""))


class _OneKey:
    """A one-key resolver for the doctests."""

    def __init__(self, key: PublicKey) -> None:
        self._key = key

    def resolve(self, kid: str) -> PublicKey | None:
        return self._key if kid == self._key.kid else None

    async def aresolve(self, kid: str) -> PublicKey | None:
        return self.resolve(kid)
