"""Live webhooks over Streamable HTTP: the whole API under uvicorn on 127.0.0.1, platforms on the
official MCP client (stateful sessions), each verifying and deduplicating what it hears with
``usp_receiver.mcp.NotificationBinding`` against the business's published JWKS."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from sqlalchemy.engine import Engine

from tests.dispatcher.conftest import MakeSettings, Serve
from tests.dispatcher.mcp.support import OTHER_PROFILE, PROFILE, book, free_slots, ok, usp
from tests.dispatcher.mcp_live.support import Platform, connect, emit, proxied, wait_until
from usp_core import db
from usp_dispatcher import access
from usp_dispatcher.api.app import create_app
from usp_dispatcher.mcp.http import MCPEndpoint
from usp_receiver import JWKS

pytestmark = pytest.mark.anyio

HOOK = "http://127.0.0.1:9/hooks"  # the platform's REST receiver (never reached here)
ACCEPT = "application/json, text/event-stream"


async def subscribe(
    client: Any, profile: str = PROFILE, event_types: tuple[str, ...] = ("booking.*",)
) -> None:
    """Subscribe the profile (a privileged call: it also attaches this session to the profile)."""
    arguments = {"url": HOOK, "event_types": list(event_types), **usp(profile=profile)}
    await ok(client, "usp_feed_subscriptions_create", arguments)


def only_session(endpoint: MCPEndpoint) -> str:
    hub = endpoint.hub
    assert hub is not None
    (key,) = hub.session_keys
    return key.removeprefix("http:")


async def test_a_platform_hears_its_own_bookings_and_another_platform_does_not(
    base_url: str, engine: Engine, acme_key: str, globex_key: str, business_keys: JWKS
) -> None:
    acme, globex = Platform(business_keys), Platform(business_keys)
    url = f"{base_url}/mcp"
    async with (
        connect(url, acme, key=acme_key) as acme_client,
        connect(url, globex, key=globex_key) as globex_client,
    ):
        await subscribe(acme_client, PROFILE)
        await subscribe(globex_client, OTHER_PROFILE)

        slot = (await free_slots(acme_client))[0]
        booked = await book(acme_client, slot["id"], key=acme_key, correlation_id="corr-live")
        booking_id = booked["booking"]["id"]
        await wait_until(lambda: bool(acme.received))
        (created,) = acme.received
        assert created.event.event == "booking.created"
        assert created.params["booking_id"] == booking_id
        assert created.params["_meta"]["usp"]["correlation_id"] == "corr-live"  # the join id, echoed
        assert created.verified.kid in {key.kid for key in business_keys}

        catalog = emit(engine, "catalog.service.updated", audience=None)  # public, but not booking.*
        business_only = emit(engine, "booking.confirmed", audience="")
        globex_booking = emit(engine, "booking.confirmed", audience=OTHER_PROFILE)
        fence = emit(engine, "booking.cancelled", audience=PROFILE)
        await acme.wait_for(fence)
        await globex.wait_for(globex_booking)

    assert acme.event_ids == [created.event.event_id, fence]
    assert globex.event_ids == [globex_booking]  # never acme's booking, though it subscribes to booking.*
    assert catalog not in acme.event_ids
    assert business_only not in acme.event_ids + globex.event_ids
    for platform in (acme, globex):
        assert platform.binding.stats.rejected == 0
        assert platform.binding.stats.duplicates == 0


async def test_a_client_cut_off_gets_every_missed_notification_once_when_it_reconnects(
    base_url: str, engine: Engine, endpoint: MCPEndpoint, acme_key: str, business_keys: JWKS
) -> None:
    acme = Platform(business_keys)
    async with proxied(base_url) as proxy, connect(proxy.url("/mcp"), acme, key=acme_key) as client:
        await subscribe(client)
        session_id = only_session(endpoint)
        first = emit(engine, "booking.created", audience=PROFILE)
        await acme.wait_for(first)

        await proxy.cut()  # the network goes; the client's GET stream breaks
        held = endpoint.buffered(session_id)
        missed = [emit(engine, "booking.confirmed", audience=PROFILE) for _ in range(3)]
        await wait_until(lambda: endpoint.buffered(session_id) == held + len(missed))
        assert acme.event_ids == [first]
        proxy.resume()  # the client reconnects with Last-Event-ID

        for event_id in missed:
            await acme.wait_for(event_id)
        after = emit(engine, "booking.cancelled", audience=PROFILE)  # and stays live
        await acme.wait_for(after)

    assert acme.event_ids == [first, *missed, after]
    assert acme.binding.stats.duplicates == 0
    assert acme.binding.stats.rejected == 0
    resumed = [
        head for head in proxy.heads if head.startswith(b"GET ") and b"\r\nlast-event-id:" in head.lower()
    ]
    assert resumed, "the client did not resume with Last-Event-ID"


async def test_another_sessions_last_event_id_replays_nothing_of_ours(
    base_url: str, engine: Engine, endpoint: MCPEndpoint, acme_key: str, globex_key: str, business_keys: JWKS
) -> None:
    """The SDK's standalone stream has the same id in every session; with one store for all, any
    session could name another's event id and be replayed its notifications."""
    acme = Platform(business_keys)
    async with proxied(base_url) as proxy, connect(proxy.url("/mcp"), acme, key=acme_key) as client:
        await subscribe(client)
        acme_session = only_session(endpoint)
        secret = emit(engine, "booking.created", audience=PROFILE)
        await acme.wait_for(secret)
        more = emit(engine, "booking.confirmed", audience=PROFILE)
        await acme.wait_for(more)
        acme_ids = proxy.event_ids()
        assert acme_ids

        # Another session, even one opened with the same credential, names acme's ids.
        async with raw_session(base_url, acme_key) as (other, other_session):
            for event_id in acme_ids:
                replay = await other.get("/mcp", headers=stream_headers(other_session, event_id))
                assert replay.status_code == 200
                assert "data:" not in replay.text
                assert secret not in replay.text
                assert more not in replay.text

        # And acme's own session answers only to acme's credential.
        for key in (globex_key, None):
            async with raw_session(base_url, key) as (intruder, _):
                denied = await intruder.get("/mcp", headers=stream_headers(acme_session, acme_ids[0]))
                assert denied.status_code == 404
                assert secret not in denied.text


