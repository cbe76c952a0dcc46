"""An ``httpx`` transport with one small HTTP/1.1 connection pool per pinned origin.

Deliveries go to pinned addresses (:func:`usp_workers.ssrf.send_pinned`): the URL carries the
checked IP, the ``Host`` header and, for https, the ``sni_hostname`` extension carry the name. This
transport keys its pools by **(scheme, pinned IP, port, and for https the SNI name)**, which buys
two things over ``httpx``'s own pool (keyed by ``scheme://ip:port`` only):

* **keep-alive is safe for https.** A connection whose certificate was verified for one name is
  only ever reused for that name, never for another name a CDN serves on the same address, so
  https deliveries need no ``Connection: close`` and no TLS handshake per delivery.
* **it is cheap.** Profiling a worker showed most of a delivery's CPU in httpcore's pool
  bookkeeping: every request and every response close runs ``_assign_requests_to_connections``,
  which scans the whole pool and asks each connection ``has_expired()`` (a ``poll`` syscall and
  anyio's per-call attribute dict): ~0.95 ms of CPU per request against a local receiver, and
  httpx's client layer (URL parsing, header models, cookies, auth and redirect hooks) ~0.17 ms
  more. Here a request takes an idle connection from its origin's deque (O(1)), is written with
  ``h11`` on an asyncio stream, and its answer parsed with ``h11``: ~0.13 ms.
  :meth:`OriginTransport.request` (what :func:`usp_workers.ssrf.send_pinned` calls for a
  :class:`PinnedClient`) skips httpx's models altogether; :meth:`OriginTransport.handle_async_request`
  serves any other use of the client through httpx as usual.

What it does not do, on purpose: HTTP/2, proxies, cookies, redirects, retries of requests that a
server may have seen. The one retry is a request written to a *reused* connection that the server
had already closed (no byte of an answer came back): the keep-alive race every HTTP/1.1 client
has, when a server times out an idle connection just as it is reused.

Concurrency per origin is bounded by the caller (the delivery engine's per-endpoint slots,
:func:`usp_workers.transport.endpoint_slot`), not here; this pool bounds what it *keeps*: at most
``max_idle_per_origin`` idle connections per origin, each for ``keepalive_expiry`` seconds, and at
most ``max_origins`` origins (least recently used evicted and closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Final

import h11
import httpx

__all__ = [
    "DEFAULT_KEEPALIVE_EXPIRY",
    "DEFAULT_MAX_IDLE_PER_ORIGIN",
    "DEFAULT_MAX_ORIGINS",
    "Origin",
    "OriginTransport",
    "PinnedClient",
    "RawRequest",
    "RawResponse",
]

#: Seconds an idle connection is kept. Below the 5 s many servers use (uvicorn, Node), so we
#: rarely reuse a connection the server is closing at that very moment.
DEFAULT_KEEPALIVE_EXPIRY: Final = 4.0
DEFAULT_MAX_IDLE_PER_ORIGIN: Final = 32
DEFAULT_MAX_ORIGINS: Final = 512
_READ_SIZE: Final = 65536
_SWEEP_INTERVAL: Final = 1.0
_DISCONNECTED: Final = "Server disconnected without sending a response."  # httpcore's words

#: ``(scheme, IP or host, port, SNI name for https else None)``.
Origin = tuple[str, str, int, str | None]


@dataclass(frozen=True, slots=True)
class RawRequest:
    """One request on the wire: ``target`` is the path and query exactly as sent; ``headers``
    are sent as given (``Host`` and ``Content-Length`` included: nothing is added). Timeouts are
    seconds (``None``: none). ``request`` is only attached to the errors raised."""

    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""
    connect_timeout: float | None = None
    read_timeout: float | None = None
    write_timeout: float | None = None
    request: httpx.Request | None = None


@dataclass(frozen=True, slots=True)
class RawResponse:
    """A whole response: the body as sent (not decoded) up to the limit asked for, ``truncated``
    when the server sent more (the rest was not read, the connection closed)."""

    status_code: int
    headers: list[tuple[bytes, bytes]]
    content: bytes
    truncated: bool


class _StaleConnection(Exception):
    """The server closed the connection before sending a byte of an answer."""


@dataclass(eq=False, slots=True)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    state: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))
    idle_since: float = 0.0

    def usable(self, now: float, expiry: float) -> bool:
        """Still worth reusing: not expired, not closed or half-closed by the server, and with
        nothing unread (a server has nothing to say on an idle HTTP/1.1 connection: bytes there
        are a stray answer, such as a ``408`` before it hangs up)."""
        return (
            now - self.idle_since < expiry
            and self.state.our_state is h11.IDLE
            and not self.writer.is_closing()
            and not self.reader.at_eof()
            and not getattr(self.reader, "_buffer", b"")
        )

    def close(self) -> None:
        """Close without waiting (safe under cancellation: no await)."""
        self.writer.close()


class _OriginPool:
    """Idle connections to one origin, most recently used last."""

    def __init__(self, transport: OriginTransport, origin: Origin) -> None:
        self.transport = transport
        self.origin = origin
        self.idle: deque[_Connection] = deque()
        self.closed = False

    async def open(self, raw: RawRequest) -> tuple[_Connection, h11.Response]:
        """Send ``raw`` and read the response's head; the connection then belongs to the caller,
        who must :meth:`release` it (or close it)."""
        connection, reused = await self._acquire(raw)
        head = await self._attempt(connection, raw)
        if head is not None:
            return connection, head
        if not reused:
            raise httpx.RemoteProtocolError(_DISCONNECTED, request=raw.request)
        # The server had closed the connection we reused (the keep-alive race): it saw nothing of
        # this request, so sending it again is safe. Its idle siblings are suspect too.
        self.close_idle()
        connection = await self._connect(raw)
        head = await self._attempt(connection, raw)
        if head is None:
            raise httpx.RemoteProtocolError(_DISCONNECTED, request=raw.request)
        return connection, head

    def release(self, connection: _Connection) -> None:
        """Back to the idle deque when the exchange ended cleanly and both sides keep it open."""
        state = connection.state
        if (
            self.closed
            or state.our_state is not h11.DONE
            or state.their_state is not h11.DONE
            or len(self.idle) >= self.transport.max_idle_per_origin
        ):
            connection.close()
            return
        state.start_next_cycle()
        connection.idle_since = time.monotonic()
        self.idle.append(connection)

    def sweep(self, now: float) -> None:
        """Close idle connections that expired or that the server closed."""
        expiry = self.transport.keepalive_expiry
        keep: deque[_Connection] = deque()
        for connection in self.idle:
            if connection.usable(now, expiry):
                keep.append(connection)
            else:
                connection.close()
        self.idle = keep

    def close_idle(self) -> None:
        while self.idle:
            self.idle.pop().close()

    def close(self) -> None:
        self.closed = True
        self.close_idle()

    async def _acquire(self, raw: RawRequest) -> tuple[_Connection, bool]:
        now = time.monotonic()
        expiry = self.transport.keepalive_expiry
        while self.idle:
            connection = self.idle.pop()
            if connection.usable(now, expiry):
                return connection, True
            connection.close()
        return await self._connect(raw), False

    async def _connect(self, raw: RawRequest) -> _Connection:
        scheme, host, port, sni = self.origin
        context = self.transport.ssl_context() if scheme == "https" else None
        try:
            async with asyncio.timeout(raw.connect_timeout):
                reader, writer = await asyncio.open_connection(
                    host,
                    port,
                    ssl=context,
                    server_hostname=sni if context is not None else None,
                    limit=_READ_SIZE,
                )
        except TimeoutError:
            raise httpx.ConnectTimeout("timed out connecting", request=raw.request) from None
        except OSError as exc:  # refused, unreachable, and ssl.SSLError (certificate checks)
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=raw.request) from None
        return _Connection(reader, writer)

    async def _attempt(self, connection: _Connection, raw: RawRequest) -> h11.Response | None:
        """The response's head, or ``None`` when the server closed before answering anything.
        The connection is closed on every failure."""
        try:
            return await _send(connection, raw)
        except _StaleConnection:
            connection.close()
            return None
        except BaseException:
            connection.close()
            raise


async def _send(connection: _Connection, raw: RawRequest) -> h11.Response:
    """Write the request on ``connection`` and read up to the response's head."""
    state = connection.state
    try:
        data = state.send(h11.Request(method=raw.method, target=raw.target, headers=raw.headers))
        if raw.body:
            data += state.send(h11.Data(data=raw.body))
        data += state.send(h11.EndOfMessage())
    except h11.LocalProtocolError as exc:
        raise httpx.LocalProtocolError(str(exc), request=raw.request) from None
    writer = connection.writer
    try:
        writer.write(data)
        if writer.transport.get_write_buffer_size():  # the kernel did not take it all at once
            async with asyncio.timeout(raw.write_timeout):
                await writer.drain()
        elif writer.is_closing():
            raise _StaleConnection
    except TimeoutError:
        raise httpx.WriteTimeout("timed out writing the request", request=raw.request) from None
    except (ConnectionResetError, BrokenPipeError):
        raise _StaleConnection from None
    except OSError as exc:
        raise httpx.WriteError(str(exc) or type(exc).__name__, request=raw.request) from None
    answered = False  # any byte of an answer: from then on, a closed connection is an error
    while True:
        event = _next_event(state, raw.request)
        if event is h11.NEED_DATA:
            chunk = await _read(connection, raw, stale_ok=not answered)
            answered = answered or bool(chunk)
            state.receive_data(chunk)
        elif isinstance(event, h11.Response):
            return event
        elif not isinstance(event, h11.InformationalResponse):
            raise httpx.RemoteProtocolError(f"unexpected {type(event).__name__}", request=raw.request)


