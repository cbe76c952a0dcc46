"""The tools over Streamable HTTP (the API's ``/mcp`` under a real uvicorn), the discovery
document, and a Hypothesis fuzz of ``tools/call`` arguments against the running server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy.engine import Engine
from sqlmodel import col, select

from tests.dispatcher.conftest import Serve
from tests.dispatcher.mcp.support import ALICE, HAIRCUT, PROFILE, free_slots, ok, refused, usp
from tests.dispatcher.mcp.test_tools import TOOL_NAMES
from usp_core import db
from usp_dispatcher.api.app import create_app
from usp_dispatcher.cli.config import Settings
from usp_schemas import EVENT_TYPES, OUTCOME_CODES, USP_VERSION
from usp_workers.storage.models import EventRecord

pytestmark = pytest.mark.anyio


@pytest.fixture
def base_url(settings: Settings, mcp_engine: Engine, serve: Serve) -> str:
    return serve(create_app(settings))


@asynccontextmanager
async def over_http(base_url: str, headers: dict[str, str] | None = None) -> AsyncIterator[Client]:
    """The official client on a Streamable HTTP session, ``headers`` on every request."""
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http,
        Client(streamable_http_client(f"{base_url}/mcp", http_client=http), mode="legacy") as client,
    ):
        yield client


async def test_http_credentials_authenticate_the_tools(
    base_url: str, mcp_engine: Engine, acme_key: str
) -> None:
    """SHOULD 3 over HTTP: the Authorization header, no credential in ``_meta``; the
    ``USP-Correlation-Id`` header reaches the events."""
    headers = {"Authorization": f"Bearer {acme_key}", "USP-Correlation-Id": "http-corr-1"}
    async with over_http(base_url, headers) as client:
        slot = (await free_slots(client))[0]
        body = await ok(
            client,
            "usp_bookings_create",
            {"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": ALICE, **usp()},
        )
        assert body["booking_scoped_credential"]["credential"]
    async with over_http(base_url) as anonymous:
        await refused(
            anonymous,
            "usp_bookings_create",
            {"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": ALICE, **usp()},
            -32001,
        )
    with db.session(mcp_engine) as session:
        record = session.exec(
            select(EventRecord).where(col(EventRecord.event_type) == "booking.created")
        ).one()
    assert record.correlation_id == "http-corr-1"


def test_the_business_profile_names_the_tools_policy_and_webhooks(base_url: str, settings: Settings) -> None:
    response = httpx.get(f"{base_url}/.well-known/usp")
    assert response.status_code == 200
    assert "max-age" in response.headers["cache-control"]
    profile = response.json()
    base = settings.public_base_url.rstrip("/")
    assert profile["usp"]["version"] == USP_VERSION
    assert "dev.usp-protocol.services.availability" in profile["usp"]["capabilities"]
    assert profile["bindings"]["mcp"]["endpoint"] == f"{base}/mcp"
    assert {t["name"]: t["x-usp-access"] for t in profile["tools"]} == TOOL_NAMES
    assert "bearer" in profile["authorization"]["mechanisms"]
    assert profile["webhooks"]["jwks_uri"] == f"{base}/.well-known/usp/jwks.json"
    assert profile["webhooks"]["event_types"] == list(EVENT_TYPES)
    assert httpx.get(f"{base_url}/.well-known/usp/jwks.json").json()["keys"]


# ------------------------------------------------------------------------------------ the fuzz


class RawSession:
    """A Streamable HTTP session driven by hand, to send what the SDK client would not."""

    def __init__(self, base_url: str, key: str) -> None:
        self.http = httpx.Client(
            base_url=base_url,
            timeout=60,
            headers={"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"},
        )
        self.next_id = 0
        answer, response = self.post(
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "fuzz", "version": "0"},
            },
        )
        assert "result" in answer
        self.http.headers["mcp-session-id"] = response.headers["mcp-session-id"]
        self.http.headers["mcp-protocol-version"] = "2025-06-18"
        self.http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, method: str, params: Any) -> tuple[dict[str, Any], httpx.Response]:
        self.next_id += 1
        body = json.dumps(
            {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}, allow_nan=False
        )
        response = self.http.post("/mcp", content=body, headers={"Content-Type": "application/json"})
        assert response.status_code < 500, response.text
        assert "Traceback" not in response.text
        assert 'File "' not in response.text
        return _message(response), response


def _message(response: httpx.Response) -> dict[str, Any]:
    if response.headers["content-type"].startswith("text/event-stream"):
        data = [
            line.removeprefix("data:").strip()
            for line in response.text.splitlines()
            if line.startswith("data:")
        ]
        messages = [json.loads(d) for d in data if d]
        (answer,) = [m for m in messages if "id" in m]
        return dict(answer)
    return dict(response.json())


@pytest.fixture
def raw_session(base_url: str, acme_key: str) -> Iterator[RawSession]:
    session = RawSession(base_url, acme_key)
    yield session
    session.http.close()


def test_broken_bodies_get_the_binding_errors_as_over_stdio(raw_session: RawSession) -> None:
    secret = "sk_live_do_not_echo_me"
    for body, code, word, id_ in (
        ("{this is not json", -32700, "parse_error", None),
        (b"\xff\xfe{", -32700, "parse_error", None),
        ('{"jsonrpc": "2.0", "id": 1, "method": NaN}', -32700, "parse_error", None),
        ("[1, 2, 3]", -32600, "invalid_request", None),
        (json.dumps({"jsonrpc": "2.0", "id": 7, "method": {"x": secret}}), -32600, "invalid_request", 7),
        (json.dumps({"jsonrpc": "1.0", "id": "a", "method": "ping"}), -32600, "invalid_request", "a"),
        (json.dumps({"hello": secret}), -32600, "invalid_request", None),
    ):
        response = raw_session.http.post("/mcp", content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == 400, response.text
        answer = response.json()
        assert answer["jsonrpc"] == "2.0"
        assert answer["id"] == id_
        assert answer["error"]["code"] == code
        assert answer["error"]["message"] == word
        assert set(answer["error"]["data"]) == {"content"}
        assert secret not in response.text
    # The session still answers afterwards.
    answer, _ = raw_session.post("tools/call", {"name": "usp_catalog_list", "arguments": {}})
    assert answer["result"]["structuredContent"]["services"]


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**60), 2**60) | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
_ids = st.text(max_size=20) | st.sampled_from(["\x00", "bkg_\x00", "wl_\u202e", "sub_" + "9" * 200])
_names = st.sampled_from(sorted(TOOL_NAMES)) | st.text(max_size=30)
_known = st.fixed_dictionaries(
    {},
    optional={
        "service_id": st.sampled_from([HAIRCUT, "svc_nope", ""]) | _json,
        "slot_id": _ids | _json,
        "booking_id": _ids | _json,
        "waitlist_entry_id": _ids | _json,
        "subscription_id": _ids | _json,
        "start_date": st.dates().map(str) | _json,
        "end_date": st.dates().map(str) | _json,
        "buyer": st.just(ALICE) | _json,
        "url": st.sampled_from(["http://127.0.0.1:9/x", "ftp://x", "http://10.0.0.1/"]) | _json,
        "event_types": st.lists(st.sampled_from(["*", "booking.*", "nope.*"]), max_size=3) | _json,
        "limit": st.integers(-5, 500) | _json,
        "_meta": st.fixed_dictionaries(
            {},
            optional={
                "usp": st.fixed_dictionaries(
                    {},
                    optional={
                        "profile": st.just(PROFILE) | _json,
                        "idempotency_key": st.text(max_size=300) | _json,
                        "correlation_id": st.text(max_size=200) | _json,
                        "authorization": _json,
                        "platform_key": _json,
                    },
                )
                | _json
            },
        )
        | _json,
    },
)
_arguments = st.one_of(_known, st.dictionaries(st.text(max_size=12), _json, max_size=5), _json)
_ERROR_CODES = {-32600, -32601, -32602, -32603, -32001, -32003}


@hypothesis_settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(name=_names, arguments=_arguments)
def test_fuzzed_tool_calls_get_a_protocol_error_or_a_result_never_a_crash(
    raw_session: RawSession, name: str, arguments: Any
) -> None:
    answer, _ = raw_session.post("tools/call", {"name": name, "arguments": arguments})
    if "error" in answer:
        error = answer["error"]
        assert error["code"] in _ERROR_CODES, error
        assert error["code"] != -32603, error  # nothing a caller sends may break the server
        assert isinstance(error["data"]["content"], str)
        return
    structured = answer["result"]["structuredContent"]
    assert structured["usp"]["version"] == USP_VERSION
    for message in structured["messages"]:
        assert message["code"] in (*OUTCOME_CODES, "waitlist_entry_not_found", "subscription_not_found"), (
            message
        )