async def test_events_written_before_the_session_attached_are_not_pushed(
    base_url: str, engine: Engine, acme_key: str, business_keys: JWKS
) -> None:
    """Our choice: a live session is a live feed from the moment it attaches (its first privileged
    call), never a backlog; what happened before reaches the platform over REST."""
    acme = Platform(business_keys)
    async with connect(f"{base_url}/mcp", acme, key=acme_key) as client:
        before = emit(engine, "booking.created", audience=PROFILE)
        await subscribe(client)
        after = emit(engine, "booking.created", audience=PROFILE)
        await acme.wait_for(after)
    assert acme.event_ids == [after]
    assert before not in acme.event_ids


async def test_a_closed_session_is_detached_and_the_others_still_hear(
    base_url: str, engine: Engine, endpoint: MCPEndpoint, acme_key: str, business_keys: JWKS
) -> None:
    staying, leaving = Platform(business_keys), Platform(business_keys)
    url = f"{base_url}/mcp"
    hub = endpoint.hub
    assert hub is not None
    async with connect(url, staying, key=acme_key) as staying_client:
        await subscribe(staying_client)
        async with connect(url, leaving, key=acme_key) as leaving_client:
            await ok(leaving_client, "usp_feed_subscriptions_list", usp(profile=PROFILE))
            assert len(hub.session_keys) == 2
            both = emit(engine, "booking.created", audience=PROFILE)
            await staying.wait_for(both)
            await leaving.wait_for(both)
        # The client closed (DELETE): its session is gone, and the hub lets go of it.
        await wait_until(lambda: len(hub.session_keys) == 1)
        later = emit(engine, "booking.confirmed", audience=PROFILE)
        await staying.wait_for(later)
    assert staying.event_ids == [both, later]
    assert leaving.event_ids == [both]


async def test_an_invalid_credential_is_answered_401_with_a_json_rpc_error(base_url: str) -> None:
    body = initialize(7)
    async with httpx.AsyncClient(base_url=base_url) as http:
        response = await http.post(
            "/mcp", json=body, headers={**POST_HEADERS, "Authorization": "Bearer usp_not_a_real_key"}
        )
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    error = response.json()
    assert error["jsonrpc"] == "2.0"
    assert error["id"] == 7
    assert error["error"]["code"] == -32001
    assert error["error"]["message"] == "unauthenticated"
    assert error["error"]["data"]["content"]
    assert "usp_not_a_real_key" not in response.text


async def test_a_foreign_host_or_origin_is_refused(base_url: str) -> None:
    """DNS rebinding: a page on another site must not drive the local endpoint."""
    async with httpx.AsyncClient(base_url=base_url) as http:
        rebound = await http.post(
            "/mcp", json=initialize(1), headers={**POST_HEADERS, "Host": "evil.example"}
        )
        foreign = await http.post(
            "/mcp", json=initialize(1), headers={**POST_HEADERS, "Origin": "https://evil.example"}
        )
        local = await http.post("/mcp", json=initialize(1), headers={**POST_HEADERS, "Origin": base_url})
    assert rebound.status_code == 421
    assert foreign.status_code == 403
    assert local.status_code == 200


# -- speaking the transport by hand -----------------------------------------------------------------

POST_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def initialize(request_id: int) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }


