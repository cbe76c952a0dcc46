"""``usp-webhooks mcp``: the stdio server as a child process, driven with raw lines (what the SDK
client cannot send) and with the official client."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import Client
from sqlalchemy.engine import Engine
from sqlmodel import select

from tests.dispatcher.mcp.conftest import stdio_parameters
from tests.dispatcher.mcp.support import ALICE, HAIRCUT, PROFILE, book, free_slots, ok, usp, window
from usp_core import db
from usp_dispatcher.scheduling.tables import BookingRow

pytestmark = pytest.mark.anyio

#: A guard against a hung child, not a timing assertion.
_PATIENCE = 60


class RawSession:
    """Lines in, lines out, over the child's stdin/stdout."""

    def __init__(self, process: Process) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self.process = process
        self.stdin = process.stdin
        self.stdout = BufferedByteReceiveStream(process.stdout)

    async def send(self, line: str) -> None:
        await self.stdin.send(line.encode() + b"\n")

    async def receive(self) -> dict[str, Any]:
        with anyio.fail_after(_PATIENCE):
            line = await self.stdout.receive_until(b"\n", 1 << 20)
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def request(self, id_: int, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(json.dumps(message))
        answer = await self.receive()
        assert answer["id"] == id_
        return answer


async def _spawn(env: dict[str, str], cwd: Path) -> Process:
    return await anyio.open_process(
        [sys.executable, "-m", "usp_dispatcher.cli", "mcp"],
        env={**_base_env(), **env},
        cwd=str(cwd),
        stderr=None,
    )


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("USP_")}


def _error(answer: dict[str, Any], code: int, word: str, id_: int | str | None) -> None:
    assert answer["jsonrpc"] == "2.0"
    assert answer["id"] == id_
    assert "result" not in answer
    assert answer["error"]["code"] == code
    assert answer["error"]["message"] == word
    assert answer["error"]["data"]["content"]


INITIALIZE = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "raw-test", "version": "0"},
}


async def test_malformed_lines_are_answered_not_dropped(
    mcp_engine: Engine, stdio_env: dict[str, str], tmp_path: Path
) -> None:
    async with await _spawn(stdio_env, tmp_path) as process:
        raw = RawSession(process)
        await raw.send("{this is not json")
        _error(await raw.receive(), -32700, "parse_error", None)
        await raw.send('{"jsonrpc": "2.0", "id": 1, "method": NaN}')
        _error(await raw.receive(), -32700, "parse_error", None)
        await raw.send("[1, 2, 3]")
        _error(await raw.receive(), -32600, "invalid_request", None)
        await raw.send('{"jsonrpc": "2.0", "id": 7, "method": 42}')
        _error(await raw.receive(), -32600, "invalid_request", 7)
        await raw.send('{"jsonrpc": "1.0", "id": "a", "method": "ping"}')
        _error(await raw.receive(), -32600, "invalid_request", "a")
        await raw.send("")  # a blank line is nothing, and answered with nothing
        # The session still works afterwards.
        initialized = await raw.request(2, "initialize", INITIALIZE)
        assert initialized["result"]["serverInfo"]["name"] == "usp-dispatcher"
        await raw.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        missing_name = await raw.request(3, "tools/call", {"arguments": {}})
        _error(missing_name, -32600, "invalid_request", 3)
        assert missing_name["error"]["data"]["content"] == "Missing required field: params.name"
        _error(
            await raw.request(4, "tools/call", {"name": "nope", "arguments": {}}),
            -32601,
            "method_not_found",
            4,
        )
        _error(await raw.request(5, "no/such/method", {}), -32601, "method_not_found", 5)
        listed = await raw.request(6, "tools/call", {"name": "usp_catalog_list", "arguments": {}})
        assert listed["result"]["structuredContent"]["services"]
        await raw.stdin.aclose()
        with anyio.fail_after(_PATIENCE):
            assert await process.wait() == 0


