"""Fetch a small document (a platform profile, an agent's key directory) from a URL the SSRF
guard approved.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.documents``.
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio
import httpx

from usp_core.settings import CommonSettings
from usp_core.ssrf import ResolvedTarget, new_client, send_pinned
from usp_dispatcher.errors import DocumentUnavailable

__all__ = ["Document", "fetch_document"]

#: Why a document could not be had: no answer in time; no answer at all (refused, reset, TLS);
#: a redirect (never followed); a status other than 200; a compressed body; a body too large.


@dataclass(frozen=True, slots=True)
class Document:
    """A fetched document: its body, and the headers that say how long it may be kept."""

    body: bytes
    headers: httpx.Headers


async def fetch_document(
    target: ResolvedTarget, settings: CommonSettings, *, accept: str, max_bytes: int, seconds: float
) -> Document:
    """GET ``target``'s checked address and return its 200 answer.

    Raises :class:`DocumentUnavailable` for a timeout (``seconds`` in all), a transport
    failure, a redirect, any other status, a compressed body or one over ``max_bytes``.
    """
    try:
        async with new_client(settings) as client:
            response = await send_pinned(
                client,
                target,
                method="GET",
                headers={"Accept": accept, "Accept-Encoding": "identity"},
                timeout=httpx.Timeout(seconds),
                keep_alive=False,  # one request, then the client is closed
                max_response_bytes=max_bytes,
                total_timeout=seconds,
            )
    except (TimeoutError, httpx.TimeoutException):
        raise DocumentUnavailable("timeout") from None
    except (httpx.HTTPError, anyio.BrokenResourceError, OSError) as exc:
        raise DocumentUnavailable("unreachable", cause=type(exc).__name__) from None
    if response.is_redirect:
        raise DocumentUnavailable("redirect", status_code=response.status_code)
    if response.status_code != 200:
        raise DocumentUnavailable("status", status_code=response.status_code)
    if response.headers.get("content-encoding", "identity").lower() != "identity":
        raise DocumentUnavailable("compressed")
    if response.truncated:
        raise DocumentUnavailable("too_large")
    return Document(response.content, response.headers)
