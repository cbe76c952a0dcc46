"""The general path: ``http_message_signatures`` builds the signature base, our key checks it.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_receiver._library``.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn

from http_message_signatures import (
    HTTPMessageSignaturesException,
    HTTPMessageSigner,
    HTTPMessageVerifier,
    HTTPSignatureAlgorithm,
    HTTPSignatureKeyResolver,
    InvalidSignature,
)

from usp_receiver._errors import BadSignature, MalformedSignature, MissingComponent, VerificationError
from usp_receiver._keys import PublicKey
from usp_receiver._message import HttpRequest
from usp_receiver._sigbase import SignatureEntry

__all__ = ["library_prepare", "library_signature_base", "library_verify"]


class _CryptoFailedError(Exception):
    """Raised inside the library by our algorithm bridge: the signature bytes are wrong."""


class _Bridge(HTTPSignatureAlgorithm):
    algorithm_id = ""
    recorded: list[bytes] | None = None

    def __init__(self, public_key: Any = None, private_key: Any = None) -> None:
        self.key = public_key

    def sign(self, message: bytes) -> NoReturn:
        raise HTTPMessageSignaturesException("verification only")

    def verify(self, signature: bytes, message: bytes) -> None:
        if self.recorded is not None:
            self.recorded.append(message)
            return
        if not isinstance(self.key, PublicKey) or not self.key.verify(signature, message):
            raise _CryptoFailedError


class _Resolver(HTTPSignatureKeyResolver):
    def __init__(self, key: object) -> None:
        self.key = key

    def resolve_public_key(self, key_id: str) -> object:
        return self.key

    def resolve_private_key(self, key_id: str) -> NoReturn:
        raise HTTPMessageSignaturesException("verification only")


class _PolicyFreeVerifier(HTTPMessageVerifier):
    """Our :class:`~usp_receiver.VerificationPolicy` owns time checks (with an injectable clock)."""

    def validate_created_and_expires(self, sig_input: Any, max_age: Any = None) -> None:
        return None


def library_verify(
    request: HttpRequest, entry: SignatureEntry, key: PublicKey, *, status: int | None = None
) -> None:
    """Verify ``entry`` with ``key`` through the library; raise typed errors.

    With ``status`` the message is a response with that status code, and ``request`` carries the
    response's fields plus, in ``method``/``url``, the request it answers (for ``;req`` components).
    """
    bridge = type("_KeyBridge", (_Bridge,), {"algorithm_id": str(entry.params.get("alg", key.alg))})
    _run(request, entry, bridge, key, status)


def library_signature_base(request: HttpRequest, entry: SignatureEntry) -> bytes:
    """The exact bytes the library would verify for ``entry`` (for tests and diagnostics)."""
    recorded: list[bytes] = []
    alg = str(entry.params.get("alg", "ed25519"))
    bridge = type("_RecordingBridge", (_Bridge,), {"algorithm_id": alg, "recorded": recorded})
    _run(request, entry, bridge, object(), None)
    return recorded[0]


def _run(
    request: HttpRequest, entry: SignatureEntry, bridge: type[_Bridge], key: object, status: int | None
) -> None:
    fields = [
        (name, value)
        for name, lines in request.fields.items()
        if name not in ("signature-input", "signature")
        for value in lines
    ]
    signature = base64.b64encode(entry.signature).decode("ascii")
    fields.append(("signature-input", f"{entry.label}={entry.inner}"))
    fields.append(("signature", f"{entry.label}=:{signature}:"))
    view: _View | _ResponseView = _View(method=request.method, url=request.url, headers=_Fields(fields))
    if status is not None:
        answered = _View(method=request.method, url=request.url, headers=_Fields([]))
        view = _ResponseView(status_code=status, headers=_Fields(fields), request=answered)
    verifier = _PolicyFreeVerifier(signature_algorithm=bridge, key_resolver=_Resolver(key))
    try:
        verifier.verify(view, max_age=None)
    except InvalidSignature as exc:
        raise _classify(exc) from None
    except HTTPMessageSignaturesException as exc:
        raise MalformedSignature(str(exc)) from None


def _classify(exc: InvalidSignature) -> VerificationError:
    cause = exc.__cause__
    if isinstance(cause, _CryptoFailedError):
        return BadSignature(f"signature {exc} does not verify")
    text = str(cause or exc)
    if "not found in the message" in text:
        return MissingComponent(text)
    return MalformedSignature(text)


@dataclass(frozen=True)
class _View:
    """The request attributes the library's component resolver reads."""

    method: str
    url: str
    headers: _Fields


@dataclass(frozen=True)
class _ResponseView:
    """A response, and the request it answers, as the library's resolver reads them."""

    status_code: int
    headers: _Fields
    request: _View


class _Fields:
    """Read-only header view with ``items()`` keeping repeated field lines, as the library wants."""

    def __init__(self, pairs: list[tuple[str, str]]) -> None:
        self._pairs = pairs

    def items(self) -> list[tuple[str, str]]:
        return self._pairs

    def __iter__(self) -> Any:
        return iter(dict.fromkeys(name for name, _ in self._pairs))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and any(n.lower() == name.lower() for n, _ in self._pairs)


def library_prepare(
    request: HttpRequest,
    *,
    label: str,
    components: tuple[str, ...],
    params: dict[str, Any],
    alg: str,
) -> tuple[bytes, str]:
    """Signature base and ``@signature-params`` value as the library's signer builds them.

    ``params`` must hold ``created`` and ``keyid``; ``alg`` is written only when ``params`` has it.
    """
    fields = [(name, value) for name, lines in request.fields.items() for value in lines]
    view = _View(method=request.method, url=request.url, headers=_Fields(fields))
    bridge = type("_SignBridge", (_Bridge,), {"algorithm_id": alg})
    signer = HTTPMessageSigner(signature_algorithm=bridge)
    expires = params.get("expires")
    try:
        prepared = signer.prepare(
            view,
            key_id=params["keyid"],
            created=datetime.fromtimestamp(params["created"], tz=UTC),
            expires=None if expires is None else datetime.fromtimestamp(expires, tz=UTC),
            nonce=params.get("nonce"),
            label=label,
            tag=params.get("tag"),
            include_alg="alg" in params,
            covered_component_ids=components,
            use_existing_digest="content-digest" in request.fields,
        )
    except HTTPMessageSignaturesException as exc:
        raise ValueError(f"cannot sign this message: {exc}") from None
    return prepared.signature_base, prepared.signature_params
