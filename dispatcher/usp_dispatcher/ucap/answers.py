"""What a ``/v1`` operation answers: a status, a JSON body, headers. The routes send it as is; the
MCP tools turn it into a tool result (:mod:`.tools`). One shape for both keeps them one code path.

Refusals are :class:`UcapError`: UCAP's error code (``payment_required``, ``agent_unauthorized``,
``content_not_found``, ``rate_limited``, ``invalid_request`` …) with its HTTP status. Over HTTP
they are RFC 9457 problems whose ``reason`` is the code, carrying UCAP's own ``error`` object too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from usp_dispatcher.errors import UcapError

__all__ = ["Answer", "invalid", "not_found", "unauthorized"]


@dataclass(frozen=True, slots=True)
class Answer:
    """An operation's answer: ``status`` 200 (or 402 with offers), the body, extra headers."""

    body: dict[str, Any]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


def invalid(detail: str) -> UcapError:
    return UcapError(400, "invalid_request", detail)


def not_found(detail: str) -> UcapError:
    return UcapError(404, "content_not_found", detail)


def unauthorized(detail: str) -> UcapError:
    return UcapError(403, "agent_unauthorized", detail)
