"""Live webhooks for MCP 2026-07-28 clients: ``subscriptions/listen``, whose response is the stream.

A platform opts in with :data:`LISTEN_FILTER` in the request's ``notifications`` filter and names
its profile in ``_meta.usp.profile`` (authenticated as for a privileged tool). The stream opens
with ``notifications/subscriptions/acknowledged`` (the honoured subset of the filter), then
carries ``usp_webhook`` notifications, each signed in band with the stream's
``io.modelcontextprotocol/subscriptionId`` inside what is signed. ``_meta["io.usp/after"]``, an
event id, asks first for what the profile missed since that event.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.mcp.listen``.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from sqlalchemy.engine import Engine

from usp_core import db
from usp_core.keycache import current_signing_keys
from usp_dispatcher import access
from usp_dispatcher.access import AccessError, Caller
from usp_dispatcher.access.errors import Access, unauthenticated
from usp_dispatcher.mcp.live import DEFAULT_QUEUE_SIZE, LiveHub, missed_since, webhook_notification
from usp_dispatcher.mcp.principals import request_identity
from usp_dispatcher.mcp.protocol import INVALID_PARAMS, protocol_error
from usp_dispatcher.settings import ApiSettings
from usp_receiver import sign_notification_params
from usp_receiver.mcp import CURSOR_META_KEY, LISTEN_FILTER_KEY

__all__ = [
    "LISTEN_FILTER",
    "MAX_CATCH_UP",
    "ListenHandler",
    "listen_handler",
]

#: The whole filter object ``/.well-known/usp`` publishes for a client to copy.
LISTEN_FILTER: Final = {LISTEN_FILTER_KEY: True}
#: The most missed events a stream sends before going live (the rest arrive over REST/JSON-RPC).
MAX_CATCH_UP: Final = 1000

ListenHandler = Callable[
    [ServerRequestContext[Any, Any], types.SubscriptionsListenRequestParams],
    Awaitable[types.SubscriptionsListenResult],
]


def listen_handler(engine: Engine, settings: ApiSettings, hub: LiveHub) -> ListenHandler:
    """The ``subscriptions/listen`` handler feeding streams from ``hub``."""

    async def listen(
        ctx: ServerRequestContext[Any, Any], params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise MCPError(types.INVALID_REQUEST, "subscriptions/listen requires a request id")
        raw = params.model_dump(by_alias=True, mode="json", exclude_none=True)
        stamp: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
        wanted = (raw.get("notifications") or {}).get(LISTEN_FILTER_KEY) is True

        async def send(notification: Any) -> None:
            await ctx.session.send_notification(notification, related_request_id=subscription_id)

        honored = types.SubscriptionFilter.model_validate(LISTEN_FILTER if wanted else {})
        acknowledged = types.SubscriptionsAcknowledgedNotification(
            params=types.SubscriptionsAcknowledgedNotificationParams(notifications=honored, _meta=stamp)
        )
        if not wanted:  # nothing this server publishes was asked for: acknowledged, and closed
            await send(acknowledged)
            return types.SubscriptionsListenResult(_meta=stamp)
        meta = raw.get("_meta") or {}
        principal, profile = await _listener(engine, settings, ctx, meta, raw)
        cursor = meta.get(CURSOR_META_KEY)
        if cursor is not None and not isinstance(cursor, str):
            raise protocol_error(INVALID_PARAMS, f"_meta.{CURSOR_META_KEY} is an event id")

        inbox, outbox = anyio.create_memory_object_stream[dict[str, Any]](DEFAULT_QUEUE_SIZE)

        async def push(notification_params: dict[str, Any]) -> None:
            inbox.send_nowait(notification_params)  # full: a stalled stream, dropped by the hub

        async def stamped(notification_params: Mapping[str, Any]) -> None:
            signed = await anyio.to_thread.run_sync(_signed, engine, settings, notification_params, stamp)
            await send(webhook_notification(signed))

        key = f"listen:{uuid.uuid4()}"
        # Dropped by the hub (revoked, not keeping up): the inbox closes, the stream ends, and its
        # client listens again.
        hub.attach(key, profile, push, principal=principal, swept=False, on_drop=inbox.close)
        try:
            await send(acknowledged)
            caught_up: set[str] = set()
            if cursor is not None:
                missed = await anyio.to_thread.run_sync(missed_since, engine, profile, cursor, MAX_CATCH_UP)
                if missed is None:
                    raise protocol_error(
                        INVALID_PARAMS, f"_meta.{CURSOR_META_KEY}: no such event here (unknown, or purged)"
                    )
                for envelope in missed:
                    await stamped(envelope)
                    caught_up.add(envelope["event_id"])
            async for notification_params in outbox:
                if notification_params.get("event_id") not in caught_up:
                    await stamped(notification_params)
        finally:
            hub.detach(key)
            inbox.close()
            outbox.close()
        return types.SubscriptionsListenResult(_meta=stamp)

    return listen


async def _listener(
    engine: Engine,
    settings: ApiSettings,
    ctx: ServerRequestContext[Any, Any],
    meta: Mapping[str, Any],
    params: Mapping[str, Any],
) -> tuple[str, str]:
    """The principal and profile of a listener, by the rules of attaching a legacy session: a
    platform authenticated as for a privileged tool, naming its profile; over HTTP by the
    request's own credential (an in-band bearer, or a scoped credential alone, attaches nothing)."""
    identity = request_identity(ctx)

    def work() -> Caller:
        with db.session(engine) as session:
            return access.authorize(
                session,
                settings,
                tool="subscriptions/listen",
                access=Access.PRIVILEGED_PLATFORM,
                arguments={"_meta": meta},
                params=params,
                identity=identity,
            )

    try:
        caller = await anyio.to_thread.run_sync(work)
    except AccessError as exc:
        raise MCPError(code=exc.code, message=exc.reason, data={"content": exc.detail}) from None
    transport = identity.principal if identity is not None else None
    over_http = ctx.request is not None
    if caller.principal is None or caller.profile is None or (over_http and transport != caller.principal):
        error = unauthenticated(
            "subscriptions/listen needs the platform's own credential on the request (an API key or "
            "an agent signature)"
        )
        raise MCPError(code=error.code, message=error.reason, data={"content": error.detail})
    return caller.principal, caller.profile


def _signed(
    engine: Engine, settings: ApiSettings, params: Mapping[str, Any], stamp: Mapping[str, Any]
) -> dict[str, Any]:
    """``params`` with the stream's subscription id in ``_meta``, signed in band (the signature
    covers everything in ``params`` but itself: the id too)."""
    meta = dict(params.get("_meta") or {})
    return sign_notification_params(
        {**params, "_meta": meta | dict(stamp)}, current_signing_keys(engine, settings)[0]
    )
