"""The HTTP message as the verifier sees it: method, full public URL, field lines, body bytes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from http_message_signatures.structures import normalize_header_value

__all__ = ["Fields", "HeadersInput", "HttpRequest", "normalize_fields"]

HeadersInput = Mapping[str, str] | Iterable[tuple[str | bytes, str | bytes]]
#: Lower-cased field name → its field lines in wire order, each normalised as RFC 9421 §2.1 says.
Fields = dict[str, list[str]]


def normalize_fields(headers: HeadersInput) -> Fields:
    """Group field lines by lower-cased name, keeping repeats and their order.

    Accepts a mapping (``dict``, ``httpx.Headers``...) or raw pairs as ASGI gives them (bytes are
    decoded as Latin-1, so no byte is lost or invented). Values are normalised with the library's
    own function so the fast path and the library see identical component values. A value that
    is neither ``str`` nor ``bytes`` (``None`` from a caller's dict) is a ``TypeError`` here, not
    deep inside the library.
    """
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    fields: Fields = {}
    for name, value in pairs:
        if not isinstance(name, str | bytes) or not isinstance(value, str | bytes):
            shown = name if isinstance(name, str | bytes) else type(name).__name__
            raise TypeError(
                f"header {shown!r} has a {type(value).__name__} value: header names and values must be"
                " str or bytes (leave a header out rather than pass None)"
            )
        key = (name.decode("latin-1") if isinstance(name, bytes) else name).lower()
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        fields.setdefault(key, []).append(normalize_header_value(text))
    return fields


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """A request to verify. ``url`` is the full public URL the sender used (scheme, host, path and
    query), which behind a proxy is not what the app sees: integrations take a ``public_url``."""

    method: str
    url: str
    headers: HeadersInput
    body: bytes = b""
    fields: Fields = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", normalize_fields(self.headers))

    def field_value(self, name: str) -> str | None:
        """The combined value of field ``name`` (lines joined by ", "), or None when absent."""
        lines = self.fields.get(name)
        return None if lines is None else ", ".join(lines)
