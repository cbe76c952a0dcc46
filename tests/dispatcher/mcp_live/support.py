"""What the live-webhook tests share: a platform's receiving side, the official client over
Streamable HTTP, events written the way the domain writes them, and a TCP proxy that can cut a
client off."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
from anyio.abc import ByteStream, SocketAttribute, SocketStream, TaskGroup
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy.engine import Engine

from tests.dispatcher.support import event
from usp_core import db
from usp_receiver import JWKS
from usp_receiver.dedupe import MemoryDedupe
from usp_receiver.mcp import NotificationBinding, ReceivedNotification
from usp_workers.engine import outbox

#: Waits for something that must happen are bounded by this (a hang fails, speed is not tested).
PATIENCE = 30.0


class Platform:
    """A platform's receiving side: the SDK notification binding (verifying against the
    business's JWKS, deduplicating on ``event_id``) and what its handler got."""

    def __init__(self, keys: JWKS) -> None:
        self.received: list[ReceivedNotification] = []
        self._changed = anyio.Event()
        self.binding = NotificationBinding(keys=keys, dedupe=MemoryDedupe(), handler=self._on_event)

    async def _on_event(self, notification: ReceivedNotification) -> None:
        self.received.append(notification)
        self._changed.set()

    @property
    def event_ids(self) -> list[str]:
        return [notification.event.event_id for notification in self.received]

    async def wait_for(self, event_id: str) -> None:
        """Until ``event_id`` has been received (fails after :data:`PATIENCE`)."""
        with anyio.fail_after(PATIENCE):
            while event_id not in self.event_ids:
                self._changed = anyio.Event()
                await self._changed.wait()


@asynccontextmanager
async def connect(url: str, platform: Platform, *, key: str | None = None) -> AsyncIterator[Client]:
    """The official client on a stateful Streamable HTTP session (handshake protocol), with the
    platform's binding and, when given, ``Authorization: Bearer <key>`` on every request."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else None
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode="legacy", extensions=[platform.binding.extension]) as client:
            yield client


def emit(engine: Engine, event_type: str, *, audience: str | None, **changes: Any) -> str:
    """Write an event as the domain does (outbox, one transaction); returns its ``event_id``."""
    body = event(event_type, **changes)
    with db.session(engine) as session:
        outbox.emit(session, body, audience=audience)
        session.commit()
    event_id: str = body["event_id"]
    return event_id


async def wait_until(condition: Callable[[], bool]) -> None:
    """Poll ``condition`` until it holds (fails after :data:`PATIENCE`)."""
    with anyio.fail_after(PATIENCE):
        while not condition():  # noqa: ASYNC110 - server state, no event to wait on
            await anyio.sleep(0.02)


class Proxy:
    """A TCP proxy in front of the server that can cut every connection through it and hold new
    ones until it is resumed: a client that loses its network for a while.

    ``heads`` are the first bytes each connection sent (the request line and headers of its first
    request), to see what a reconnecting client asked for; ``downstream`` is everything the server
    sent back (where the SSE event ids are).
    """

    def __init__(self, task_group: TaskGroup, upstream_port: int) -> None:
        self._task_group = task_group
        self._upstream_port = upstream_port
        self._open: set[ByteStream] = set()
        self._up = anyio.Event()
        self._up.set()
        self.heads: list[bytes] = []
        self.downstream = bytearray()
        self.port = 0

    async def start(self) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = listener.extra(SocketAttribute.local_port)  # noqa: S610 - anyio, not Django

        async def serve() -> None:
            async with listener:
                await listener.serve(self._handle)

        self._task_group.start_soon(serve)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def cut(self) -> None:
        """Drop every connection, and hold new ones until :meth:`resume`."""
        self._up = anyio.Event()
        for stream in list(self._open):
            await stream.aclose()

    def resume(self) -> None:
        self._up.set()

    def event_ids(self) -> list[str]:
        """The SSE event ids the server sent through the proxy, in order."""
        lines = bytes(self.downstream).replace(b"\r\n", b"\n").split(b"\n")
        return [line[3:].strip().decode() for line in lines if line.startswith(b"id:")]

    async def _handle(self, client: SocketStream) -> None:
        async with client:
            await self._up.wait()
            try:
                upstream = await anyio.connect_tcp("127.0.0.1", self._upstream_port)
            except OSError:
                return
            async with upstream, anyio.create_task_group() as pumps:
                self._open |= {client, upstream}

                async def pump(source: ByteStream, sink: ByteStream, record: Callable[[bytes], None]) -> None:
                    try:
                        async for chunk in source:
                            record(chunk)
                            await sink.send(chunk)
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        pass
                    finally:
                        pumps.cancel_scope.cancel()
                        self._open -= {client, upstream}

                pumps.start_soon(pump, upstream, client, self.downstream.extend)
                pumps.start_soon(pump, client, upstream, self._record_head())

    def _record_head(self) -> Callable[[bytes], None]:
        first = True

        def record(chunk: bytes) -> None:
            nonlocal first
            if first:
                self.heads.append(chunk)
                first = False

        return record


@asynccontextmanager
async def proxied(base_url: str) -> AsyncIterator[Proxy]:
    """A :class:`Proxy` to the server at ``base_url`` for the block (resumed before it stops, so
    a failing test's client can still say goodbye)."""
    async with anyio.create_task_group() as task_group:
        proxy = Proxy(task_group, int(base_url.rsplit(":", 1)[1]))
        await proxy.start()
        try:
            yield proxy
        finally:
            proxy.resume()
            task_group.cancel_scope.cancel()
