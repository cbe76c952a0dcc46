"""The in-band JWS of ``usp_webhook`` notifications: round trips, tampering, replay window,
interoperability with a JWS assembled by hand with ``cryptography``, and a fuzzer proving the
verifier only ever raises ``ReceiverError`` subclasses."""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import time
from typing import Any

import pytest
import rfc8785
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from usp_receiver._errors import (
    BadSignature,
    FutureSignature,
    MalformedSignature,
    MissingSignature,
    ReceiverError,
    StaleSignature,
    UnknownKey,
)
from usp_receiver._jws import (
    JWS_TYP,
    averify_notification_params,
    canonical_notification_payload,
    sign_notification_params,
    verify_notification_params,
)
from usp_receiver._keys import PublicKey, SigningKey

NOW = 1_773_526_000  # 2026-03-14T22:06:40Z


class DictResolver:
    """The smallest ``KeyResolver``: a dict of trusted keys by ``kid``."""

    def __init__(self, *keys: PublicKey) -> None:
        self.keys = {key.kid: key for key in keys}

    def resolve(self, kid: str) -> PublicKey | None:
        return self.keys.get(kid)

    async def aresolve(self, kid: str) -> PublicKey | None:
        return self.resolve(kid)


ED = SigningKey.generate("ed25519")
ED_OTHER = SigningKey.generate("ed25519")
ES = SigningKey.generate("ecdsa-p256-sha256")
TRUSTED = DictResolver(ED.public, ED_OTHER.public, ES.public)
KEYS = {"ed25519": ED, "ecdsa-p256-sha256": ES}


def envelope() -> dict[str, Any]:
    return {
        "event": "booking.confirmed",
        "event_id": "evt_01JQ3Z7R8KXW4B9N2M5P6T0VYA",
        "timestamp": "2026-03-14T22:06:00Z",
        "version": "2026-08-20",
        "booking_id": "bkg_456def",
        "order_id": "ord_ucp_001",
        "correlation_id": "corr_7",
        "data": {
            "id": "bkg_456def",
            "status": "confirmed",
            "start": "2026-03-15T09:00:00-04:00",
            "price": {"amount": 4500, "currency": "USD", "tax_rate": 0.0825},
            "notes": None,
            "tags": ["first-visit", "ünïcødé ✂", ""],
        },
    }


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def token_of(params: dict[str, Any]) -> str:
    token: str = params["_meta"]["usp"]["signature"]
    return token


def with_token(params: dict[str, Any], token: str) -> dict[str, Any]:
    tampered = copy.deepcopy(params)
    tampered["_meta"]["usp"]["signature"] = token
    return tampered


def header_of(params: dict[str, Any]) -> dict[str, Any]:
    header: dict[str, Any] = json.loads(unb64(token_of(params).split(".")[0]))
    return header


def resign_header(params: dict[str, Any], key: SigningKey, **changes: Any) -> dict[str, Any]:
    """Rewrite the protected header and sign it again with ``key`` (a valid signature over a
    header the verifier must still refuse)."""
    header = {**header_of(params), **changes}
    header = {name: value for name, value in header.items() if value is not None}
    encoded = b64(json.dumps(header).encode())
    signing_input = f"{encoded}.{b64(canonical_notification_payload(params))}".encode()
    return with_token(params, f"{encoded}..{b64(key.sign(signing_input))}")


# -- round trips ---------------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["ed25519", "ecdsa-p256-sha256"])
def test_round_trip(alg: str) -> None:
    key = KEYS[alg]
    params = envelope()
    signed = sign_notification_params(params, key, iat=NOW)

    assert params == envelope(), "the input is not mutated"
    header_b64, payload_b64, signature_b64 = token_of(signed).split(".")
    assert payload_b64 == ""
    assert json.loads(unb64(header_b64)) == {
        "alg": key.public.jose_alg,
        "kid": key.kid,
        "typ": JWS_TYP,
        "iat": NOW,
    }
    assert len(unb64(signature_b64)) == 64

    verified = verify_notification_params(signed, TRUSTED, now=NOW + 5)
    assert (verified.kid, verified.alg, verified.iat) == (key.kid, key.public.jose_alg, NOW)
    assert verified.params == params, "the signature and the containers it alone needed are gone"


