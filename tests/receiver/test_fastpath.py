"""The fast path is the library, only faster: byte-for-byte proofs over generated messages.

Both our signer and our verifier build signature bases without ``http_message_signatures`` when
a message has the canonical shape they recognise. These tests generate messages (URLs with odd
ports, percent escapes and empty paths; header values with stray whitespace and repeated lines;
every parameter combination) and compare our bytes with the library's.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from http_message_signatures import HTTPMessageSigner, HTTPMessageVerifier, MappingKeyResolver, algorithms
from http_message_signatures.structures import normalize_header_value
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from usp_receiver import PROFILE_COMPONENTS, SigningKey, Verifier, sign_message, sign_request
from usp_receiver._jwks import JWKS
from usp_receiver._library import library_signature_base
from usp_receiver._message import HttpRequest
from usp_receiver._sigbase import fast_signature_base, parse_signatures, parse_url_fast

KEY = SigningKey.generate()
LIBRARY_SIGNER = HTTPMessageSigner(
    signature_algorithm=algorithms.ED25519,
    key_resolver=MappingKeyResolver(public_keys={}, private_keys={KEY.kid: KEY.key}),
)

_PCHAR = st.one_of(
    st.sampled_from("abcxyzABC019-._~!$&'()*+,;=:@"),
    st.sampled_from(["%20", "%2F", "%7e", "%C3%A9"]),
)
hosts = st.from_regex(r"[a-z0-9][a-z0-9\-]{0,8}(\.[a-z0-9]{1,6}){0,2}", fullmatch=True)
ports = st.one_of(st.none(), st.sampled_from(["80", "443", "0443", "8080", "1", ""]))
paths = st.one_of(
    st.none(),
    st.lists(st.lists(_PCHAR, max_size=6).map("".join), max_size=4).map(lambda parts: "/" + "/".join(parts)),
)
queries = st.one_of(st.none(), st.lists(st.one_of(_PCHAR, st.sampled_from("?/")), max_size=10).map("".join))


@st.composite
def urls(draw: st.DrawFn) -> str:
    scheme = draw(st.sampled_from(["http", "https"]))
    port = draw(ports)
    path = draw(paths)
    query = draw(queries)
    url = f"{scheme}://{draw(hosts)}" + ("" if port is None else f":{port}") + (path or "")
    return url + ("" if query is None else f"?{query}")


header_values = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20)
padded_values = st.tuples(
    st.sampled_from(["", " ", "\t", "  "]), header_values, st.sampled_from(["", " ", "\t"])
).map("".join)
header_names = st.sampled_from(["content-type", "x-usp-thing", "date", "x-empty"])
headers_lists = st.lists(st.tuples(header_names, padded_values), max_size=6)
simple_strings = st.text(alphabet=st.sampled_from("abcXYZ019-_.:/+= ,;"), max_size=12)


@st.composite
def signing_cases(draw: st.DrawFn) -> dict[str, Any]:
    method = draw(st.sampled_from(["POST", "GET", "PUT", "OPTIONS", "DELETE"]))
    headers = draw(headers_lists)
    names = sorted({name for name, _ in headers})
    derived = ["@method", "@authority", "@path", "@query", "@scheme", "@target-uri"]
    components = draw(st.lists(st.sampled_from(derived + names), unique=True, max_size=7))
    return {
        "method": method,
        "url": draw(urls()),
        "headers": headers,
        "components": components,
        "created": draw(st.integers(min_value=0, max_value=4_000_000_000)),
        "expires": draw(st.one_of(st.none(), st.integers(min_value=1, max_value=4_000_000_000))),
        "nonce": draw(st.one_of(st.none(), simple_strings)),
        "tag": draw(st.one_of(st.none(), simple_strings)),
        "include_alg": draw(st.booleans()),
    }


@dataclass
class _LibraryMessage:
    method: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(signing_cases())
def test_signer_output_equals_the_library_signer_byte_for_byte(case: dict[str, Any]) -> None:
    # The library's message view takes one line per field: combine repeats the way RFC 9110 does.
    combined: dict[str, str] = {}
    for name, value in HttpRequest(case["method"], case["url"], case["headers"]).fields.items():
        combined[name] = ", ".join(value)
        # A combined value with empty lines ("a, ") would be re-trimmed as one line; the verifier
        # test below covers repeated lines exactly, with the library reading each line itself.
        assume(normalize_header_value(combined[name]) == combined[name])
    library_message = _LibraryMessage(case["method"], case["url"], dict(combined))
    LIBRARY_SIGNER.sign(
        library_message,
        key_id=KEY.kid,
        created=datetime.datetime.fromtimestamp(case["created"], tz=datetime.UTC),
        expires=(
            None
            if case["expires"] is None
            else datetime.datetime.fromtimestamp(case["expires"], tz=datetime.UTC)
        ),
        nonce=case["nonce"],
        label="sig1",
        tag=case["tag"],
        include_alg=case["include_alg"],
        covered_component_ids=case["components"],
    )
    ours = sign_message(
        case["method"],
        case["url"],
        case["headers"],
        KEY,
        label="sig1",
        components=case["components"],
        created=case["created"],
        expires=case["expires"],
        nonce=case["nonce"],
        tag=case["tag"],
        include_alg=case["include_alg"],
    )
    assert ours.signature_input == library_message.headers["Signature-Input"]
    assert ours.signature == library_message.headers["Signature"]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(signing_cases())
def test_verifier_fast_base_equals_the_library_base(case: dict[str, Any]) -> None:
    member = sign_message(
        case["method"],
        case["url"],
        case["headers"],
        KEY,
        label="sig1",
        components=case["components"],
        created=case["created"],
        expires=case["expires"],
        nonce=case["nonce"],
        tag=case["tag"],
        include_alg=case["include_alg"],
    )
    request = HttpRequest(
        case["method"],
        case["url"],
        [*case["headers"], ("Signature-Input", member.signature_input), ("Signature", member.signature)],
    )
    (entry,) = parse_signatures(member.signature_input, member.signature)
    assert entry.signature == KEY.sign(member.signature_base)
    library = library_signature_base(request, entry)
    fast = fast_signature_base(entry, request, parse_url_fast(case["url"]))
    assert fast is None or fast == library
    assert member.signature_base == library


def test_the_profile_shape_takes_the_fast_path() -> None:
    """The equality proofs above are only worth something if real webhooks use the fast path."""
    headers = {"Content-Type": "application/json"}
    body = b'{"event": "booking.created"}'
    url = "https://platform.example:8443/webhooks/usp?tenant=a%20b"
    headers |= sign_request("POST", url, headers, body, [KEY], created=1_800_000_000)
    request = HttpRequest("POST", url, headers, body)
    (entry,) = parse_signatures(headers["Signature-Input"], headers["Signature"])
    assert entry.fast
    fast = fast_signature_base(entry, request, parse_url_fast(url))
    assert fast is not None
    assert fast == library_signature_base(request, entry)
    assert entry.components == tuple(f'"{c}"' for c in PROFILE_COMPONENTS)


def test_sign_request_equals_the_library_signing_with_a_body() -> None:
    url = "https://platform.example/webhooks/usp"
    body = b'{"event": "booking.created", "event_id": "evt_1"}'
    ours = sign_request("POST", url, {"Content-Type": "application/json"}, body, [KEY], created=1_790_000_000)
    library_message = _LibraryMessage("POST", url, {"Content-Type": "application/json"})
    LIBRARY_SIGNER.sign(
        library_message,
        key_id=KEY.kid,
        created=datetime.datetime.fromtimestamp(1_790_000_000, tz=datetime.UTC),
        label="sig1",
        tag="usp-webhook",
        covered_component_ids=PROFILE_COMPONENTS,
        body=body,
    )
    assert ours == {
        "Content-Digest": library_message.headers["Content-Digest"],
        "Signature-Input": library_message.headers["Signature-Input"],
        "Signature": library_message.headers["Signature"],
    }
    # ... and the library's verifier accepts what we signed, digest included.
    library_message.headers = {"Content-Type": "application/json", **ours}
    verifier = _library_verifier()
    results = verifier.verify(library_message, max_age=None, body=body, expect_tag="usp-webhook")
    assert results[0].parameters["keyid"] == KEY.kid
    assert Verifier(JWKS([KEY.public])).verify("POST", url, library_message.headers, body, now=1_790_000_000)


def _library_verifier() -> Any:
    resolver = MappingKeyResolver(public_keys={KEY.kid: KEY.public.key}, private_keys={})
    return HTTPMessageVerifier(signature_algorithm=algorithms.ED25519, key_resolver=resolver)
