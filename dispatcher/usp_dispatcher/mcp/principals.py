"""Who an MCP request speaks for: the identity the HTTP mount authenticated."""

from __future__ import annotations

from typing import Any

from mcp.server.context import ServerRequestContext

from usp_dispatcher.access import Identity

__all__ = ["request_identity"]


def request_identity(ctx: ServerRequestContext[Any, Any]) -> Identity | None:
    """What the HTTP mount authenticated (``None`` over stdio, or when nothing was presented)."""
    state = getattr(ctx.request, "state", None)
    identity = getattr(state, "usp_identity", None)
    return identity if isinstance(identity, Identity) else None