@pytest.mark.anyio
@pytest.mark.parametrize("alg", ["ed25519", "ecdsa-p256-sha256"])
async def test_async_round_trip(alg: str) -> None:
    signed = sign_notification_params(envelope(), KEYS[alg], iat=NOW)
    verified = await averify_notification_params(signed, TRUSTED, now=NOW)
    assert verified.params == envelope()


def test_default_iat_is_now_and_default_clock_accepts_it() -> None:
    before = int(time.time())
    signed = sign_notification_params(envelope(), ED)
    assert before <= header_of(signed)["iat"] <= time.time()
    assert verify_notification_params(signed, TRUSTED).params == envelope()


def test_other_meta_members_are_kept_and_signed() -> None:
    params = {**envelope(), "_meta": {"usp": {"profile": "https://agent.example/p.json"}, "other": 1}}
    signed = sign_notification_params(params, ED, iat=NOW)
    assert signed["_meta"]["usp"]["profile"] == "https://agent.example/p.json"
    assert verify_notification_params(signed, TRUSTED, now=NOW).params == params

    tampered = copy.deepcopy(signed)
    tampered["_meta"]["usp"]["profile"] = "https://evil.example/p.json"
    with pytest.raises(BadSignature):
        verify_notification_params(tampered, TRUSTED, now=NOW)
    tampered = copy.deepcopy(signed)
    tampered["_meta"]["other"] = 2
    with pytest.raises(BadSignature):
        verify_notification_params(tampered, TRUSTED, now=NOW)


@pytest.mark.parametrize("meta", [{}, {"usp": {}}, {"usp": {}, "k": 1}, {"usp": {"p": {}}}])
def test_senders_empty_meta_containers_round_trip(meta: dict[str, Any]) -> None:
    params = {**envelope(), "_meta": meta}
    signed = sign_notification_params(params, ED, iat=NOW)
    assert canonical_notification_payload(signed) == canonical_notification_payload(params)
    verify_notification_params(signed, TRUSTED, now=NOW)


def test_resigning_replaces_the_old_signature() -> None:
    once = sign_notification_params(envelope(), ED, iat=NOW)
    twice = sign_notification_params(once, ES, iat=NOW + 1)
    assert verify_notification_params(twice, TRUSTED, now=NOW).kid == ES.kid


@pytest.mark.parametrize(
    ("params", "canonical"),
    [
        ({"b": 1, "a": 2}, b'{"a":2,"b":1}'),
        # An empty usp (or _meta) left behind by the removal is removed too, on both sides.
        ({"a": 1, "_meta": {"usp": {"signature": "x"}}}, b'{"a":1}'),
        ({"a": 1, "_meta": {"usp": {"signature": "x"}, "k": 1}}, b'{"_meta":{"k":1},"a":1}'),
        ({"a": 1, "_meta": {"usp": {"signature": "x", "p": 1}}}, b'{"_meta":{"usp":{"p":1}},"a":1}'),
        # Empty containers never count, whether the removal emptied them or the sender did.
        ({"a": 1, "_meta": {}}, b'{"a":1}'),
        ({"a": 1, "_meta": {"usp": {}}}, b'{"a":1}'),
        ({"a": 1, "_meta": {"usp": {}, "k": {}}}, b'{"_meta":{"k":{}},"a":1}'),
        ({"n": [1.0, 1e21, 0.5, -0.0]}, b'{"n":[1,1e+21,0.5,0]}'),
        ({"\u20ac": 1, "\r": 2, "a": 3}, '{"\\r":2,"a":3,"\u20ac":1}'.encode()),
    ],
)
def test_canonical_payload(params: dict[str, Any], canonical: bytes) -> None:
    assert canonical_notification_payload(params) == canonical


