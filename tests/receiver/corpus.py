"""The cross-receiver corpus: signed, tampered and mangled webhook requests with the Python
receiver's verdict on each, which the TypeScript receiver (``receiver-js/test/corpus.test.mjs``)
must reproduce exactly: ``"ok"`` or the same reason code.

Named cases cover what a verifier decides (policy, keys, rotation pairs, digests, components,
parameters, field syntax, legal but unusual spellings, Standard Webhooks); the rest are
``test_fuzz``'s mutations of valid field values and bodies, from a fixed seed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from usp_receiver import (
    JWKS,
    ReceiverError,
    SigningKey,
    VerificationPolicy,
    Verifier,
    content_digest,
    sign_message,
    sign_request,
    standard_webhooks,
)
from usp_schemas import BOOKING_CONFIRMED_EXAMPLE

__all__ = ["NOW", "corpus"]

NOW = 1_800_000_000
URL = "https://platform.example/webhooks/usp"
BODY = json.dumps(json.loads(BOOKING_CONFIRMED_EXAMPLE), separators=(",", ":")).encode()
COMPONENTS = ("@method", "@authority", "@path", "content-digest", "content-type")
#: The order of the P-256 group: ``s`` and ``n - s`` are both valid ECDSA signatures.
P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
MUTATION_CHARS = '=():;,"\\ *0aZ/+'
FUZZ_CASES = 400


@dataclass
class Case:
    name: str
    headers: dict[str, str]
    body: bytes = BODY
    method: str = "POST"
    url: str = URL
    scheme: str = "rfc9421"
    policy: dict[str, Any] = field(default_factory=dict)


def corpus(seed: int = 39) -> dict[str, Any]:
    """The corpus as the Node test reads it: keys, secrets and every case with its verdict."""
    rng = random.Random(seed)
    key, p256, untrusted = (
        SigningKey.generate(),
        SigningKey.generate("ecdsa-p256-sha256"),
        SigningKey.generate(),
    )
    colons = SigningKey.from_jwk(SigningKey.generate().to_jwk() | {"kid": "urn:usp:key:1:"})
    jwks = JWKS([key.public, p256.public, colons.public])
    secret = standard_webhooks.SECRET_PREFIX + base64.b64encode(rng.randbytes(32)).decode()
    signing_key = standard_webhooks.new_signing_key()
    public_key = standard_webhooks.public_key_of(signing_key)
    cases = [
        *_rfc9421_cases(key, p256, untrusted),
        Case("a keyid with colons", _signed([colons])),
        *_fuzz_cases(rng, key, p256),
        *_standard_cases(secret, signing_key),
    ]
    return {
        "now": NOW,
        "jwks": jwks.to_dict(),
        "secrets": [secret],
        "public_keys": [public_key],
        "cases": [_judged(case, jwks, secret, public_key) for case in cases],
    }


def _judged(case: Case, jwks: JWKS, secret: str, public_key: str) -> dict[str, Any]:
    try:
        if case.scheme == "standard":
            standard_webhooks.verify(
                case.headers, case.body, secrets=[secret], public_keys=[public_key], now=NOW
            )
            verdict = "ok"
        else:
            verifier = Verifier(jwks, VerificationPolicy(**case.policy)) if case.policy else Verifier(jwks)
            verdict = "ok:" + verifier.verify(case.method, case.url, case.headers, case.body, now=NOW).label
    except ReceiverError as exc:
        verdict = exc.reason
    return {
        "name": case.name,
        "scheme": case.scheme,
        "method": case.method,
        "url": case.url,
        "headers": list(case.headers.items()),
        "body": base64.b64encode(case.body).decode(),
        "policy": case.policy,
        "verdict": verdict,
    }


def _signed(keys: list[SigningKey], *, url: str = URL, body: bytes = BODY, **options: Any) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    return headers | sign_request(
        "POST", url, headers, body, keys, created=options.pop("created", NOW), **options
    )


def _member(key: SigningKey, label: str, headers: dict[str, str], **options: Any) -> tuple[str, str]:
    options.setdefault("components", COMPONENTS)
    options.setdefault("created", NOW)
    member = sign_message(
        options.pop("method", "POST"), options.pop("url", URL), headers, key, label=label, **options
    )
    return member.signature_input, member.signature


def _rfc9421_cases(key: SigningKey, p256: SigningKey, untrusted: SigningKey) -> Iterator[Case]:
    good = _signed([key])
    yield Case("valid ed25519", good)
    yield Case("valid P-256", _signed([p256]))
    raw = base64.b64decode(_signed([p256])["Signature"].split(":")[1])
    s = int.from_bytes(raw[32:], "big")
    high = s if s > P256_ORDER // 2 else P256_ORDER - s
    high_s = _signed([p256])
    high_s["Signature"] = "sig1=:" + base64.b64encode(raw[:32] + high.to_bytes(32, "big")).decode() + ":"
    yield Case("valid P-256, high S", high_s)
    yield Case("rotation: sig1 by an unpublished key, sig2 by the current one", _signed([untrusted, key]))
    yield Case("rotation: sig1 by the current key, sig2 by a retired one", _signed([key, untrusted]))
    forged = _signed([key, untrusted])
    forged["Signature"] = forged["Signature"].replace(forged["Signature"][6:20], "A" * 14, 1)
    yield Case("a forged sig1 beside an unknown sig2 reports the forgery", forged)
    yield Case("unknown key alone", _signed([untrusted]))
    yield Case("body changed, digest kept", good, body=BODY.replace(b"Alice", b"Mallory"))
    changed = BODY.replace(b"Alice", b"Mallory")
    yield Case(
        "body changed, digest updated", good | {"Content-Digest": content_digest(changed)}, body=changed
    )
    yield Case("no Content-Digest", {k: v for k, v in good.items() if k != "Content-Digest"})
    sha512 = "sha-512=:" + base64.b64encode(hashlib.sha512(BODY).digest()).decode() + ":"
    yield Case("sha-512 digest, signed", _with_fields(key, {"Content-Digest": sha512}))
    yield Case("digest of an unknown algorithm", good | {"Content-Digest": "md5=:" + "A" * 22 + "==:"})
    yield Case(
        "two digests, one wrong",
        good | {"Content-Digest": good["Content-Digest"] + ", " + sha512.replace("A", "B", 1)},
    )
    yield Case(
        "two digests, both right", _with_fields(key, {"Content-Digest": content_digest(BODY) + ", " + sha512})
    )
    yield Case(
        "the same digest algorithm twice",
        good | {"Content-Digest": good["Content-Digest"] + ", " + good["Content-Digest"]},
    )
    yield Case("digest not a byte sequence", good | {"Content-Digest": "sha-256=abc"})
    yield Case("stale (created 10 minutes ago)", _signed([key], created=NOW - 600))
    yield Case("created 301 s ago", _signed([key], created=NOW - 301))
    yield Case("created 299 s ago", _signed([key], created=NOW - 299))
    yield Case("created 10 minutes ahead", _signed([key], created=NOW + 600))
    yield Case("created 59 s ahead", _signed([key], created=NOW + 59))
    yield Case("expired", _signed([key], expires=NOW - 1))
    yield Case("expires ahead", _signed([key], expires=NOW + 60))
    yield Case("another application's tag", _signed([key], tag="web-bot-auth"))
    yield Case("no tag", _signed([key], tag=None))
    yield Case("no tag, tag required", _signed([key], tag=None), policy={"require_tag": True})
    yield Case("content-type not covered", _signed([key], components=COMPONENTS[:-1]))
    yield Case(
        "content-digest not covered",
        _signed([key], components=("@method", "@authority", "@path", "content-type")),
    )
    yield Case(
        "@query covered",
        _signed([key], url=URL + "?a=1&b=%20", components=(*COMPONENTS, "@query")),
        url=URL + "?a=1&b=%20",
    )
    yield Case(
        "? inside the query",
        _signed([key], url=URL + "?next=/x?y=1", components=(*COMPONENTS, "@query")),
        url=URL + "?next=/x?y=1",
    )
    yield Case(
        "@target-uri covered",
        _signed([key], components=("@method", "@target-uri", "content-digest", "content-type")),
        policy={"required_components": ("@method", "@target-uri", "content-digest", "content-type")},
    )
    yield Case(
        "a default port in the URL",
        _signed([key], url="https://platform.example:443/webhooks/usp"),
        url="https://platform.example:443/webhooks/usp",
    )
    yield Case("signed for another authority", _signed([key], url="https://attacker.example/webhooks/usp"))
    yield Case("signed for another path", _signed([key], url="https://platform.example/other"))
    yield Case("method lower-case on arrival", good, method="post")
    yield Case(
        "@query-param covered",
        _signed([key], url=URL + "?Pet=dog", components=(*COMPONENTS, '"@query-param";name="Pet"')),
        url=URL + "?Pet=dog",
    )
    absent = dict(good)  # signed with X-Absent present, sent without it
    absent["Signature-Input"], absent["Signature"] = _member(
        key, "sig1", good | {"X-Absent": "1"}, components=(*COMPONENTS, "x-absent")
    )
    yield Case("covers a field the message lacks", absent)
    no_created = dict(good)
    no_created["Signature-Input"] = good["Signature-Input"].replace(f";created={NOW}", "")
    yield Case("no created parameter", no_created)
    yield Case("no created, not required", no_created, policy={"require_created": False})
    yield Case("unknown parameter", good | {"Signature-Input": good["Signature-Input"] + ';foo="bar"'})
    yield Case(
        "created as a string",
        good | {"Signature-Input": good["Signature-Input"].replace(f"created={NOW}", f'created="{NOW}"')},
    )
    yield Case(
        "created as a decimal",
        good | {"Signature-Input": good["Signature-Input"].replace(f"created={NOW}", f"created={NOW}.5")},
    )
    yield Case(
        "keyid as a token",
        good | {"Signature-Input": good["Signature-Input"].replace(f'keyid="{key.kid}"', "keyid=abc")},
    )
    yield Case(
        "no keyid", good | {"Signature-Input": good["Signature-Input"].replace(f';keyid="{key.kid}"', "")}
    )
    yield Case(
        "alg names another algorithm",
        good
        | {"Signature-Input": good["Signature-Input"].replace('alg="ed25519"', 'alg="ecdsa-p256-sha256"')},
    )
    hmac_key = SigningKey.from_jwk(
        {"kty": "oct", "k": base64.urlsafe_b64encode(b"k" * 32).rstrip(b"=").decode()}
    )
    yield Case("an HMAC key (never in a JWKS)", _signed([hmac_key]))
    yield Case("Signature-Input alone", {k: v for k, v in good.items() if k != "Signature"})
    yield Case("Signature alone", {k: v for k, v in good.items() if k != "Signature-Input"})
    yield Case(
        "no signature at all", {"Content-Type": "application/json", "Content-Digest": good["Content-Digest"]}
    )
    yield Case("labels differ", good | {"Signature": good["Signature"].replace("sig1=", "sig9=")})
    two = _signed([key, p256])
    duplicate_label = good | {
        "Signature-Input": good["Signature-Input"]
        + ", "
        + two["Signature-Input"].split(", ")[1].replace("sig2=", "sig1="),
        "Signature": good["Signature"] + ", " + two["Signature"].split(", ")[1].replace("sig2=", "sig1="),
    }
    yield Case("the same label twice", duplicate_label)
    yield Case("unpadded signature", good | {"Signature": good["Signature"].rstrip(":").rstrip("=") + ":"})
    yield Case("signature as a token", good | {"Signature": "sig1=abc"})
    yield Case("signature with a parameter", good | {"Signature": good["Signature"] + ";x=1"})
    yield Case("signature input not an inner list", good | {"Signature-Input": 'sig1="@method";created=1'})
    yield Case(
        "a component twice",
        good | {"Signature-Input": good["Signature-Input"].replace('("@method"', '("@method" "@method"')},
    )
    yield Case(
        "a component as a token",
        good | {"Signature-Input": good["Signature-Input"].replace('"@method"', "method")},
    )
    many = _signed([key, *(SigningKey.generate() for _ in range(8))])
    yield Case("nine signatures", many)
    yield Case("eight signatures, the last valid", _signed([*(SigningKey.generate() for _ in range(7)), key]))
    yield Case("empty Signature-Input", good | {"Signature-Input": ""})
    yield Case(
        "a non-ASCII character in Signature-Input",
        good | {"Signature-Input": good["Signature-Input"] + ';n="é"'},
    )
    yield Case("a trailing comma", good | {"Signature-Input": good["Signature-Input"] + ","})
    yield Case(
        "empty body, no digest",
        {
            k: v
            for k, v in _signed([key], body=b"", components=("@method", "@authority", "@path")).items()
            if k != "Content-Digest"
        },
        body=b"",
        policy={"required_components": ("@method", "@authority", "@path")},
    )


def _with_fields(key: SigningKey, extra: dict[str, str]) -> dict[str, str]:
    """A delivery whose fields include ``extra`` (e.g. another Content-Digest), signed over them."""
    headers = {"Content-Type": "application/json"} | extra
    signature_input, signature = _member(key, "sig1", headers, tag="usp-webhook")
    return headers | {"Signature-Input": signature_input, "Signature": signature}


def _mutate(rng: random.Random, value: str) -> str:
    chars = list(value)
    for _ in range(rng.randint(1, 4)):
        position = rng.randint(0, max(len(chars) - 1, 0))
        action = rng.choice(["insert", "delete", "replace"])
        char = rng.choice(MUTATION_CHARS)
        if action == "insert":
            chars.insert(position, char)
        elif chars and action == "delete":
            del chars[position]
        elif chars:
            chars[position] = char
    return "".join(chars)


def _fuzz_cases(rng: random.Random, key: SigningKey, p256: SigningKey) -> Iterator[Case]:
    good = _signed([key, p256])
    targets = ("Signature-Input", "Signature", "Content-Digest", "body")
    for index in range(FUZZ_CASES):
        target = targets[index % len(targets)]
        if target == "body":
            case = Case("mutated body", good, body=_mutate(rng, BODY.decode()).encode())
        else:
            case = Case(f"mutated {target}", good | {target: _mutate(rng, good[target])})
        case.name = f"fuzz {index}: {case.name}"
        yield case


def _standard_cases(secret: str, signing_key: str) -> Iterator[Case]:
    def signed(moment: int = NOW, body: bytes = BODY, **keys: Any) -> dict[str, str]:
        keys.setdefault("secrets", [secret])
        return standard_webhooks.sign("evt_019a2b3c4d5e7000800000000000000a", moment, body, **keys)

    yield Case("SW v1", signed(), scheme="standard")
    yield Case("SW v1a", signed(secrets=[], signing_keys=[signing_key]), scheme="standard")
    yield Case("SW v1 and v1a", signed(signing_keys=[signing_key]), scheme="standard")
    yield Case("SW tampered body", signed(), body=BODY + b" ", scheme="standard")
    yield Case("SW stale", signed(NOW - 301), scheme="standard")
    yield Case("SW ahead", signed(NOW + 301), scheme="standard")
    yield Case("SW wrong secret", signed(secrets=[standard_webhooks.new_secret()]), scheme="standard")
    yield Case(
        "SW wrong key",
        signed(secrets=[], signing_keys=[standard_webhooks.new_signing_key()]),
        scheme="standard",
    )
    yield Case(
        "SW rotation: an old secret first",
        signed(secrets=[standard_webhooks.new_secret(), secret]),
        scheme="standard",
    )
    yield Case("SW timestamp not a number", signed() | {"webhook-timestamp": "17e8"}, scheme="standard")
    yield Case("SW no id", {k: v for k, v in signed().items() if k != "webhook-id"}, scheme="standard")
    nine = signed()
    nine["webhook-signature"] = " ".join([nine["webhook-signature"]] * 9)
    yield Case("SW nine signatures", nine, scheme="standard")
    yield Case("SW signature not base64", signed() | {"webhook-signature": "v1,@@@@"}, scheme="standard")
