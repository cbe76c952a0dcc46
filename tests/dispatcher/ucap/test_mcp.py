"""The five UCAP tools over MCP, with the official client: exactly the seed's definitions; on the
API's /mcp acting as the agent whose signature the MCP request carries; and on the agent-side
stdio server (``usp-webhooks ucap-mcp``) that signs each /v1 call itself."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from typer.testing import CliRunner

from tests.dispatcher.conftest import MakeSettings, Serve
from tests.dispatcher.ucap.conftest import Agent, Registry
from usp_dispatcher import cli
from usp_dispatcher.access.signatures import web_bot_auth_headers
from usp_dispatcher.api.app import create_app
from usp_dispatcher.ucap.seed import DEMO_PAID_POST, DEMO_PUBLICATION
from usp_dispatcher.ucap.tools import UCAP_TOOLS

pytestmark = pytest.mark.anyio

SEED = Path(__file__).resolve().parents[2] / "fixtures" / "ucap-mcp-integration.txt"
PRO = "tier_ai_weekly_pro"


def seed_tools() -> dict[str, dict[str, Any]]:
    """The tool definitions of the seed document, read from its text (each a YAML block)."""
    tools: dict[str, dict[str, Any]] = {}
    block: list[str] = []
    for line in [*SEED.read_text(encoding="utf-8").splitlines(), ""]:
        if line.startswith("name: ") or (block and line.strip()):
            block.append(line)
        elif block:
            document = yaml.safe_load("\n".join(block))
            tools[document["name"]] = document
            block = []
    return tools


def test_the_tools_are_the_seeds_member_by_member() -> None:
    seed = seed_tools()
    assert list(seed) == [tool.name for tool in UCAP_TOOLS]
    for tool in UCAP_TOOLS:
        assert tool.description == seed[tool.name]["description"], tool.name
        assert tool.input_schema == seed[tool.name]["inputSchema"], tool.name


class WebBotAuth(httpx2.Auth):
    """Signs every request the MCP client sends, as OpenBotAuth's signer does."""

    requires_request_body = True

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def auth_flow(self, request: httpx2.Request) -> Generator[httpx2.Request, httpx2.Response, None]:
        fields = web_bot_auth_headers(
            request.method,
            str(request.url),
            request.content,
            self.agent.key,
            signature_agent=self.agent.jwks_url,
            content_type=request.headers.get("content-type", "application/json"),
            digest=bool(request.content),
        )
        request.headers.update(fields)
        yield request


@asynccontextmanager
async def over_http(base_url: str, agent: Agent | None) -> AsyncIterator[Client]:
    auth = WebBotAuth(agent) if agent is not None else None
    async with (
        httpx2.AsyncClient(auth=auth, timeout=httpx2.Timeout(30, read=60)) as http,
        Client(streamable_http_client(f"{base_url}/mcp", http_client=http), mode="legacy") as client,
    ):
        yield client


@pytest.fixture
def base_url(make_settings: MakeSettings, serve: Serve) -> str:
    return serve(create_app(make_settings()))


async def test_remote_tools_act_as_the_signing_agent(base_url: str, alice: Agent, database_url: str) -> None:
    async with over_http(base_url, alice) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
        for tool in UCAP_TOOLS:
            assert listed[tool.name].input_schema == tool.input_schema
        found = await client.call_tool("search_catalog", {"query": "deep dive agents pay"})
        assert found.structured_content is not None
        assert found.structured_content["results"][0]["post"]["id"] == DEMO_PAID_POST

        item = await client.call_tool("get_catalog_item", {"id": "slug:ai-weekly"})
        assert item.structured_content is not None
        assert item.structured_content["publication"]["id"] == DEMO_PUBLICATION

        wall = await client.call_tool(
            "read_content", {"publisher_id": DEMO_PUBLICATION, "post_id": DEMO_PAID_POST}
        )
        assert wall.structured_content is not None
        assert wall.structured_content["status"] == "payment_required"
        assert {o["tier_id"] for o in wall.structured_content["offers"]} == {PRO, "tier_ai_weekly_annual"}
        assert wall.structured_content["message"] == "Please click the checkout URL to subscribe"

        started = await client.call_tool(
            "subscribe", {"publisher_id": DEMO_PUBLICATION, "tier_id": PRO, "payment_method": "usdc"}
        )
        assert started.structured_content is not None
        assert not started.is_error  # the /v1 answer is a 402 (x402 asks), the tool's is the details
        session_id = started.structured_content["checkout"]["session_id"]
        assert started.structured_content["accepts"][0]["payTo"].startswith("0x")

        confirmed = CliRunner().invoke(
            cli.app,
            ["payments", "confirm", session_id],
            env={"USP_DATABASE_URL": database_url},
        )
        assert confirmed.exit_code == 0, confirmed.output
        assert "granted" in confirmed.output

        read = await client.call_tool(
            "read_content", {"publisher_id": DEMO_PUBLICATION, "post_id": DEMO_PAID_POST}
        )
        assert read.structured_content is not None
        assert read.structured_content["status"] == "ok"
        assert "Agents that pay" in read.structured_content["content"]["html"]

        listed_entitlements = await client.call_tool("list_entitlements", {})
        assert listed_entitlements.structured_content is not None
        assert [e["tier_id"] for e in listed_entitlements.structured_content["entitlements"]] == [PRO]


