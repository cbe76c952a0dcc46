"""One HTTP try of one delivery, and the client it goes through.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_workers.engine.transport``.
"""

from __future__ import annotations

import errno
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from http.cookiejar import CookieJar
from typing import Any

import anyio
import httpx
from anyio.lowlevel import RunVar

from usp_core.origin_pool import OriginTransport, PinnedClient
from usp_core.settings import CommonSettings
from usp_core.ssrf import ResolvedTarget, TargetRefused, send_pinned
from usp_workers.engine.schedule import parse_retry_after

__all__ = [
    "EXCERPT_BYTES",
    "FAILURES",
    "TryResult",
    "connect_failure",
    "endpoint_slot",
    "make_client",
    "refused_result",
    "send_once",
]

logger = logging.getLogger("usp_workers")

#: Response bytes kept for the attempt's ``response_excerpt`` (the column holds 1024 characters).
EXCERPT_BYTES = 1024
_RETRY_AFTER_STATUSES = frozenset({429, 503})
_MAX_SLOTS = 4096


@dataclass(frozen=True, slots=True)
class TryResult:
    """What one try came to: a response (``status_code``) or an error (``error_class``)."""

    started_at: datetime
    duration_ms: float
    status_code: int | None = None
    response_excerpt: str | None = None
    retry_after: float | None = None  #: seconds a 429/503 asked us to wait
    error_class: str | None = None
    error: str | None = None  #: short, safe to store: never the response body, the URL's query


def make_client(settings: CommonSettings) -> PinnedClient:
    """The client deliveries go through: build it once per process (per event loop) and reuse it.

    A :class:`~usp_core.origin_pool.PinnedClient`: one small pool of kept-alive HTTP/1.1
    connections per origin (scheme, pinned IP, port, and for https the name the certificate was
    verified for), so https deliveries reuse their TLS connections safely, and finding a
    connection costs the same with ten endpoints or ten thousand. Built once because a client
    costs ~38 ms (the TLS context) and discards its connections. Redirects are never followed,
    proxies from the environment are ignored (the connection must go to the address the SSRF
    check pinned), and there are no cookies: requests go to pinned IP addresses, so a cookie one
    receiver sets would otherwise be sent to any other receiver on the same address.
    """
    return PinnedClient(
        transport=OriginTransport(),
        timeout=request_timeout(settings),
        cookies=httpx.Cookies(_NoCookies()),
    )


class _NoCookies(CookieJar):
    """A cookie jar that never stores nor sends a cookie (and skips the parsing)."""

    def extract_cookies(self, response: Any, request: Any) -> None:
        return None

    def add_cookie_header(self, request: Any) -> None:
        return None


def request_timeout(settings: CommonSettings) -> httpx.Timeout:
    """httpx's per-phase timeouts: ``connect_timeout`` to connect, ``total_timeout`` otherwise."""
    return httpx.Timeout(settings.total_timeout, connect=settings.connect_timeout)


async def send_once(
    client: httpx.AsyncClient,
    target: ResolvedTarget,
    body: bytes,
    headers: dict[str, str],
    settings: CommonSettings,
    *,
    now: Callable[[], datetime],
) -> TryResult:
    """POST ``body`` to the pinned ``target`` once and say what happened. Never raises (but
    lets cancellation through)."""
    started_at = now()
    clock = time.perf_counter()

    def elapsed() -> float:
        return (time.perf_counter() - clock) * 1000

    try:
        response = await send_pinned(
            client,
            target,
            content=body,
            headers=headers,
            timeout=request_timeout(settings),
            max_response_bytes=EXCERPT_BYTES,
            total_timeout=settings.total_timeout,
        )
    except (httpx.TimeoutException, TimeoutError) as exc:
        return TryResult(started_at, elapsed(), error_class="timeout", error=_describe(exc, "timed out"))
    except httpx.ConnectError as exc:
        return TryResult(started_at, elapsed(), error_class=connect_failure(exc), error=_describe(exc))
    except httpx.TransportError as exc:
        return TryResult(started_at, elapsed(), error_class="transport_error", error=_describe(exc))
    except Exception as exc:
        logger.exception("delivery try to %s failed unexpectedly", target.host)
        return TryResult(started_at, elapsed(), error_class="internal_error", error=type(exc).__name__)
    retry_after = None
    if response.status_code in _RETRY_AFTER_STATUSES:
        retry_after = parse_retry_after(response.headers.get("retry-after"), now())
    return TryResult(
        started_at,
        elapsed(),
        status_code=response.status_code,
        response_excerpt=excerpt(response.content),
        retry_after=retry_after,
    )


