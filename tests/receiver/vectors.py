"""The RFC 9421 test vectors: ``tests/fixtures/rfc9421.json`` (RFC 9421 Appendix B keys and
cases, RFC 9530, Web Bot Auth draft vectors; public RFC test data, each part's source is named in
the file's ``source`` fields). Kept in the repository so a fresh clone runs every test."""

from __future__ import annotations

import base64
import json
from functools import cache
from pathlib import Path
from typing import Any

from usp_receiver import PublicKey, SigningKey
from usp_receiver._keys import b64url_encode

VECTORS = Path(__file__).resolve().parents[1] / "fixtures" / "rfc9421.json"


@cache
def vectors() -> dict[str, Any]:
    """The vector file (no skip: it ships with the tests)."""
    return dict(json.loads(VECTORS.read_text()))


def case(case_id: str) -> dict[str, Any]:
    return dict(next(c for c in vectors()["cases"] if c["id"] == case_id))


# The vector file names RSA keys without an alg; the RFC says which algorithm each case uses.
_RSA_ALG = {"test-key-rsa-pss": "rsa-pss-sha512", "test-key-rsa": "rsa-v1_5-sha256"}


def _secret_jwk() -> dict[str, str]:
    secret = base64.b64decode(vectors()["keys"]["test-shared-secret"]["shared_secret_base64"])
    return {"kty": "oct", "k": b64url_encode(secret), "kid": "test-shared-secret"}


def public_key(name: str) -> PublicKey:
    if name == "test-shared-secret":
        return PublicKey.from_jwk(_secret_jwk())
    return PublicKey.from_jwk(vectors()["keys"][name]["jwk"], alg=_RSA_ALG.get(name))


def signing_key(name: str) -> SigningKey:
    if name == "test-shared-secret":
        return SigningKey.from_jwk(_secret_jwk())
    return SigningKey.from_jwk(vectors()["keys"][name]["jwk"], alg=_RSA_ALG.get(name))


def all_public_keys() -> list[PublicKey]:
    return [public_key(name) for name in vectors()["keys"]]
