"""An ``httpx`` transport with one small HTTP/1.1 connection pool per pinned origin.

Pools are keyed by (scheme, pinned IP, port, SNI name), so https keeps alive safely. Hand-written
for speed, measured with ``bench/pool.py`` (client CPU per delivery-sized POST): 25-28 µs here,
185 µs through ``httpx.AsyncClient`` on this pool, 575 µs with httpx's own pool. Details and what
it leaves out on purpose: docs/architecture.md, "Outbound requests".
"""

from __future__ import annotations

import asyncio
import re
import ssl
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Final, cast

import httptools
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
_CLOSE_TIMEOUT: Final = 5.0
_DISCONNECTED: Final = "Server disconnected without sending a response."  # httpcore's words

#: ``(scheme, IP or host, port, SNI name for https else None)``.
Origin = tuple[str, str, int, str | None]


@dataclass(frozen=True, slots=True)
class RawRequest:
    """One request on the wire: ``target`` is the path and query exactly as sent; ``headers``
    are sent as given (``Host`` and ``Content-Length`` included: nothing is added). Timeouts are
    seconds per phase (``None``: none); ``deadline`` (event loop time) ends the whole exchange,
    raising the builtin ``TimeoutError`` (a caller's total, without a timer of its own around the
    call: ``asyncio.timeout`` cost ~10 µs a delivery). ``request`` is only attached to the errors
    raised."""

    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""
    connect_timeout: float | None = None
    read_timeout: float | None = None
    write_timeout: float | None = None
    request: httpx.Request | None = None
    deadline: float | None = None


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


#: RFC 9110 token characters: what a method and a header name may be made of.
_TOKEN: Final = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: What may never appear in a header value or the request target: a line break or NUL would end
#: the header early and let a value (a subscription's custom header, say) inject another.
_BREAK: Final = re.compile(rb"[\x00\r\n]")
_NO_TARGET: Final = re.compile(rb"[\x00-\x20\x7f]")


