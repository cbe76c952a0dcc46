"""The per-origin HTTP/1.1 pools deliveries go through (``usp_core.origin_pool``).

A raw asyncio server on 127.0.0.1 plays the receiver, so the tests can count connections and
misbehave in ways uvicorn will not: close a kept-alive connection instead of answering, close a
fresh one without a word, send more body than asked for. (Per-name keep-alive over TLS is in
``test_ssrf.py``, next to the certificate checks.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
import pytest

from usp_core.origin_pool import Origin, OriginTransport, RawRequest, RawResponse

pytestmark = pytest.mark.anyio

Handler = Callable[["Server", asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[bool]]


@dataclass
class Server:
    """Counts connections and requests; ``handler`` answers the n-th request of a connection
    (returns whether to keep the connection open)."""

    handler: Handler
    port: int = 0
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = 0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                self.requests.append(head.split(b"\r\n")[0])
                if not await self.handler(self, reader, writer, number):
                    return
                number += 1
        finally:
            writer.close()


def ok(body: bytes = b"ok") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


async def answer(server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> bool:
    writer.write(ok())
    await writer.drain()
    return True


@asynccontextmanager
async def running(handler: Handler) -> AsyncIterator[Server]:
    server = Server(handler)
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        listener.close()


def post(server: Server, path: bytes = b"/hook") -> tuple[Origin, RawRequest]:
    headers = [(b"Host", b"hooks.example"), (b"Content-Length", b"2")]
    return ("http", "127.0.0.1", server.port, None), RawRequest(b"POST", path, headers, b"{}", 2.0, 2.0, 2.0)


async def send(transport: OriginTransport, server: Server, *, max_body: int = 1024) -> RawResponse:
    origin, raw = post(server)
    return await transport.request(origin, raw, max_body=max_body)


async def test_one_kept_alive_connection_carries_request_after_request() -> None:
    transport = OriginTransport()
    async with running(answer) as server:
        for _ in range(5):
            response = await send(transport, server)
            assert (response.status_code, response.content, response.truncated) == (200, b"ok", False)
        await transport.aclose()
    assert server.connections == 1
    assert len(server.requests) == 5


async def test_a_kept_alive_connection_the_server_dropped_is_replaced_without_a_failure() -> None:
    """The keep-alive race: the server closes an idle connection as we reuse it. It saw no byte
    of the request's answer, so the request goes again, once, on a fresh connection."""

    async def first_only(server: Server, reader: object, writer: asyncio.StreamWriter, n: int) -> bool:
        if n == 0:
            writer.write(ok())
            await writer.drain()
            return True
        return False  # the second request on a connection: hang up without a word

    transport = OriginTransport()
    async with running(first_only) as server:
        assert (await send(transport, server)).status_code == 200
        assert (await send(transport, server)).status_code == 200
        await transport.aclose()
    assert server.connections == 2
    assert len(server.requests) == 3, "the dropped request was sent again once"


async def test_a_fresh_connection_closed_without_an_answer_fails_and_is_not_retried() -> None:
    async def hang_up(server: Server, reader: object, writer: object, n: int) -> bool:
        return False

    transport = OriginTransport()
    async with running(hang_up) as server:
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            await send(transport, server)
        await transport.aclose()
    assert len(server.requests) == 1


