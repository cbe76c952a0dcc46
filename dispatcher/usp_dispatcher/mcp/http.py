"""The MCP server over Streamable HTTP at ``/mcp``, with stateful sessions so the server can push.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.mcp.http``.
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Final
from urllib.parse import urlsplit

import anyio
import mcp_types as types
from fastapi import FastAPI
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, AuthorizationContext
from mcp.server.auth.provider import AccessToken
from mcp.server.lowlevel import Server
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import (
    DEFAULT_MAX_REQUEST_BODY_SIZE,
    DEFAULT_SESSION_IDLE_TIMEOUT,
    RequestBodyLimitMiddleware,
    StreamableHTTPSessionManager,
)
from mcp.server.transport_security import TransportSecuritySettings
from sqlalchemy.engine import Engine
from sqlmodel import Session
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from usp_core import db
from usp_dispatcher.access import AccessError, authenticate_http
from usp_dispatcher.access.nonces import nonces_for
from usp_dispatcher.access.signatures import NonceCheck
from usp_dispatcher.mcp.event_store import DEFAULT_MAX_AGE, DEFAULT_MAX_EVENTS, SessionEventStore
from usp_dispatcher.mcp.live import DEFAULT_POLL_INTERVAL, LiveHub
from usp_dispatcher.mcp.principals import SESSION_STATE
from usp_dispatcher.mcp.protocol import INTERNAL_ERROR, error_object, parse_message
from usp_dispatcher.mcp.server import build_server
from usp_dispatcher.mcp.tools import TOOLS_BY_NAME
from usp_dispatcher.scheduling.service import release
from usp_dispatcher.settings import ApiSettings
from usp_dispatcher.text import json_too_deep

__all__ = ["HTTP_SESSION_PREFIX", "MCP_PATH", "MCPEndpoint", "ServerFactory", "default_security", "mount_mcp"]

logger = logging.getLogger("usp_dispatcher.mcp")

MCP_PATH: Final = "/mcp"
#: Live-webhook session keys of HTTP sessions are this prefix and the ``Mcp-Session-Id``.
HTTP_SESSION_PREFIX: Final = "http:"

#: Builds the MCP server for the endpoint: ``(engine, settings, hub) -> Server``.
ServerFactory = Callable[[Engine, ApiSettings, LiveHub], Server[Any]]


def mount_mcp(
    app: FastAPI,
    settings: ApiSettings,
    *,
    path: str = MCP_PATH,
    server_factory: ServerFactory | None = None,
    security: TransportSecuritySettings | None = None,
    session_idle_timeout: float | None = DEFAULT_SESSION_IDLE_TIMEOUT,
    max_request_body_size: int = DEFAULT_MAX_REQUEST_BODY_SIZE,
    replay_max_events: int = DEFAULT_MAX_EVENTS,
    replay_max_age: float = DEFAULT_MAX_AGE,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
) -> MCPEndpoint:
    """Add the MCP endpoint at ``path`` (also ``app.state.mcp``); enter :meth:`MCPEndpoint.serve`
    in the app's lifespan.

    Until it is entered (and after it exits) the endpoint answers 503. ``server_factory``
    defaults to :func:`.server.build_server` (with the app's ``target_resolver``).
    """

    def default_factory(engine: Engine, settings: ApiSettings, hub: LiveHub) -> Server[Any]:
        return build_server(
            engine,
            settings,
            hub=hub,
            resolver=getattr(app.state, "target_resolver", None),
            ucap=getattr(app.state, "ucap", None),
        )

    endpoint = MCPEndpoint(
        app,
        settings,
        server_factory=server_factory or default_factory,
        security=security if security is not None else default_security(settings),
        session_idle_timeout=session_idle_timeout,
        max_request_body_size=max_request_body_size,
        replay_max_events=replay_max_events,
        replay_max_age=replay_max_age,
        poll_interval=poll_interval,
    )
    # First, so an MCP request does not walk every router's routes before matching (measured:
    # FastAPI's route matching was ~4% of the API's CPU per MCP call with the endpoint last).
    app.router.routes.insert(0, Route(path, endpoint=endpoint, include_in_schema=False))
    app.state.mcp = endpoint
    return endpoint


def default_security(settings: ApiSettings) -> TransportSecuritySettings:
    """The SDK's DNS-rebinding checks for this deployment: loopback on any port, and the public
    URL's host.

    >>> default_security(ApiSettings(public_base_url="https://book.example")).allowed_hosts[-1]
    'book.example'
    """
    hosts = ["127.0.0.1", "127.0.0.1:*", "localhost", "localhost:*", "[::1]", "[::1]:*"]
    origins = [f"http://{host}" for host in hosts]
    public = urlsplit(settings.public_base_url)
    if public.netloc:
        hosts.append(public.netloc)
        origins.append(f"{public.scheme}://{public.netloc}")
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


@dataclass(frozen=True)
class _Running:
    manager: _SessionManager
    hub: LiveHub
    engine: Engine
    nonces: NonceCheck


class MCPEndpoint:
    """The ASGI app at ``/mcp``: authentication in front of the SDK's session manager."""

    def __init__(
        self,
        app: FastAPI,
        settings: ApiSettings,
        *,
        server_factory: ServerFactory,
        security: TransportSecuritySettings,
        session_idle_timeout: float | None,
        max_request_body_size: int,
        replay_max_events: int,
        replay_max_age: float,
        poll_interval: float,
    ) -> None:
        self._app = app
        self._settings = settings
        self._server_factory = server_factory
        self._security = security
        self._session_idle_timeout = session_idle_timeout
        self._max_request_body_size = max_request_body_size
        self._store_factory = partial(SessionEventStore, max_events=replay_max_events, max_age=replay_max_age)
        self._poll_interval = poll_interval
        self._running: _Running | None = None
        self._limited = RequestBodyLimitMiddleware(self._authenticated, max_request_body_size)

    @property
    def hub(self) -> LiveHub | None:
        """The live-webhook hub while the endpoint is serving."""
        return None if self._running is None else self._running.hub

    @asynccontextmanager
    async def serve(self, engine: Engine) -> AsyncIterator[LiveHub]:
        """Serve MCP on ``engine``'s database (the session manager and the live-webhook hub) for
        the duration of the block; the app's lifespan enters it. Yields the hub."""
        hub = LiveHub(is_alive=self._session_alive)
        server = self._server_factory(engine, self._settings, hub)
        manager = _SessionManager(
            server,
            store_factory=self._store_factory,
            security_settings=self._security,
            session_idle_timeout=self._session_idle_timeout,
            max_request_body_size=self._max_request_body_size,
        )
        async with manager.run(), anyio.create_task_group() as task_group:
            task_group.start_soon(partial(hub.run, engine, self._settings, poll_interval=self._poll_interval))
            self._running = _Running(manager, hub, engine, nonces_for(engine, self._settings))
            try:
                yield hub
            finally:
                self._running = None
                task_group.cancel_scope.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._running is None:
            await _rpc_error(503, INTERNAL_ERROR, "The MCP endpoint is not running.")(scope, receive, send)
            return
        await self._limited(scope, receive, send)

    async def _authenticated(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Authenticate, hand the identity on in the scope, let the session manager serve."""
        running = self._running
        if running is None:  # stopped while the body was read
            await _rpc_error(503, INTERNAL_ERROR, "The MCP endpoint is not running.")(scope, receive, send)
            return
        body, receive = await _buffered(receive)
        request = Request(scope)
        parsed = parse_message(body) if request.method == "POST" else None
        # A USP tool call is one transaction: the key lookup here, its authorization and its
        # work in the tool (which takes the session from the box, and then closes it).
        box = [db.session(running.engine)] if _calls_a_usp_tool(parsed) else []
        try:
            await self._serve_authenticated(request, body, parsed, box, running, receive, send)
        finally:
            while box:  # not taken: the request went no further than the lookup
                await release(box.pop())

    async def _serve_authenticated(
        self,
        request: Request,
        body: bytes,
        parsed: types.JSONRPCMessage | types.JSONRPCError | None,
        box: list[Session],
        running: _Running,
        receive: Receive,
        send: Send,
    ) -> None:
        scope = request.scope
        try:
            identity = await authenticate_http(
                request.method,
                str(request.url),
                request.headers,
                body,
                engine=running.engine,
                settings=self._settings,
                resolver=getattr(self._app.state, "target_resolver", None),
                nonces=running.nonces,
                session=box[0] if box else None,
            )
        except AccessError as exc:
            response = _rpc_error(401, exc.code, exc.detail, request_id=_request_id(body), message=exc.reason)
            if "authorization" in request.headers:
                response.headers["WWW-Authenticate"] = 'Bearer error="invalid_token"'  # RFC 6750
            await response(scope, receive, send)
            return
        except Exception:
            logger.exception("MCP request authentication failed")
            await _rpc_error(500, INTERNAL_ERROR, request_id=_request_id(body))(scope, receive, send)
            return
        if isinstance(parsed, types.JSONRPCError):
            # Answered here, as stdio answers a broken line: the SDK's own answers to these
            # are not in the binding's shape (a -32602 that echoes the input, among others).
            answer = parsed.model_dump(mode="json", by_alias=True, exclude_unset=True)
            await JSONResponse(answer, status_code=400)(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        state["usp_identity"] = identity
        state[SESSION_STATE] = box
        if identity is not None:
            # The SDK binds a session to the credential that opened it through the scope's
            # user (its authorization_context); the token itself is never needed, nor kept.
            scope["user"] = AuthenticatedUser(AccessToken(token="", client_id=identity.principal, scopes=[]))
        await running.manager.handle_request(scope, receive, send)

    def buffered(self, session_id: str) -> int:
        """How many messages the session ``session_id`` holds for a reconnecting client (for
        metrics and tests; 0 for a session that is not being served)."""
        return 0 if self._running is None else self._running.manager.buffered(session_id)

    def _session_alive(self, session_key: str) -> bool:
        running = self._running
        if running is None or not session_key.startswith(HTTP_SESSION_PREFIX):
            return False  # this process serves no stdio session
        return running.manager.session_alive(session_key.removeprefix(HTTP_SESSION_PREFIX))


class _SessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager, giving each session an event store of its own.

    The SDK offers one ``event_store`` for all sessions and no per-session factory; the hook is
    ``_admit_session``, which builds each session's transport from ``self.event_store`` under the
    session-creation lock, synchronously. Setting the attribute around the call hands the new
    transport a fresh store, and nothing else sees it. The per-session isolation test fails if an
    SDK upgrade changes this.
    """

    def __init__(
        self, app: Server[Any], *, store_factory: Callable[[], SessionEventStore], **options: Any
    ) -> None:
        super().__init__(app, event_store=None, **options)
        self._store_factory = store_factory
        self._transports: weakref.WeakValueDictionary[str, StreamableHTTPServerTransport] = (
            weakref.WeakValueDictionary()
        )
        self._stores: weakref.WeakValueDictionary[str, SessionEventStore] = weakref.WeakValueDictionary()

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        store = self.event_store = self._store_factory()
        try:
            transport = super()._admit_session(requestor)
        finally:
            self.event_store = None
        if transport is not None and transport.mcp_session_id is not None:
            self._transports[transport.mcp_session_id] = transport
            self._stores[transport.mcp_session_id] = store
        return transport

    def session_alive(self, session_id: str) -> bool:
        """Whether ``session_id`` is a session this manager still serves."""
        transport = self._transports.get(session_id)
        return transport is not None and not transport.is_terminated

    def buffered(self, session_id: str) -> int:
        """Messages ``session_id``'s event store holds for replay (0 for an unknown session)."""
        store = self._stores.get(session_id) if self.session_alive(session_id) else None
        return 0 if store is None else store.held


async def _buffered(receive: Receive) -> tuple[bytes, Receive]:
    """The request body, and a ``receive`` that replays it before passing on what follows (the
    disconnect the SDK's streams wait for)."""
    chunks: list[bytes] = []
    replay: list[Message] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            replay.append(message)
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(chunks)
    replay.insert(0, {"type": "http.request", "body": body, "more_body": False})

    async def replaying() -> Message:
        return replay.pop(0) if replay else await receive()

    return body, replaying


def _calls_a_usp_tool(message: types.JSONRPCMessage | types.JSONRPCError | None) -> bool:
    if not isinstance(message, types.JSONRPCRequest) or message.method != "tools/call":
        return False
    name = (message.params or {}).get("name")
    return isinstance(name, str) and name in TOOLS_BY_NAME


def _request_id(body: bytes) -> int | str | None:
    """The id of the JSON-RPC request in ``body``, to answer it by; ``None`` when there is none."""
    if json_too_deep(body):
        return None
    try:
        document = json.loads(body)
    except ValueError:
        return None
    candidate = document.get("id") if isinstance(document, dict) else None
    return candidate if isinstance(candidate, int | str) and not isinstance(candidate, bool) else None


def _rpc_error(
    status: int,
    code: int,
    content: str | None = None,
    *,
    request_id: int | str | None = None,
    message: str | None = None,
) -> JSONResponse:
    """An HTTP error answered with a JSON-RPC error body, as the SDK answers its own."""
    error = error_object(code, content)
    if message is not None:
        error["message"] = message
    return JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": error}, status_code=status)
