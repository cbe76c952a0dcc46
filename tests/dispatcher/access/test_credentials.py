"""Booking-scoped credentials (signed by the business's key, verified against the published
keys) and ``platform_key_pop`` proofs for key-bound ones."""

from __future__ import annotations

import copy
from datetime import timedelta
from typing import Any

import pytest
from sqlmodel import Session

from tests.dispatcher.access.conftest import PROFILE
from tests.dispatcher.conftest import MakeSettings
from usp_core import keys
from usp_core.clock import utcnow
from usp_dispatcher.access import (
    AccessError,
    credentials,
    issue_booking_credential,
    make_pop_proof,
    proof_digest,
    verify_booking_credential,
)
from usp_dispatcher.access.credentials import looks_like_booking_credential, proof_holds
from usp_dispatcher.cli.config import Settings
from usp_receiver import SigningKey, jwk_thumbprint
from usp_receiver.jose import parse_jws, sign_jws

BOOKING = "bkg_123"


def issue(session: Session, settings: Settings, **overrides: Any) -> dict[str, Any]:
    values: dict[str, Any] = {"booking_id": BOOKING, "profile": PROFILE, "jkt": None}
    values.update(overrides)
    return issue_booking_credential(session, settings, **values)


def test_issued_credential_verifies(session: Session, settings: Settings) -> None:
    issued = issue(session, settings)
    assert issued["mechanism"] == "booking_scoped_credential"
    assert "cnf" not in issued
    assert looks_like_booking_credential(issued["credential"])
    credential = verify_booking_credential(session, settings, issued["credential"])
    assert credential.booking_id == BOOKING
    assert credential.profile == PROFILE
    assert credential.jkt is None
    assert set(credential.scope) == {"usp_bookings_get", "usp_bookings_cancel", "usp_bookings_reschedule"}
    assert "usp_bookings_confirm" not in credential.scope
    assert credential.expires_at - credential.issued_at == settings.booking_credential_ttl_seconds
    claims = parse_jws(issued["credential"]).claims
    assert claims["iss"] == settings.public_base_url
    assert claims["sub"] == BOOKING


def test_lifetime_is_configurable(session: Session, make_settings: MakeSettings) -> None:
    settings = make_settings(booking_credential_ttl_seconds=60)
    now = utcnow()
    token = issue(session, settings, now=now)["credential"]
    verify_booking_credential(session, settings, token, now=now + timedelta(seconds=59))
    with pytest.raises(AccessError) as caught:
        verify_booking_credential(session, settings, token, now=now + timedelta(seconds=60))
    assert "expired" in caught.value.detail


def test_default_lifetime_is_thirty_days(session: Session, settings: Settings) -> None:
    now = utcnow()
    token = issue(session, settings, now=now)["credential"]
    verify_booking_credential(session, settings, token, now=now + timedelta(days=29, hours=23))
    with pytest.raises(AccessError):
        verify_booking_credential(session, settings, token, now=now + timedelta(days=30))


def test_bound_credential_carries_cnf(session: Session, settings: Settings) -> None:
    issued = issue(session, settings, jkt="thumb")
    assert issued["cnf"] == {"jkt": "thumb"}
    assert verify_booking_credential(session, settings, issued["credential"]).jkt == "thumb"


def test_tampered_credential_is_refused(session: Session, settings: Settings) -> None:
    token = issue(session, settings)["credential"]
    parsed = parse_jws(token)
    forged_claims = parsed.claims | {"sub": "bkg_other"}
    stranger = SigningKey.generate()
    # Same header (kid of the business key), other claims, a stranger's signature.
    forged = sign_jws({"typ": parsed.header["typ"], "kid": parsed.header["kid"]}, forged_claims, stranger)
    header, claims, signature = token.split(".")
    _, payload, _signature = forged.split(".")
    # One signature byte changed (its first character: never a no-op, unlike overwriting the
    # end with fixed characters, which a signature ending in them would survive).
    flipped = f"{header}.{claims}.{'B' if signature[0] == 'A' else 'A'}{signature[1:]}"
    for candidate in (forged, f"{header}.{payload}.{signature}", flipped, "a.b.c", ""):
        with pytest.raises(AccessError) as caught:
            verify_booking_credential(session, settings, candidate)
        assert caught.value.code == -32001


def test_credential_of_another_issuer_is_refused(session: Session, make_settings: MakeSettings) -> None:
    token = issue(session, make_settings(public_base_url="https://elsewhere.example"))["credential"]
    with pytest.raises(AccessError):
        verify_booking_credential(session, make_settings(), token)


def test_rotation_keeps_credentials_valid_while_the_old_key_is_published(
    session: Session, settings: Settings
) -> None:
    now = utcnow()
    token = issue(session, settings, now=now)["credential"]
    keys.rotate(session, settings, now=now)
    session.commit()
    later = now + timedelta(seconds=settings.key_publish_lead_seconds + 10)
    verify_booking_credential(session, settings, token, now=later)  # both keys published
    new_token = issue(session, settings, now=later)["credential"]
    assert parse_jws(new_token).header["kid"] != parse_jws(token).header["kid"]
    gone = later + timedelta(seconds=settings.key_overlap_seconds + 2 * settings.key_publish_lead_seconds)
    with pytest.raises(AccessError):
        verify_booking_credential(session, settings, token, now=gone)  # old key unpublished
    verify_booking_credential(session, settings, new_token, now=gone)


