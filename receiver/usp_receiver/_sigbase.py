"""Signature fields and signature bases: a fast path for our profile, the library for the rest.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_receiver._sigbase``.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import http_sf
from http_sf.compat import Dictionary, InnerList, Item

from usp_receiver._errors import MalformedSignature, MissingComponent
from usp_receiver._message import HttpRequest

__all__ = [
    "KNOWN_PARAMETERS",
    "SignatureEntry",
    "UrlParts",
    "fast_signature_base",
    "parse_signatures",
    "parse_url_fast",
]

KNOWN_PARAMETERS = frozenset({"alg", "created", "expires", "keyid", "nonce", "tag"})

# --- the fast grammar: exactly what a canonical RFC 8941 serialiser writes for our profile ---
_LABEL = r"[a-z*][a-z0-9_\-.*]{0,63}"
_COMPONENT = r'"[a-z0-9@_\-.]{1,64}"'
_INT_PARAM = r";(?:created|expires)=(?:0|[1-9][0-9]{0,14})"
_STR_PARAM = r';(?:keyid|alg|nonce|tag)="[\x20\x21\x23-\x5b\x5d-\x7e]{0,256}"'
_INPUT_MEMBER = re.compile(
    rf"({_LABEL})=(\(((?:{_COMPONENT}(?: {_COMPONENT})*)?)\)((?:{_INT_PARAM}|{_STR_PARAM}){{0,8}}))"
)
_SIG_MEMBER = re.compile(rf"({_LABEL})=:([A-Za-z0-9+/]{{0,684}}={{0,2}}):")
_PARAM = re.compile(r';([a-z]+)=(?:"([^"]*)"|([0-9]+))')  # findall: (name, text or "", number or "")
_FAST_DERIVED = frozenset({"@method", "@authority", "@path", "@query", "@scheme", "@target-uri"})
_DEFAULT_PORTS = {"http": "80", "https": "443"}
_URL = re.compile(
    r"(https?)://([a-z0-9.\-]{1,253})(?::([0-9]{1,5}))?"
    r"(/(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/]|%[0-9A-Fa-f]{2}){0,2048})?"
    r"(?:\?((?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2}){0,2048}))?"
)
_PRINTABLE = re.compile(r"[\t\x20-\x7e]*")
_METHOD = re.compile(r"[A-Z]{1,16}")


class SignatureEntry(NamedTuple):
    """One member of ``Signature-Input`` with its ``Signature`` bytes.

    ``components`` are the serialised component ids (``'"@method"'``,
    ``'"@query-param";name="Pet"'``); ``inner`` is the canonical serialisation of the inner list,
    i.e. the ``@signature-params`` value; ``fast`` says the fast path can build its base.
    """

    label: str
    components: tuple[str, ...]
    params: dict[str, Any]
    signature: bytes
    inner: str
    fast: bool


@dataclass(frozen=True, slots=True)
class UrlParts:
    scheme: str
    host: str
    port: str | None
    path: str
    query: str | None


def parse_signatures(signature_input: str, signature: str) -> list[SignatureEntry]:
    """Pair the members of both fields by label; raise :class:`MalformedSignature` on any flaw."""
    fast = _parse_fast(signature_input, signature)
    if fast is not None:
        return fast
    return _parse_library(signature_input, signature)


def parse_url_fast(url: str) -> UrlParts | None:
    """Split a plain lower-case http(s) URL; None sends the message to the library's parser."""
    m = _URL.fullmatch(url)
    if m is None:
        return None
    scheme, host, port, path, query = m.groups()
    return UrlParts(scheme, host, port, path or "", query)


def fast_signature_base(entry: SignatureEntry, request: HttpRequest, url: UrlParts | None) -> bytes | None:
    """The signature base for ``entry``, or None when only the library can build it.

    Mirrors ``HTTPSignatureComponentResolver`` for the components in ``_FAST_DERIVED`` and plain
    header fields. Raises :class:`MissingComponent` when a covered header is absent (that verdict
    does not depend on who builds the base).
    """
    if not entry.fast or url is None or _METHOD.fullmatch(request.method) is None:
        return None
    lines = []
    for component in entry.components:
        name = component[1:-1]
        if name[0] == "@":
            value = _derived(name, request.method, url)
        else:
            field_lines = request.fields.get(name)
            if field_lines is None:
                raise MissingComponent(f"covered field {name!r} is absent from the message")
            value = field_lines[0] if len(field_lines) == 1 else ", ".join(field_lines)
            if _PRINTABLE.fullmatch(value) is None:
                return None
        lines.append(f"{component}: {value}")
    lines.append(f'"@signature-params": {entry.inner}')
    return "\n".join(lines).encode("ascii")


