"""What one delivery's HTTP exchange costs the worker, by client.

Run: ``uv run python bench/pool.py [--requests 20000] [--in-flight 8]``

A server process on 127.0.0.1 answers every request at once with a fixed 200 (so the figures are
the client's). The client process sends signed-delivery-sized POSTs (a ~600-byte body, the
headers a delivery carries) over kept-alive HTTP/1.1 connections, ``--in-flight`` at a time, and
prints its own CPU per request and the requests per second for:

* ``OriginTransport.request`` — the worker's path (:func:`usp_core.ssrf.send_pinned`);
* ``httpx.AsyncClient`` over ``OriginTransport`` — httpx's models on our pool;
* ``httpx.AsyncClient`` with its own pool (httpcore, HTTP/1.1 keep-alive) — the alternative.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import time
from collections.abc import Awaitable, Callable

import httpx
from rich.console import Console
from rich.table import Table

from usp_core.origin_pool import OriginTransport, RawRequest

ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\n"
    b"date: Sat, 05 Dec 2026 20:00:00 GMT\r\nserver: uvicorn\r\n\r\n"
    b'{"status":"ok"}'
)
BODY = b'{"event_id":"' + b"e" * 36 + b'","data":{"note":"' + b"x" * 520 + b'"}}'
HEADERS = {
    "Content-Type": "application/json",
    "Content-Digest": "sha-256=:" + "B" * 43 + "=:",
    "Signature-Input": 'sig1=("@method" "@authority" "@path" "content-digest" "content-type");'
    'created=1764960000;keyid="k-2026-12";alg="ed25519";tag="usp-webhook"',
    "Signature": "sig1=:" + "A" * 86 + "==:",
    "User-Agent": "usp-webhooks/0.1",
}


class _Answer(asyncio.Protocol):
    """Answers each complete request (head + Content-Length body) with :data:`ANSWER`."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].lower()
            at = head.find(b"content-length:")
            length = int(head[at + 15 :].split(b"\r\n")[0]) if at >= 0 else 0
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            self.transport.write(ANSWER)  # type: ignore[attr-defined]


def _serve(sock: socket.socket) -> None:
    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(_Answer, sock=sock)
        await server.serve_forever()

    asyncio.run(main())


Send = Callable[[], Awaitable[int]]


async def _measure(send: Send, requests: int, in_flight: int) -> tuple[float, float]:
    """(µs of this process's CPU per request, requests/s), after a warm-up."""

    async def caller(count: int) -> None:
        for _ in range(count):
            if await send() != 200:
                raise RuntimeError("the server did not answer 200")

    await asyncio.gather(*(caller(100) for _ in range(in_flight)))
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(caller(requests // in_flight) for _ in range(in_flight)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    done = requests // in_flight * in_flight
    return cpu / done * 1e6, done / wall


async def _rows(port: int, requests: int, in_flight: int) -> list[tuple[str, float, float]]:
    url = f"http://127.0.0.1:{port}/webhooks/usp"
    rows = []

    transport = OriginTransport()
    wire = [(b"Host", b"platform.example"), *((k.encode(), v.encode()) for k, v in HEADERS.items())]
    wire.append((b"Content-Length", str(len(BODY)).encode()))
    raw = RawRequest(b"POST", b"/webhooks/usp", wire, BODY, 5.0, 5.0, 5.0)
    origin = ("http", "127.0.0.1", port, None)

    async def direct() -> int:
        return (await transport.request(origin, raw, max_body=65536)).status_code

    rows.append(("OriginTransport.request (the worker's path)", *await _measure(direct, requests, in_flight)))
    await transport.aclose()

    for name, client in (
        ("httpx.AsyncClient over OriginTransport", httpx.AsyncClient(transport=OriginTransport())),
        ("httpx.AsyncClient, its own pool (httpcore)", httpx.AsyncClient()),
    ):
        async with client:

            async def through_httpx(client: httpx.AsyncClient = client) -> int:
                response = await client.post(url, content=BODY, headers=HEADERS)
                return response.status_code

            rows.append((name, *await _measure(through_httpx, requests, in_flight)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--in-flight", type=int, default=8)
    args = parser.parse_args()
    sock = socket.create_server(("127.0.0.1", 0))
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(sock,), daemon=True)
    server.start()
    try:
        rows = asyncio.run(_rows(sock.getsockname()[1], args.requests, args.in_flight))
    finally:
        server.terminate()
    table = Table(title=f"One delivery's HTTP exchange: {args.requests:,} POSTs, {args.in_flight} in flight")
    table.add_column("client")
    table.add_column("client CPU µs/request", justify="right")
    table.add_column("requests/s", justify="right")
    table.add_column("vs the worker's path", justify="right")
    base = rows[0][1]
    for name, cpu, rate in rows:
        table.add_row(name, f"{cpu:,.1f}", f"{rate:,.0f}", f"{cpu / base:.1f} times")
    Console().print(table)


if __name__ == "__main__":
    main()