def _piped(env: dict[str, str], cwd: Path, *messages: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Run ``usp-webhooks mcp`` with ``messages`` piped in at once (stdin closes after the last
    one, as ``cat session.jsonl | usp-webhooks mcp`` does); its answers by id."""
    import subprocess

    lines = "".join(json.dumps(m) + "\n" for m in messages)
    done = subprocess.run(
        [sys.executable, "-m", "usp_dispatcher.cli", "mcp"],
        input=lines.encode(),
        capture_output=True,
        env={**_base_env(), **env},
        cwd=str(cwd),
        timeout=_PATIENCE,
        check=True,
    )
    answers = [json.loads(line) for line in done.stdout.decode().splitlines() if line.strip()]
    return {a["id"]: a for a in answers if "id" in a}


async def test_a_piped_session_is_answered_in_full_after_stdin_closes(
    mcp_engine: Engine, stdio_env: dict[str, str], tmp_path: Path, acme_key: str
) -> None:
    def call(id_: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {
            "jsonrpc": "2.0",
            "id": id_,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments},
        }

    opening = (
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
    )
    first = await anyio.to_thread.run_sync(
        lambda: _piped(
            stdio_env,
            tmp_path,
            *opening,
            call(2, "usp_availability_query", {"service_id": HAIRCUT, **window()}),
        )
    )
    assert sorted(first) == [1, 2]
    assert "result" in first[2], first[2]
    slots = first[2]["result"]["structuredContent"]["slots"]
    booking = {"service_id": HAIRCUT, "buyer": ALICE, **usp(key=acme_key)}
    second = await anyio.to_thread.run_sync(
        lambda: _piped(
            stdio_env,
            tmp_path,
            *opening,
            call(2, "usp_bookings_create", {**booking, "slot_id": slots[0]["id"]}),
            call(3, "usp_bookings_create", {**booking, "slot_id": slots[1]["id"]}),
        )
    )
    assert sorted(second) == [1, 2, 3]
    made = [second[i]["result"]["structuredContent"]["booking"]["id"] for i in (2, 3)]
    with db.session(mcp_engine) as session:
        rows = session.exec(select(BookingRow)).all()
    assert sorted(r.id for r in rows) == sorted(made)


async def test_the_official_client_books_over_stdio_with_credentials_in_meta(
    mcp_engine: Engine, stdio_env: dict[str, str], tmp_path: Path, acme_key: str
) -> None:
    async with Client(stdio_parameters(stdio_env, tmp_path)) as client:
        slot = (await free_slots(client))[0]
        body = await book(client, slot["id"], key=acme_key)
        got = await ok(
            client,
            "usp_bookings_get",
            {
                "booking_id": body["booking"]["id"],
                "_meta": {"usp": {"profile": PROFILE, "authorization": body["booking_scoped_credential"]}},
            },
        )
        assert got["booking"] == body["booking"]
    with db.session(mcp_engine) as session:
        rows = session.exec(select(BookingRow)).all()
    assert [(r.id, r.platform_profile) for r in rows] == [(body["booking"]["id"], PROFILE)]


async def test_an_era_mismatch_is_answered_in_our_shape(
    mcp_engine: Engine, stdio_env: dict[str, str], tmp_path: Path
) -> None:
    """A request with the 2026-07-28 ``_meta`` envelope on a handshake connection: the SDK refuses
    it before our middleware runs; the transport still answers with our code word."""
    envelope = {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}}
    async with await _spawn(stdio_env, tmp_path) as process:
        raw = RawSession(process)
        await raw.request(1, "initialize", INITIALIZE)
        await raw.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        answer = await raw.request(2, "tools/call", {"name": "usp_catalog_list", "arguments": {}, **envelope})
        _error(answer, -32600, "invalid_request", 2)
        assert set(answer["error"]["data"]) == {"content"}
        assert "era" in answer["error"]["data"]["content"]
        listed = await raw.request(3, "tools/call", {"name": "usp_catalog_list", "arguments": {}})
        assert listed["result"]["structuredContent"]["services"]
        await raw.stdin.aclose()
        with anyio.fail_after(_PATIENCE):
            assert await process.wait() == 0
