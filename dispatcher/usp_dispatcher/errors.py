"""Every error the dispatcher raises on purpose, as one tree (as httpx keeps its exceptions)::

    DispatcherError
    ├── Refusal: the services' refusals, independent of the wire (``reason``, ``detail``)
    │   ├── NotFound (404), Conflict (409), Refused (422), Unauthenticated (401), TooSoon (429)
    ├── AccessError: a USP call refused for who made it (JSON-RPC code and reason)
    ├── InvalidRequest: malformed scheduling input a schema cannot express
    ├── UcapError: a UCAP refusal, with UCAP's code and its HTTP status
    ├── PaymentRefused: an x402 payment that does not pay
    ├── HTTPProblem: a refusal already in HTTP's shape (an RFC 9457 problem)
    ├── DocumentUnavailable: a remote document (a directory, a JWKS) that could not be read
    └── NonceStoreUnavailable: the signature nonce store does not answer

Each surface maps them to its wire shape: REST to RFC 9457 problems (``usp_dispatcher.web.problems``),
MCP to JSON-RPC errors (``usp_dispatcher.mcp.protocol``, whose ``MCPError`` is the SDK's). A
business outcome is not an error: it is an answer (``usp_dispatcher.scheduling.outcomes.Outcome``).
The engine's operator verbs raise their own (``usp_workers.operations.OperationError``), which the
admin API maps. A ``reason`` is the stable code clients switch on, so it never carries user input
or exception text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

__all__ = [
    "FORBIDDEN",
    "INVALID_PARAMS",
    "UNAUTHENTICATED",
    "AccessError",
    "Conflict",
    "DispatcherError",
    "DocumentUnavailable",
    "Failure",
    "HTTPProblem",
    "InvalidRequest",
    "NonceStoreUnavailable",
    "NotFound",
    "PaymentRefused",
    "Reason",
    "Refusal",
    "Refused",
    "TooSoon",
    "UcapError",
    "Unauthenticated",
]

UNAUTHENTICATED: Final = -32001
FORBIDDEN: Final = -32003
INVALID_PARAMS: Final = -32602

Reason = Literal["unauthenticated", "forbidden", "invalid_params"]
_REASONS: Final[dict[int, Reason]] = {
    UNAUTHENTICATED: "unauthenticated",
    FORBIDDEN: "forbidden",
    INVALID_PARAMS: "invalid_params",
}

Failure = Literal["timeout", "unreachable", "redirect", "status", "compressed", "too_large"]


class DispatcherError(Exception):
    """The root: every error the dispatcher raises on purpose."""


class Refusal(DispatcherError):
    """Base of the services' refusals: a stable ``reason`` code, a human ``detail``, and optional ``extra``
    machine-readable members (e.g. the SSRF check's own reason for refusing a target)."""

    def __init__(self, reason: str, detail: str, *, extra: Mapping[str, str] | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.extra: dict[str, str] = dict(extra or {})


class NotFound(Refusal):
    """The thing asked for does not exist (HTTP 404)."""


class Conflict(Refusal):
    """The request contradicts what is already stored (HTTP 409)."""


class Refused(Refusal):
    """The request is well-formed but not acceptable: a private target, an unknown event type,
    a profile without a webhook URL (HTTP 422)."""


class Unauthenticated(Refusal):
    """The operation needs a caller who proved who they are (HTTP 401)."""


class TooSoon(Refusal):
    """Asked again before it may be (HTTP 429 with ``Retry-After``): ``retry_after`` seconds."""

    def __init__(self, reason: str, detail: str, *, retry_after: int) -> None:
        super().__init__(reason, detail)
        self.retry_after = retry_after


class AccessError(DispatcherError):
    """A call refused for who made it (or for the identity arguments it lacks).

    ``code`` is the JSON-RPC code, ``reason`` its code word (the error ``message``), ``detail``
    the human text for ``data.content``.

    >>> error = AccessError(FORBIDDEN, "the profile differs from the one bound to this principal")
    >>> error.code, error.reason
    (-32003, 'forbidden')
    """

    def __init__(self, code: int, detail: str) -> None:
        if code not in _REASONS:
            raise ValueError(f"not an access error code: {code}")
        super().__init__(detail)
        self.code: int = code
        self.reason: Reason = _REASONS[code]
        self.detail: str = detail

    def __repr__(self) -> str:
        return f"AccessError({self.code}, {self.detail!r})"


class InvalidRequest(DispatcherError, ValueError):
    """Malformed input a schema cannot express (an end date before the start date): the caller's
    mistake, not a business outcome. REST answers 422, MCP ``invalid_params``."""


class UcapError(DispatcherError):
    """A refusal: ``code`` is UCAP's error code, ``status`` its HTTP status, ``detail`` safe to show
    (never the rejected input)."""

    def __init__(
        self, status: int, code: str, detail: str, *, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = dict(headers or {})


class PaymentRefused(DispatcherError):
    """A payment that does not pay: ``reason`` is x402's code (``invalid_exact_evm_payload_…``)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class HTTPProblem(DispatcherError):
    """Raise from a route or dependency to answer with a problem (e.g. 401 from the admin check)."""

    def __init__(
        self,
        status: int,
        reason: str,
        title: str,
        detail: str,
        *,
        headers: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.reason = reason
        self.title = title
        self.detail = detail
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})


class DocumentUnavailable(DispatcherError):
    """The document could not be fetched or may not be read; ``failure`` says why."""

    def __init__(self, failure: Failure, *, status_code: int | None = None, cause: str | None = None) -> None:
        super().__init__(failure if status_code is None else f"{failure} ({status_code})")
        self.failure: Failure = failure
        self.status_code = status_code
        self.cause = cause  #: the transport error's class name, for "unreachable"


class NonceStoreUnavailable(DispatcherError):
    """The nonce store (Redis) does not answer: a signed request can be neither accepted (it may
    be a replay) nor refused as one; the API answers 503 and the agent retries."""