def connect_failure(exc: BaseException) -> str:
    """What kept a connection from opening, as an attempt's ``error_class``: ``tls_error`` (the
    handshake or the certificate), ``connection_refused`` (nothing listens), ``unreachable`` (no
    route), ``connection_reset``, else ``connect_error``. httpx wraps the OS error twice; the
    chain is walked to find it."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLError | ssl.CertificateError):
            return "tls_error"
        if isinstance(cause, ConnectionRefusedError):
            return "connection_refused"
        if isinstance(cause, ConnectionResetError):
            return "connection_reset"
        if isinstance(cause, OSError) and cause.errno in _UNREACHABLE:
            return "unreachable"
        cause = cause.__cause__ or cause.__context__
    text = str(exc)
    if "SSL" in text or "CERTIFICATE" in text:
        return "tls_error"
    if "Connection refused" in text:
        return "connection_refused"
    return "connect_error"


_UNREACHABLE = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EADDRNOTAVAIL})

#: What each ``error_class`` of a try without an answer means, for people (console, CLI).
FAILURES: dict[str, str] = {
    "timeout": "timed out",
    "connection_refused": "connection refused (nothing listens there)",
    "connection_reset": "connection reset",
    "unreachable": "network unreachable",
    "tls_error": "TLS failed (certificate or handshake)",
    "dns_error": "the name does not resolve (DNS)",
    "ssrf_refused": "refused: a private or reserved address",
    "connect_error": "could not connect",
    "transport_error": "the connection broke",
    "internal_error": "an internal error (see the worker's log)",
    "secrets_unavailable": "not sent: the worker cannot open its Standard Webhooks secret (USP_SECRETS_KEY)",
}


def refused_result(refusal: Exception, started_at: datetime) -> TryResult:
    """The try that did not happen because the target was refused (or its check failed).

    A name that does not resolve is a ``dns_error``; anything else the guard refuses is
    ``ssrf_refused``. Both go through the retry schedule like any failure: DNS changes, and a
    name that points somewhere private today may be fixed by its owner tomorrow; the schedule
    ends in the dead letter either way, where an operator sees why.
    """
    if isinstance(refusal, TargetRefused):
        error_class = "dns_error" if refusal.reason == "unresolvable" else "ssrf_refused"
        return TryResult(started_at, 0.0, error_class=error_class, error=_short(f"refused: {refusal}"))
    return TryResult(started_at, 0.0, error_class="internal_error", error=type(refusal).__name__)


def excerpt(body: bytes) -> str:
    """The start of a response body as text, decoded leniently, NULs replaced (PostgreSQL text
    cannot hold them).

    >>> excerpt(b'{"ok": true}\\x00\\xff')
    '{"ok": true}\\ufffd\\ufffd'
    """
    return body[:EXCERPT_BYTES].decode("utf-8", errors="replace").replace("\x00", "\ufffd")


def endpoint_slot(target: ResolvedTarget, limit: int) -> anyio.Semaphore:
    """The semaphore bounding concurrent tries to ``target``'s endpoint in this event loop.

    Kept per event loop (an asyncio primitive belongs to one loop; the sync facade runs one loop
    per process, tests run one per test). Idle entries are dropped once there are many.
    """
    slots = _SLOTS.get(None)
    if slots is None:
        slots = {}
        _SLOTS.set(slots)
    key = (target.scheme, target.host, target.port, limit)
    slot = slots.get(key)
    if slot is None:
        if len(slots) >= _MAX_SLOTS:
            for idle in [k for k, s in slots.items() if s.value == k[3] and not s.statistics().tasks_waiting]:
                del slots[idle]
        slot = slots[key] = anyio.Semaphore(limit)
    return slot


_SLOTS: RunVar[dict[tuple[str, str, int, int], anyio.Semaphore]] = RunVar("usp_workers_endpoint_slots")


def _describe(exc: Exception, fallback: str = "") -> str:
    """``Type: message`` for a transport error. httpx's messages name the OS error, not the URL."""
    message = str(exc) or fallback
    return _short(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)


def _short(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