def stream_headers(session_id: str, last_event_id: str) -> dict[str, str]:
    return {"Accept": "text/event-stream", "Mcp-Session-Id": session_id, "Last-Event-ID": last_event_id}


class raw_session:
    """An initialized session spoken by hand (to send what a well-behaved client never would)."""

    def __init__(self, base_url: str, key: str | None) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        self._http = httpx.AsyncClient(base_url=base_url, headers=headers)

    async def __aenter__(self) -> tuple[httpx.AsyncClient, str]:
        opened = await self._http.post("/mcp", json=initialize(1), headers=POST_HEADERS)
        assert opened.status_code == 200, opened.text
        session_id = opened.headers["mcp-session-id"]
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        done = await self._http.post(
            "/mcp", json=initialized, headers={**POST_HEADERS, "Mcp-Session-Id": session_id}
        )
        assert done.status_code == 202, done.text
        return self._http, session_id

    async def __aexit__(self, *exc_info: object) -> None:
        await self._http.aclose()


async def test_an_in_band_bearer_does_not_attach_a_session_no_transport_credential_opened(
    base_url: str, endpoint: MCPEndpoint, acme_key: str, business_keys: JWKS
) -> None:
    """A session opened without ``Authorization`` is bound to nobody: anyone holding its id may
    read its stream. A privileged call authenticated only in-band (``_meta.usp.authorization``)
    is served, but the platform's events are not pushed into such a session."""
    platform = Platform(business_keys)
    hub = endpoint.hub
    assert hub is not None
    async with connect(f"{base_url}/mcp", platform) as client:  # no transport credential
        arguments = {"url": HOOK, "event_types": ["booking.*"], **usp(profile=PROFILE, key=acme_key)}
        await ok(client, "usp_feed_subscriptions_create", arguments)
        assert hub.session_keys == frozenset()


async def test_revoking_the_platforms_api_key_stops_the_pushes_to_its_open_session(
    base_url: str, engine: Engine, endpoint: MCPEndpoint, acme_key: str, business_keys: JWKS
) -> None:
    """An open GET stream keeps a session alive for as long as the client holds it; revoking the
    key that opened it must end what the business pushes there, not only the next request."""
    platform = Platform(business_keys)
    hub = endpoint.hub
    assert hub is not None
    async with connect(f"{base_url}/mcp", platform, key=acme_key) as client:
        await subscribe(client)
        before = emit(engine, "booking.created", audience=PROFILE)
        await platform.wait_for(before)
        with db.session(engine) as session:
            (row,) = access.list_api_keys(session)
            assert access.revoke_api_key(session, row.id)
        after = emit(engine, "booking.confirmed", audience=PROFILE)
        await wait_until(lambda: hub.session_keys == frozenset())
    assert platform.event_ids == [before]
    assert after not in platform.event_ids


async def test_an_abandoned_session_is_closed_once_idle_and_a_listening_one_is_not(
    make_settings: MakeSettings, serve: Serve, engine: Engine, business_keys_for: Callable[[str], JWKS]
) -> None:
    """``USP_MCP_SESSION_IDLE_SECONDS``: a session its client left without ``DELETE`` is closed
    once nothing was in flight for that long, and its memory (transport, replay store) goes with
    it; a session whose notification stream is open is in flight, so it stays."""
    app = create_app(make_settings(mcp_session_idle_seconds=1.0))
    base_url = serve(app)
    endpoint: MCPEndpoint = app.state.mcp
    running = endpoint._running
    assert running is not None
    manager = running.manager
    with db.session(engine) as session:
        key = access.issue_api_key(session, "acme")
    url = f"{base_url}/mcp"

    headers = {"Authorization": f"Bearer {key}"}
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        transport = streamable_http_client(url, http_client=http, terminate_on_close=False)
        async with Client(transport, mode="legacy") as abandoned:
            await ok(abandoned, "usp_catalog_list", {})
            (abandoned_id,) = manager._server_instances
    assert manager.session_alive(abandoned_id)  # no DELETE was sent

    listener = Platform(business_keys_for(base_url))
    async with connect(url, listener, key=key) as listening:
        await subscribe(listening)
        await wait_until(lambda: not manager.session_alive(abandoned_id))
        (listening_id,) = manager._server_instances
        await anyio.sleep(2.0)  # twice the idle timeout, with only the notification stream open
        assert manager.session_alive(listening_id)
        pushed = emit(engine, "booking.created", audience=PROFILE)
        await listener.wait_for(pushed)
    gc.collect()
    assert abandoned_id not in manager._stores  # its replay buffer was freed with it
    async with httpx.AsyncClient() as http:
        response = await http.post(
            url,
            headers=headers | {"Mcp-Session-Id": abandoned_id, "Accept": ACCEPT},
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        )
    assert response.status_code == 404