# ------------------------------------------------------------------------------ proofs


def params_with(credential: str, proof: str | None = None) -> dict[str, Any]:
    authorization: dict[str, Any] = {"mechanism": "booking_scoped_credential", "credential": credential}
    if proof is not None:
        authorization["proof"] = proof
    return {
        "name": "usp_bookings_get",
        "arguments": {
            "booking_id": BOOKING,
            "_meta": {"usp": {"profile": PROFILE, "authorization": authorization}},
        },
    }


def attach(params: dict[str, Any], proof: str) -> dict[str, Any]:
    signed = copy.deepcopy(params)
    signed["arguments"]["_meta"]["usp"]["authorization"]["proof"] = proof
    return signed


def test_proof_digest_ignores_the_proof_and_key_order() -> None:
    params = params_with("cred")
    assert proof_digest(params) == proof_digest(attach(params, "anything"))
    reordered = {"arguments": dict(reversed(list(params["arguments"].items()))), "name": params["name"]}
    assert proof_digest(reordered) == proof_digest(params)
    assert proof_digest(params) != proof_digest(params | {"name": "usp_bookings_cancel"})


def test_valid_proof_holds() -> None:
    platform = SigningKey.generate()
    params = params_with("cred")
    signed = attach(params, make_pop_proof(params, platform))
    proof = signed["arguments"]["_meta"]["usp"]["authorization"]["proof"]
    assert proof_holds(proof, signed, jkt=jwk_thumbprint(platform.public.jwk))


def test_p256_proof_holds() -> None:
    platform = SigningKey.generate("ecdsa-p256-sha256")
    params = params_with("cred")
    proof = make_pop_proof(params, platform)
    assert proof_holds(proof, attach(params, proof), jkt=jwk_thumbprint(platform.public.jwk))


def test_proof_by_another_key_fails() -> None:
    platform, other = SigningKey.generate(), SigningKey.generate()
    params = params_with("cred")
    proof = make_pop_proof(params, other)
    assert not proof_holds(proof, attach(params, proof), jkt=jwk_thumbprint(platform.public.jwk))


def test_proof_over_other_params_fails() -> None:
    platform = SigningKey.generate()
    params = params_with("cred")
    proof = make_pop_proof(params, platform)
    changed = attach(params, proof)
    changed["arguments"]["booking_id"] = "bkg_other"
    assert not proof_holds(proof, changed, jkt=jwk_thumbprint(platform.public.jwk))


def test_stale_or_future_proof_fails() -> None:
    platform = SigningKey.generate()
    jkt = jwk_thumbprint(platform.public.jwk)
    params = params_with("cred")
    at = utcnow().replace(microsecond=0)
    now = int(at.timestamp())
    for iat, holds in ((now - 300, True), (now - 301, False), (now + 300, True), (now + 301, False)):
        proof = make_pop_proof(params, platform, iat=iat)
        assert proof_holds(proof, attach(params, proof), jkt=jkt, now=at) is holds, iat


def test_proof_with_a_swapped_header_key_fails() -> None:
    """The header's jwk must be the key that signed: naming the bound key is not enough."""
    platform, attacker = SigningKey.generate(), SigningKey.generate()
    params = params_with("cred")
    proof = make_pop_proof(params, attacker)
    parsed = parse_jws(proof)
    bound_jwk = {n: v for n, v in platform.public.jwk.items() if n in ("kty", "crv", "x")}
    forged = sign_jws({"typ": parsed.header["typ"], "jwk": bound_jwk}, parsed.claims, attacker)
    assert not proof_holds(forged, attach(params, forged), jkt=jwk_thumbprint(platform.public.jwk))


@pytest.mark.parametrize("proof", [None, 42, "", "x.y.z"])
def test_junk_proofs_fail(proof: object) -> None:
    assert not proof_holds(proof, params_with("cred"), jkt="thumb")


def test_proof_digest_is_the_jcs_sha256_of_params_without_the_proof() -> None:
    """Computed independently: base64url(SHA-256(RFC 8785 JSON)) of params minus the proof."""
    import base64
    import hashlib

    import rfc8785

    params = attach(params_with("cred"), "the-proof")
    expected_input = params_with("cred")  # the same params, no proof member
    digest = hashlib.sha256(rfc8785.dumps(expected_input)).digest()
    assert proof_digest(params) == base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def test_the_proof_digest_leaves_out_the_trace_context_a_transport_adds() -> None:
    params = {"name": "usp_bookings_get", "arguments": {"booking_id": "bkg_1"}}
    traced = {
        **params,
        "_meta": {
            "traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01",
            "tracestate": "a=b",
            "baggage": "k=v",
        },
    }
    assert credentials.proof_digest(traced) == credentials.proof_digest(params)
    # Anything else in params._meta is signed.
    assert credentials.proof_digest({**params, "_meta": {"other": 1}}) != credentials.proof_digest(params)
