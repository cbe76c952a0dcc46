"""The verifier under tampering: every covered component, every parameter, every policy rule.

Each case starts from a correctly signed USP webhook request and changes one thing; the test
asserts the exact reason code, so a check that silently stopped running would show up here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest

from usp_receiver import (
    PROFILE_COMPONENTS,
    ReceiverError,
    SigningKey,
    VerificationPolicy,
    Verified,
    Verifier,
    content_digest,
    sign_message,
    sign_request,
)
from usp_receiver._jwks import JWKS

NOW = 1_800_000_000
URL = "https://platform.example/webhooks/usp"
BODY = json.dumps({"event": "booking.confirmed", "event_id": "evt_01JD00000000000000000000"}).encode()
KEY = SigningKey.generate()
OTHER = SigningKey.generate()
P256 = SigningKey.generate("ecdsa-p256-sha256")
STRANGER = SigningKey.generate()  # not in the trusted set


@dataclass
class Msg:
    """A request under test: change any part, then call :meth:`verify`."""

    method: str = "POST"
    url: str = URL
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = BODY

    def verify(self, policy: VerificationPolicy | None = None, now: float = NOW) -> Verified:
        verifier = Verifier(JWKS([KEY.public, OTHER.public, P256.public]), policy)
        return verifier.verify(self.method, self.url, self.headers, self.body, now=now)

    def with_input(self, old: str, new: str) -> Msg:
        """Edit the Signature-Input text while keeping the signature bytes: a forged parameter."""
        value = self.headers["Signature-Input"]
        assert old in value, (old, value)
        return replace(self, headers={**self.headers, "Signature-Input": value.replace(old, new)})


def signed(keys: list[SigningKey] | None = None, *, created: int = NOW, **kwargs: object) -> Msg:
    headers = {"Content-Type": "application/json"}
    headers |= sign_request("POST", URL, headers, BODY, keys or [KEY], created=created, **kwargs)  # type: ignore[arg-type]
    return Msg(headers=headers)


def reason_of(msg: Msg, policy: VerificationPolicy | None = None, now: float = NOW) -> str:
    with pytest.raises(ReceiverError) as info:
        msg.verify(policy, now)
    return info.value.reason


def test_valid_request_verifies_with_its_key_and_components() -> None:
    verified = signed().verify()
    assert verified.kid == KEY.kid
    assert verified.label == "sig1"
    assert verified.created == NOW
    assert verified.tag == "usp-webhook"
    assert verified.components == tuple(f'"{c}"' for c in PROFILE_COMPONENTS)


def test_p256_signatures_verify() -> None:
    assert signed([P256]).verify().kid == P256.kid


# --- one tamper per covered component -------------------------------------------------------


def _other_method(m: Msg) -> Msg:
    return replace(m, method="PUT")


def _other_host(m: Msg) -> Msg:
    return replace(m, url=URL.replace("platform.example", "evil.example"))


def _other_port(m: Msg) -> Msg:
    return replace(m, url=URL.replace("platform.example", "platform.example:8443"))


def _other_path(m: Msg) -> Msg:
    return replace(m, url=URL + "/other")


def _other_content_type(m: Msg) -> Msg:
    return replace(m, headers={**m.headers, "Content-Type": "text/plain"})


def _other_body_and_digest(m: Msg) -> Msg:
    body = BODY.replace(b"confirmed", b"cancelled")
    return replace(m, body=body, headers={**m.headers, "Content-Digest": content_digest(body)})


def _other_body(m: Msg) -> Msg:
    return replace(m, body=BODY.replace(b"confirmed", b"cancelled"))


def _other_digest(m: Msg) -> Msg:
    return replace(m, headers={**m.headers, "Content-Digest": content_digest(b"something else")})


def _no_content_type(m: Msg) -> Msg:
    return replace(m, headers={k: v for k, v in m.headers.items() if k != "Content-Type"})


def _no_digest(m: Msg) -> Msg:
    return replace(m, headers={k: v for k, v in m.headers.items() if k != "Content-Digest"})


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [
        (_other_method, "bad_signature"),
        (_other_host, "bad_signature"),
        (_other_port, "bad_signature"),
        (_other_path, "bad_signature"),
        (_other_content_type, "bad_signature"),
        (_other_body_and_digest, "bad_signature"),
        (_other_body, "digest_mismatch"),
        (_other_digest, "digest_mismatch"),
        (_no_content_type, "missing_component"),
        (_no_digest, "digest_mismatch"),
    ],
)
def test_tampered_component_is_refused(tamper: Callable[[Msg], Msg], reason: str) -> None:
    assert reason_of(tamper(signed())) == reason


@pytest.mark.parametrize("component", PROFILE_COMPONENTS)
def test_dropping_a_required_component_from_the_signature_is_refused(component: str) -> None:
    msg = signed(components=[c for c in PROFILE_COMPONENTS if c != component])
    assert reason_of(msg) == "missing_component"
    # ... and only the policy makes that a failure: relax it and the same signature is valid.
    relaxed = VerificationPolicy(required_components=tuple(c for c in PROFILE_COMPONENTS if c != component))
    assert msg.verify(relaxed).kid == KEY.kid


# --- one tamper per parameter ---------------------------------------------------------------


def test_forged_created_within_the_window_is_a_bad_signature() -> None:
    assert reason_of(signed().with_input(f"created={NOW}", f"created={NOW - 10}")) == "bad_signature"


def test_missing_created_is_refused_unless_the_policy_allows_it() -> None:
    msg = signed().with_input(f"created={NOW};", "")
    assert reason_of(msg) == "missing_component"
    lax = VerificationPolicy(require_created=False)
    assert reason_of(msg, lax) == "bad_signature"  # the signature was made over created=...


def test_keyid_of_another_trusted_key_is_a_bad_signature() -> None:
    assert reason_of(signed().with_input(KEY.kid, OTHER.kid)) == "bad_signature"


def test_keyid_of_an_unknown_key() -> None:
    assert reason_of(signed([STRANGER])) == "unknown_key"


def test_missing_keyid() -> None:
    assert reason_of(signed().with_input(f';keyid="{KEY.kid}"', "")) == "missing_component"


def test_alg_that_differs_from_the_key_is_refused() -> None:
    assert reason_of(signed().with_input('alg="ed25519"', 'alg="ecdsa-p256-sha256"')) == "bad_signature"


def test_alg_outside_the_policy_is_refused() -> None:
    only_ed = VerificationPolicy(algorithms=frozenset({"ed25519"}))
    assert reason_of(signed([P256]), only_ed) == "bad_signature"


def test_signature_without_alg_verifies_under_the_keys_own_algorithm() -> None:
    headers = {"Content-Type": "application/json", "Content-Digest": content_digest(BODY)}
    member = sign_message(
        "POST", URL, headers, KEY, label="sig1", components=PROFILE_COMPONENTS, created=NOW, include_alg=False
    )
    msg = Msg(headers=headers | {"Signature-Input": member.signature_input, "Signature": member.signature})
    assert "alg=" not in member.signature_input
    assert msg.verify().kid == KEY.kid


def test_tag_of_another_application_is_refused() -> None:
    assert reason_of(signed(tag="something-else")) == "tag_mismatch"
    assert reason_of(signed().with_input('tag="usp-webhook"', 'tag="other"')) == "tag_mismatch"


def test_untagged_signature_is_accepted_by_default_and_refused_when_tags_are_required() -> None:
    msg = signed(tag=None)
    assert msg.verify().tag is None
    assert reason_of(msg, VerificationPolicy(require_tag=True)) == "tag_mismatch"


def test_forged_tag_removal_is_a_bad_signature() -> None:
    assert reason_of(signed().with_input(';tag="usp-webhook"', "")) == "bad_signature"


def test_nonce_added_after_signing_is_a_bad_signature() -> None:
    assert (
        reason_of(signed().with_input(';tag="usp-webhook"', ';nonce="x";tag="usp-webhook"'))
        == "bad_signature"
    )


def test_unknown_parameter_is_malformed() -> None:
    assert reason_of(signed().with_input(';tag="usp-webhook"', ';tag="usp-webhook";color="red"')) == (
        "malformed_signature"
    )


def test_wrongly_typed_parameter_is_malformed() -> None:
    assert reason_of(signed().with_input(f"created={NOW}", f'created="{NOW}"')) == "malformed_signature"


# --- policy rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("age", "reason"),
    [(299, None), (301, "stale"), (-59, None), (-61, "future")],
)
def test_replay_window(age: int, reason: str | None) -> None:
    msg = signed(created=NOW - age)
    if reason is None:
        assert msg.verify().created == NOW - age
    else:
        assert reason_of(msg) == reason


def test_window_is_configurable() -> None:
    assert reason_of(signed(created=NOW - 100), VerificationPolicy(max_age=60)) == "stale"


def test_expires_is_honoured() -> None:
    assert signed(expires=NOW + 5).verify().expires == NOW + 5
    assert reason_of(signed(expires=NOW - 1)) == "expired"


def test_expires_added_after_signing_is_refused() -> None:
    forged = signed().with_input(';tag="usp-webhook"', f';expires={NOW + 60};tag="usp-webhook"')
    assert reason_of(forged) == "bad_signature"


def test_no_signature_at_all() -> None:
    assert reason_of(Msg(headers={"Content-Type": "application/json"})) == "missing_signature"


@pytest.mark.parametrize("drop", ["Signature", "Signature-Input"])
def test_half_a_signature_is_malformed(drop: str) -> None:
    msg = signed()
    assert reason_of(replace(msg, headers={k: v for k, v in msg.headers.items() if k != drop})) == (
        "malformed_signature"
    )


@pytest.mark.parametrize(
    "garbage",
    ["sig1", "sig1=(", 'sig1=("@method";created=1', "sig1=:AAAA:", "=", "sig1=();created=x", "SIG1=()"],
)
def test_garbage_signature_input_is_malformed(garbage: str) -> None:
    msg = signed()
    assert (
        reason_of(replace(msg, headers={**msg.headers, "Signature-Input": garbage})) == "malformed_signature"
    )


def test_mismatched_labels_are_malformed() -> None:
    msg = signed()
    headers = {**msg.headers, "Signature": msg.headers["Signature"].replace("sig1=", "sig9=")}
    assert reason_of(replace(msg, headers=headers)) == "malformed_signature"


def test_renamed_label_in_both_fields_still_verifies() -> None:
    """Labels are not signed (RFC 9421 §4.2); renaming them must not break a valid signature."""
    msg = signed()
    headers = {
        **msg.headers,
        "Signature": msg.headers["Signature"].replace("sig1=", "hook="),
        "Signature-Input": msg.headers["Signature-Input"].replace("sig1=", "hook="),
    }
    assert replace(msg, headers=headers).verify().label == "hook"


def test_truncated_signature_bytes_are_a_bad_signature() -> None:
    msg = signed([P256])
    value = msg.headers["Signature"]
    short = value[: value.index("=:") + 2] + "AAAA" + ":"
    assert reason_of(replace(msg, headers={**msg.headers, "Signature": short})) == "bad_signature"


# --- several signatures (key rotation) ------------------------------------------------------


def test_rotation_new_key_unknown_yet_old_key_verifies() -> None:
    verified = signed([STRANGER, KEY]).verify()
    assert (verified.label, verified.kid) == ("sig2", KEY.kid)


def test_rotation_new_key_verifies_when_old_is_unknown() -> None:
    verified = signed([KEY, STRANGER]).verify()
    assert (verified.label, verified.kid) == ("sig1", KEY.kid)


def test_forgery_from_a_trusted_key_is_reported_over_an_unknown_key() -> None:
    msg = signed([STRANGER, KEY])
    sig = msg.headers["Signature"]
    forged_sig2 = sig[: sig.index("sig2=:") + 6] + ("A" if sig[sig.index("sig2=:") + 6] != "A" else "B")
    forged = forged_sig2 + sig[len(forged_sig2) :]
    assert reason_of(replace(msg, headers={**msg.headers, "Signature": forged})) == "bad_signature"


def test_repeated_field_lines_are_combined_like_one_field() -> None:
    """A proxy may split Signature-Input over two field lines; RFC 9110 says they combine."""
    msg = signed([STRANGER, KEY])
    first, second = msg.headers["Signature-Input"].split(", sig2=")
    s_first, s_second = msg.headers["Signature"].split(", sig2=")
    pairs = [(k, v) for k, v in msg.headers.items() if k not in ("Signature", "Signature-Input")]
    pairs += [("Signature-Input", first), ("Signature-Input", "sig2=" + second)]
    pairs += [("Signature", s_first), ("Signature", "sig2=" + s_second)]
    verifier = Verifier(JWKS([KEY.public]))
    assert verifier.verify("POST", URL, pairs, BODY, now=NOW).label == "sig2"


# --- the general (library) path gives the same verdicts ------------------------------------


def test_non_canonical_whitespace_goes_through_the_library_and_verifies() -> None:
    msg = signed().with_input('"@method" "@authority"', '"@method"   "@authority"')
    assert msg.verify().kid == KEY.kid


def test_non_canonical_whitespace_with_a_tampered_body_still_fails() -> None:
    msg = _other_content_type(signed().with_input('"@method" "@authority"', '"@method"   "@authority"'))
    assert reason_of(msg) == "bad_signature"


def test_bytes_headers_as_asgi_gives_them() -> None:
    msg = signed()
    raw = [(k.lower().encode(), v.encode()) for k, v in msg.headers.items()]
    verifier = Verifier(JWKS([KEY.public]))
    assert verifier.verify("POST", URL, raw, BODY, now=NOW).kid == KEY.kid


@pytest.mark.anyio
async def test_averify_matches_verify() -> None:
    msg = signed([STRANGER, KEY])
    verifier = Verifier(JWKS([KEY.public]))
    assert (await verifier.averify(msg.method, msg.url, msg.headers, msg.body, now=NOW)).label == "sig2"
    with pytest.raises(ReceiverError) as info:
        await verifier.averify("PUT", msg.url, msg.headers, msg.body, now=NOW)
    assert info.value.reason == "bad_signature"


# ------------------------------------------------------------------ OpenBotAuth's member lines


def _openbotauth_signed(key: SigningKey) -> dict[str, str]:
    """A request signed over OpenBotAuth's base: its ``;key`` member line is written
    ``"signature-agent": sig1="<url>"`` (not RFC 9421's ``"signature-agent";key="sig1": "<url>"``)."""
    import base64

    agent = "https://registry.example/jwks/bot.json"
    params = (
        f'("@method" "@path" "@authority" "signature-agent";key="sig1");created={NOW};expires={NOW + 300};'
        f'nonce="n1";keyid="{KEY.kid}";alg="ed25519";tag="web-bot-auth"'
    )
    base = "\n".join(
        [
            '"@method": GET',
            '"@path": /webhooks/usp',
            '"@authority": platform.example',
            f'"signature-agent": sig1="{agent}"',
            f'"@signature-params": {params}',
        ]
    )
    signature = base64.b64encode(key.sign(base.encode())).decode()
    return {
        "Signature-Agent": f'sig1="{agent}"',
        "Signature-Input": f"sig1={params}",
        "Signature": f"sig1=:{signature}:",
    }


@pytest.mark.parametrize("compat", [False, True])
def test_openbotauth_member_lines_verify_only_with_member_compat(compat: bool) -> None:
    policy = VerificationPolicy(
        required_components=("@method",), tag="web-bot-auth", require_digest=False, member_compat=compat
    )
    verifier = Verifier(JWKS([KEY.public]), policy)
    headers = _openbotauth_signed(KEY)
    if compat:
        assert verifier.verify("GET", URL, headers, b"", now=NOW).nonce == "n1"
    else:
        with pytest.raises(ReceiverError) as caught:
            verifier.verify("GET", URL, headers, b"", now=NOW)
        assert caught.value.reason == "bad_signature"
    forged = _openbotauth_signed(OTHER)
    with pytest.raises(ReceiverError) as caught:
        verifier.verify("GET", URL, forged, b"", now=NOW)
    assert caught.value.reason == "bad_signature"


def test_member_compat_still_verifies_the_rfc_form() -> None:
    agent = 'sig1="https://registry.example/jwks/bot.json"'
    member = sign_message(
        "GET",
        URL,
        {"Signature-Agent": agent},
        KEY,
        label="sig1",
        components=("@method", "@path", "@authority", '"signature-agent";key="sig1"'),
        created=NOW,
        tag="web-bot-auth",
    )
    headers = {
        "Signature-Agent": agent,
        "Signature-Input": member.signature_input,
        "Signature": member.signature,
    }
    policy = VerificationPolicy(required_components=("@method",), tag="web-bot-auth", member_compat=True)
    assert Verifier(JWKS([KEY.public]), policy).verify("GET", URL, headers, b"", now=NOW).label == "sig1"
