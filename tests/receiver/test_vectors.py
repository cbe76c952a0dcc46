"""RFC 9421 Appendix B, RFC 9530 and Web Bot Auth vectors, through our own code paths."""

from __future__ import annotations

from typing import Any

import pytest

from tests.receiver.vectors import all_public_keys, case, signing_key, vectors
from usp_receiver import (
    DigestMismatch,
    ReceiverError,
    SigningKey,
    VerificationPolicy,
    Verifier,
    check_content_digest,
    content_digest,
    sign_message,
)
from usp_receiver._jwks import JWKS

ALL_ALGORITHMS = frozenset(
    {"ed25519", "ecdsa-p256-sha256", "rsa-pss-sha512", "rsa-v1_5-sha256", "hmac-sha256"}
)


def _vector_verifier(tag: str | None = None) -> Verifier:
    # The RFC's messages predate our profile: no required components, no digest rule, any age.
    policy = VerificationPolicy(
        required_components=(),
        max_age=1e12,
        algorithms=ALL_ALGORITHMS,
        require_digest=False,
        tag=tag,
    )
    return Verifier(JWKS(all_public_keys()), policy)


def _headers(message: dict[str, Any], c: dict[str, Any]) -> list[tuple[str, str]]:
    headers = [(name, value) for name, value in message["headers"]]
    return [
        *headers,
        ("Signature-Input", c["expected_signature_input"]),
        ("Signature", c["expected_signature"]),
    ]


@pytest.mark.parametrize("case_id", ["b21", "b22", "b23", "b25", "b26"])
def test_rfc9421_request_cases_verify(case_id: str) -> None:
    c = case(case_id)
    message = vectors()["messages"][c["message"]]
    verifier = _vector_verifier(tag=c["signature_params"].get("tag"))
    verified = verifier.verify(
        message["method"],
        message["target_uri"],
        _headers(message, c),
        message["body"].encode(),
        now=c["signature_params"]["created"],
    )
    assert verified.label == c["label"]
    assert verified.kid == c["key_id"]
    assert verified.components == tuple(c["covered_components"])


def test_rfc9421_b24_response_verifies() -> None:
    c = case("b24")
    message = vectors()["messages"]["test-response"]
    verified = _vector_verifier().verify_response(
        message["status"], _headers(message, c), message["body"].encode(), now=1618884473
    )
    assert verified.kid == "test-key-ecc-p256"


@pytest.mark.parametrize("case_id", ["b21", "b22", "b23", "b25", "b26"])
def test_rfc9421_request_cases_reject_a_flipped_signature_bit(case_id: str) -> None:
    """The vectors verifying is meaningful only if the same path rejects a wrong signature."""
    c = case(case_id)
    message = vectors()["messages"][c["message"]]
    flipped = c["expected_signature_b64"]
    flipped = ("A" if flipped[0] != "A" else "B") + flipped[1:]
    headers = [*message["headers"], ("Signature-Input", c["expected_signature_input"])]
    headers.append(("Signature", f"{c['label']}=:{flipped}:"))
    with pytest.raises(ReceiverError) as info:
        _vector_verifier(tag=c["signature_params"].get("tag")).verify(
            message["method"], message["target_uri"], headers, message["body"].encode(), now=1618884473
        )
    assert info.value.reason == "bad_signature"


@pytest.mark.parametrize("case_id", ["b25", "b26"])
def test_rfc9421_deterministic_cases_reproduce_byte_for_byte(case_id: str) -> None:
    c = case(case_id)
    message = vectors()["messages"][c["message"]]
    member = sign_message(
        message["method"],
        message["target_uri"],
        [(name, value) for name, value in message["headers"]],
        signing_key(c["key_id"]),
        label=c["label"],
        components=[component.strip('"') for component in c["covered_components"]],
        created=c["signature_params"]["created"],
        include_alg=c["include_alg"],
    )
    assert member.signature_base.decode() == c["signature_base"]
    assert member.signature_input == c["expected_signature_input"]
    assert member.signature == c["expected_signature"]


@pytest.mark.parametrize("index", [0, 1])
def test_web_bot_auth_request_vectors_reproduce_and_verify(index: int) -> None:
    v = vectors()["web_bot_auth_vectors"][index]
    url = f"https://{v['request']['authority']}/"
    headers = [(name, value) for name, value in v["request"]["headers"]]
    params = v["expected_signature_input"]
    components = [
        '"signature-agent";key="agent2"' if 'key="agent2"' in params else "signature-agent",
    ]
    jwk = {name: value for name, value in vectors()["keys"][v["key"]]["jwk"].items() if name != "kid"}
    key = SigningKey.from_jwk(jwk)  # Web Bot Auth names keys by their RFC 7638 thumbprint
    assert key.kid == v["key_id"]
    member = sign_message(
        v["request"]["method"],
        url,
        headers,
        key,
        label="sig2",
        components=["@authority", *components],
        created=1735689600,
        expires=int(params.split(";expires=")[1].split(";")[0]),
        nonce=params.split(';nonce="')[1].split('"')[0],
        tag="web-bot-auth",
    )
    assert member.signature_base.decode() == v["signature_base"]
    assert member.signature_input == v["expected_signature_input"]
    assert member.signature == v["expected_signature"]
    signed = [*headers, ("Signature-Input", member.signature_input), ("Signature", member.signature)]
    verifier = Verifier(
        JWKS([key.public]), VerificationPolicy(required_components=("@authority",), tag="web-bot-auth")
    )
    assert verifier.verify("GET", url, signed, b"", now=1735689600).kid == v["key_id"]


def test_web_bot_auth_signed_directory_response_verifies() -> None:
    v = vectors()["web_bot_auth_vectors"][2]
    headers = [
        ("Content-Digest", v["content_digest"]),
        ("Signature-Input", v["expected_signature_input"]),
        ("Signature", v["expected_signature"]),
    ]
    keys = JWKS.from_json(v["response_body"])
    policy = VerificationPolicy(
        required_components=("content-digest",), tag="http-message-signatures-directory"
    )
    verified = Verifier(keys, policy).verify_response(
        200,
        headers,
        v["response_body"].encode(),
        request_url="https://signature-agent.test/.well-known/http-message-signatures-directory",
        now=1735689600,
    )
    assert verified.label == "binding"


def test_rfc9530_examples() -> None:
    examples = vectors()["rfc9530_content_digest_examples"]["examples"]
    checked = 0
    for example in examples:
        raw = example["body_utf8_or_hex"]
        body = bytes.fromhex(raw) if example["name"].startswith("RFC 9530 B.4") else raw.encode()
        if example["reproduces"]:
            check_content_digest(example["field_value"], body)
            if example["field_value"].startswith("sha-256="):
                assert content_digest(body) == example["field_value"]
            checked += 1
        else:  # the two known-bad values in the RFC must be refused, not waved through
            with pytest.raises(DigestMismatch):
                check_content_digest(example["field_value"], body)
    assert checked >= 6
