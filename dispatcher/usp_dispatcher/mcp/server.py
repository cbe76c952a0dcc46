"""The USP MCP server: the SDK's low-level ``Server`` with our two handlers, ``tools/list`` and
``tools/call``.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.mcp.server``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import anyio.to_thread
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError
from sqlalchemy.engine import Engine
from sqlmodel import Session

from usp_core import db
from usp_core.ssrf import Resolver
from usp_dispatcher import access
from usp_dispatcher.access import AccessError, Caller, Identity
from usp_dispatcher.errors import Refused, Unauthenticated
from usp_dispatcher.mcp.listen import LISTEN_FILTER, listen_handler
from usp_dispatcher.mcp.live import LiveHub, notification_sender
from usp_dispatcher.mcp.principals import request_identity, take_session
from usp_dispatcher.mcp.protocol import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    UNAUTHENTICATED,
    ProtocolErrors,
    argument_error,
    protocol_error,
)
from usp_dispatcher.mcp.results import envelope
from usp_dispatcher.mcp.tools import TOOLS, TOOLS_BY_NAME, ToolSpec
from usp_dispatcher.mcp.ucap import call_ucap_tool
from usp_dispatcher.scheduling.service import Call, UspMeta, read_meta, release
from usp_dispatcher.settings import ApiSettings
from usp_dispatcher.text import NUL_REFUSED, contains_nul, validation_text
from usp_dispatcher.ucap.service import UcapService
from usp_dispatcher.ucap.settings import UcapSettings
from usp_dispatcher.ucap.tools import UCAP_TOOLS_BY_NAME
from usp_dispatcher.ucap.tools import list_entries as ucap_tool_entries
from usp_receiver.mcp import CURSOR_META_KEY, EXTENSION_IDENTIFIER
from usp_schemas import WEBHOOK_METHOD

__all__ = ["SERVER_NAME", "STDIO_SESSION", "build_server", "list_tools_result"]

SERVER_NAME: Final = "usp-dispatcher"
#: The live-webhook session key of the one client a stdio server has.
STDIO_SESSION: Final = "stdio"
_SESSION_HEADER: Final = "mcp-session-id"
_CORRELATION_HEADER: Final = "usp-correlation-id"
_READ_ONLY: Final = frozenset(
    {"usp_catalog_list", "usp_availability_query", "usp_bookings_get", "usp_feed_subscriptions_list"}
)
_DESTRUCTIVE: Final = frozenset({"usp_bookings_cancel", "usp_feed_subscriptions_delete"})

_INSTRUCTIONS: Final = (
    "UCAP content tools (search_catalog, get_catalog_item, read_content, subscribe, "
    "list_entitlements) act as the agent whose HTTP message signature the request carries. "
    "USP scheduling tools of this business. Put _meta.usp inside arguments: profile (your platform "
    "profile URI, required on privileged tools), idempotency_key (a UUID v4 on every state change), "
    "correlation_id (optional join id), authorization (stdio credentials and booking-scoped "
    "credentials). Business outcomes (slot_unavailable, booking_not_found, ...) come back as "
    "results with structuredContent.messages[]; protocol problems as JSON-RPC errors."
)


def build_server(
    engine: Engine,
    settings: ApiSettings,
    *,
    hub: LiveHub | None = None,
    resolver: Resolver | None = None,
    ucap: UcapService | None = None,
) -> Server[Any]:
    """The MCP server over ``engine``'s database. ``hub`` (when given) pushes each platform's
    events to the sessions that speak for it; ``resolver`` is the SSRF check's DNS resolver
    (``None``: the system's); ``ucap`` the content service the UCAP tools call (default: one of
    this server's own over ``engine``)."""
    content = ucap if ucap is not None else UcapService(engine, settings, UcapSettings())

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return list_tools_result()

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name in UCAP_TOOLS_BY_NAME:
            if contains_nul(params.arguments or {}):
                raise protocol_error(INVALID_PARAMS, f"{NUL_REFUSED}.")
            return await call_ucap_tool(content, params.name, params.arguments or {}, request_identity(ctx))
        spec = TOOLS_BY_NAME.get(params.name)
        if spec is None:
            raise protocol_error(METHOD_NOT_FOUND, f"There is no tool {_shown(params.name)}.")
        arguments: dict[str, Any] = dict(params.arguments or {})
        if contains_nul(arguments):  # the REST routes' rule too (RefuseNul)
            raise protocol_error(INVALID_PARAMS, f"{NUL_REFUSED}.")
        try:
            meta = read_meta(arguments)
        except ValidationError as exc:
            raise protocol_error(INVALID_PARAMS, f"_meta: {validation_text(exc)}") from None
        session = take_session(ctx)
        try:
            return await _call(spec, arguments, meta, ctx, session)
        finally:
            if session is not None:
                await release(session)

    async def _call(
        spec: ToolSpec,
        arguments: dict[str, Any],
        meta: UspMeta,
        ctx: ServerRequestContext[Any, Any],
        session: Session | None,
    ) -> types.CallToolResult:
        identity = request_identity(ctx)
        caller = await _authorize(engine, settings, spec, arguments, ctx.params or {}, identity, session)
        session_key = _session_key(ctx)
        # Only an authenticated principal's session is attached: an anonymous caller (allowed when
        # USP_REQUIRE_AUTHENTICATION is off) could name any profile and would receive its
        # bookings' buyer details. A scoped credential alone (principal None) attaches nothing.
        # Over HTTP the principal must be the one whose transport credential owns the session: a
        # session opened without one is bound to nobody (anyone with its id may read its stream),
        # so an in-band bearer serves the call but does not make that session the platform's.
        if (
            hub is not None
            and session_key is not None
            and spec.operation.access.privileged
            and caller.profile
            and caller.principal is not None
            and (session_key == STDIO_SESSION or _transport_principal(ctx) == caller.principal)
        ):
            hub.attach(
                session_key, caller.profile, notification_sender(ctx.session), principal=caller.principal
            )
        operation = spec.operation
        try:
            model = operation.arguments.model_validate({k: v for k, v in arguments.items() if k != "_meta"})
        except ValidationError as exc:
            raise argument_error(exc) from None
        correlation_id = _correlation_id(ctx, meta)
        held = [session] if session is not None else []
        call = Call(engine, settings, caller, meta, correlation_id, resolver, held=held)
        try:
            body = await operation.handler(call, model)
        except Refused as exc:
            raise protocol_error(INVALID_PARAMS, exc.detail) from None
        except Unauthenticated as exc:
            raise protocol_error(UNAUTHENTICATED, exc.detail) from None
        return envelope(body, capability=spec.capability, correlation_id=correlation_id)

    server: Server[Any] = Server(
        SERVER_NAME,
        version=_version(),
        title="USP scheduling (MCP binding)",
        instructions=_INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_subscriptions_listen=listen_handler(engine, settings, hub) if hub is not None else None,
        get_tool_input_schema=lambda name: (
            TOOLS_BY_NAME[name].input_schema
            if name in TOOLS_BY_NAME
            else UCAP_TOOLS_BY_NAME[name].input_schema
            if name in UCAP_TOOLS_BY_NAME
            else None
        ),
    )
    server.middleware.append(ProtocolErrors())
    if hub is not None:
        # Advertised in capabilities (``server/discover``, ``initialize``): the webhook stream.
        server.extensions[EXTENSION_IDENTIFIER] = {
            "method": WEBHOOK_METHOD,
            "listen_filter": dict(LISTEN_FILTER),
            "cursor_meta_key": CURSOR_META_KEY,
        }
    return server


def list_tools_result() -> types.ListToolsResult:
    """Every tool: the USP tools with their access class in ``_meta["x-usp-access"]`` (as the
    binding's OpenAPI names it), then the five UCAP tools exactly as their seed defines them."""
    return types.ListToolsResult(
        tools=[
            types.Tool(
                name=tool.name,
                description=tool.description,
                input_schema=tool.input_schema,
                annotations=types.ToolAnnotations(
                    read_only_hint=tool.name in _READ_ONLY,
                    destructive_hint=tool.name in _DESTRUCTIVE,
                    open_world_hint=False,
                ),
                _meta={"x-usp-access": tool.operation.access.value},
            )
            for tool in TOOLS
        ]
        + ucap_tool_entries()
    )


async def _authorize(
    engine: Engine,
    settings: ApiSettings,
    spec: ToolSpec,
    arguments: Mapping[str, Any],
    params: Mapping[str, Any],
    identity: Identity | None,
    held: Session | None,
) -> Caller:
    """Authorize on ``held`` (left open for the call's work) or on a session of its own."""

    def work() -> Caller:
        with db.session_or_held(engine, held) as session:
            return access.authorize(
                session,
                settings,
                tool=spec.name,
                access=spec.operation.access,
                arguments=arguments,
                params=params,
                identity=identity,
            )

    try:
        return await anyio.to_thread.run_sync(work)
    except AccessError as exc:
        raise MCPError(code=exc.code, message=exc.reason, data={"content": exc.detail}) from None


def _transport_principal(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The principal the HTTP mount authenticated, which the SDK binds the session to."""
    identity = request_identity(ctx)
    return identity.principal if identity is not None else None


def _session_key(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The live-webhook key of this call's session: ``http:<Mcp-Session-Id>`` over HTTP, the one
    stdio session otherwise; ``None`` for an HTTP call outside a session (nothing to push to)."""
    if ctx.request is None:
        return STDIO_SESSION
    headers = getattr(ctx.request, "headers", None)
    session_id = headers.get(_SESSION_HEADER) if headers is not None else None
    return f"http:{session_id}" if session_id else None


def _correlation_id(ctx: ServerRequestContext[Any, Any], meta: UspMeta) -> str | None:
    """``_meta.usp.correlation_id``, else the ``USP-Correlation-Id`` header (HTTP; the binding
    says both SHOULD agree, and ``_meta`` is what every transport carries, so it wins)."""
    if meta.correlation_id is not None:
        return meta.correlation_id
    headers = getattr(ctx.request, "headers", None)
    header = headers.get(_CORRELATION_HEADER) if headers is not None else None
    if isinstance(header, str) and 0 < len(header) <= 128 and header.isascii() and header.isprintable():
        return header
    return None


def _shown(name: str) -> str:
    """A client-supplied name, safe to echo: printable and short."""
    return repr(name) if len(name) <= 100 and name.isprintable() else "with that name"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("usp-dispatcher")
    except PackageNotFoundError:
        return "0"
