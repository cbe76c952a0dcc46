"""Compact JWS (RFC 7515) with this package's keys, strict: the one codec behind in-band
notification signatures (:mod:`usp_receiver`) and the dispatcher's booking credentials and key
proofs. Headers and payloads are RFC 8785 (JCS) JSON, so a token's bytes never depend on dict order.
"""

from __future__ import annotations

import binascii
import json
import re
from dataclasses import dataclass
from typing import Any, Final

import rfc8785

from usp_receiver._keys import JOSE_TO_HTTPSIG, PublicKey, SigningKey, b64url_encode

__all__ = [
    "JOSE_ALGS",
    "JWSError",
    "ParsedJWS",
    "b64url",
    "parse_jws",
    "peek_header",
    "sign_jws",
    "unb64url",
]

#: The JOSE ``alg`` names a JWS here may carry → the key algorithm (RFC 9421 name) each requires,
#: from the key module's one table. ``Ed25519`` is RFC 9864's fully specified name for EdDSA.
JOSE_ALGS: Final[dict[str, str]] = {alg: JOSE_TO_HTTPSIG[alg] for alg in ("EdDSA", "Ed25519", "ES256")}
_B64URL: Final = re.compile(r"[A-Za-z0-9_-]*")
_MAX_TOKEN: Final = 16 * 1024

b64url = b64url_encode


class JWSError(ValueError):
    """Not a well-formed compact JWS (the message is safe to show: it never echoes the input)."""


@dataclass(frozen=True)
class ParsedJWS:
    """A parsed, not yet verified, compact JWS. ``claims`` is empty for a detached one."""

    header: dict[str, Any]
    claims: dict[str, Any]
    encoded_header: str
    signature: bytes
    signing_input: bytes

    def verifies_with(self, key: PublicKey) -> bool:
        """The header's ``alg`` is the key's own and the signature holds. Never raises."""
        alg = self.header.get("alg")
        return (
            isinstance(alg, str)
            and JOSE_ALGS.get(alg) == key.alg
            and key.verify(self.signature, self.signing_input)
        )


def unb64url(text: str, what: str = "part") -> bytes:
    """Unpadded base64url in its one canonical spelling: no padding, no stray characters, no
    non-zero trailing bits (a signature with two spellings would be malleable)."""
    if not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        raise JWSError(f"JWS {what} is not unpadded base64url")
    try:
        data = binascii.a2b_base64(text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4))
    except binascii.Error:
        raise JWSError(f"JWS {what} is not unpadded base64url") from None
    if b64url(data) != text:
        raise JWSError(f"JWS {what} is not canonical base64url")
    return data


def sign_jws(
    header: dict[str, Any], payload: bytes | dict[str, Any], key: SigningKey, *, detached: bool = False
) -> str:
    """``<header>.<payload>.<signature>``, the header given the key's ``alg``; a dict payload is
    written as JCS. ``detached`` leaves the payload part empty (RFC 7515 Appendix F): the
    verifier rebuilds it. ``ValueError`` for a key with no JOSE form or a payload JCS refuses."""
    if key.alg not in JOSE_ALGS.values():
        raise ValueError(f"JWS signing needs an ed25519 or ecdsa-p256-sha256 key, not {key.alg!r}")
    encoded_header = b64url(rfc8785.dumps(header | {"alg": key.public.jose_alg}))
    encoded_payload = b64url(payload if isinstance(payload, bytes) else rfc8785.dumps(payload))
    signature = b64url(key.sign(f"{encoded_header}.{encoded_payload}".encode("ascii")))
    return f"{encoded_header}.{'' if detached else encoded_payload}.{signature}"


def parse_jws(token: object, *, detached_payload: bytes | None = None) -> ParsedJWS:
    """Split and decode a compact JWS whose header and payload are JSON objects; with
    ``detached_payload``, the payload part must be empty and these bytes are what was signed.
    ``JWSError`` for anything else, ``crit`` and ``b64`` included (no extension is understood)."""
    if not isinstance(token, str) or len(token) > _MAX_TOKEN:
        raise JWSError("not a compact JWS")
    parts = token.split(".")
    if len(parts) != 3:
        raise JWSError("not a compact JWS (three dot-separated parts)")
    encoded_header, encoded_payload, encoded_signature = parts
    header = json_object(unb64url(encoded_header, "protected header"), "protected header")
    for member in ("crit", "b64"):
        if member in header:
            raise JWSError(f"JWS header member {member!r} is not supported")
    alg = header.get("alg")
    if not isinstance(alg, str) or alg not in JOSE_ALGS:
        raise JWSError(f"JWS alg must be one of {sorted(JOSE_ALGS)}")
    claims: dict[str, Any] = {}
    if detached_payload is not None:
        if encoded_payload:
            raise JWSError("the JWS must be detached (an empty payload part)")
        encoded_payload = b64url(detached_payload)
    else:
        claims = json_object(unb64url(encoded_payload, "payload"), "payload")
    signature = unb64url(encoded_signature, "signature")
    return ParsedJWS(
        header, claims, encoded_header, signature, f"{encoded_header}.{encoded_payload}".encode("ascii")
    )


def peek_header(token: object) -> dict[str, Any] | None:
    """The protected header of something shaped like a compact JWS, else ``None`` (no checks)."""
    if not isinstance(token, str) or token.count(".") != 2 or len(token) > _MAX_TOKEN:
        return None
    try:
        return json_object(unb64url(token.split(".", 1)[0]), "protected header")
    except JWSError:
        return None


def json_object(raw: bytes, what: str) -> dict[str, Any]:
    """Strict JSON: UTF-8, no duplicate members (RFC 7515 §4: reject or take the last; we
    reject), no NaN or Infinity, and an object."""
    try:
        value = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise JWSError(f"JWS {what} is not valid JSON") from None
    if not isinstance(value, dict):
        raise JWSError(f"JWS {what} must be a JSON object")
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("duplicate member")
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
