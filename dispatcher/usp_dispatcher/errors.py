"""The service layer's refusals, independent of HTTP.

The REST routes and (later) the MCP tools call the same service functions; each front end maps
these to its own wire shape (an RFC 9457 problem here, a business outcome message in MCP). The
``reason`` is the stable code clients switch on, so it never carries user input or exception text.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["Conflict", "DispatcherError", "NotFound", "Refused", "TooSoon", "Unauthenticated"]


class DispatcherError(Exception):
    """Base of every refusal: a stable ``reason`` code, a human ``detail``, and optional ``extra``
    machine-readable members (e.g. the SSRF check's own reason for refusing a target)."""

    def __init__(self, reason: str, detail: str, *, extra: Mapping[str, str] | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.extra: dict[str, str] = dict(extra or {})


class NotFound(DispatcherError):
    """The thing asked for does not exist (HTTP 404)."""


class Conflict(DispatcherError):
    """The request contradicts what is already stored (HTTP 409)."""


class Refused(DispatcherError):
    """The request is well-formed but not acceptable: a private target, an unknown event type,
    a profile without a webhook URL (HTTP 422)."""


class Unauthenticated(DispatcherError):
    """The operation needs a caller who proved who they are (HTTP 401)."""


class TooSoon(DispatcherError):
    """Asked again before it may be (HTTP 429 with ``Retry-After``): ``retry_after`` seconds."""

    def __init__(self, reason: str, detail: str, *, retry_after: int) -> None:
        super().__init__(reason, detail)
        self.retry_after = retry_after
