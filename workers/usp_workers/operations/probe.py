"""A battery of deliveries, most of them wrong on purpose, that tells whether an endpoint really
verifies what it receives: signature, digest, covered components, key, time window.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_workers.operations.probe``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal

import httpx

from usp_core.ssrf import ResolvedTarget, send_pinned
from usp_receiver import (
    PROFILE_COMPONENTS,
    USP_TAG,
    SigningKey,
    content_digest,
    sign_message,
    standard_webhooks,
)
from usp_schemas import PROBE_EVENT, PROBE_HEADER, WEBHOOK_METHOD, new_event_id
from usp_workers.storage.models import Transport

__all__ = ["CASES", "Case", "CaseResult", "Expect", "as_json", "probe_endpoint", "summary", "verdict"]

Expect = Literal["accept", "reject"]
_CONTENT_TYPE: Final = "application/json"
_SKEW: Final = 600  # ten minutes: far outside any sane replay window, either way


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    expect: Expect
    what: str  #: what was sent, in a phrase


@dataclass(frozen=True, slots=True)
class CaseResult:
    case: Case
    status: int | None  #: what the endpoint answered (``None``: no answer)
    error: str | None  #: why there was no answer
    ok: bool
    finding: str  #: what the answer means, in a sentence


CASES: Final = (
    Case("valid", "accept", "a delivery signed as every delivery is"),
    Case("duplicate", "accept", "the same event_id again (it must not be processed twice)"),
    Case("body_changed", "reject", "a body changed after signing (its Content-Digest updated to match)"),
    Case("digest_mismatch", "reject", "a signed Content-Digest that is not the body's"),
    Case("other_authority", "reject", "a signature over another endpoint's @authority"),
    Case("other_path", "reject", "a signature over another @path"),
    Case("unknown_key", "reject", "a signature by a key not in the JWKS"),
    Case("wrong_key", "reject", "a keyid naming a published key, signed by another key"),
    Case("created_old", "reject", "created 10 minutes ago"),
    Case("created_ahead", "reject", "created 10 minutes ahead"),
    Case("unsigned", "reject", "no signature at all"),
    Case("digest_not_covered", "reject", "Signature-Input without content-digest"),
    Case("expired", "reject", "an expires in the past"),
    Case("rotation_sig2", "accept", "sig1 by a key not yet published, sig2 by the current key"),
)


async def probe_endpoint(
    client: httpx.AsyncClient,
    target: ResolvedTarget,
    keys: Sequence[SigningKey],
    *,
    transport: Transport = Transport.REST,
    timeout: float = 10.0,  # noqa: ASYNC109 - per case, as send_pinned takes it
    clock: Callable[[], float] = time.time,
    standard: tuple[Sequence[str], Sequence[str]] | None = None,
    extra: Mapping[str, str] | None = None,
) -> list[CaseResult]:
    """Send every case of :data:`CASES` to ``target`` (checked already), one after another, and
    judge each answer: 2xx where a verifying receiver accepts, 4xx where it refuses (a 5xx is a
    refusal for the wrong reason: a sender would retry it).

    With ``standard`` (the subscription's ``whsec_`` secrets and ``whsk_`` keys), each case also
    carries Standard Webhooks headers that hold exactly where the case should be accepted: over
    the body before it changed (tampered), at the old or early time (stale), under another secret
    (wrong secret), and none where the case is about RFC 9421 alone; so a receiver that verifies
    either scheme is judged by the same verdicts. ``extra``: the subscription's own headers, on
    every case as on its deliveries (outside the signature: the cases are about the profile's)."""
    if not keys:
        raise ValueError("probing needs the business's current signing key")
    valid_id = new_event_id()
    results = []
    for case in CASES:
        event_id = valid_id if case.name in ("valid", "duplicate") else new_event_id()
        body, headers = _request(case, target.url, keys, event_id, int(clock()), transport, standard)
        headers = dict(extra or {}) | headers
        try:
            response = await send_pinned(
                client,
                target,
                content=body,
                headers=headers,
                timeout=httpx.Timeout(timeout),
                total_timeout=timeout,
                max_response_bytes=4096,
            )
        except httpx.HTTPError as exc:
            results.append(
                CaseResult(case, None, type(exc).__name__, False, f"no answer ({type(exc).__name__})")
            )
            continue
        results.append(_judge(case, response.status_code))
    return results


def summary(results: Sequence[CaseResult]) -> str:
    """The verdict line."""
    return verdict([(r.case.name, r.finding) for r in results if not r.ok])


def verdict(wrong: Sequence[tuple[str, str]]) -> str:
    """The verdict line for the ``(case, finding)`` pairs that went wrong."""
    if not wrong:
        return "endpoint verifies signatures correctly"
    problems = "; ".join(f"{name}: {finding}" for name, finding in wrong)
    return f"{len(wrong)} problem{'s' if len(wrong) > 1 else ''}: {problems}"


def _judge(case: Case, status: int) -> CaseResult:
    if case.expect == "accept":
        if 200 <= status < 300:
            note = "accepted; it must not be handled twice" if case.name == "duplicate" else "accepted"
            return CaseResult(case, status, None, True, note)
        return CaseResult(case, status, None, False, f"refused a correct delivery ({status})")
    if 400 <= status < 500:
        return CaseResult(case, status, None, True, "refused")
    if 200 <= status < 300:
        return CaseResult(case, status, None, False, f"accepted {case.what}")
    if status >= 500:
        return CaseResult(
            case, status, None, False, f"refused for the wrong reason ({status}: a sender retries it)"
        )
    return CaseResult(case, status, None, False, f"answered {status}, neither accepted nor refused")


def as_json(results: Sequence[CaseResult]) -> list[dict[str, object]]:
    """The results as the admin API answers them (and as a run is recorded)."""
    return [
        {
            "case": r.case.name,
            "sent": r.case.what,
            "expected": "2xx" if r.case.expect == "accept" else "4xx",
            "status": r.status,
            "error": r.error,
            "ok": r.ok,
            "finding": r.finding,
        }
        for r in results
    ]


def _request(
    case: Case,
    url: str,
    keys: Sequence[SigningKey],
    event_id: str,
    now: int,
    transport: Transport,
    standard: tuple[Sequence[str], Sequence[str]] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of ``case``: signed as deliveries are, except what the case is about."""
    body, headers = _rfc9421_request(case, url, keys, event_id, now, transport)
    if standard is not None:
        headers |= _standard_headers(
            case, event_id, now, _body(event_id, case.name, now, transport), standard
        )
    return body, headers


def _standard_headers(
    case: Case, event_id: str, now: int, signed_body: bytes, standard: tuple[Sequence[str], Sequence[str]]
) -> dict[str, str]:
    """``case``'s Standard Webhooks headers: valid where it is to be accepted, wrong the same way
    where the case is one Standard Webhooks can be wrong in, absent where it is not."""
    secrets, keys = standard
    moment = now
    match case.name:
        case "valid" | "duplicate" | "rotation_sig2" | "body_changed":  # body_changed: the old body's
            pass
        case "created_old":
            moment = now - _SKEW
        case "created_ahead":
            moment = now + _SKEW
        case "unknown_key" | "wrong_key":
            secrets = [standard_webhooks.new_secret()] if secrets else []
            keys = [standard_webhooks.new_signing_key()] if keys else []
        case _:
            return {}
    return standard_webhooks.sign(event_id, moment, signed_body, secrets=secrets, signing_keys=keys)


def _rfc9421_request(
    case: Case, url: str, keys: Sequence[SigningKey], event_id: str, now: int, transport: Transport
) -> tuple[bytes, dict[str, str]]:
    body = _body(event_id, case.name, now, transport)
    headers = {"Content-Type": _CONTENT_TYPE, PROBE_HEADER: case.name}
    if case.name == "unsigned":
        return body, headers | {"Content-Digest": content_digest(body)}
    signed_url = url
    created, expires = now, None
    components: tuple[str, ...] = tuple(PROFILE_COMPONENTS)
    signers = list(keys)
    digest = sent_digest = content_digest(body)
    match case.name:
        case "body_changed":  # as a tamperer would: new body, its digest, the old signature
            body = _body(event_id, "changed after signing", now, transport)
            sent_digest = content_digest(body)
        case "digest_mismatch":  # signed as it is, but not the body's
            digest = sent_digest = content_digest(b'{"another":"body"}')
        case "other_authority":
            signed_url = _replace_authority(url)
        case "other_path":
            signed_url = _replace_path(url)
        case "unknown_key":
            signers = [SigningKey.generate()]
        case "wrong_key":
            signers = [dataclasses.replace(SigningKey.generate(), kid=keys[0].kid)]
        case "created_old":
            created = now - _SKEW
        case "created_ahead":
            created = now + _SKEW
        case "digest_not_covered":
            components = tuple(c for c in components if c != "content-digest")
        case "expired":
            created, expires = now - 60, now - 30
        case "rotation_sig2":
            signers = [SigningKey.generate(), keys[0]]
    pairs = [("content-type", _CONTENT_TYPE), ("content-digest", digest)]
    members = [
        sign_message(
            "POST",
            signed_url,
            pairs,
            key,
            label=f"sig{number}",
            components=components,
            created=created,
            expires=expires,
            tag=USP_TAG,
        )
        for number, key in enumerate(signers, start=1)
    ]
    return body, headers | {
        "Content-Digest": sent_digest,
        "Signature-Input": ", ".join(m.signature_input for m in members),
        "Signature": ", ".join(m.signature for m in members),
    }


def _body(event_id: str, case: str, now: int, transport: Transport) -> bytes:
    moment = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    data = {"probe": True, "case": case}
    event = {"event": PROBE_EVENT, "event_id": event_id, "timestamp": moment, "data": data}
    if transport is Transport.JSONRPC:  # a notification, as deliveries to a JSON-RPC endpoint are
        return json.dumps({"jsonrpc": "2.0", "method": WEBHOOK_METHOD, "params": event}).encode()
    return json.dumps(event, separators=(",", ":")).encode()


def _replace_authority(url: str) -> str:
    parsed = httpx.URL(url)
    return str(parsed.copy_with(host="another-endpoint.invalid", port=None))


def _replace_path(url: str) -> str:
    parsed = httpx.URL(url)
    return str(parsed.copy_with(path=parsed.path.rstrip("/") + "/elsewhere"))