def _derived(name: str, method: str, url: UrlParts) -> str:
    if name == "@method":
        return method
    if name == "@authority":
        return _authority(url)
    if name == "@path":
        return url.path or "/"
    if name == "@query":
        return "?" + (url.query or "")
    if name == "@scheme":
        return url.scheme
    # @target-uri keeps the URL's own spelling of the authority; only OPTIONS keeps an empty path.
    path = url.path if method == "OPTIONS" else (url.path or "/")
    authority = url.host if url.port is None else f"{url.host}:{url.port}"
    query = "" if url.query is None else "?" + url.query
    return f"{url.scheme}://{authority}{path}{query}"


def _authority(url: UrlParts) -> str:
    port = url.port
    if port and port.lstrip("0") == _DEFAULT_PORTS[url.scheme]:
        port = None
    return f"{url.host}:{port}" if port else url.host


def _members(pattern: re.Pattern[str], value: str) -> list[re.Match[str]] | None:
    matches = []
    pos = 0
    while True:
        m = pattern.match(value, pos)
        if m is None:
            return None
        matches.append(m)
        pos = m.end()
        if pos == len(value):
            return matches
        if not value.startswith(", ", pos):
            return None
        pos += 2


def _parse_fast(signature_input: str, signature: str) -> list[SignatureEntry] | None:
    inputs = _members(_INPUT_MEMBER, signature_input)
    sigs = _members(_SIG_MEMBER, signature)
    if inputs is None or sigs is None:
        return None
    sig_by_label = {m.group(1): m.group(2) for m in sigs}
    if len(sig_by_label) != len(sigs) or len(inputs) != len(sigs):
        return None  # duplicates or unpaired labels: let the library name the flaw
    entries = []
    for m in inputs:
        label, inner, component_text, param_text = m.groups()
        if label not in sig_by_label:
            return None
        components = tuple(component_text.split(" ")) if component_text else ()
        if len(set(components)) != len(components):
            return None
        params: dict[str, Any] = {}
        for pname, text, number in _PARAM.findall(param_text):
            if pname in params:
                return None
            params[pname] = int(number) if number else text
        encoded = sig_by_label[label]
        if len(encoded) % 4:
            return None  # unpadded: legal in RFC 9651, left to the library's parser
        try:
            sig_bytes = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            return None
        fast = all(c[1] != "@" or c[1:-1] in _FAST_DERIVED for c in components)
        entries.append(SignatureEntry(label, components, params, sig_bytes, inner, fast))
    return entries


def _parse_library(signature_input: str, signature: str) -> list[SignatureEntry]:
    inputs = _parse_dictionary(signature_input, "Signature-Input")
    sigs = _parse_dictionary(signature, "Signature")
    if inputs.keys() != sigs.keys():
        raise MalformedSignature("Signature-Input and Signature have different labels")
    entries = []
    for label, node in inputs.items():
        sig_node = sigs[label]
        if not isinstance(node, InnerList):
            raise MalformedSignature(f"Signature-Input member {label!r} must be an inner list")
        if not isinstance(sig_node, Item) or not isinstance(sig_node.value, bytes) or sig_node.params:
            raise MalformedSignature(f"Signature member {label!r} must be a byte sequence")
        components = []
        for item in node:
            if not isinstance(item.value, str):
                raise MalformedSignature(f"component ids of {label!r} must be strings")
            components.append(str(item))
        if len(set(components)) != len(components):
            raise MalformedSignature(f"signature {label!r} covers a component twice")
        entries.append(
            SignatureEntry(
                label=label,
                components=tuple(components),
                params=dict(node.params),
                signature=sig_node.value,
                inner=str(node),
                fast=False,
            )
        )
    return entries


def _parse_dictionary(value: str, name: str) -> Dictionary:
    def reject_duplicate(key: str, context: str) -> None:
        if context == "dictionary":
            raise ValueError(f"duplicate label {key!r}")

    try:
        parsed: Any = http_sf.parse(
            value.encode("latin-1"), tltype="dictionary", on_duplicate_key=reject_duplicate
        )
        result = Dictionary()
        for label, (member, params) in parsed.items():
            node: Item | InnerList
            if isinstance(member, list):
                node = InnerList()
                for bare, item_params in member:
                    item = Item(bare)
                    item.params.update(item_params)
                    node.append(item)
            else:
                node = Item(member)
            node.params.update(params)
            result[label] = node
        str(result)  # the serialiser rejects values the parser let through (e.g. odd keys)
    except (ValueError, TypeError, UnicodeError, KeyError, IndexError, AttributeError) as exc:
        raise MalformedSignature(f"{name} is not a valid Structured Field dictionary: {exc}") from None
    if not result:
        raise MalformedSignature(f"{name} has no members")
    return result
