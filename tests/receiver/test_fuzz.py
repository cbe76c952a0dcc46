"""Hostile input never escapes the typed error hierarchy.

A receiver sits on the public internet; any exception other than :class:`ReceiverError` would be
a 500 (and a retry storm from honest senders) or worse, a crash. Hypothesis feeds the verifier
random and mutated ``Signature``, ``Signature-Input``, ``Content-Digest`` values and bodies.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from usp_receiver import ReceiverError, SigningKey, VerificationPolicy, Verifier, sign_request
from usp_receiver._jwks import JWKS

NOW = 1_800_000_000
URL = "https://platform.example/webhooks/usp"
KEY = SigningKey.generate()
P256 = SigningKey.generate("ecdsa-p256-sha256")
VERIFIER = Verifier(JWKS([KEY.public, P256.public]))
LAX = Verifier(
    JWKS([KEY.public, P256.public]),
    VerificationPolicy(required_components=(), require_created=False, max_age=1e12, max_future=1e12),
)
BODY = json.dumps({"event": "booking.created", "event_id": "evt_01JD0000000000000000000000"}).encode()
GOOD = {"Content-Type": "application/json"} | sign_request(
    "POST", URL, {"Content-Type": "application/json"}, BODY, [KEY, P256], created=NOW
)

# Text that looks like Structured Fields: the parsers' interesting characters, much more often
# than uniform random text would produce them.
sf_text = st.text(
    alphabet=st.sampled_from('sig12=():;,"\\ \t*-_.@abcdefkyrtdn0123456789+/=AZ?%\x00\x7f\u00e9\u2028'),
    max_size=120,
)
any_text = st.one_of(sf_text, st.text(max_size=80))


@st.composite
def mutations(draw: st.DrawFn, value: str) -> str:
    """A valid field value with a few characters inserted, deleted or replaced."""
    chars = list(value)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        position = draw(st.integers(min_value=0, max_value=max(len(chars) - 1, 0)))
        action = draw(st.sampled_from(["insert", "delete", "replace"]))
        char = draw(st.sampled_from('=():;,"\\ *0aZ/+'))
        if action == "insert":
            chars.insert(position, char)
        elif chars and action == "delete":
            del chars[position]
        elif chars:
            chars[position] = char
    return "".join(chars)


def field_strategy(name: str) -> st.SearchStrategy[str | None]:
    return st.one_of(st.none(), st.just(GOOD[name]), mutations(GOOD[name]), any_text)


bodies = st.one_of(
    st.just(BODY),
    st.binary(max_size=200),
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=10)),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
        max_leaves=8,
    ).map(lambda value: json.dumps(value).encode()),
)


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(
    signature_input=field_strategy("Signature-Input"),
    signature=field_strategy("Signature"),
    digest=field_strategy("Content-Digest"),
    body=bodies,
    method=st.sampled_from(["POST", "post", "GET", ""]),
    url=st.sampled_from(
        [URL, "https://PLATFORM.example/x", "not a url", "https://[::1]:99/", URL + "?q=%zz"]
    ),
)
def test_verifier_raises_only_typed_errors(
    signature_input: str | None,
    signature: str | None,
    digest: str | None,
    body: bytes,
    method: str,
    url: str,
) -> None:
    headers = {"Content-Type": "application/json"}
    for name, value in (
        ("Signature-Input", signature_input),
        ("Signature", signature),
        ("Content-Digest", digest),
    ):
        if value is not None:
            headers[name] = value
    reasons: list[str] = []
    for verifier in (VERIFIER, LAX):
        try:
            verified = verifier.verify(method, url, headers, body, now=NOW)
        except ReceiverError as exc:
            reasons.append(exc.reason)
        else:
            # Whatever passed really is the untouched signed message.
            assert body == BODY
            assert headers["Content-Digest"] == GOOD["Content-Digest"] or verifier is LAX
            assert verified.kid in (KEY.kid, P256.kid)
    assert all(reasons)  # every refusal names a stable, non-empty code
