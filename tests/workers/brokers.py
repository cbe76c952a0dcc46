"""The brokers on this machine, for the broker-destination tests: RabbitMQ, NATS JetStream and
Redis on their usual loopback ports (``.ci/run`` starts any that is not answering), each given a
destination of its own per test (a queue, a stream and subject, a stream key), read back the way a
consumer would; and :class:`Outage`, a TCP proxy in front of one that a test takes down and brings
back, so a broker can be "down for 20 s" without stopping the machine's own server."""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import aio_pika
import nats
import redis

RABBITMQ = ("127.0.0.1", 5672)
NATS = ("127.0.0.1", 4222)
REDIS = ("127.0.0.1", 6379)


@dataclass
class Destination:
    """One broker destination: the subscription's URL (through ``port``) and how to read it."""

    kind: str
    name: str

    def url(self, port: int) -> str:
        if self.kind == "amqp":
            return f"amqp://guest:guest@127.0.0.1:{port}/%2F?exchange=&routing_key={self.name}"
        if self.kind == "nats":
            return f"nats://127.0.0.1:{port}?subject={self.name}"
        return f"redis://127.0.0.1:{port}/0?stream={self.name}&maxlen=10000"

    def read(self) -> list[tuple[dict[str, str], bytes]]:
        """Every message at the destination, oldest first: (headers, body)."""
        return asyncio.run(_READERS[self.kind](self.name))

    def drop(self) -> None:
        asyncio.run(_DROPPERS[self.kind](self.name))


@contextmanager
def destinations() -> Iterator[dict[str, Destination]]:
    """A fresh queue, JetStream stream and Redis stream, removed afterwards."""
    tag = uuid.uuid4().hex[:10]
    made = {
        "amqp": Destination("amqp", f"usp-test-{tag}"),
        "nats": Destination("nats", f"usp.test.{tag}"),
        "redis": Destination("redis", f"usp:test:{tag}"),
    }
    asyncio.run(_create(made))
    try:
        yield made
    finally:
        for destination in made.values():
            destination.drop()


async def _create(made: dict[str, Destination]) -> None:
    connection = await aio_pika.connect(host=RABBITMQ[0], port=RABBITMQ[1])
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(made["amqp"].name, durable=True)
    client = await nats.connect(f"nats://{NATS[0]}:{NATS[1]}")
    try:
        subject = made["nats"].name
        await client.jetstream().add_stream(name=_stream(subject), subjects=[subject])
    finally:
        await client.close()


def _stream(subject: str) -> str:
    return subject.replace(".", "_").upper()


async def _read_amqp(name: str) -> list[tuple[dict[str, str], bytes]]:
    got = []
    connection = await aio_pika.connect(host=RABBITMQ[0], port=RABBITMQ[1])
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue(name)
        # Not acknowledged: closing the channel puts them back, so reading never consumes.
        while (message := await queue.get(no_ack=False, fail=False)) is not None:
            headers = {
                k: (v.decode() if isinstance(v, bytes) else str(v))
                for k, v in (message.headers or {}).items()
            }
            headers["message_id"] = str(message.message_id)
            got.append((headers, message.body))
    return got


async def _read_nats(subject: str) -> list[tuple[dict[str, str], bytes]]:
    client = await nats.connect(f"nats://{NATS[0]}:{NATS[1]}")
    try:
        stream = client.jetstream()
        info = await stream.stream_info(_stream(subject))
        got = []
        for sequence in range(info.state.first_seq, info.state.last_seq + 1) if info.state.messages else ():
            message = await stream.get_msg(_stream(subject), sequence)
            got.append((dict(message.headers or {}), message.data or b""))
        return got
    finally:
        await client.close()


async def _read_redis(key: str) -> list[tuple[dict[str, str], bytes]]:
    client = redis.Redis(host=REDIS[0], port=REDIS[1])
    try:
        entries: Any = client.xrange(key)
        got = []
        for _, fields in entries:
            decoded = {bytes(k).decode(): bytes(v) for k, v in fields.items()}
            body = decoded.pop("body")
            got.append(({k: v.decode() for k, v in decoded.items()}, body))
        return got
    finally:
        client.close()


async def _drop_amqp(name: str) -> None:
    connection = await aio_pika.connect(host=RABBITMQ[0], port=RABBITMQ[1])
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(name)


async def _drop_nats(subject: str) -> None:
    client = await nats.connect(f"nats://{NATS[0]}:{NATS[1]}")
    try:
        await client.jetstream().delete_stream(_stream(subject))
    finally:
        await client.close()


async def _drop_redis(key: str) -> None:
    redis.Redis(host=REDIS[0], port=REDIS[1]).delete(key)


_READERS: dict[str, Any] = {"amqp": _read_amqp, "nats": _read_nats, "redis": _read_redis}
_DROPPERS: dict[str, Any] = {"amqp": _drop_amqp, "nats": _drop_nats, "redis": _drop_redis}


class Outage:
    """A TCP proxy on 127.0.0.1 in front of ``upstream``; :meth:`down` refuses and cuts every
    connection until :meth:`up` (the same port), as a broker that went away and came back."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port: int = probe.getsockname()[1]
        probe.close()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.up()

    def up(self) -> None:
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    def down(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)

    def close(self) -> None:
        self.down()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port, reuse_address=True)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            return
        self._open.update((writer, up_writer))

        async def copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                sink.transport.abort()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