def test_wire_spelling_does_not_matter() -> None:
    """JCS: key order, whitespace, escapes and number spelling on the wire are irrelevant."""
    signed = sign_notification_params({**envelope(), "count": 100, "ratio": 0.5}, ED, iat=NOW)

    def reversed_keys(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: reversed_keys(v) for k, v in reversed(list(value.items()))}
        if isinstance(value, list):
            return [reversed_keys(v) for v in value]
        return value

    wire = json.dumps(reversed_keys(signed), indent=7, ensure_ascii=True)
    wire = wire.replace('"count": 100', '"count": 1E2').replace('"ratio": 0.5', '"ratio": 5.0e-1')
    assert "1E2" in wire
    assert "5.0e-1" in wire
    assert "\\u00fc" in wire
    received = json.loads(wire)
    assert list(received) != list(signed)
    assert verify_notification_params(received, TRUSTED, now=NOW).params["count"] == 100


def test_known_answer() -> None:
    """Ed25519 is deterministic: this pins the exact wire form (RFC 8032 test key 1)."""
    secret = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    private = ed25519.Ed25519PrivateKey.from_private_bytes(secret)
    public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    key = SigningKey.from_jwk({"kty": "OKP", "crv": "Ed25519", "x": b64(public), "d": b64(secret)})
    signed = sign_notification_params({"event": "booking.confirmed", "event_id": "evt_1"}, key, iat=NOW)
    header = json.dumps(
        {"alg": "EdDSA", "iat": NOW, "kid": key.kid, "typ": JWS_TYP}, separators=(",", ":")
    ).encode()
    payload = b'{"event":"booking.confirmed","event_id":"evt_1"}'
    expected = private.sign(f"{b64(header)}.{b64(payload)}".encode())
    assert token_of(signed) == f"{b64(header)}..{b64(expected)}"


# -- interoperability ----------------------------------------------------------------------------


def _hand_made(params: dict[str, Any], header: dict[str, Any], sign: Any) -> dict[str, Any]:
    """A JWS assembled without the signer: header JSON with spaces, own base64, own JCS input."""
    encoded_header = base64.urlsafe_b64encode(json.dumps(header).encode()).decode().rstrip("=")
    payload = rfc8785.dumps({k: v for k, v in params.items() if k != "_meta"})
    signing_input = (encoded_header + "." + base64.urlsafe_b64encode(payload).decode().rstrip("=")).encode()
    signature = base64.urlsafe_b64encode(sign(signing_input)).decode().rstrip("=")
    return {**params, "_meta": {"usp": {"signature": f"{encoded_header}..{signature}"}}}


def test_hand_made_ed25519_jws_verifies() -> None:
    private = ed25519.Ed25519PrivateKey.generate()
    x = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    public = PublicKey.from_jwk({"kty": "OKP", "crv": "Ed25519", "x": b64(x), "kid": "biz-2026"})
    header = {"typ": "usp-webhook+jws", "kid": "biz-2026", "alg": "EdDSA", "iat": NOW}
    params = _hand_made(envelope(), header, private.sign)
    verified = verify_notification_params(params, DictResolver(public), now=NOW)
    assert verified.params == envelope()


def test_hand_made_es256_jws_verifies() -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    numbers = private.public_key().public_numbers()
    jwk = {
        "kty": "EC",
        "crv": "P-256",
        "x": b64(numbers.x.to_bytes(32, "big")),
        "y": b64(numbers.y.to_bytes(32, "big")),
    }
    public = PublicKey.from_jwk(jwk)

    def sign(data: bytes) -> bytes:
        r, s = decode_dss_signature(private.sign(data, ec.ECDSA(hashes.SHA256())))
        return r.to_bytes(32, "big") + s.to_bytes(32, "big")  # JWS wants raw r||s, not DER

    # "application/" may prefix a typ (RFC 7515 §4.1.9), in any case.
    header = {"alg": "ES256", "kid": public.kid, "typ": "Application/USP-Webhook+JWS", "iat": NOW}
    params = _hand_made(envelope(), header, sign)
    assert verify_notification_params(params, DictResolver(public), now=NOW).kid == public.kid


