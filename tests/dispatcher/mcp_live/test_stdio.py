"""Live webhooks over stdio: ``usp-webhooks mcp`` as a child process (its own hub, tailing the
shared database), the official client with the platform's notification binding."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from sqlalchemy.engine import Engine

from tests.dispatcher.conftest import ADMIN_TOKEN
from tests.dispatcher.mcp.support import OTHER_PROFILE, PROFILE, ok, usp
from tests.dispatcher.mcp_live.support import Platform, emit
from usp_core import db, keys
from usp_dispatcher import access
from usp_dispatcher.cli.config import Settings
from usp_receiver import JWKS

pytestmark = pytest.mark.anyio


def usp_webhooks_mcp(settings: Settings, cwd: Path) -> StdioServerParameters:
    """How a platform's agent starts the business's stdio server (the console script's module)."""
    env = {
        "USP_DATABASE_URL": settings.database_url,
        "USP_BROKER_URL": str(settings.broker_url),
        "USP_ADMIN_TOKEN": ADMIN_TOKEN,
        "USP_ALLOW_PRIVATE_TARGETS": "true",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    return StdioServerParameters(
        command=sys.executable, args=["-m", "usp_dispatcher.cli", "mcp"], env=env, cwd=str(cwd)
    )


@pytest.mark.parametrize("mode", ["legacy", "auto"])  # the handshake era, and whatever the client picks
async def test_a_stdio_session_hears_its_profiles_events(
    keyed: Engine, settings: Settings, tmp_path: Path, mode: str
) -> None:
    with db.session(keyed) as session:
        acme_key = access.issue_api_key(session, "acme")
        published = JWKS.from_dict(keys.published_jwks(session, settings))
    acme = Platform(published)
    parameters = usp_webhooks_mcp(settings, tmp_path)
    async with Client(parameters, mode=mode, extensions=[acme.binding.extension]) as client:
        subscription = {"url": "http://127.0.0.1:9/hooks", "event_types": ["booking.*"]}
        await ok(
            client, "usp_feed_subscriptions_create", {**subscription, **usp(profile=PROFILE, key=acme_key)}
        )
        mine = emit(keyed, "booking.created", audience=PROFILE)
        not_mine = emit(keyed, "booking.created", audience=OTHER_PROFILE)
        fence = emit(keyed, "booking.confirmed", audience=PROFILE)
        await acme.wait_for(fence)
    assert acme.event_ids == [mine, fence]
    assert not_mine not in acme.event_ids
    assert acme.binding.stats.rejected == 0
