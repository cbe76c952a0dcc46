"""Verify a USP webhook request: RFC 9421 signature, RFC 9530 digest, replay window.

Order matters for cost and for honest reason codes: parse the fields, check the digest (a hash),
apply the policy to the signature parameters (free), resolve the key, and only then spend the
public-key operation. Of several signatures (key rotation sends ``sig1`` with the new key and
``sig2`` with the old one) the first that verifies from a trusted key wins.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from usp_receiver._digest import check_content_digest
from usp_receiver._errors import (
    BadSignature,
    ExpiredSignature,
    FutureSignature,
    MalformedSignature,
    MissingComponent,
    MissingSignature,
    StaleSignature,
    TagMismatch,
    UnknownKey,
    VerificationError,
)
from usp_receiver._keys import DEFAULT_ALGORITHMS, KeyResolver, PublicKey
from usp_receiver._library import library_signature_base, library_verify
from usp_receiver._message import HeadersInput, HttpRequest
from usp_receiver._sigbase import (
    KNOWN_PARAMETERS,
    SignatureEntry,
    UrlParts,
    fast_signature_base,
    parse_signatures,
    parse_url_fast,
)

__all__ = ["PROFILE_COMPONENTS", "USP_TAG", "VerificationPolicy", "Verified", "Verifier"]

#: What the USP REST profile signs (SPEC-NOTES), in order.
PROFILE_COMPONENTS: tuple[str, ...] = ("@method", "@authority", "@path", "content-digest", "content-type")
#: The application tag USP senders put on webhook signatures.
USP_TAG = "usp-webhook"


@dataclass(frozen=True)
class VerificationPolicy:
    """What a signature must satisfy beyond being cryptographically valid.

    The defaults are the USP receiver policy: the profile's components covered, ``created`` no
    older than 300 s and no more than 60 s ahead, ``expires`` honoured, the digest always checked,
    a ``tag`` other than ``usp-webhook`` refused (a signature made for another application must
    not be replayed here) while a signature without ``tag`` is accepted, as the USP document's own
    example has none. Set ``require_tag=True`` once every sender you trust tags its signatures.

    >>> strict = VerificationPolicy(require_tag=True, max_age=120)
    """

    required_components: tuple[str, ...] = PROFILE_COMPONENTS
    max_age: float = 300.0
    max_future: float = 60.0
    require_created: bool = True
    tag: str | None = USP_TAG
    require_tag: bool = False
    algorithms: frozenset[str] = DEFAULT_ALGORITHMS
    require_digest: bool = True
    #: Also accept OpenBotAuth's signature base for a dictionary-member component: it writes
    #: ``"signature-agent": sig1="<url>"`` where RFC 9421 §2.1.2 has
    #: ``"signature-agent";key="sig1": "<url>"`` (its signer and verifier agree, so its agents'
    #: signatures verify only this way). Off by default: only Web Bot Auth verifiers need it.
    member_compat: bool = False
    #: How many signatures one request may carry; each is tried (those from keys we trust, within
    #: the policy) until one verifies. More is refused whole: verifying costs a key lookup and a
    #: public-key operation each, and no sender needs more than a few (one per rotating key).
    max_signatures: int = 8


@dataclass(frozen=True, slots=True)
class Verified:
    """A signature that verified: who signed (``key``), when, and what it covers."""

    label: str
    key: PublicKey
    created: int | None
    expires: int | None
    tag: str | None
    nonce: str | None
    components: tuple[str, ...] = field(repr=False)

    @property
    def kid(self) -> str:
        return self.key.kid


class Verifier:
    """Verifies signed webhook requests against trusted keys under a policy.

    >>> from usp_receiver import JWKS, SigningKey, sign_request
    >>> key = SigningKey.generate()
    >>> body = b'{"event": "booking.confirmed"}'
    >>> headers = {"Content-Type": "application/json"}
    >>> headers |= sign_request("POST", "https://p.example/hooks", headers, body, [key])
    >>> verifier = Verifier(JWKS([key.public]))
    >>> verifier.verify("POST", "https://p.example/hooks", headers, body).kid == key.kid
    True
    """

    def __init__(self, keys: KeyResolver, policy: VerificationPolicy | None = None) -> None:
        self.keys = keys
        self.policy = policy or VerificationPolicy()
        self._required = frozenset(f'"{name}"' for name in self.policy.required_components)

    def verify(
        self, method: str, url: str, headers: HeadersInput, body: bytes, *, now: float | None = None
    ) -> Verified:
        """Return the first valid signature, or raise the :class:`VerificationError` that explains
        why none is (the one from a key we trust, when there is one)."""
        request, entries = self._prepare(method, url, headers, body, now)
        url_parts = parse_url_fast(request.url)
        errors: list[VerificationError] = []
        for entry in entries:
            try:
                return self._verify_one(request, entry, self.keys.resolve(entry.params["keyid"]), url_parts)
            except VerificationError as exc:
                errors.append(exc)
        raise _most_telling(errors)

    def verify_response(
        self,
        status: int,
        headers: HeadersInput,
        body: bytes,
        *,
        request_method: str = "GET",
        request_url: str = "https://invalid.example/",
        now: float | None = None,
    ) -> Verified:
        """Verify a signed response (e.g. a signed JWKS directory), under the same policy.

        ``request_method``/``request_url`` describe the request it answers, for ``;req``
        components. Set ``required_components`` in the policy to what responses must cover.
        """
        request, entries = self._prepare(request_method, request_url, headers, body, now)
        errors: list[VerificationError] = []
        for entry in entries:
            try:
                return self._verify_one(
                    request, entry, self.keys.resolve(entry.params["keyid"]), None, status
                )
            except VerificationError as exc:
                errors.append(exc)
        raise _most_telling(errors)

    async def averify(
        self, method: str, url: str, headers: HeadersInput, body: bytes, *, now: float | None = None
    ) -> Verified:
        """:meth:`verify` for async code: a remote JWKS is fetched without blocking the loop."""
        request, entries = self._prepare(method, url, headers, body, now)
        url_parts = parse_url_fast(request.url)
        errors: list[VerificationError] = []
        for entry in entries:
            key = await self.keys.aresolve(entry.params["keyid"])
            try:
                return self._verify_one(request, entry, key, url_parts)
            except VerificationError as exc:
                errors.append(exc)
        raise _most_telling(errors)

    def _prepare(
        self, method: str, url: str, headers: HeadersInput, body: bytes, now: float | None
    ) -> tuple[HttpRequest, list[SignatureEntry]]:
        request = HttpRequest(method, url, headers, body)
        signature_input = request.field_value("signature-input")
        signature = request.field_value("signature")
        if not signature_input and not signature:
            raise MissingSignature("the request carries no Signature-Input/Signature fields")
        if not signature_input or not signature:
            raise MalformedSignature("Signature-Input and Signature must both be present")
        entries = parse_signatures(signature_input, signature)
        if len(entries) > self.policy.max_signatures:
            raise MalformedSignature(
                f"the request carries {len(entries)} signatures, more than the"
                f" {self.policy.max_signatures} VerificationPolicy.max_signatures allows"
            )
        digest = request.field_value("content-digest")
        if self.policy.require_digest and (body or digest is not None):
            # An empty body without a digest has nothing to protect (a signed GET); otherwise the
            # digest is checked whether or not the signature covers it.
            check_content_digest(digest, body)
        moment = time.time() if now is None else now
        # Policy failures that need no key are decided here; only entries that pass go on.
        errors: list[VerificationError] = []
        usable = []
        for entry in entries:
            try:
                self._check_policy(entry, moment)
            except VerificationError as exc:
                errors.append(exc)
            else:
                usable.append(entry)
        if not usable:
            raise errors[0]
        return request, usable

    def _check_policy(self, entry: SignatureEntry, now: float) -> None:
        params = entry.params
        for name, value in params.items():
            if name not in KNOWN_PARAMETERS:
                raise MalformedSignature(f"unknown signature parameter {name!r}")
            wanted = int if name in ("created", "expires") else str
            if type(value) is not wanted:
                raise MalformedSignature(f"parameter {name!r} must be a {wanted.__name__}")
        if "keyid" not in params:
            raise MissingComponent(f"signature {entry.label!r} has no keyid")
        missing = self._required.difference(entry.components)
        if missing:
            raise MissingComponent(f"signature {entry.label!r} does not cover {', '.join(sorted(missing))}")
        tag = params.get("tag")
        if (tag is not None and tag != self.policy.tag) or (tag is None and self.policy.require_tag):
            raise TagMismatch(f"signature {entry.label!r} has tag {tag!r}, expected {self.policy.tag!r}")
        created = params.get("created")
        if created is None:
            if self.policy.require_created:
                raise MissingComponent(f"signature {entry.label!r} has no created parameter")
        elif created > now + self.policy.max_future:
            raise FutureSignature(
                f"signature {entry.label!r} was created {created - now:.0f} s in the future"
            )
        elif created < now - self.policy.max_age:
            raise StaleSignature(f"signature {entry.label!r} is {now - created:.0f} s old")
        expires = params.get("expires")
        if expires is not None and expires < now:
            raise ExpiredSignature(f"signature {entry.label!r} expired {now - expires:.0f} s ago")

    def _verify_one(
        self,
        request: HttpRequest,
        entry: SignatureEntry,
        key: PublicKey | None,
        url: UrlParts | None,
        status: int | None = None,
    ) -> Verified:
        params = entry.params
        if key is None:
            raise UnknownKey(f"no trusted key has keyid {params['keyid']!r}")
        alg = params.get("alg", key.alg)
        if alg != key.alg or key.alg not in self.policy.algorithms:
            raise BadSignature(f"algorithm {alg!r} is not allowed for key {key.kid!r}")
        base = None if status is not None else fast_signature_base(entry, request, url)
        try:
            if base is not None:
                if not key.verify(entry.signature, base):
                    raise BadSignature(f"signature {entry.label!r} does not verify")
            else:
                library_verify(request, entry, key, status=status)
        except BadSignature:
            compat = self._member_compat_base(request, entry, base, status)
            if compat is None or not key.verify(entry.signature, compat):
                raise
        return Verified(
            label=entry.label,
            key=key,
            created=params.get("created"),
            expires=params.get("expires"),
            tag=params.get("tag"),
            nonce=params.get("nonce"),
            components=entry.components,
        )

    def _member_compat_base(
        self, request: HttpRequest, entry: SignatureEntry, base: bytes | None, status: int | None
    ) -> bytes | None:
        """The OpenBotAuth form of the base (see ``VerificationPolicy.member_compat``), when the
        policy allows it and the signature covers a ``;key`` dictionary member; else None."""
        if not self.policy.member_compat or status is not None:
            return None
        members = [c for c in entry.components if _MEMBER.fullmatch(c)]
        if not members:
            return None
        standard = base if base is not None else library_signature_base(request, entry)
        lines = standard.decode("ascii").split("\n")
        for index, line in enumerate(lines):
            for component in members:
                if line.startswith(component + ": "):
                    match = _MEMBER.fullmatch(component)
                    assert match is not None
                    lines[index] = f'"{match.group(1)}": {match.group(2)}={line[len(component) + 2 :]}'
        return "\n".join(lines).encode("ascii")


#: A dictionary-member component id: ``"name";key="member"``.
_MEMBER = re.compile(r'"([a-z0-9_\-.]+)";key="([a-z*][a-z0-9_\-.*]*)"')


def _most_telling(errors: list[VerificationError]) -> VerificationError:
    """Of several failed signatures, report one from a key we trust: an unknown old key next to a
    forged new signature must not hide the forgery."""
    trusted = [e for e in errors if not isinstance(e, UnknownKey)]
    return (trusted or errors)[0]