@pytest.mark.parametrize("alg", ["ed25519", "ecdsa-p256-sha256"])
def test_signer_output_verifies_with_cryptography_directly(alg: str) -> None:
    key = KEYS[alg]
    signed = sign_notification_params(envelope(), key, iat=NOW)
    header_b64, _, signature_b64 = token_of(signed).split(".")
    signing_input = f"{header_b64}.{b64(rfc8785.dumps(envelope()))}".encode()
    signature = unb64(signature_b64)
    if alg == "ed25519":
        assert isinstance(key.public.key, ed25519.Ed25519PublicKey)
        key.public.key.verify(signature, signing_input)
    else:
        assert isinstance(key.public.key, ec.EllipticCurvePublicKey)
        der = encode_dss_signature(
            int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big")
        )
        key.public.key.verify(der, signing_input, ec.ECDSA(hashes.SHA256()))


# -- tampering -----------------------------------------------------------------------------------


@pytest.mark.parametrize("field", sorted(envelope()))
def test_changing_any_top_level_field_breaks_the_signature(field: str) -> None:
    signed = sign_notification_params(envelope(), ED, iat=NOW)
    tampered = copy.deepcopy(signed)
    tampered[field] = {"forged": True} if field != "data" else {**signed["data"], "status": "cancelled"}
    with pytest.raises(BadSignature):
        verify_notification_params(tampered, TRUSTED, now=NOW)
    del tampered[field]
    with pytest.raises(BadSignature):
        verify_notification_params(tampered, TRUSTED, now=NOW)


def test_adding_a_field_breaks_the_signature() -> None:
    signed = sign_notification_params(envelope(), ES, iat=NOW)
    with pytest.raises(BadSignature):
        verify_notification_params({**signed, "waitlist_entry_id": "wle_1"}, TRUSTED, now=NOW)


def test_kid_swapped_to_another_trusted_key() -> None:
    signed = sign_notification_params(envelope(), ED, iat=NOW)
    header = {**header_of(signed), "kid": ED_OTHER.kid}
    forged = with_token(signed, b64(rfc8785.dumps(header)) + token_of(signed)[token_of(signed).index(".") :])
    with pytest.raises(BadSignature):
        verify_notification_params(forged, TRUSTED, now=NOW)


def test_alg_must_match_the_key() -> None:
    signed = sign_notification_params(envelope(), ED, iat=NOW)
    # Header claims ES256 for an Ed25519 key, even correctly signed over that header.
    with pytest.raises(BadSignature, match="does not match"):
        verify_notification_params(resign_header(signed, ED, alg="ES256"), TRUSTED, now=NOW)
    # An ES256 key named by an EdDSA header.
    signed = sign_notification_params(envelope(), ES, iat=NOW)
    with pytest.raises(BadSignature):
        verify_notification_params(resign_header(signed, ES, alg="EdDSA"), TRUSTED, now=NOW)


@pytest.mark.parametrize("alg", ["none", "HS256", "RS256", "PS512", "eddsa", 7, None])
def test_unsupported_alg_is_malformed(alg: Any) -> None:
    signed = resign_header(sign_notification_params(envelope(), ED, iat=NOW), ED, alg=alg)
    with pytest.raises(MalformedSignature):
        verify_notification_params(signed, TRUSTED, now=NOW)


def test_hmac_key_under_the_kid_never_verifies() -> None:
    """A symmetric key in the trust store must not turn the public kid into a forgery oracle."""
    hmac = PublicKey.from_jwk({"kty": "oct", "k": b64(b"k" * 32), "kid": "shared"})
    signed = sign_notification_params(envelope(), ED, iat=NOW)
    with pytest.raises(BadSignature):
        verify_notification_params(resign_header(signed, ED, kid="shared"), DictResolver(hmac), now=NOW)


