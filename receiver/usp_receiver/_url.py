"""The full URL a sender signed, rebuilt from an ASGI request.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_receiver._url``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

__all__ = ["check_public_url", "request_url"]

_DEFAULT_PORTS = {"http": 80, "https": 443}
# Characters RFC 3986 allows unescaped in a path; everything else in a decoded ASGI path is escaped.
_PATH_SAFE = "/:@!$&'()*+,;=-._~"


def check_public_url(public_url: str) -> str:
    """Validate a configured ``public_url`` up front: absolute http(s), no query, no fragment.

    A mistake here would make every delivery fail verification, so it fails at start-up instead.

    >>> check_public_url("https://platform.example/hooks")
    'https://platform.example/hooks'
    """
    parts = urlsplit(public_url)
    if parts.scheme not in _DEFAULT_PORTS or not parts.netloc:
        raise ValueError(f"public_url must be an absolute http(s) URL, got {public_url!r}")
    if parts.query or parts.fragment:
        raise ValueError(
            f"public_url must not have a query or fragment (the request's is used): {public_url!r}"
        )
    return public_url


def request_url(scope: Mapping[str, Any], public_url: str | None = None) -> str:
    """The URL to verify an ASGI HTTP request against.

    >>> scope = {"scheme": "http", "headers": [(b"host", b"127.0.0.1:8000")],
    ...          "raw_path": b"/webhooks/usp", "query_string": b"a=1"}
    >>> request_url(scope)
    'http://127.0.0.1:8000/webhooks/usp?a=1'
    >>> request_url(scope, "https://platform.example/hooks")
    'https://platform.example/hooks?a=1'
    """
    query_bytes: bytes = scope.get("query_string") or b""
    query = "?" + query_bytes.decode("latin-1") if query_bytes else ""
    if public_url is not None:
        parts = urlsplit(public_url)
        return f"{parts.scheme}://{parts.netloc}{parts.path}{query}"
    scheme = str(scope.get("scheme") or "http")
    return f"{scheme}://{_authority(scope, scheme)}{_path(scope)}{query}"


def _authority(scope: Mapping[str, Any], scheme: str) -> str:
    for name, value in scope.get("headers") or ():
        if bytes(name).lower() == b"host":
            return bytes(value).decode("latin-1")
    server = scope.get("server")
    if not server:
        return "localhost"
    host, port = str(server[0]), server[1]
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    if port is None or port == _DEFAULT_PORTS.get(scheme):
        return host
    return f"{host}:{port}"


def _path(scope: Mapping[str, Any]) -> str:
    raw = scope.get("raw_path")
    if raw:
        # The bytes as received, percent-escapes intact; a server that left the query on it is
        # tolerated (the query comes from ``query_string``).
        return bytes(raw).partition(b"?")[0].decode("latin-1")
    return quote(str(scope.get("path") or "/"), safe=_PATH_SAFE)