async def _body_events(connection: _Connection, raw: RawRequest) -> AsyncIterator[bytes]:
    """The response body's chunks, until its end."""
    state = connection.state
    while True:
        event = _next_event(state, raw.request)
        if event is h11.NEED_DATA:
            state.receive_data(await _read(connection, raw))
        elif isinstance(event, h11.Data):
            yield bytes(event.data)
        elif isinstance(event, h11.EndOfMessage):
            return
        else:
            raise httpx.RemoteProtocolError(
                f"unexpected {type(event).__name__} in a response body", request=raw.request
            )


def _next_event(state: h11.Connection, request: httpx.Request | None) -> object:
    try:
        return state.next_event()
    except h11.RemoteProtocolError as exc:
        raise httpx.RemoteProtocolError(str(exc), request=request) from None


async def _read(connection: _Connection, raw: RawRequest, *, stale_ok: bool = False) -> bytes:
    """The next bytes from the server (``b""`` at its end of the stream). With ``stale_ok`` (no
    byte of an answer yet), a reset or an end of stream raises :class:`_StaleConnection`."""
    try:
        if raw.read_timeout is None:
            chunk = await connection.reader.read(_READ_SIZE)
        else:
            async with asyncio.timeout(raw.read_timeout):
                chunk = await connection.reader.read(_READ_SIZE)
    except TimeoutError:
        raise httpx.ReadTimeout("timed out reading the response", request=raw.request) from None
    except (ConnectionResetError, BrokenPipeError) as exc:
        if stale_ok:
            raise _StaleConnection from None
        raise httpx.ReadError(str(exc) or type(exc).__name__, request=raw.request) from None
    except OSError as exc:
        raise httpx.ReadError(str(exc) or type(exc).__name__, request=raw.request) from None
    if not chunk and stale_ok:
        raise _StaleConnection
    return chunk


