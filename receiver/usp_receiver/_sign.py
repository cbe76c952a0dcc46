"""The signing half of the USP profile, byte-compatible with RFC 9421 and the library.

The delivery workers sign every attempt afresh (a new ``created``), so signing sits on their hot
path. The common case builds the base with the same fast path the verifier uses; anything the
fast path declines is prepared by ``http_message_signatures``' own signer. Tests prove both give
identical bytes, and that RFC 9421 B.2.5/B.2.6 reproduce exactly.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from usp_receiver._digest import content_digest
from usp_receiver._keys import SigningKey
from usp_receiver._library import library_prepare
from usp_receiver._message import HeadersInput, HttpRequest
from usp_receiver._sigbase import SignatureEntry, fast_signature_base, parse_url_fast
from usp_receiver._verify import PROFILE_COMPONENTS, USP_TAG

__all__ = ["SignedMember", "sign_message", "sign_request"]

_SIMPLE_STRING = re.compile(r"[\x20\x21\x23-\x5b\x5d-\x7e]*")
_SIMPLE_COMPONENT = re.compile(r"[a-z0-9@_\-.]{1,64}")


@dataclass(frozen=True, slots=True)
class SignedMember:
    """One signature: its ``Signature-Input`` member and ``Signature`` member (``label=...``)."""

    label: str
    signature_input: str
    signature: str
    signature_base: bytes


def sign_request(
    method: str,
    url: str,
    headers: HeadersInput,
    body: bytes,
    keys: Sequence[SigningKey],
    *,
    created: int | None = None,
    expires: int | None = None,
    tag: str | None = USP_TAG,
    components: Sequence[str] = PROFILE_COMPONENTS,
) -> dict[str, str]:
    """Sign a webhook request per the USP profile; return the fields to add to it.

    Adds ``Content-Digest`` over ``body`` and one signature per key, labelled ``sig1``, ``sig2``…
    in the order given (during key rotation: the new key first, then the old one).
    ``headers`` must already hold every other covered field (``Content-Type``).

    >>> key = SigningKey.generate()
    >>> fields = sign_request("POST", "https://p.example/hooks",
    ...                       {"Content-Type": "application/json"}, b"{}", [key], created=1700000000)
    >>> sorted(fields)
    ['Content-Digest', 'Signature', 'Signature-Input']
    """
    if not keys:
        raise ValueError("at least one signing key is needed")
    digest = content_digest(body)
    fields = HttpRequest(method, url, headers).fields
    pairs = [(name, value) for name, lines in fields.items() if name != "content-digest" for value in lines]
    pairs.append(("content-digest", digest))
    moment = int(time.time()) if created is None else created
    members = [
        sign_message(
            method,
            url,
            pairs,
            key,
            label=f"sig{index}",
            components=components,
            created=moment,
            expires=expires,
            tag=tag,
        )
        for index, key in enumerate(keys, start=1)
    ]
    return {
        "Content-Digest": digest,
        "Signature-Input": ", ".join(m.signature_input for m in members),
        "Signature": ", ".join(m.signature for m in members),
    }


def sign_message(
    method: str,
    url: str,
    headers: HeadersInput,
    key: SigningKey,
    *,
    label: str,
    components: Sequence[str],
    created: int,
    expires: int | None = None,
    nonce: str | None = None,
    tag: str | None = None,
    include_alg: bool = True,
) -> SignedMember:
    """One RFC 9421 signature over an HTTP request: the building block of :func:`sign_request`.

    Parameters are written in the library's order (``created``, ``keyid``, ``alg``, ``expires``,
    ``nonce``, ``tag``). ``components`` are names (``"@method"``, ``"content-type"``) or
    serialised component ids (``'"@query-param";name="Pet"'``).
    """
    request = HttpRequest(method, url, headers)
    params: dict[str, int | str] = {"created": created, "keyid": key.kid}
    if include_alg:
        params["alg"] = key.alg
    if expires is not None:
        params["expires"] = expires
    if nonce is not None:
        params["nonce"] = nonce
    if tag is not None:
        params["tag"] = tag
    base, inner = _fast_prepare(request, label, tuple(components), params)
    if base is None:
        base, inner = library_prepare(
            request, label=label, components=tuple(components), params=params, alg=key.alg
        )
    signature = base64.b64encode(key.sign(base)).decode("ascii")
    return SignedMember(label, f"{label}={inner}", f"{label}=:{signature}:", base)


def _fast_prepare(
    request: HttpRequest, label: str, components: tuple[str, ...], params: dict[str, int | str]
) -> tuple[bytes | None, str]:
    if not all(_SIMPLE_COMPONENT.fullmatch(c) for c in components) or len(set(components)) != len(components):
        return None, ""
    if not all(isinstance(v, int) or _SIMPLE_STRING.fullmatch(v) for v in params.values()):
        return None, ""
    quoted = tuple(f'"{c}"' for c in components)
    rendered = "".join(f";{k}={v}" if isinstance(v, int) else f';{k}="{v}"' for k, v in params.items())
    inner = f"({' '.join(quoted)}){rendered}"
    entry = SignatureEntry(label, quoted, dict(params), b"", inner, fast=True)
    try:
        base = fast_signature_base(entry, request, parse_url_fast(request.url))
    except Exception:  # any doubt goes to the library, which explains itself
        return None, ""
    return base, inner
