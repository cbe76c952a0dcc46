"""Raw HTTP/1.1 requests as text files: what the CLI signs and verifies.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_receiver._rawhttp``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

__all__ = ["RawRequest", "RawRequestError", "parse_request"]

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VERSION = re.compile(r"HTTP/\d\.\d")


class RawRequestError(ValueError):
    """The bytes are not an HTTP/1.1 request this tool can read; the message says where."""


@dataclass(frozen=True)
class RawRequest:
    """One parsed request. Header names keep their case and order; values are Latin-1 text.

    >>> request = parse_request(b"POST /hooks HTTP/1.1\\nHost: p.example\\n\\n{}")
    >>> request.url("https"), request.body
    ('https://p.example/hooks', b'{}')
    """

    method: str
    target: str
    version: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        wanted = name.lower()
        return next((value for key, value in self.headers if key.lower() == wanted), None)

    def url(self, scheme: str = "https") -> str:
        """The URL the request was sent to: ``scheme://Host`` + target (absolute targets as is)."""
        if "://" in self.target:
            return self.target
        host = self.header("host")
        if not host:
            raise RawRequestError("the request has no Host header, so its URL is unknown")
        return f"{scheme}://{host}{self.target}"

    def with_headers(self, fields: Mapping[str, str]) -> RawRequest:
        """A copy where each of ``fields`` replaces every line of that header (in place of the
        first one), or is appended when the request has none."""
        pending = {name.lower(): (name, value) for name, value in fields.items()}
        replaced = set(pending)
        headers: list[tuple[str, str]] = []
        for key, value in self.headers:
            lowered = key.lower()
            if lowered not in replaced:
                headers.append((key, value))
            elif lowered in pending:
                headers.append(pending.pop(lowered))
        headers.extend(pending.values())
        return replace(self, headers=tuple(headers))

    def serialize(self) -> bytes:
        """The request as bytes on the wire: CRLF line ends, the body unchanged."""
        lines = [f"{self.method} {self.target} {self.version}"]
        lines += [f"{name}: {value}" for name, value in self.headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


def parse_request(data: bytes) -> RawRequest:
    """Parse a raw request; raises :class:`RawRequestError` with the reason on anything else.

    >>> parse_request(b"GET / HTTP/1.1\\r\\nHost: a.example\\r\\n\\r\\n").method
    'GET'
    """
    head, body = _split_head(data)
    if not head or not head[0]:
        raise RawRequestError("the input is empty or does not start with a request line")
    parts = head[0].split(" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[1] or not _VERSION.fullmatch(parts[2]):
        raise RawRequestError(f"not an HTTP request line: {head[0]!r}")
    headers = tuple(_header(line, number) for number, line in enumerate(head[1:], start=2))
    request = RawRequest(parts[0], parts[1], parts[2], headers, body)
    return replace(request, body=_framed_body(request))


def _split_head(data: bytes) -> tuple[list[str], bytes]:
    """Head lines (line ends removed) and the bytes after the blank line."""
    lines: list[str] = []
    position = 0
    while position < len(data):
        end = data.find(b"\n", position)
        if end < 0:
            end = len(data)
        line = data[position:end]
        position = end + 1
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            return lines, data[position:]
        lines.append(line.decode("latin-1"))
    return lines, b""


def _header(line: str, number: int) -> tuple[str, str]:
    if line[:1] in (" ", "\t"):
        raise RawRequestError(f"line {number}: folded header lines are not allowed (RFC 9112 §5.2)")
    name, colon, value = line.partition(":")
    if not colon or not _TOKEN.fullmatch(name):
        raise RawRequestError(f"line {number}: not a header line: {line!r}")
    return name, value.strip(" \t")


def _framed_body(request: RawRequest) -> bytes:
    lengths = {value.strip() for key, value in request.headers if key.lower() == "content-length"}
    if any(key.lower() == "transfer-encoding" for key, _ in request.headers):
        raise RawRequestError("Transfer-Encoding is not supported: save the request with Content-Length")
    if not lengths:
        return request.body
    if len(lengths) > 1 or not next(iter(lengths)).isdigit():
        raise RawRequestError(f"invalid Content-Length: {', '.join(sorted(lengths))}")
    length = int(next(iter(lengths)))
    if len(request.body) < length:
        raise RawRequestError(f"the body has {len(request.body)} bytes, Content-Length says {length}")
    return request.body[:length]