async def test_a_body_over_the_limit_is_cut_and_its_connection_not_reused() -> None:
    async def big(server: Server, reader: object, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(ok(b"x" * 10_000))
        await writer.drain()
        return True

    transport = OriginTransport()
    async with running(big) as server:
        response = await send(transport, server, max_body=100)
        assert (response.content, response.truncated) == (b"x" * 100, True)
        assert transport.idle_connections(post(server)[0]) == 0, "closed, not drained"
        response = await send(transport, server, max_body=10_000)
        assert (len(response.content), response.truncated) == (10_000, False)
        assert transport.idle_connections(post(server)[0]) == 1
        await transport.aclose()
    assert server.connections == 2


async def test_an_answer_asking_to_close_closes_the_connection() -> None:
    async def closing(server: Server, reader: object, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
        await writer.drain()
        return False

    transport = OriginTransport()
    async with running(closing) as server:
        for _ in range(2):
            assert (await send(transport, server)).status_code == 204
        await transport.aclose()
    assert server.connections == 2


async def test_the_least_recently_used_origin_is_evicted_beyond_max_origins() -> None:
    transport = OriginTransport(max_origins=1)
    async with running(answer) as first, running(answer) as second:
        await send(transport, first)
        await send(transport, second)
        assert transport.origins == [post(second)[0]]
        await send(transport, first)
        await transport.aclose()
    assert first.connections == 2, "its pool (and idle connection) went with the eviction"


async def test_through_httpx_the_response_streams_and_releases_its_connection() -> None:
    transport = OriginTransport()
    async with running(answer) as server, httpx.AsyncClient(transport=transport) as client:
        for _ in range(3):
            response = await client.post(f"http://127.0.0.1:{server.port}/hook", content=b"{}")
            assert (response.status_code, response.content) == (200, b"ok")
        assert server.connections == 1


def raw_answer(*parts: bytes, keep: bool = True) -> Handler:
    """A handler writing ``parts`` as they are (one write each), then keeping the connection
    open or closing it."""

    async def handler(server: Server, reader: object, writer: asyncio.StreamWriter, n: int) -> bool:
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.01)
        return keep

    return handler


async def test_interim_answers_are_skipped_and_a_chunked_body_is_joined() -> None:
    handler = raw_answer(
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
        b"2\r\nde\r\n0\r\n\r\n",
    )
    transport = OriginTransport()
    async with running(handler) as server:
        response = await send(transport, server)
        assert (response.status_code, response.content) == (200, b"abcde")
        assert transport.idle_connections(post(server)[0]) == 1
        await transport.aclose()


async def test_a_body_without_a_length_ends_with_the_stream_and_the_connection_is_not_kept() -> None:
    handler = raw_answer(b"HTTP/1.1 200 OK\r\n\r\nall of ", b"it", keep=False)
    transport = OriginTransport()
    async with running(handler) as server:
        response = await send(transport, server)
        assert (response.status_code, response.content, response.truncated) == (200, b"all of it", False)
        assert transport.idle_connections(post(server)[0]) == 0
        await transport.aclose()


async def test_a_body_cut_short_by_the_server_is_an_error_not_a_short_answer() -> None:
    handler = raw_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", keep=False)
    transport = OriginTransport()
    async with running(handler) as server:
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            await send(transport, server)
        await transport.aclose()


async def test_an_invalid_answer_is_a_protocol_error() -> None:
    transport = OriginTransport()
    async with running(raw_answer(b"HTTP/1.1 2x0 OK\r\n\r\n")) as server:
        with pytest.raises(httpx.RemoteProtocolError, match="invalid response"):
            await send(transport, server)
        await transport.aclose()


async def test_a_silent_server_times_out_the_read() -> None:
    async def silent(server: Server, reader: object, writer: object, n: int) -> bool:
        await asyncio.sleep(5)
        return False

    transport = OriginTransport()
    async with running(silent) as server:
        origin, raw = post(server)
        quick = RawRequest(raw.method, raw.target, raw.headers, raw.body, 2.0, 0.2, 2.0)
        with pytest.raises(httpx.ReadTimeout):
            await transport.request(origin, quick, max_body=100)
        assert transport.idle_connections(origin) == 0
        await transport.aclose()


async def test_bytes_on_an_idle_connection_keep_it_from_being_reused() -> None:
    async def then_408(server: Server, reader: object, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(ok() + b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        return True

    transport = OriginTransport()
    async with running(then_408) as server:
        assert (await send(transport, server)).status_code == 200
        assert (await send(transport, server)).status_code == 200
        await transport.aclose()
    assert server.connections == 2, "the connection that spoke out of turn was not reused"


@pytest.mark.parametrize(
    "headers",
    [
        [(b"X-Note", b"a\r\nX-Injected: 1")],
        [(b"X Bad", b"1")],
        [(b"Content-Length", b"99")],
    ],
    ids=["line break in a value", "space in a name", "length not the body's"],
)
async def test_a_request_that_would_not_say_what_it_means_is_refused_before_sending(
    headers: list[tuple[bytes, bytes]],
) -> None:
    transport = OriginTransport()
    async with running(answer) as server:
        origin, raw = post(server)
        bad = RawRequest(raw.method, raw.target, [(b"Host", b"hooks.example"), *headers], raw.body)
        with pytest.raises(httpx.LocalProtocolError):
            await transport.request(origin, bad, max_body=100)
        await transport.aclose()
    assert server.requests == []


async def test_the_deadline_ends_an_answer_that_trickles_in_under_every_read_timeout() -> None:
    async def trickle(server: Server, reader: object, writer: asyncio.StreamWriter, n: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
        for _ in range(100):
            await asyncio.sleep(0.05)
            writer.write(b"x")
        return False

    transport = OriginTransport()
    async with running(trickle) as server:
        origin, raw = post(server)
        loop = asyncio.get_running_loop()
        started = loop.time()
        bounded = RawRequest(
            raw.method, raw.target, raw.headers, raw.body, 2.0, 2.0, 2.0, deadline=started + 0.4
        )
        with pytest.raises(TimeoutError):
            await transport.request(origin, bounded, max_body=1000)
        assert 0.4 <= loop.time() - started < 1.0
        assert transport.idle_connections(origin) == 0
        await transport.aclose()