@pytest.mark.parametrize(
    "changes",
    [
        {"typ": "JWT"},
        {"typ": None},
        {"typ": "application/jose"},
        {"kid": ""},
        {"kid": 5},
        {"kid": None},
        {"iat": None},
        {"iat": "1773526000"},
        {"iat": True},
        {"iat": 2**60},
        {"crit": ["exp"]},
        {"b64": False},
    ],
)
def test_bad_header_members_are_malformed(changes: dict[str, Any]) -> None:
    signed = resign_header(sign_notification_params(envelope(), ED, iat=NOW), ED, **changes)
    with pytest.raises(MalformedSignature):
        verify_notification_params(signed, TRUSTED, now=NOW)


def test_fractional_iat_is_a_numeric_date() -> None:
    signed = resign_header(sign_notification_params(envelope(), ED, iat=NOW), ED, iat=NOW + 0.5)
    assert verify_notification_params(signed, TRUSTED, now=NOW).iat == NOW + 0.5


def test_duplicate_header_members_are_malformed() -> None:
    signed = sign_notification_params(envelope(), ED, iat=NOW)
    raw = f'{{"alg":"EdDSA","kid":"{ED.kid}","typ":"{JWS_TYP}","iat":{NOW},"kid":"{ED_OTHER.kid}"}}'
    signing_input = f"{b64(raw.encode())}.{b64(canonical_notification_payload(signed))}".encode()
    forged = with_token(signed, f"{b64(raw.encode())}..{b64(ED.sign(signing_input))}")
    with pytest.raises(MalformedSignature):
        verify_notification_params(forged, TRUSTED, now=NOW)


# -- replay window -------------------------------------------------------------------------------


def test_stale_and_future() -> None:
    signed = sign_notification_params(envelope(), ED, iat=NOW)
    assert verify_notification_params(signed, TRUSTED, now=NOW + 300).iat == NOW
    assert verify_notification_params(signed, TRUSTED, now=NOW - 60).iat == NOW
    with pytest.raises(StaleSignature):
        verify_notification_params(signed, TRUSTED, now=NOW + 301)
    with pytest.raises(FutureSignature):
        verify_notification_params(signed, TRUSTED, now=NOW - 61)
    assert verify_notification_params(signed, TRUSTED, now=NOW + 3000, max_age=3600).iat == NOW
    with pytest.raises(FutureSignature):
        verify_notification_params(signed, TRUSTED, now=NOW - 10, max_future=5)


def test_freshness_is_judged_only_after_the_signature() -> None:
    """A forged, stale notification is reported as forged: its iat proves nothing."""
    signed = sign_notification_params(envelope(), ED, iat=NOW)
    with pytest.raises(BadSignature):
        verify_notification_params({**signed, "event": "booking.cancelled"}, TRUSTED, now=NOW + 10_000)


# -- missing, unknown, malformed -----------------------------------------------------------------


def test_unknown_kid() -> None:
    stranger = SigningKey.generate()
    with pytest.raises(UnknownKey) as info:
        verify_notification_params(sign_notification_params(envelope(), stranger, iat=NOW), TRUSTED, now=NOW)
    assert info.value.reason == "unknown_key"


@pytest.mark.parametrize(
    "meta",
    [None, {}, {"usp": {}}, {"usp": {"profile": "x"}}, {"usp": {"signature": None}}],
)
def test_missing_signature(meta: Any) -> None:
    params = envelope()
    if meta is not None:
        params["_meta"] = meta
    with pytest.raises(MissingSignature) as info:
        verify_notification_params(params, TRUSTED, now=NOW)
    assert info.value.reason == "missing_signature"


