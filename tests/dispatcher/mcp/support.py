"""Helpers the MCP tests share: ``_meta.usp`` builders and the three kinds of answer."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import TextContent

from usp_schemas import USP_VERSION

PROFILE = "https://agent.example/profiles/scheduling-agent.json"
OTHER_PROFILE = "https://other.example/profiles/agent.json"
HAIRCUT = "svc_haircut_001"
ALICE = {"first_name": "Alice", "email": "alice@example.com"}
BOB = {"first_name": "Bob", "email": "bob@example.com"}
SEVERITIES = ("recoverable", "requires_buyer_input", "unrecoverable")


def usp(
    *,
    profile: str | None = PROFILE,
    key: str | None = None,
    credential: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """``{"_meta": {"usp": ...}}``: the profile, a bearer ``key`` or a booking ``credential``
    (``_meta.usp.authorization``), and anything else (idempotency_key, correlation_id ...)."""
    meta: dict[str, Any] = dict(extra)
    if profile is not None:
        meta["profile"] = profile
    if key is not None:
        meta["authorization"] = {"mechanism": "bearer", "credential": key}
    if credential is not None:
        meta["authorization"] = credential
    return {"_meta": {"usp": meta}}


async def ok(client: Client, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A successful call: its ``structuredContent`` (no messages, the dual envelope complete)."""
    result = await client.call_tool(name, arguments)
    assert not result.is_error
    body = result.structured_content
    assert body is not None
    assert body["messages"] == [], body["messages"]
    assert body["usp"]["version"] == USP_VERSION
    assert body["usp"]["capabilities"]
    ((text),) = result.content
    assert isinstance(text, TextContent)
    assert text.text
    assert not text.text.startswith("Error")
    answer: dict[str, Any] = body
    return answer


async def outcome(client: Client, name: str, arguments: dict[str, Any], code: str) -> dict[str, Any]:
    """A business outcome: a result (not an error) whose one message has ``code``."""
    result = await client.call_tool(name, arguments)
    body = result.structured_content
    assert body is not None
    ((message),) = body["messages"]
    assert message["code"] == code, message
    assert message["type"] == "error"
    assert message["severity"] in SEVERITIES
    assert set(body) == {"usp", "messages"}
    ((text),) = result.content
    assert isinstance(text, TextContent)
    assert text.text == "Error: " + message["content"]
    found: dict[str, Any] = message
    return found


async def refused(client: Client, name: str, arguments: dict[str, Any] | None, code: int) -> str:
    """A protocol error: JSON-RPC ``code``, the code word as ``message``, ``data.content`` text.
    Returns the text."""
    with pytest.raises(MCPError) as caught:
        await client.call_tool(name, arguments)
    error = caught.value.error
    assert error.code == code, error
    assert error.message == WORDS[code]
    assert isinstance(error.data, dict)
    assert set(error.data) == {"content"}
    content: str = error.data["content"]
    assert content
    assert "Traceback" not in content
    return content


WORDS = {
    -32700: "parse_error",
    -32600: "invalid_request",
    -32601: "method_not_found",
    -32602: "invalid_params",
    -32603: "internal_error",
    -32001: "unauthenticated",
    -32003: "forbidden",
}


def window(days: int = 4) -> dict[str, str]:
    today = date.today()
    return {"start_date": str(today), "end_date": str(today + timedelta(days=days))}


async def free_slots(client: Client, service_id: str = HAIRCUT) -> list[dict[str, Any]]:
    body = await ok(client, "usp_availability_query", {"service_id": service_id, **window()})
    slots: list[dict[str, Any]] = body["slots"]
    assert len(slots) >= 3
    return slots


async def book(
    client: Client,
    slot_id: str,
    *,
    key: str,
    buyer: dict[str, str] = ALICE,
    profile: str = PROFILE,
    **meta: Any,
) -> dict[str, Any]:
    """A booking made over MCP (must succeed): the structured answer, credential included."""
    arguments = {
        "service_id": HAIRCUT,
        "slot_id": slot_id,
        "buyer": buyer,
        **usp(profile=profile, key=key, **meta),
    }
    return await ok(client, "usp_bookings_create", arguments)
