"""The access classes of the USP MCP tools and the one error every access check raises.

A refusal is a protocol error (JSON-RPC ``error``), never a business outcome: the MCP layer turns
an :class:`AccessError` into ``{"code": code, "message": reason, "data": {"content": detail}}``.
``detail`` is written for the caller and never holds a credential, a signature or a key.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, Literal

__all__ = [
    "FORBIDDEN",
    "INVALID_PARAMS",
    "UNAUTHENTICATED",
    "Access",
    "AccessError",
    "Reason",
    "forbidden",
    "invalid_params",
    "unauthenticated",
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


class Access(StrEnum):
    """A tool's ``x-usp-access``: who may call it (SPEC-NOTES "MCP surface").

    >>> Access("business_only") is Access.BUSINESS_ONLY
    True
    """

    PUBLIC = "public"
    PRIVILEGED_PLATFORM = "privileged_platform"
    PRIVILEGED_SCOPED = "privileged_scoped"
    BUSINESS_ONLY = "business_only"

    @property
    def privileged(self) -> bool:
        """The binding's "privileged methods": they need ``_meta.usp.profile`` (MUST 5)."""
        return self in (Access.PRIVILEGED_PLATFORM, Access.PRIVILEGED_SCOPED)


class AccessError(Exception):
    """A call refused for who made it (or for the identity arguments it lacks).

    ``code`` is the JSON-RPC code, ``reason`` its code word (the error ``message``), ``detail``
    the human text for ``data.content``.

    >>> error = forbidden("the profile differs from the one bound to this principal")
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


def unauthenticated(detail: str) -> AccessError:
    """-32001: no acceptable credential, or a presented one that does not hold."""
    return AccessError(UNAUTHENTICATED, detail)


def forbidden(detail: str) -> AccessError:
    """-32003: the caller is known but may not do this (profile mismatch, business only...)."""
    return AccessError(FORBIDDEN, detail)


def invalid_params(detail: str) -> AccessError:
    """-32602: the identity arguments themselves are missing or malformed."""
    return AccessError(INVALID_PARAMS, detail)
