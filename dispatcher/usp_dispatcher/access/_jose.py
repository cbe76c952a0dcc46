"""Compact JWS (RFC 7515) with the receiver's key types: just what booking credentials and
``platform_key_pop`` proofs need.

Header and payload are serialized with RFC 8785 (JCS), so a token's bytes do not depend on dict
order. Parsing is strict: canonical unpadded base64url only (one spelling per signature, so no
malleability), JSON objects without duplicate members, no ``crit``/``b64`` extensions.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any, Final

import rfc8785

from usp_receiver import PublicKey, SigningKey

__all__ = ["JOSE_ALGS", "JWSError", "ParsedJWS", "b64url", "parse_jws", "peek_header", "sign_jws", "unb64url"]

#: JOSE ``alg`` → the receiver's algorithm name (the key must be of that algorithm).
JOSE_ALGS: Final[dict[str, str]] = {"EdDSA": "ed25519", "Ed25519": "ed25519", "ES256": "ecdsa-p256-sha256"}
_KEY_TO_JOSE: Final[dict[str, str]] = {"ed25519": "EdDSA", "ecdsa-p256-sha256": "ES256"}
_B64URL: Final = re.compile(r"[A-Za-z0-9_-]*")
_MAX_TOKEN: Final = 16 * 1024


class JWSError(ValueError):
    """A token that is not a well-formed compact JWS of ours (the message is safe to show)."""


@dataclass(frozen=True)
class ParsedJWS:
    """A parsed, not yet verified, compact JWS."""

    header: dict[str, Any]
    claims: dict[str, Any]
    signing_input: bytes
    signature: bytes

    def verifies_with(self, key: PublicKey) -> bool:
        """The header's ``alg`` is the key's own and the signature holds. Never raises."""
        alg = self.header.get("alg")
        return (
            isinstance(alg, str)
            and JOSE_ALGS.get(alg) == key.alg
            and key.verify(self.signature, self.signing_input)
        )


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes:
    """Strict decoding: ``JWSError`` for padding, stray characters or non-canonical spellings."""
    if not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        raise JWSError("not unpadded base64url")
    try:
        data = binascii.a2b_base64(text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4))
    except binascii.Error:
        raise JWSError("not unpadded base64url") from None
    if b64url(data) != text:
        raise JWSError("not canonical base64url")
    return data


def sign_jws(header: dict[str, Any], claims: dict[str, Any], key: SigningKey) -> str:
    """``header`` gets the key's ``alg``; returns ``<header>.<payload>.<signature>``."""
    alg = _KEY_TO_JOSE.get(key.alg)
    if alg is None:
        raise ValueError(f"JWS signing needs an ed25519 or ecdsa-p256-sha256 key, not {key.alg!r}")
    signing_input = f"{b64url(rfc8785.dumps(header | {'alg': alg}))}.{b64url(rfc8785.dumps(claims))}"
    return f"{signing_input}.{b64url(key.sign(signing_input.encode('ascii')))}"


def parse_jws(token: str) -> ParsedJWS:
    """Split and decode; ``JWSError`` for anything that is not a compact JWS with JSON objects."""
    if not isinstance(token, str) or len(token) > _MAX_TOKEN:
        raise JWSError("not a compact JWS")
    parts = token.split(".")
    if len(parts) != 3:
        raise JWSError("not a compact JWS (three dot-separated parts)")
    header = _json_object(unb64url(parts[0]), "header")
    claims = _json_object(unb64url(parts[1]), "payload")
    for member in ("crit", "b64"):
        if member in header:
            raise JWSError(f"JWS header member {member!r} is not supported")
    if header.get("alg") not in JOSE_ALGS:
        raise JWSError(f"JWS alg must be one of {sorted(JOSE_ALGS)}")
    return ParsedJWS(header, claims, f"{parts[0]}.{parts[1]}".encode("ascii"), unb64url(parts[2]))


def peek_header(token: str) -> dict[str, Any] | None:
    """The protected header of something shaped like a compact JWS, else ``None`` (no checks)."""
    if not isinstance(token, str) or token.count(".") != 2 or len(token) > _MAX_TOKEN:
        return None
    try:
        return _json_object(unb64url(token.split(".", 1)[0]), "header")
    except JWSError:
        return None


def _json_object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        value = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise JWSError(f"JWS {what} is not JSON") from None
    if not isinstance(value, dict):
        raise JWSError(f"JWS {what} is not a JSON object")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("duplicate member")
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
