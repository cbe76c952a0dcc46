"""Who an MCP request speaks for: the identity the HTTP mount authenticated, and the session it
looked the key up on."""

from __future__ import annotations

from typing import Any, Final

from mcp.server.context import ServerRequestContext
from sqlmodel import Session

from usp_dispatcher.access import Identity

__all__ = ["SESSION_STATE", "request_identity", "take_session"]

#: The request state's box holding the session the mount authenticated a USP tool call on.
SESSION_STATE: Final = "usp_session"


def request_identity(ctx: ServerRequestContext[Any, Any]) -> Identity | None:
    """What the HTTP mount authenticated (``None`` over stdio, or when nothing was presented)."""
    state = getattr(ctx.request, "state", None)
    identity = getattr(state, "usp_identity", None)
    return identity if isinstance(identity, Identity) else None


def take_session(ctx: ServerRequestContext[Any, Any]) -> Session | None:
    """The session the mount looked the caller's key up on, now the caller's to close (``None``
    over stdio, or for a request that was not a USP tool call)."""
    box = getattr(getattr(ctx.request, "state", None), SESSION_STATE, None)
    return box.pop() if isinstance(box, list) and box else None
