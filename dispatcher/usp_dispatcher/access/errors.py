"""The access classes of the USP MCP tools, and the one error every access check raises
(:class:`usp_dispatcher.errors.AccessError`), made by code.

A refusal is a protocol error (JSON-RPC ``error``), never a business outcome: the MCP layer turns
an :class:`AccessError` into ``{"code": code, "message": reason, "data": {"content": detail}}``.
``detail`` is written for the caller and never holds a credential, a signature or a key.
"""

from __future__ import annotations

from enum import StrEnum

from usp_dispatcher.errors import FORBIDDEN, INVALID_PARAMS, UNAUTHENTICATED, AccessError

__all__ = ["Access", "forbidden", "invalid_params", "unauthenticated"]


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


def unauthenticated(detail: str) -> AccessError:
    """-32001: no acceptable credential, or a presented one that does not hold."""
    return AccessError(UNAUTHENTICATED, detail)


def forbidden(detail: str) -> AccessError:
    """-32003: the caller is known but may not do this (profile mismatch, business only...)."""
    return AccessError(FORBIDDEN, detail)


def invalid_params(detail: str) -> AccessError:
    """-32602: the identity arguments themselves are missing or malformed."""
    return AccessError(INVALID_PARAMS, detail)
