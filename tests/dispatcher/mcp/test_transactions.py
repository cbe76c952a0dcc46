"""A USP call over HTTP, REST or MCP, is one transaction: the API key's lookup, the call's
authorization and its work; and a key revoked between two calls refuses the second at once."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import httpx
import httpx2
import pytest
import sqlalchemy as sa
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy.engine import Engine

from tests.dispatcher.conftest import Serve
from tests.dispatcher.mcp.support import ALICE, HAIRCUT, PROFILE, free_slots, ok, outcome, usp, window
from tests.dispatcher.mcp.test_http import RawSession
from usp_core import db
from usp_dispatcher import access
from usp_dispatcher.api.app import create_app
from usp_dispatcher.cli.config import Settings

pytestmark = pytest.mark.anyio


class Transactions:
    """The statements each connection ran, cut where a transaction ended (commit, rollback) or the
    connection went back to the pool."""

    def __init__(self) -> None:
        self.cut: dict[int, list[list[str]]] = defaultdict(lambda: [[]])

    def statement(self, connection: sa.Connection, statement: str) -> None:
        self.cut[id(connection.connection.dbapi_connection)][-1].append(statement)

    def end(self, dbapi_connection: Any) -> None:
        self.cut[id(dbapi_connection)].append([])

    def around(self, marker: str) -> list[str]:
        """The one transaction that ran a statement containing ``marker``."""
        (found,) = [
            statements
            for transactions in self.cut.values()
            for statements in transactions
            if any(marker in statement for statement in statements)
        ]
        return found


@pytest.fixture
def traced(settings: Settings, mcp_engine: Engine) -> Iterator[tuple[Engine, Transactions]]:
    engine = db.make_engine(settings)
    seen = Transactions()
    sa.event.listen(engine, "before_cursor_execute", lambda conn, _c, text, *_: seen.statement(conn, text))
    sa.event.listen(engine, "commit", lambda conn: seen.end(conn.connection.dbapi_connection))
    sa.event.listen(engine, "rollback", lambda conn: seen.end(conn.connection.dbapi_connection))
    sa.event.listen(engine.pool, "checkin", lambda dbapi_connection, _record: seen.end(dbapi_connection))
    yield engine, seen
    engine.dispose()


def _one_transaction(seen: Transactions) -> None:
    """The booking's transaction looked the key up. (A principal's first profile is committed on
    its own before: the tests' first privileged call reads a booking, to bind it.)"""
    statements = seen.around("INSERT INTO sched_bookings")
    assert any("FROM sched_api_keys" in statement for statement in statements), statements
    assert any("FROM sched_principal_profiles" in statement for statement in statements), statements
    assert any("INSERT INTO usp_events" in statement for statement in statements), statements


async def test_an_mcp_tool_call_is_one_transaction(
    settings: Settings, traced: tuple[Engine, Transactions], serve: Serve, acme_key: str
) -> None:
    engine, seen = traced
    base_url = serve(create_app(settings, engine=engine))
    headers = {"Authorization": f"Bearer {acme_key}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http,
        Client(streamable_http_client(f"{base_url}/mcp", http_client=http), mode="legacy") as client,
    ):
        slot = (await free_slots(client))[0]
        await outcome(client, "usp_bookings_get", {"booking_id": "bkg_none", **usp()}, "booking_not_found")
        arguments = {"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": ALICE, **usp()}
        assert (await ok(client, "usp_bookings_create", arguments))["booking"]["state"] == "pending"
    _one_transaction(seen)


def test_a_rest_call_is_one_transaction(
    settings: Settings, traced: tuple[Engine, Transactions], serve: Serve, acme_key: str
) -> None:
    engine, seen = traced
    base_url = serve(create_app(settings, engine=engine))
    headers = {"Authorization": f"Bearer {acme_key}", "USP-Agent": f'profile="{PROFILE}"'}
    with httpx.Client(base_url=base_url, headers=headers, timeout=30) as http:
        slots = http.get("/services/availability", params={"service_id": HAIRCUT, **window()}).json()["slots"]
        assert http.get("/services/bookings/bkg_none").status_code == 200  # binds the profile
        booked = http.post(
            "/services/bookings", json={"service_id": HAIRCUT, "slot_id": slots[0]["id"], "buyer": ALICE}
        )
    assert booked.status_code == 201, booked.text
    _one_transaction(seen)


def test_a_key_revoked_between_two_calls_refuses_the_second(
    settings: Settings, mcp_engine: Engine, serve: Serve, acme_key: str
) -> None:
    """Over MCP on the session the key opened, and over REST: no cached key outlives its row."""
    base_url = serve(create_app(settings))
    mcp = RawSession(base_url, acme_key)
    rest = httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {acme_key}"}, timeout=30)
    with rest:
        answer, _ = mcp.post("tools/call", {"name": "usp_catalog_list", "arguments": {}})
        assert answer["result"]["structuredContent"]["services"]
        assert rest.get("/services/catalog").status_code == 200
        with db.session(mcp_engine) as session:
            (row,) = access.list_api_keys(session)
            assert access.revoke_api_key(session, row.id)
        answer, response = mcp.post("tools/call", {"name": "usp_catalog_list", "arguments": {}})
        assert response.status_code == 401
        assert answer["error"]["code"] == -32001
        assert response.headers["www-authenticate"] == 'Bearer error="invalid_token"'
        refused = rest.get("/services/catalog")
        assert refused.status_code == 401, refused.text
    mcp.http.close()
