"""Who an MCP request speaks for: the identity the HTTP mount authenticated, and a live sender
that stops once that principal no longer authenticates."""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from mcp.server.context import ServerRequestContext
from sqlalchemy.engine import Engine

from usp_dispatcher.access import Identity
from usp_dispatcher.access.apikeys import still_authenticates
from usp_dispatcher.mcp.live import LiveSend
from usp_workers.storage import db

__all__ = ["request_identity", "revocable"]


def request_identity(ctx: ServerRequestContext[Any, Any]) -> Identity | None:
    """What the HTTP mount authenticated (``None`` over stdio, or when nothing was presented)."""
    state = getattr(ctx.request, "state", None)
    identity = getattr(state, "usp_identity", None)
    return identity if isinstance(identity, Identity) else None


def revocable(engine: Engine, principal: str, send: LiveSend) -> LiveSend:
    """``send``, refusing (so the hub detaches the stream) once ``principal`` can no longer
    authenticate: an open stream outlives the key that opened it, a revocation must not."""

    def still() -> bool:
        with db.session(engine) as session:
            return still_authenticates(session, principal)

    async def guarded(params: dict[str, Any]) -> None:
        if not await anyio.to_thread.run_sync(still):
            raise PermissionError("the principal's credential was revoked")
        await send(params)

    return guarded
