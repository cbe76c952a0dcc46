"""A platform on the TypeScript MCP SDK (``@modelcontextprotocol/sdk``, a 2025-11-25 session) still
hears its webhooks: ``tests/node/mcp_session.test.mjs`` under Node's test runner books through the
API under uvicorn and receives the ``usp_webhook``, which verifies here against the business's
published keys (``usp_receiver.mcp``)."""

from __future__ import annotations

import json
from pathlib import Path

import anyio.to_thread
import pytest
from sqlalchemy.engine import Engine

from tests.dispatcher.mcp.support import PROFILE
from tests.dispatcher.mcp_live.support import Platform
from tests.nodejs import node_test
from usp_core import db
from usp_dispatcher import access
from usp_receiver import JWKS
from usp_receiver.mcp import NotificationOutcome

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)]


async def test_a_typescript_sdk_session_hears_its_booking(
    base_url: str, engine: Engine, business_keys: JWKS, tmp_path: Path
) -> None:
    with db.session(engine) as session:
        key = access.issue_api_key(session, "ts-platform")
    out = tmp_path / "heard.json"
    environment = {
        "USP_MCP_URL": f"{base_url}/mcp",
        "USP_API_KEY": key,
        "USP_PROFILE": PROFILE,
        "USP_OUT": str(out),
    }
    report = await anyio.to_thread.run_sync(node_test, "mcp_session.test.mjs", environment)
    assert "# pass 1" in report, report
    params = json.loads(out.read_text())
    platform = Platform(business_keys)
    assert await platform.binding.handle(params) is NotificationOutcome.ACCEPTED
    assert platform.received[0].event.event == "booking.created"