def test_attached_payload_is_refused() -> None:
    """Even the right payload: the profile is detached, a payload part would be a second truth."""
    signed = sign_notification_params(envelope(), ED, iat=NOW)
    header_b64, _, signature_b64 = token_of(signed).split(".")
    attached = f"{header_b64}.{b64(canonical_notification_payload(signed))}.{signature_b64}"
    with pytest.raises(MalformedSignature, match="detached"):
        verify_notification_params(with_token(signed, attached), TRUSTED, now=NOW)


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t + ".",
        lambda t: t.replace("..", "."),
        lambda t: t + "=",  # padded
        lambda t: t[:-1] + ("B" if t[-1] == "A" else "A"),  # non-zero trailing bits or wrong value
        lambda t: t[:-2],  # truncated signature
        lambda t: t.replace("-", "+").replace("_", "/") if ("-" in t or "_" in t) else "a+b..c",
        lambda t: "!" + t,
        lambda t: "",
        lambda t: "..",
        lambda t: b64(b"\xff\xfe") + t[t.index(".") :],  # header is not UTF-8
        lambda t: b64(b"[1, 2]") + t[t.index(".") :],  # header is not an object
        lambda t: b64(b'{"alg": NaN}') + t[t.index(".") :],
        lambda t: b64(b"[" * 100_000) + t[t.index(".") :],  # recursion bomb
    ],
)
def test_malformed_tokens(mangle: Any) -> None:
    signed = sign_notification_params(envelope(), ED, iat=NOW)
    with pytest.raises((MalformedSignature, BadSignature)):
        verify_notification_params(with_token(signed, mangle(token_of(signed))), TRUSTED, now=NOW)


@pytest.mark.parametrize(
    "params",
    [
        ["not", "an", "object"],
        "usp_webhook",
        None,
        {"_meta": "x"},
        {"_meta": {"usp": ["x"]}},
        {"_meta": {"usp": {"signature": 1}}},
    ],
)
def test_malformed_containers(params: Any) -> None:
    with pytest.raises(MalformedSignature):
        verify_notification_params(params, TRUSTED, now=NOW)


@pytest.mark.parametrize(
    "extra",
    [float("nan"), float("inf"), 2**53, -(2**53), {1: "non-string key"}, {"s": "\ud800"}, object()],
)
def test_params_outside_jcs_cannot_be_signed_or_verified(extra: Any) -> None:
    params = {**envelope(), "extra": extra}
    with pytest.raises(ValueError, match="RFC 8785"):
        sign_notification_params(params, ED, iat=NOW)
    # A valid token grafted onto such params: malformed, not a crash.
    token = token_of(sign_notification_params(envelope(), ED, iat=NOW))
    with pytest.raises(MalformedSignature):
        verify_notification_params({**params, "_meta": {"usp": {"signature": token}}}, TRUSTED, now=NOW)


def test_signer_refuses_keys_without_an_in_band_form() -> None:
    hmac = SigningKey.from_jwk({"kty": "oct", "k": b64(b"k" * 32)})
    with pytest.raises(ValueError, match="ed25519"):
        sign_notification_params(envelope(), hmac)
    with pytest.raises(ValueError, match="_meta"):
        sign_notification_params({**envelope(), "_meta": "x"}, ED)


def test_verified_params_are_a_fresh_copy() -> None:
    signed = sign_notification_params(envelope(), ED, iat=NOW)
    verified = verify_notification_params(signed, TRUSTED, now=NOW)
    verified.params["data"]["status"] = "mutated"
    assert signed["data"]["status"] == "confirmed"


def test_error_messages_never_contain_the_signature() -> None:
    signed = sign_notification_params(envelope(), ED, iat=NOW)
    signature_b64 = token_of(signed).split(".")[2]
    for tampered in (
        {**signed, "event": "x"},
        with_token(signed, token_of(signed) + "A"),
        resign_header(signed, ED, typ="JWT"),
    ):
        with pytest.raises(ReceiverError) as info:
            verify_notification_params(tampered, TRUSTED, now=NOW)
        assert signature_b64 not in str(info.value)


# -- fuzzing -------------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.integers(), inner, max_size=4)
        | st.tuples(inner, inner)
    ),
    max_leaves=20,
)
b64_text = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=+/.", max_size=120
)