async def test_remote_tools_refuse_an_unsigned_caller_and_bad_arguments(base_url: str, alice: Agent) -> None:
    async with over_http(base_url, None) as anonymous:
        with pytest.raises(MCPError) as caught:
            await anonymous.call_tool("list_entitlements", {})
        assert caught.value.error.code == -32001
    bad: list[tuple[str, dict[str, Any]]] = [
        ("get_catalog_item", {"id": "isbn:123"}),
        ("search_catalog", {"pagination": {"limit": 500}}),
        ("search_catalog", {"filters": {"recency": "1y"}}),
        ("subscribe", {"publisher_id": DEMO_PUBLICATION, "tier_id": PRO, "payment_method": "paypal"}),
        ("subscribe", {"publisher_id": DEMO_PUBLICATION, "tier_id": "tier_carnet_membre"}),
    ]
    async with over_http(base_url, alice) as client:
        for name, arguments in bad:
            with pytest.raises(MCPError) as caught:
                await client.call_tool(name, arguments)
            assert caught.value.error.code == -32602, (name, arguments)
            assert "Traceback" not in str(caught.value.error.data)
        with pytest.raises(MCPError) as caught:  # the USP binding's example, for UCAP tools too
            await client.call_tool("read_content", {"publisher_id": DEMO_PUBLICATION})
        assert caught.value.error.code == -32600
        assert caught.value.error.data == {"content": "Missing required field: post_id"}
        missing = await client.call_tool(
            "read_content", {"publisher_id": DEMO_PUBLICATION, "post_id": "post_nope"}
        )
        assert missing.is_error
        assert missing.structured_content is not None
        assert missing.structured_content["messages"][0]["code"] == "content_not_found"


def agent_side(base_url: str, key_file: Path, jwks_url: str, cwd: Path) -> StdioServerParameters:
    """How an MCP client starts ``usp-webhooks ucap-mcp`` (the module form of the command)."""
    return StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "usp_dispatcher.cli",
            "ucap-mcp",
            "--api",
            base_url,
            "--agent-key",
            str(key_file),
            "--signature-agent",
            jwks_url,
        ],
        env={"PYTHONPATH": os.pathsep.join(sys.path)},
        cwd=str(cwd),
    )


@pytest.fixture
def agent_key_file(alice: Agent, tmp_path: Path) -> Path:
    """Alice's key as a PKCS#8 PEM file, as OpenBotAuth's keygen writes it."""
    jwk = alice.key.to_jwk()
    import base64

    raw = base64.urlsafe_b64decode(jwk["d"] + "=" * (-len(jwk["d"]) % 4))
    pem = Ed25519PrivateKey.from_private_bytes(raw).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path = tmp_path / "agent.pem"
    path.write_bytes(pem)
    path.chmod(0o600)
    return path


async def test_agent_side_stdio_server_signs_every_call(
    base_url: str, alice: Agent, agent_key_file: Path, registry: Registry, tmp_path: Path
) -> None:
    parameters = agent_side(base_url, agent_key_file, alice.jwks_url, tmp_path)
    async with Client(parameters) as client:
        assert [t.name for t in (await client.list_tools()).tools] == [t.name for t in UCAP_TOOLS]
        wall = await client.call_tool(
            "read_content", {"publisher_id": DEMO_PUBLICATION, "post_id": DEMO_PAID_POST}
        )
        assert wall.structured_content is not None
        assert wall.structured_content["status"] == "payment_required"
        entitlements = await client.call_tool("list_entitlements", {})
        assert entitlements.structured_content == {"entitlements": []}
        with pytest.raises(MCPError) as caught:
            await client.call_tool("read_content", {"post_id": DEMO_PAID_POST})
        assert caught.value.error.code == -32600
        assert caught.value.error.data == {"content": "Missing required field: publisher_id"}
    assert "alice" in registry.fetches  # the API fetched the agent's key set from its JWKS URL


def test_a_key_file_others_can_read_is_refused(agent_key_file: Path) -> None:
    """Whoever reads the agent's key signs as the agent: like ssh, refuse a key left readable."""
    agent_key_file.chmod(0o644)
    refused = CliRunner().invoke(
        cli.app,
        [
            "ucap-mcp",
            "--api",
            "http://127.0.0.1:9",
            "--agent-key",
            str(agent_key_file),
            "--signature-agent",
            "x",
        ],
    )
    assert refused.exit_code == 2
    assert "can be read by others (mode 644): chmod 600 it" in refused.output


async def test_a_stranger_key_is_refused_by_the_agent_side_server(
    base_url: str, alice: Agent, tmp_path: Path
) -> None:
    stranger = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (tmp_path / "stranger.pem").write_bytes(stranger)
    (tmp_path / "stranger.pem").chmod(0o600)
    parameters = agent_side(base_url, tmp_path / "stranger.pem", alice.jwks_url, tmp_path)
    async with Client(parameters) as client:
        with pytest.raises(MCPError) as caught:
            await client.call_tool("list_entitlements", {})
    assert caught.value.error.code == -32001
    assert "unknown_key" in str(caught.value.error.data) or "key" in str(caught.value.error.data)
