"""``usp-webhooks mcp``: the MCP server over stdio, one JSON-RPC message per line.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.mcp.stdio``.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from io import TextIOWrapper
from typing import Final

import anyio
import anyio.to_thread
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.shared.message import SessionMessage
from sqlalchemy.engine import Engine

from usp_core import db, keys
from usp_dispatcher import database
from usp_dispatcher.mcp.live import LiveHub
from usp_dispatcher.mcp.protocol import parse_message, wire_error
from usp_dispatcher.mcp.server import build_server
from usp_dispatcher.scheduling import ensure_demo_catalog
from usp_dispatcher.settings import ApiSettings
from usp_workers import tasks

__all__ = ["DRAIN_TIMEOUT", "run_stdio", "serve_stdio", "stdio_transport"]

#: Seconds the server still works on requests read before stdin closed.
DRAIN_TIMEOUT: Final = 60.0


def run_stdio(settings: ApiSettings) -> None:
    """Serve MCP on this process's stdin/stdout until stdin closes. Anything else printing to
    stdout would corrupt the wire, so ``print`` goes to stderr meanwhile."""
    stdin = anyio.wrap_file(TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace"))
    stdout = anyio.wrap_file(TextIOWrapper(sys.stdout.buffer, encoding="utf-8"))
    sys.stdout = sys.stderr
    anyio.run(partial(serve_stdio, settings, stdin=stdin, stdout=stdout))


async def serve_stdio(
    settings: ApiSettings,
    *,
    stdin: anyio.AsyncFile[str] | None = None,
    stdout: anyio.AsyncFile[str] | None = None,
) -> None:
    """Serve one MCP client over the given text streams (default: this process's)."""
    engine = db.make_engine(settings)
    try:
        with tasks.handing_off(settings):  # committed events reach the broker at once, as from the API
            await anyio.to_thread.run_sync(_prepare_database, engine, settings)
            hub = LiveHub()  # one session: the pipe, attached by its first privileged call
            server = build_server(engine, settings, hub=hub)
            async with (
                stdio_transport(stdin, stdout) as (read_stream, write_stream),
                anyio.create_task_group() as tg,
            ):
                tg.start_soon(hub.run, engine, settings)
                await server.run(read_stream, write_stream, server.create_initialization_options())
                tg.cancel_scope.cancel()
    finally:
        engine.dispose()


@asynccontextmanager
async def stdio_transport(
    stdin: anyio.AsyncFile[str] | None = None,
    stdout: anyio.AsyncFile[str] | None = None,
    *,
    drain_timeout: float = DRAIN_TIMEOUT,
) -> AsyncIterator[
    tuple[MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]]
]:
    """The server's two streams over line-delimited JSON-RPC on ``stdin``/``stdout``."""
    source = stdin or anyio.wrap_file(TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace"))
    sink = stdout or anyio.wrap_file(TextIOWrapper(sys.stdout.buffer, encoding="utf-8", line_buffering=False))
    inbound_send, inbound_receive = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outbound_send, outbound_receive = anyio.create_memory_object_stream[SessionMessage](0)
    write_lock = anyio.Lock()

    async def write_line(text: str) -> None:
        async with write_lock:  # one message per line, never two interleaved
            await sink.write(text + "\n")
            await sink.flush()

    # Requests read but not yet answered. The SDK's server stops, cancelling whatever is in
    # flight, as soon as its read stream ends; so the stream stays open after stdin's EOF until
    # each of them is answered (or ``drain_timeout`` passes), and a piped session gets every answer.
    pending: set[types.RequestId] = set()
    drained = anyio.Event()

    async def read_lines() -> None:
        nonlocal drained
        async with inbound_send:
            async for line in source:
                if not line.strip():
                    continue
                parsed = parse_message(line)
                if isinstance(parsed, types.JSONRPCError):
                    await write_line(parsed.model_dump_json(by_alias=True, exclude_unset=True))
                    continue
                if isinstance(parsed, types.JSONRPCRequest):
                    pending.add(parsed.id)
                await inbound_send.send(SessionMessage(parsed))
            with anyio.move_on_after(drain_timeout):
                while pending:
                    drained = anyio.Event()
                    await drained.wait()

    async def write_messages() -> None:
        async with outbound_receive:
            async for message in outbound_receive:
                outgoing = message.message
                if isinstance(outgoing, types.JSONRPCError):  # also those made outside the middleware
                    outgoing = outgoing.model_copy(update={"error": wire_error(outgoing.error)})
                await write_line(outgoing.model_dump_json(by_alias=True, exclude_unset=True))
                if (
                    isinstance(outgoing, types.JSONRPCResponse | types.JSONRPCError)
                    and outgoing.id in pending
                ):
                    pending.discard(outgoing.id)
                    drained.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(read_lines)
        tg.start_soon(write_messages)
        try:
            yield inbound_receive, outbound_send
        finally:
            tg.cancel_scope.cancel()


def _prepare_database(engine: Engine, settings: ApiSettings) -> None:
    """What the API does at start-up: migrate, ensure a signing key, seed a never-used catalog."""
    database.upgrade(engine)
    with db.session(engine) as session:
        keys.ensure_signing_key(session, settings)
        session.commit()
    if settings.seed_demo_catalog:
        ensure_demo_catalog(engine)