def _serialize(raw: RawRequest) -> bytes:
    """``raw`` as HTTP/1.1 bytes. The headers go as given; a body without a ``Content-Length``
    gets one, a ``Transfer-Encoding`` sends it as one chunk."""
    if not _TOKEN.fullmatch(raw.method) or not raw.target or _NO_TARGET.search(raw.target):
        raise httpx.LocalProtocolError("invalid method or target", request=raw.request)
    lines = [raw.method, b" ", raw.target, b" HTTP/1.1\r\n"]
    length: bytes | None = None
    chunked = False
    for name, value in raw.headers:
        if not _TOKEN.fullmatch(name) or _BREAK.search(value):
            raise httpx.LocalProtocolError(f"invalid header {name!r}", request=raw.request)
        lowered = name.lower()
        if lowered == b"content-length":
            length = value
        elif lowered == b"transfer-encoding":
            chunked = True
        lines += (name, b": ", value, b"\r\n")
    body = raw.body
    if chunked:
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
    elif length is None:
        if body:
            lines.append(b"Content-Length: %d\r\n" % len(body))
    elif length.strip() != b"%d" % len(body):
        raise httpx.LocalProtocolError("Content-Length does not match the body", request=raw.request)
    lines += (b"\r\n", body)
    return b"".join(lines)


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: requests are written to the transport as bytes, answers parsed
    by ``httptools`` (llhttp) as they arrive, in the event loop's own callbacks. A reader waits
    on one future at a time (:meth:`_wait`), woken by whatever the server sent."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.parser = httptools.HttpResponseParser(self)
        self.idle_since = 0.0
        self.broken = False  # never reuse: stray bytes, an end of stream, a protocol error
        self.ended = False  # the server ended its side of the stream
        self.lost: BaseException | None = None
        self.error: str | None = None  # what was wrong with the answer
        self.waiter: asyncio.Future[None] | None = None
        self.write_paused: asyncio.Future[None] | None = None
        self.reading_paused = False
        self._begin(False, False)

    def _begin(self, head_request: bool, close_requested: bool) -> None:
        self.in_flight = False  # a request was written and its answer is not complete
        self.head_request = head_request
        self.close_requested = close_requested
        self.answered = False
        self.informational = False
        self.framed = False  # Content-Length or Transfer-Encoding: else the body ends with the stream
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.keep_alive = False

    # What the server sends (asyncio.Protocol and httptools callbacks).

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self.in_flight:  # a server has nothing to say on an idle connection (a 408, say)
            self._break()
            return
        self.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("the server switched protocols")
        except httptools.HttpParserError as exc:
            self._fail(f"invalid response: {exc}")
        if self.buffered > _READ_SIZE and not self.reading_paused and self.transport is not None:
            self.transport.pause_reading()  # the reader catches up first (see next_chunk)
            self.reading_paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.broken = self.ended = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.broken = self.ended = True
        self.lost = exc
        self.closed.set_result(None)
        self._wake()
        if self.write_paused is not None and not self.write_paused.done():
            self.write_paused.set_result(None)

    def pause_writing(self) -> None:
        self.write_paused = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self.write_paused is not None and not self.write_paused.done():
            self.write_paused.set_result(None)
        self.write_paused = None

    def on_message_begin(self) -> None:
        if self.complete:  # more than one answer to a request: the first one stands
            self._break()
            return
        self.headers = []
        self.framed = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.complete:
            return
        self.headers.append((name, value))
        if name.lower() in _FRAMING:
            self.framed = True

    def on_headers_complete(self) -> None:
        if self.complete:
            return
        status = self.parser.get_status_code()
        if status < 200:  # 1xx: an interim answer, the real one follows
            self.informational = True
            return
        self.status = status
        self.head_done = True
        if self.head_request:  # llhttp would wait for the body a HEAD answer announces
            self.complete = True
            self.in_flight = False
            self.broken = True

    def on_body(self, body: bytes) -> None:
        if not self.complete:
            self.chunks.append(body)
            self.buffered += len(body)

    def on_message_complete(self) -> None:
        if self.complete:
            return
        if self.informational:
            self.informational = False
            return
        self.complete = True
        self.in_flight = False
        self.keep_alive = self.parser.should_keep_alive() and not self.close_requested

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = message
        self._break()

    def _break(self) -> None:
        self.broken = True
        if self.transport is not None:
            self.transport.close()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # What the caller does.

    def usable(self, now: float, expiry: float) -> bool:
        """Still worth reusing: not expired, and nothing happened on it since its last answer."""
        transport = self.transport
        return (
            now - self.idle_since < expiry
            and not self.broken
            and transport is not None
            and not transport.is_closing()
        )

    def reusable(self) -> bool:
        """The exchange ended cleanly, its body read to the end, and both sides keep it open."""
        return self.complete and self.keep_alive and not self.broken and not self.chunks

    def close(self) -> None:
        """Close without waiting (safe under cancellation: no await)."""
        self.broken = True
        if self.transport is not None:
            self.transport.close()

    async def send(self, raw: RawRequest) -> None:
        """Write ``raw``; waits only when the kernel did not take it all."""
        data = _serialize(raw)
        close_requested = any(n.lower() == b"connection" and v.lower() == b"close" for n, v in raw.headers)
        self._begin(raw.method == b"HEAD", close_requested)
        self.in_flight = True
        self.error = None
        transport = self.transport
        if self.broken or transport is None or transport.is_closing():
            raise _StaleConnection
        transport.write(data)
        if self.write_paused is not None:
            end, overall = _give_up_at(raw.write_timeout, raw.deadline)
            try:
                async with asyncio.timeout_at(end):
                    await self.write_paused
            except TimeoutError:
                if overall:
                    raise
                raise httpx.WriteTimeout("timed out writing the request", request=raw.request) from None

    async def head(self, raw: RawRequest) -> tuple[int, list[tuple[bytes, bytes]]]:
        """The answer's status and headers (after any 1xx)."""
        while not self.head_done:
            self._check(raw, stale_ok=not self.answered)
            await self._wait(raw)
        return self.status, self.headers

    async def next_chunk(self, raw: RawRequest) -> bytes | None:
        """The body's next bytes, ``None`` at its end."""
        while True:
            if self.chunks:
                chunk = self.chunks.popleft()
                self.buffered -= len(chunk)
                if self.reading_paused and self.buffered <= _READ_SIZE and self.transport is not None:
                    self.reading_paused = False
                    self.transport.resume_reading()
                return chunk
            if self.complete:
                return None
            if self.ended and self.error is None and not self.framed:
                self.complete = True  # no length given: the body ended with the stream
                return None
            self._check(raw, stale_ok=False)
            await self._wait(raw)

    def _check(self, raw: RawRequest, *, stale_ok: bool) -> None:
        if self.error is not None:
            raise httpx.RemoteProtocolError(self.error, request=raw.request)
        if self.broken:
            if stale_ok:
                raise _StaleConnection
            lost = self.lost
            if lost is None or isinstance(lost, ConnectionResetError):
                raise httpx.RemoteProtocolError(_DISCONNECTED, request=raw.request)
            raise httpx.ReadError(str(lost) or type(lost).__name__, request=raw.request)

    async def _wait(self, raw: RawRequest) -> None:
        loop = asyncio.get_running_loop()
        waiter = self.waiter = loop.create_future()
        end, overall = _give_up_at(raw.read_timeout, raw.deadline)
        timer = None if end is None else loop.call_at(end, _expire, waiter)
        try:
            await waiter
        except TimeoutError:
            self.close()
            if overall:
                raise
            raise httpx.ReadTimeout("timed out reading the response", request=raw.request) from None
        finally:
            self.waiter = None
            if timer is not None:
                timer.cancel()


