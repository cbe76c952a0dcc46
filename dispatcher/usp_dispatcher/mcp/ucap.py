"""The five UCAP tools on the ``/mcp`` server: each calls the ``/v1`` operation it wraps
(:class:`usp_dispatcher.ucap.service.UcapService`, the very object the routes call) as the agent
whose signature the MCP HTTP request carried, so authorization, rate limits and entitlements are
the HTTP API's, not a second copy.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.mcp.ucap``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import mcp_types as types

from usp_dispatcher.access import Identity
from usp_dispatcher.errors import UcapError
from usp_dispatcher.mcp.protocol import MISSING_FIELD, UNAUTHENTICATED, bad_arguments, protocol_error
from usp_dispatcher.ucap.agents import Agent, agent_of
from usp_dispatcher.ucap.answers import Answer
from usp_dispatcher.ucap.service import UcapService
from usp_dispatcher.ucap.tools import tool_result

__all__ = ["call_ucap_tool"]

_NO_AGENT = (
    "UCAP tools act as a signed agent: sign the MCP HTTP request with HTTP Message Signatures "
    "(RFC 9421, Web Bot Auth) naming your key directory in Signature-Agent, or run the agent-side "
    "server, usp-webhooks ucap-mcp."
)


async def call_ucap_tool(
    service: UcapService, name: str, arguments: Mapping[str, Any], identity: Identity | None
) -> types.CallToolResult:
    """Run UCAP tool ``name`` for the agent ``identity`` proves; protocol errors for a missing
    signature (-32001) and bad arguments (-32600 for a missing one, else -32602), results for
    everything the HTTP API answers."""
    agent = agent_of(identity)
    if agent is None:
        raise protocol_error(UNAUTHENTICATED, _NO_AGENT)
    given = {k: v for k, v in arguments.items() if k != "_meta"}
    try:
        service.limiter.check(agent)
        answer = await _dispatch(service, agent, name, given)
    except UcapError as exc:
        if exc.status == 400:
            raise bad_arguments(exc.detail) from None
        if exc.status == 403:
            raise protocol_error(UNAUTHENTICATED, exc.detail) from None
        return tool_result(name, exc.status, {"error": {"code": exc.code, "message": exc.detail}})
    return tool_result(name, answer.status, answer.body)


async def _dispatch(service: UcapService, agent: Agent, name: str, arguments: dict[str, Any]) -> Answer:
    if name == "search_catalog":
        return await service.search(agent, arguments)
    if name == "get_catalog_item":
        return await service.lookup(agent, arguments)
    if name == "read_content":
        publisher_id, post_id = _ids(arguments)
        return await service.read(agent, publisher_id, post_id)
    if name == "subscribe":
        return await service.subscribe(agent, arguments)
    if arguments:
        raise UcapError(400, "invalid_request", "list_entitlements takes no arguments.")
    return await service.entitlements(agent)


def _ids(arguments: Mapping[str, Any]) -> tuple[str, str]:
    for field in ("publisher_id", "post_id"):
        value = arguments.get(field)
        if value is None:
            raise UcapError(400, "invalid_request", f"{MISSING_FIELD}: {field}")
        if not isinstance(value, str) or not 0 < len(value) <= 128:
            raise UcapError(400, "invalid_request", f"{field} must be a string of 1 to 128 characters")
    unknown = sorted(set(arguments) - {"publisher_id", "post_id"})
    if unknown:
        raise UcapError(400, "invalid_request", f"Unknown argument: {unknown[0][:40]}")
    return arguments["publisher_id"], arguments["post_id"]