@st.composite
def header_tokens(draw: st.DrawFn) -> str:
    """Tokens whose header is base64url of arbitrary (often almost right) JSON."""
    header = draw(
        st.fixed_dictionaries(
            {},
            optional={
                "alg": st.sampled_from(["EdDSA", "ES256", "Ed25519", "none"]) | json_values,
                "kid": st.sampled_from([ED.kid, ES.kid, "x"]) | json_values,
                "typ": st.sampled_from([JWS_TYP, "application/" + JWS_TYP]) | json_values,
                "iat": st.integers(min_value=NOW - 1000, max_value=NOW + 1000) | json_values,
                "crit": json_values,
            },
        )
    )
    try:
        raw = json.dumps(header).encode()
    except (TypeError, ValueError):
        raw = draw(st.binary(max_size=60))
    return f"{b64(raw)}.{draw(st.sampled_from(['', 'e30']))}.{draw(b64_text | st.just(b64(bytes(64))))}"


def _must_only_raise_receiver_errors(params: Any) -> None:
    with contextlib.suppress(ReceiverError):
        verify_notification_params(params, TRUSTED, now=NOW)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.dictionaries(st.text(max_size=10), json_values, max_size=6),
    token=st.text(max_size=200) | b64_text | header_tokens() | json_values,
)
def test_fuzz_arbitrary_params_and_tokens(body: dict[str, Any], token: Any) -> None:
    _must_only_raise_receiver_errors({**body, "_meta": {"usp": {"signature": token}}})
    _must_only_raise_receiver_errors({**body, "_meta": token})
    _must_only_raise_receiver_errors(body)


jcs_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12)
jcs_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | jcs_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(jcs_text, inner, max_size=4),
    max_leaves=20,
)
meta_values = st.dictionaries(
    st.sampled_from(["usp", "k", "io.modelcontextprotocol/x"]),
    st.dictionaries(st.sampled_from(["signature", "profile", "p"]), jcs_values, max_size=3) | jcs_values,
    max_size=3,
)


@settings(max_examples=200, deadline=None)
@given(
    body=st.dictionaries(jcs_text, jcs_values, max_size=6),
    meta=st.none() | meta_values,
    alg=st.sampled_from(["ed25519", "ecdsa-p256-sha256"]),
)
def test_fuzz_any_jcs_params_round_trip_through_json(
    body: dict[str, Any], meta: dict[str, Any] | None, alg: str
) -> None:
    """Whatever (I-JSON) params a sender signs verify after a trip through any JSON text."""
    params = dict(body)
    if meta is not None:
        params["_meta"] = meta
    try:
        signed = sign_notification_params(params, KEYS[alg], iat=NOW)
    except ValueError:
        # Only a non-object _meta.usp may be refused (there is nowhere to put the signature).
        assert not isinstance(params.get("_meta", {}).get("usp", {}), dict)
        return
    received = json.loads(json.dumps(signed, indent=1))
    verified = verify_notification_params(received, TRUSTED, now=NOW)
    assert verified.params == json.loads(canonical_notification_payload(params))


@settings(max_examples=200, deadline=None)
@given(params=json_values)
def test_fuzz_arbitrary_top_level(params: Any) -> None:
    _must_only_raise_receiver_errors(params)


@settings(max_examples=200, deadline=None)
@given(
    extra=json_values,
    position=st.integers(min_value=0, max_value=400),
    replacement=st.characters(codec="ascii"),
)
def test_fuzz_mutated_valid_tokens(extra: Any, position: int, replacement: str) -> None:
    """A valid token with one character changed, over params with arbitrary extra content."""
    signed = sign_notification_params(envelope(), ES, iat=NOW)
    token = token_of(signed)
    index = position % len(token)
    mutated = token[:index] + replacement + token[index + 1 :]
    params = with_token(signed, mutated)
    params["extra"] = extra
    try:
        verify_notification_params(params, TRUSTED, now=NOW)
    except ReceiverError:
        return
    # Only an unchanged token over unchanged params may verify, and extra makes them changed.
    pytest.fail("a mutated notification verified")  # pragma: no cover