def _give_up_at(timeout: float | None, deadline: float | None) -> tuple[float | None, bool]:
    """When a wait ends (loop time, ``None``: never): after ``timeout`` or at ``deadline``,
    whichever comes first; and whether that is the deadline."""
    end = None if timeout is None else asyncio.get_running_loop().time() + timeout
    if deadline is not None and (end is None or deadline <= end):
        return deadline, True
    return end, False


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


_FRAMING: Final = frozenset({b"content-length", b"transfer-encoding"})


class _OriginPool:
    """Idle connections to one origin, most recently used last."""

    def __init__(self, transport: OriginTransport, origin: Origin) -> None:
        self.transport = transport
        self.origin = origin
        self.idle: deque[_Connection] = deque()
        self.closed = False

    async def open(self, raw: RawRequest) -> tuple[_Connection, int, list[tuple[bytes, bytes]]]:
        """Send ``raw`` and read the answer's status and headers; the connection then belongs
        to the caller, who must :meth:`release` it (or close it)."""
        connection, reused = await self._acquire(raw)
        head = await self._attempt(connection, raw)
        if head is not None:
            return connection, *head
        if not reused:
            raise httpx.RemoteProtocolError(_DISCONNECTED, request=raw.request)
        # The server had closed the connection we reused (the keep-alive race): it saw nothing of
        # this request, so sending it again is safe. Its idle siblings are suspect too.
        self.close_idle()
        connection = await self._connect(raw)
        head = await self._attempt(connection, raw)
        if head is None:
            raise httpx.RemoteProtocolError(_DISCONNECTED, request=raw.request)
        return connection, *head

    def release(self, connection: _Connection) -> None:
        """Back to the idle deque when the exchange ended cleanly and both sides keep it open."""
        if self.closed or not connection.reusable() or len(self.idle) >= self.transport.max_idle_per_origin:
            connection.close()
            return
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
        loop = asyncio.get_running_loop()
        end, overall = _give_up_at(raw.connect_timeout, raw.deadline)
        try:
            async with asyncio.timeout_at(end):
                _, connection = await loop.create_connection(
                    _Connection,
                    host,
                    port,
                    ssl=context,
                    server_hostname=sni if context is not None else None,
                )
        except TimeoutError:
            if overall:
                raise
            raise httpx.ConnectTimeout("timed out connecting", request=raw.request) from None
        except OSError as exc:  # refused, unreachable, and ssl.SSLError (certificate checks)
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=raw.request) from None
        return connection

    async def _attempt(
        self, connection: _Connection, raw: RawRequest
    ) -> tuple[int, list[tuple[bytes, bytes]]] | None:
        """The answer's status and headers, or ``None`` when the server closed before answering
        anything. The connection is closed on every failure."""
        try:
            await connection.send(raw)
            return await connection.head(raw)
        except _StaleConnection:
            connection.close()
            return None
        except BaseException:
            connection.close()
            raise


class _ResponseStream(httpx.AsyncByteStream):
    """The body of one response through httpx; closing it returns the connection to its pool
    (when the body was read to the end and neither side asked to close) or closes it."""

    def __init__(self, pool: _OriginPool, connection: _Connection, raw: RawRequest) -> None:
        self._pool = pool
        self._connection: _Connection | None = connection
        self._raw = raw

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self._connection
        while connection is not None and (chunk := await connection.next_chunk(self._raw)) is not None:
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
        :func:`usp_core.ssrf.send_pinned` takes, without httpx's request and response models."""
        pool = self._pool(origin)
        connection, status, headers = await pool.open(raw)
        body = bytearray()
        truncated = False
        try:
            while (chunk := await connection.next_chunk(raw)) is not None:
                if len(body) + len(chunk) > max_body:
                    body += chunk[: max_body - len(body)]
                    truncated = True  # the rest stays unread: the connection is closed, not drained
                    break
                body += chunk
        except BaseException:
            connection.close()
            raise
        if truncated:
            connection.close()
        else:
            pool.release(connection)
        return RawResponse(status, headers, bytes(body), truncated)

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
        connection, status, headers = await pool.open(raw)
        return httpx.Response(
            status,
            headers=headers,
            stream=_ResponseStream(pool, connection, raw),
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def aclose(self) -> None:
        self._closed = True
        pools = list(self._pools.values())
        self._pools.clear()
        closing = [c.closed for pool in pools for c in pool.idle]
        for pool in pools:
            pool.close()
        if closing:  # a TLS connection says goodbye (close_notify) before its socket closes
            await asyncio.wait(closing, timeout=_CLOSE_TIMEOUT)

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
    """An ``AsyncClient`` fit for pinned requests (:func:`usp_core.ssrf.send_pinned`).

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
