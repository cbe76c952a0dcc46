"""Booking-scoped credentials, and the ``platform_key_pop`` proofs that go with bound ones.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.access.credentials``.
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, TypeGuard

import rfc8785
from sqlmodel import Session

from usp_core.clock import utcnow
from usp_core.keycache import current_signing_keys
from usp_core.keys import published_jwks
from usp_dispatcher.access.errors import unauthenticated
from usp_dispatcher.settings import ApiSettings
from usp_receiver import JWKS, PublicKey, SigningKey, jwk_thumbprint
from usp_receiver.jose import JWSError, b64url, parse_jws, peek_header, sign_jws

__all__ = [
    "CREDENTIAL_TYP",
    "MECHANISM",
    "POP_TYP",
    "PROOF_WINDOW_SECONDS",
    "SCOPED_TOOLS",
    "BookingCredential",
    "issue_booking_credential",
    "looks_like_booking_credential",
    "make_pop_proof",
    "proof_digest",
    "proof_holds",
    "verify_booking_credential",
]

MECHANISM: Final = "booking_scoped_credential"
CREDENTIAL_TYP: Final = "usp-booking-credential+jwt"
POP_TYP: Final = "usp-pop+jwt"
#: The tools a booking-scoped credential opens (never ``usp_bookings_confirm``: business only).
SCOPED_TOOLS: Final = ("usp_bookings_get", "usp_bookings_cancel", "usp_bookings_reschedule")
PROOF_WINDOW_SECONDS: Final = 300
#: ``params._meta`` members a transport adds after signing (W3C trace context and baggage, as
#: OpenTelemetry's default propagators write them): outside ``usp_p``.
TRACE_CONTEXT: Final = ("traceparent", "tracestate", "baggage")
_CLOCK_SKEW: Final = 60


@dataclass(frozen=True)
class BookingCredential:
    """A credential whose signature and lifetime hold (its ``cnf`` is checked by the caller)."""

    booking_id: str
    profile: str | None
    scope: tuple[str, ...]
    issued_at: int
    expires_at: int
    jkt: str | None


def issue_booking_credential(
    session: Session,
    settings: ApiSettings,
    *,
    booking_id: str,
    profile: str | None,
    jkt: str | None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """A fresh credential for ``booking_id``, as ``_meta.usp.authorization`` will carry it back.

    ``{"mechanism": "booking_scoped_credential", "credential": <JWS>, "expires_at": <RFC 3339>,
    "cnf": {"jkt": ...}}`` (``cnf`` only when ``jkt`` is given). Signed by the newest key that
    signs now; ``RuntimeError`` when the business has no signing key.
    """
    moment = now or utcnow()
    # The process's key cache (exact at rotation boundaries; NoSigningKey, a RuntimeError, when
    # none signs): reading and parsing the keys per booking was 14% of a REST booking's time.
    keys = current_signing_keys(session.get_bind().engine, settings, now=moment)
    issued_at = int(moment.timestamp())
    expires_at = issued_at + settings.booking_credential_ttl_seconds
    claims: dict[str, Any] = {
        "iss": settings.public_base_url,
        "sub": booking_id,
        "scope": " ".join(SCOPED_TOOLS),
        "iat": issued_at,
        "exp": expires_at,
    }
    if profile is not None:
        claims["usp_profile"] = profile
    if jkt is not None:
        claims["cnf"] = {"jkt": jkt}
    key = keys[0]
    token = sign_jws({"typ": CREDENTIAL_TYP, "kid": key.kid}, claims, key)
    answer: dict[str, Any] = {
        "mechanism": MECHANISM,
        "credential": token,
        "expires_at": datetime.fromtimestamp(expires_at, UTC).isoformat().replace("+00:00", "Z"),
    }
    if jkt is not None:
        answer["cnf"] = {"jkt": jkt}
    return answer


def looks_like_booking_credential(token: object) -> bool:
    """Shaped like one of our credentials (the header's ``typ``), whatever it was declared as:
    such a token is never tried as a bearer API key."""
    if not isinstance(token, str):
        return False
    header = peek_header(token)
    return header is not None and header.get("typ") == CREDENTIAL_TYP


def verify_booking_credential(
    session: Session, settings: ApiSettings, token: str, *, now: datetime | None = None
) -> BookingCredential:
    """Check signature (against the published keys), issuer and lifetime; ``AccessError``
    (-32001) when any fails. ``cnf`` is returned, not judged: see :func:`proof_holds`."""
    moment = (now or utcnow()).timestamp()
    try:
        parsed = parse_jws(token)
    except JWSError as exc:
        raise unauthenticated(f"the booking credential is malformed ({exc})") from None
    kid = parsed.header.get("kid")
    if parsed.header.get("typ") != CREDENTIAL_TYP or not isinstance(kid, str):
        raise unauthenticated("the booking credential is not one this business issues")
    key = JWKS.from_dict(published_jwks(session, settings, now=now)).get(kid)
    if key is None or not parsed.verifies_with(key):
        raise unauthenticated("the booking credential's signature does not hold")
    claims = parsed.claims
    sub, scope, iat, exp = claims.get("sub"), claims.get("scope"), claims.get("iat"), claims.get("exp")
    profile, cnf = claims.get("usp_profile"), claims.get("cnf")
    if (
        claims.get("iss") != settings.public_base_url
        or not isinstance(sub, str)
        or not isinstance(scope, str)
        or not _is_time(iat)
        or not _is_time(exp)
        or not (profile is None or isinstance(profile, str))
    ):
        raise unauthenticated("the booking credential's claims are not ours")
    jkt: str | None = None
    if cnf is not None:
        if not isinstance(cnf, Mapping) or not isinstance(cnf.get("jkt"), str):
            raise unauthenticated("the booking credential's cnf is malformed")
        jkt = cnf["jkt"]
    if moment >= exp:
        raise unauthenticated("the booking credential has expired")
    if iat > moment + _CLOCK_SKEW:
        raise unauthenticated("the booking credential is not valid yet")
    return BookingCredential(sub, profile, tuple(scope.split()), int(iat), int(exp), jkt)


def proof_holds(proof: object, params: Mapping[str, Any], *, jkt: str, now: datetime | None = None) -> bool:
    """A valid ``platform_key_pop`` proof by the key ``jkt`` over these ``params``. Never raises."""
    if not isinstance(proof, str):
        return False
    try:
        parsed = parse_jws(proof)
        jwk = parsed.header.get("jwk")
        if not isinstance(jwk, Mapping) or "d" in jwk or jwk_thumbprint(jwk) != jkt:
            return False
        key = PublicKey.from_jwk({name: jwk[name] for name in ("kty", "crv", "x", "y") if name in jwk})
        typ = parsed.header.get("typ")
        if (typ is not None and typ != POP_TYP) or not parsed.verifies_with(key):
            return False
        iat, usp_p = parsed.claims.get("iat"), parsed.claims.get("usp_p")
        current = (now or utcnow()).timestamp()
        if not _is_number_time(iat) or abs(current - iat) > PROOF_WINDOW_SECONDS:
            return False
        return isinstance(usp_p, str) and usp_p == proof_digest(params)
    except (JWSError, ValueError, TypeError, KeyError):
        return False


def proof_digest(params: Mapping[str, Any]) -> str:
    """``usp_p``: base64url SHA-256 of the JCS of ``params`` without ``_meta.usp.authorization.proof``
    (looked for in ``params.arguments._meta``, where the binding puts ``_meta.usp``, and in
    ``params._meta``), and without the W3C trace context an MCP client's transport adds to
    ``params._meta`` after the platform signed (SEP-414: the official SDK does whenever
    OpenTelemetry is on); a ``params._meta`` left empty goes too. ``ValueError`` for params JCS
    cannot encode (e.g. a NaN).

    >>> proof_digest({"name": "usp_bookings_get", "arguments": {"booking_id": "bkg_1"}})
    'eFRkRYGAS3JTRk2n9FbnqKxH8z03aFfntuqirWbGVjc'
    """
    stripped = copy.deepcopy(dict(params))
    _drop_proof(stripped)
    meta = stripped.get("_meta")
    if isinstance(meta, dict):
        for name in TRACE_CONTEXT:
            meta.pop(name, None)
        if not meta:
            del stripped["_meta"]
    arguments = stripped.get("arguments")
    if isinstance(arguments, dict):
        _drop_proof(arguments)
    try:
        canonical = rfc8785.dumps(stripped)
    except (ValueError, TypeError, RecursionError) as exc:
        raise ValueError(f"params cannot be canonicalized (RFC 8785): {exc}") from None
    return b64url(hashlib.sha256(canonical).digest())


def make_pop_proof(params: Mapping[str, Any], key: SigningKey, *, iat: int | None = None) -> str:
    """A ``platform_key_pop`` proof over ``params`` (for platforms' clients and tests).

    Put it in ``arguments._meta.usp.authorization.proof``; ``params`` may already hold it (it is
    left out of the digest either way).
    """
    public = {name: value for name, value in key.public.jwk.items() if name in ("kty", "crv", "x", "y")}
    claims = {"iat": int(time.time()) if iat is None else iat, "usp_p": proof_digest(params)}
    return sign_jws({"typ": POP_TYP, "jwk": public}, claims, key)


def _drop_proof(container: dict[str, Any]) -> None:
    meta = container.get("_meta")
    if not isinstance(meta, dict):
        return
    usp = meta.get("usp")
    if not isinstance(usp, dict):
        return
    authorization = usp.get("authorization")
    if isinstance(authorization, dict):
        authorization.pop("proof", None)


def _is_time(value: object) -> TypeGuard[int]:
    """A NumericDate as we issue them: a whole number of seconds."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53


def _is_number_time(value: object) -> TypeGuard[int | float]:
    """A NumericDate as RFC 7519 allows it from others: fractions too."""
    return _is_time(value) or (isinstance(value, float) and 0 <= value < 2**53)