class _ResponseStream(httpx.AsyncByteStream):
    """The body of one response through httpx; closing it returns the connection to its pool
    (when the body was read to the end and neither side asked to close) or closes it."""

    def __init__(self, pool: _OriginPool, connection: _Connection, raw: RawRequest) -> None:
        self._pool = pool
        self._connection: _Connection | None = connection
        self._raw = raw

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._connection is not None:
            async for chunk in _body_events(self._connection, self._raw):
                yield chunk

    async def aclose(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.release(connection)


class OriginTransport(httpx.AsyncBaseTransport):
    """Routes each request to the pool of its origin (see the module docstring).

    ``ssl_context`` verifies https servers (default: httpx's, with certifi's roots), built on the
    first https request: building one costs ~38 ms, and many deployments only ever see http in
    tests. Use one transport per event loop (it holds asyncio streams).
    """

    def __init__(
        self,
        *,
        ssl_context: ssl.SSLContext | None = None,
        keepalive_expiry: float = DEFAULT_KEEPALIVE_EXPIRY,
        max_idle_per_origin: int = DEFAULT_MAX_IDLE_PER_ORIGIN,
        max_origins: int = DEFAULT_MAX_ORIGINS,
    ) -> None:
        self._ssl_context = ssl_context
        self.keepalive_expiry = keepalive_expiry
        self.max_idle_per_origin = max_idle_per_origin
        self.max_origins = max_origins
        self._pools: OrderedDict[Origin, _OriginPool] = OrderedDict()
        self._next_sweep = time.monotonic() + _SWEEP_INTERVAL
        self._closed = False

    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl_context is None:
            context = httpx.create_ssl_context()
            context.set_alpn_protocols(["http/1.1"])
            self._ssl_context = context
        return self._ssl_context

    @property
    def origins(self) -> list[Origin]:
        """The origins that have a pool, least recently used first (for tests and debugging)."""
        return list(self._pools)

    def idle_connections(self, origin: Origin) -> int:
        pool = self._pools.get(origin)
        return 0 if pool is None else len(pool.idle)

    async def request(self, origin: Origin, raw: RawRequest, *, max_body: int) -> RawResponse:
        """Send ``raw`` to ``origin`` (``(scheme, address, port, SNI name or None)``) and read the
        whole response, keeping at most ``max_body`` bytes of its body: the path that
        :func:`usp_workers.ssrf.send_pinned` takes, without httpx's request and response models."""
        pool = self._pool(origin)
        connection, head = await pool.open(raw)
        body = bytearray()
        truncated = False
        try:
            async for chunk in _body_events(connection, raw):
                if len(body) + len(chunk) > max_body:
                    body += chunk[: max_body - len(body)]
                    truncated = True  # the rest stays unread: the connection is closed, not drained
                    break
                body += chunk
        except BaseException:
            connection.close()
            raise
        pool.release(connection)
        return RawResponse(head.status_code, head.headers.raw_items(), bytes(body), truncated)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.scheme
        if scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"scheme {scheme!r} is not supported", request=request)
        sni: str | None = None
        if scheme == "https":
            sni = request.extensions.get("sni_hostname") or url.host
        origin: Origin = (scheme, url.host, url.port or (443 if scheme == "https" else 80), sni)
        timeouts = request.extensions.get("timeout", {})
        raw = RawRequest(
            method=request.method.encode("ascii"),
            target=url.raw_path,
            headers=request.headers.raw,
            body=await request.aread(),
            connect_timeout=timeouts.get("connect"),
            read_timeout=timeouts.get("read"),
            write_timeout=timeouts.get("write"),
            request=request,
        )
        pool = self._pool(origin)
        connection, head = await pool.open(raw)
        return httpx.Response(
            head.status_code,
            headers=head.headers.raw_items(),
            stream=_ResponseStream(pool, connection, raw),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": head.reason},
        )

    async def aclose(self) -> None:
        self._closed = True
        pools = list(self._pools.values())
        self._pools.clear()
        writers: list[asyncio.StreamWriter] = []
        for pool in pools:
            writers.extend(c.writer for c in pool.idle)
            pool.close()
        for writer in writers:
            with contextlib.suppress(OSError):  # ssl.SSLError is an OSError
                await writer.wait_closed()

    def _pool(self, origin: Origin) -> _OriginPool:
        """``origin``'s pool, made most recently used; the least recently used is evicted (and
        its idle connections closed) beyond ``max_origins``; idle connections that expired are
        swept once a second."""
        if self._closed:
            raise RuntimeError("the transport is closed")
        pool = self._pools.get(origin)
        if pool is None:
            pool = self._pools[origin] = _OriginPool(self, origin)
            while len(self._pools) > self.max_origins:
                _, evicted = self._pools.popitem(last=False)
                evicted.close()
        else:
            self._pools.move_to_end(origin)
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + _SWEEP_INTERVAL
            for each in self._pools.values():
                each.sweep(now)
        return pool


class PinnedClient(httpx.AsyncClient):
    """An ``AsyncClient`` fit for pinned requests (:func:`usp_workers.ssrf.send_pinned`).

    Its connections are pooled per origin *including the https name* (an
    :class:`OriginTransport`), so ``send_pinned`` keeps https connections alive through it (with
    any other client it sends ``Connection: close``), and takes the transport's direct path.
    ``trust_env=False``: a proxy from the environment would connect somewhere else than the
    checked address. Redirects are never followed: a redirect is an unchecked target.
    """

    def __init__(
        self,
        *,
        timeout: httpx.Timeout,
        transport: OriginTransport | None = None,
        cookies: httpx.Cookies | None = None,
    ) -> None:
        self.origin_transport = transport if transport is not None else OriginTransport()
        super().__init__(
            transport=self.origin_transport,
            timeout=timeout,
            cookies=cookies,
            trust_env=False,
            follow_redirects=False,
        )
