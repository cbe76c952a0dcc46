"""``usp-webhooks ucap-mcp``: the agent-side MCP server of the seed's example. It runs beside the
agent (stdio, in its MCP client's configuration), offers the five UCAP tools, and answers each by
calling the publisher's ``/v1`` API over HTTP, every request signed with the agent's Ed25519 key
as OpenBotAuth's signer signs (:func:`usp_dispatcher.access.signatures.web_bot_auth_headers`).

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.mcp.ucap_agent``.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
from functools import partial
from io import TextIOWrapper
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import anyio
import httpx
import mcp_types as types
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server

from usp_dispatcher.access.signatures import web_bot_auth_headers
from usp_dispatcher.mcp.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    MISSING_FIELD,
    UNAUTHENTICATED,
    ProtocolErrors,
    bad_arguments,
    protocol_error,
)
from usp_dispatcher.mcp.stdio import stdio_transport
from usp_dispatcher.ucap.tools import UCAP_TOOLS_BY_NAME, list_entries, tool_result
from usp_receiver import SigningKey

__all__ = ["AgentClient", "build_agent_server", "load_agent_key", "run_agent_stdio"]

_TIMEOUT: Final = 30.0
_USER_AGENT: Final = "usp-webhooks-ucap-mcp/0.1"


def load_agent_key(path: Path) -> SigningKey:
    """The agent's Ed25519 private key from a PKCS#8 PEM file (OpenBotAuth's key format).

    As ssh does, a file that others may read is refused: whoever reads it can sign as the agent
    and spend what it is entitled to."""
    mode = path.stat().st_mode
    if os.name == "posix" and mode & 0o077:
        raise ValueError(
            f"the agent key {path} can be read by others (mode {stat.S_IMODE(mode):o}): chmod 600 it"
        )
    private = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(private, Ed25519PrivateKey):
        raise ValueError("the agent key must be an Ed25519 private key (PKCS#8 PEM)")
    raw = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    public = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return SigningKey.from_jwk({"kty": "OKP", "crv": "Ed25519", "x": _b64url(public), "d": _b64url(raw)})


class AgentClient:
    """Signed calls to a UCAP server's ``/v1`` API as one agent."""

    def __init__(
        self, api: str, key: SigningKey, signature_agent: str, *, http: httpx.AsyncClient | None = None
    ) -> None:
        self.api = api.rstrip("/")
        self.key = key
        self.signature_agent = signature_agent
        self._http = http or httpx.AsyncClient(timeout=_TIMEOUT, follow_redirects=False)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def request(self, method: str, path: str, payload: Any = None) -> tuple[int, dict[str, Any]]:
        """One signed request; the status and the JSON answer."""
        body = b"" if payload is None else json.dumps(payload, separators=(",", ":")).encode()
        url = self.api + path
        headers = web_bot_auth_headers(
            method, url, body, self.key, signature_agent=self.signature_agent, digest=bool(body)
        )
        headers["User-Agent"] = _USER_AGENT
        response = await self._http.request(method, url, content=body, headers=headers)
        try:
            answer = response.json()
        except ValueError:
            answer = {
                "error": {"code": "bad_response", "message": f"The server answered {response.status_code}."}
            }
        return response.status_code, answer if isinstance(answer, dict) else {"result": answer}

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The ``/v1`` request that tool ``name`` wraps."""
        given = {k: v for k, v in arguments.items() if k != "_meta"}
        if name == "search_catalog":
            return await self.request("POST", "/v1/catalog/search", given)
        if name == "get_catalog_item":
            return await self.request("POST", "/v1/catalog/lookup", given)
        if name == "read_content":
            publisher_id, post_id = (_text(given, field) for field in ("publisher_id", "post_id"))
            return await self.request(
                "GET", f"/v1/content/{quote(publisher_id, safe='')}/{quote(post_id, safe='')}"
            )
        if name == "subscribe":
            return await self.request("POST", "/v1/subscribe", given)
        return await self.request("GET", "/v1/entitlements")


def build_agent_server(client: AgentClient) -> Server[Any]:
    """The stdio MCP server: the five tools, each one signed ``/v1`` call."""

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=list_entries())

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name not in UCAP_TOOLS_BY_NAME:
            raise protocol_error(-32601, f"There is no tool {params.name[:60]!r}.")
        try:
            status, body = await client.call(params.name, dict(params.arguments or {}))
        except httpx.HTTPError:
            raise protocol_error(
                INTERNAL_ERROR, f"The UCAP server at {client.api} could not be reached."
            ) from None
        if status == 400:
            raise bad_arguments(_detail(body))
        if status == 403:
            raise protocol_error(UNAUTHENTICATED, _detail(body))
        return tool_result(params.name, status, body)

    server: Server[Any] = Server(
        "ucap-agent",
        title="UCAP content tools (signed as this agent)",
        instructions="Search, read and subscribe to UCAP publications; every call is signed with your key.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=lambda name: (
            UCAP_TOOLS_BY_NAME[name].input_schema if name in UCAP_TOOLS_BY_NAME else None
        ),
    )
    server.middleware.append(ProtocolErrors())
    return server


def run_agent_stdio(api: str, key_file: Path, signature_agent: str) -> None:
    """Serve the agent-side tools on this process's stdin/stdout until stdin closes."""
    key = load_agent_key(key_file)
    stdin = anyio.wrap_file(TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace"))
    stdout = anyio.wrap_file(TextIOWrapper(sys.stdout.buffer, encoding="utf-8"))
    sys.stdout = sys.stderr
    anyio.run(partial(_serve, api, key, signature_agent, stdin, stdout))


async def _serve(
    api: str, key: SigningKey, signature_agent: str, stdin: anyio.AsyncFile[str], stdout: anyio.AsyncFile[str]
) -> None:
    client = AgentClient(api, key, signature_agent)
    server = build_agent_server(client)
    try:
        async with stdio_transport(stdin, stdout) as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await client.aclose()


def _text(arguments: dict[str, Any], field: str) -> str:
    value = arguments.get(field)
    if value is None:
        raise bad_arguments(f"{MISSING_FIELD}: {field}")
    if not isinstance(value, str) or not 0 < len(value) <= 128:
        raise protocol_error(INVALID_PARAMS, f"{field} must be a string of 1 to 128 characters")
    return value


def _detail(body: dict[str, Any]) -> str:
    error = body.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return str(body.get("detail") or "The server refused the request.")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")
