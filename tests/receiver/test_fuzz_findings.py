"""Cases a fuzzing run of 100,000 requests reported (issue 17), kept as regressions: valid
requests in unusual but legal spellings verify (unpadded byte sequences, ``?`` inside the query,
a valid signature among others from the same key), a caller's ``None`` header is a clear
``TypeError`` at the boundary, and the number of signatures tried has a documented cap."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from usp_receiver import (
    JWKS,
    MalformedSignature,
    SigningKey,
    VerificationPolicy,
    Verifier,
    content_digest,
    sign_message,
    sign_request,
)

NOW = 1_800_000_000
URL = "https://platform.example/webhooks/usp"
BODY = json.dumps({"event": "booking.confirmed", "event_id": "evt_789abc"}).encode()
KEY = SigningKey.generate()
VERIFIER = Verifier(JWKS([KEY.public]))
COMPONENTS = ("@method", "@authority", "@path", "content-digest", "content-type")


def _unpadded(member: str) -> str:
    """``label=:abc=:`` as ``label=:abc:`` (or a bare ``:abc=:`` as ``:abc:``)."""
    head, _, value = member.partition(":")
    return head + ":" + value.rstrip(":").rstrip("=") + ":"


def test_unpadded_byte_sequences_verify() -> None:
    """RFC 8941 §4.2.7: parsers SHOULD NOT fail on missing padding. The sender signs the digest
    exactly as it sends it, unpadded."""
    digest = _unpadded(content_digest(BODY))
    assert not digest.endswith("=:")
    headers = {"Content-Type": "application/json", "Content-Digest": digest}
    member = sign_message("POST", URL, headers, KEY, label="sig1", components=COMPONENTS, created=NOW)
    signature = _unpadded(member.signature)
    assert not signature.endswith("=:")
    fields = headers | {"Signature-Input": member.signature_input, "Signature": signature}
    assert VERIFIER.verify("POST", URL, fields, BODY, now=NOW).kid == KEY.kid


@pytest.mark.parametrize("url", [URL + "?a=b?c", URL + "?next=/x?y=1", URL + "??", URL + "?"])
@pytest.mark.parametrize(
    "components",
    [COMPONENTS, (*COMPONENTS, "@query"), ("@method", "@target-uri", "content-digest", "content-type")],
)
def test_a_question_mark_inside_the_query_verifies(url: str, components: tuple[str, ...]) -> None:
    headers = {"Content-Type": "application/json"}
    headers |= sign_request("POST", url, headers, BODY, [KEY], created=NOW, components=components)
    verifier = Verifier(JWKS([KEY.public]), VerificationPolicy(required_components=components))
    assert verifier.verify("POST", url, headers, BODY, now=NOW).kid == KEY.kid


def _with_others(others: int, *, first: bool) -> dict[str, str]:
    """A valid ``sig1`` beside ``others`` signatures naming the same trusted key that do not hold."""
    headers = {"Content-Type": "application/json"}
    headers |= sign_request("POST", URL, headers, BODY, [KEY], created=NOW)
    params = headers["Signature-Input"].split(")", 1)[1]
    covered = '("@method" "@authority" "@path" "content-digest" "content-type" "x-absent")'
    bogus = base64.b64encode(bytes(64)).decode()
    inputs = [
        f"x{i}={covered if i % 2 else headers['Signature-Input'][5:].split(')')[0] + ')'}{params}"
        for i in range(others)
    ]
    signatures = [f"x{i}=:{bogus}:" for i in range(others)]
    valid_in, valid_sig = headers["Signature-Input"], headers["Signature"]
    all_in = [*inputs, valid_in] if first else [valid_in, *inputs]
    all_sig = [*signatures, valid_sig] if first else [valid_sig, *signatures]
    return headers | {"Signature-Input": ", ".join(all_in), "Signature": ", ".join(all_sig)}


@pytest.mark.parametrize("others", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("first", [True, False])
def test_a_valid_signature_verifies_beside_others_naming_the_same_key(others: int, first: bool) -> None:
    verified = VERIFIER.verify("POST", URL, _with_others(others, first=first), BODY, now=NOW)
    assert (verified.label, verified.kid) == ("sig1", KEY.kid)


#: The order of the P-256 group: ``s`` and ``n - s`` are both valid ECDSA signatures (RFC 9421
#: does not ask for low-S, and neither does any verifier we test against).
P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("bogus_kid", ["the same key", "another trusted key", "an unknown key"])
def test_a_high_s_ecdsa_signature_verifies_alone_and_beside_two_bogus_ones(
    first: bool, bogus_kid: str
) -> None:
    """Issue 38 asks again (a new fuzzing run): a valid high-S P-256 signature next to two that do
    not hold, whichever key they name and wherever they stand, through ``verify`` and ``averify``."""
    ecdsa, other = SigningKey.generate("ecdsa-p256-sha256"), SigningKey.generate()
    verifier = Verifier(JWKS([ecdsa.public, other.public]))
    headers = {"Content-Type": "application/json"}
    headers |= sign_request("POST", URL, headers, BODY, [ecdsa], created=NOW)
    raw = base64.b64decode(headers["Signature"].split(":")[1])
    r, s = raw[:32], int.from_bytes(raw[32:], "big")
    high = s if s > P256_ORDER // 2 else P256_ORDER - s
    headers["Signature"] = "sig1=:" + base64.b64encode(r + high.to_bytes(32, "big")).decode() + ":"
    assert verifier.verify("POST", URL, headers, BODY, now=NOW).kid == ecdsa.kid

    kid = {"the same key": ecdsa.kid, "another trusted key": other.kid, "an unknown key": "nope"}[bogus_kid]
    bogus_in = headers["Signature-Input"].split("=", 1)[1].replace(ecdsa.kid, kid)
    inputs = [f"b{i}={bogus_in}" for i in (1, 2)]
    signatures = [f"b{i}=:{base64.b64encode(bytes([i]) * 64).decode()}:" for i in (1, 2)]
    mine_in, mine_sig = [headers["Signature-Input"]], [headers["Signature"]]
    fields = headers | {
        "Signature-Input": ", ".join([*inputs, *mine_in] if first else [*mine_in, *inputs]),
        "Signature": ", ".join([*signatures, *mine_sig] if first else [*mine_sig, *signatures]),
    }
    assert verifier.verify("POST", URL, fields, BODY, now=NOW).label == "sig1"
    assert asyncio.run(verifier.averify("POST", URL, fields, BODY, now=NOW)).label == "sig1"


def test_more_signatures_than_the_cap_are_refused_naming_the_cap() -> None:
    policy = VerificationPolicy()
    headers = _with_others(policy.max_signatures, first=True)
    with pytest.raises(MalformedSignature, match="max_signatures"):
        VERIFIER.verify("POST", URL, headers, BODY, now=NOW)
    assert Verifier(JWKS([KEY.public]), VerificationPolicy(max_signatures=16)).verify(
        "POST", URL, headers, BODY, now=NOW
    )


def test_a_none_header_value_is_refused_at_the_boundary() -> None:
    headers: dict[str, object] = {"Content-Type": "application/json"}
    headers |= sign_request("POST", URL, {"Content-Type": "application/json"}, BODY, [KEY], created=NOW)
    headers["X-Trace"] = None
    with pytest.raises(TypeError, match="'X-Trace' has a NoneType value"):
        VERIFIER.verify("POST", URL, headers, BODY, now=NOW)  # type: ignore[arg-type]
