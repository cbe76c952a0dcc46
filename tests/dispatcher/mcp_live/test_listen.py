"""Live webhooks for MCP 2026-07-28 clients: the official Python client in its default mode
(stateless, no session) opens ``subscriptions/listen`` with the filter the business publishes and
hears its platform's events, signed in band with the stream's subscription id inside the signature,
verified and deduplicated by ``usp_receiver.mcp``; and the same from a raw HTTP client written from
the spec text."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from anyio.abc import TaskGroup
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from sqlalchemy.engine import Engine

from tests.dispatcher.mcp.support import OTHER_PROFILE, PROFILE, ok, usp
from tests.dispatcher.mcp_live.support import PATIENCE, Platform, emit, wait_until
from tests.dispatcher.support import event
from usp_core import db
from usp_dispatcher import access
from usp_dispatcher.mcp.http import MCPEndpoint
from usp_receiver import JWKS
from usp_receiver.mcp import CURSOR_META_KEY, LISTEN_FILTER_KEY, listen
from usp_workers.engine import outbox

pytestmark = pytest.mark.anyio

HOOK = "http://127.0.0.1:9/hooks"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
#: What a 2026-07-28 request carries in ``_meta`` by the spec, and its HTTP headers.
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": "2026-07-28",
    "Mcp-Method": "subscriptions/listen",
}


@asynccontextmanager
async def modern(
    url: str, platform: Platform | None = None, *, key: str | None = None
) -> AsyncIterator[Client]:
    """The official client as it comes (protocol 2026-07-28, no session), with the platform's
    binding and its API key on every request."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else None
    extensions = [platform.binding.extension] if platform is not None else []
    timeout = httpx2.Timeout(30, read=300)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
        Client(streamable_http_client(url, http_client=http), extensions=extensions) as client,
    ):
        assert client.session.protocol_version == "2026-07-28"
        yield client


async def subscribe(client: Client, profile: str = PROFILE, ordering: str | None = None) -> None:
    arguments: dict[str, Any] = {"url": HOOK, "event_types": ["booking.*"], **usp(profile=profile)}
    if ordering is not None:
        arguments["ordering"] = ordering
    await ok(client, "usp_feed_subscriptions_create", arguments)


@asynccontextmanager
async def listening(
    client: Client, task_group: TaskGroup, profile: str = PROFILE, after: str | None = None
) -> AsyncIterator[None]:
    """A listen stream held in the background for the block."""
    scope = anyio.CancelScope()

    async def hold() -> None:
        with scope:
            await listen(client.session, profile=profile, after=after)

    task_group.start_soon(hold)
    try:
        yield
    finally:
        scope.cancel()


async def test_the_default_client_hears_its_webhooks_on_a_listen_stream(
    base_url: str, engine: Engine, endpoint: MCPEndpoint, acme_key: str, globex_key: str, business_keys: JWKS
) -> None:
    acme, globex = Platform(business_keys), Platform(business_keys)
    hub = endpoint.hub
    assert hub is not None
    url = f"{base_url}/mcp"
    async with (
        modern(url, acme, key=acme_key) as acme_client,
        modern(url, globex, key=globex_key) as globex_client,
        anyio.create_task_group() as task_group,
    ):
        await subscribe(acme_client, PROFILE)
        await subscribe(globex_client, OTHER_PROFILE)
        async with listening(acme_client, task_group), listening(globex_client, task_group, OTHER_PROFILE):
            await wait_until(lambda: len(hub.session_keys) == 2)  # attached before the events
            ours = emit(engine, "booking.confirmed", audience=PROFILE)
            theirs = emit(engine, "booking.confirmed", audience=OTHER_PROFILE)
            business_only = emit(engine, "booking.cancelled", audience="")
            fence = emit(engine, "booking.cancelled", audience=PROFILE)
            await acme.wait_for(fence)
            await globex.wait_for(theirs)
    assert acme.event_ids == [ours, fence]
    assert globex.event_ids == [theirs]
    assert business_only not in acme.event_ids + globex.event_ids
    for received in acme.received:
        # The stream's id rides in _meta, inside what the business signed.
        assert SUBSCRIPTION_ID in received.params["_meta"]
        assert received.verified.kid in {key.kid for key in business_keys}
    assert acme.binding.stats.rejected == 0


async def test_discovery_publishes_the_filter_and_server_discover_the_stream(
    base_url: str, acme_key: str
) -> None:
    async with httpx.AsyncClient() as http:
        profile = (await http.get(f"{base_url}/.well-known/usp")).json()
    assert profile["bindings"]["mcp"]["listen_filter"] == {LISTEN_FILTER_KEY: True}
    assert "2026-07-28" in profile["bindings"]["mcp"]["protocol_versions"]
    async with modern(f"{base_url}/mcp", key=acme_key) as client:
        discovered = await client.session.send_request(
            types.DiscoverRequest(params=types.RequestParams()), types.DiscoverResult
        )
    extension = (discovered.capabilities.extensions or {})["dev.usp-protocol/webhooks"]
    assert extension["listen_filter"] == {LISTEN_FILTER_KEY: True}
    assert extension["method"] == "usp_webhook"


async def test_a_listener_without_credentials_is_refused(base_url: str) -> None:
    async with modern(f"{base_url}/mcp") as client:
        with pytest.raises(MCPError) as refused:
            await listen(client.session, profile=PROFILE)
    assert refused.value.error.code == -32001


async def test_a_client_that_does_not_opt_in_hears_nothing(
    base_url: str, engine: Engine, acme_key: str, business_keys: JWKS
) -> None:
    acme = Platform(business_keys)
    async with modern(f"{base_url}/mcp", acme, key=acme_key) as client:
        await subscribe(client)
        async with client.listen(tools_list_changed=True) as stream:
            assert not stream.honored.tools_list_changed  # nothing of MCP's own is published here
            emit(engine, "booking.confirmed", audience=PROFILE)
            assert [event async for event in stream] == []  # closed by the server, gracefully
        await anyio.sleep(1.0)
    assert acme.received == []


async def test_a_listener_that_names_the_last_event_it_got_hears_what_it_missed_first(
    base_url: str, engine: Engine, acme_key: str, business_keys: JWKS
) -> None:
    acme = Platform(business_keys)
    async with modern(f"{base_url}/mcp", acme, key=acme_key) as client, anyio.create_task_group() as tg:
        await subscribe(client)
        last_seen = emit(engine, "booking.created", audience=PROFILE)
        missed = [emit(engine, "booking.confirmed", audience=PROFILE) for _ in range(3)]
        async with listening(client, tg, after=last_seen):
            await acme.wait_for(missed[-1])
            live = emit(engine, "booking.cancelled", audience=PROFILE)
            await acme.wait_for(live)
    assert acme.event_ids == [*missed, live]
    assert acme.binding.stats.duplicates == 0


async def test_an_unknown_cursor_is_refused_with_the_reason(base_url: str, acme_key: str) -> None:
    async with modern(f"{base_url}/mcp", key=acme_key) as client:
        await subscribe(client)
        with pytest.raises(MCPError) as refused:
            await listen(client.session, profile=PROFILE, after="evt_not_here")
    assert refused.value.error.code == -32602
    assert CURSOR_META_KEY in str(refused.value.error.data)


async def test_revoking_the_key_ends_the_stream(
    base_url: str, engine: Engine, endpoint: MCPEndpoint, acme_key: str, business_keys: JWKS
) -> None:
    acme = Platform(business_keys)
    hub = endpoint.hub
    assert hub is not None
    async with modern(f"{base_url}/mcp", acme, key=acme_key) as client:
        await subscribe(client)
        with anyio.fail_after(PATIENCE):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: listen(client.session, profile=PROFILE))
                await wait_until(lambda: bool(hub.session_keys))
                first = emit(engine, "booking.confirmed", audience=PROFILE)
                await acme.wait_for(first)
                with db.session(engine) as session:
                    (row,) = access.list_api_keys(session)
                    assert access.revoke_api_key(session, row.id)
                after = emit(engine, "booking.cancelled", audience=PROFILE)
                # the server ends the stream: listen() returns and the task group closes
    assert hub.session_keys == frozenset()
    assert acme.event_ids == [first]
    assert after not in acme.event_ids


async def test_a_raw_http_client_written_from_the_spec_hears_the_same(
    base_url: str, engine: Engine, acme_key: str, business_keys: JWKS
) -> None:
    """POST ``subscriptions/listen`` with the 2026 ``_meta``, read the SSE response: the ack first,
    then the signed ``usp_webhook``, each stamped with the request's id."""
    acme = Platform(business_keys)
    async with modern(f"{base_url}/mcp", key=acme_key) as client:
        await subscribe(client)
    request = {
        "jsonrpc": "2.0",
        "id": "raw-1",
        "method": "subscriptions/listen",
        "params": {
            "notifications": {LISTEN_FILTER_KEY: True},
            "_meta": META | {"usp": {"profile": PROFILE}},
        },
    }
    headers = HEADERS | {"Authorization": f"Bearer {acme_key}"}
    frames: list[dict[str, Any]] = []
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(30, read=PATIENCE)) as http,
        http.stream("POST", f"{base_url}/mcp", json=request, headers=headers) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            frames.append(json.loads(line.removeprefix("data:")))
            if len(frames) == 1:
                event_id = emit(engine, "booking.confirmed", audience=PROFILE)
            if len(frames) == 2:
                break
    acknowledged, pushed = frames
    assert acknowledged["method"] == "notifications/subscriptions/acknowledged"
    assert acknowledged["params"]["notifications"] == {LISTEN_FILTER_KEY: True}
    assert acknowledged["params"]["_meta"][SUBSCRIPTION_ID] == "raw-1"
    assert pushed["method"] == "usp_webhook"
    assert "id" not in pushed
    assert pushed["params"]["_meta"][SUBSCRIPTION_ID] == "raw-1"
    assert await acme.binding.handle(pushed["params"]) is not None
    assert acme.event_ids == [event_id]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_thousand_events_reach_fifty_listeners_once_each_in_order_per_subject(
    base_url: str, engine: Engine, endpoint: MCPEndpoint, business_keys: JWKS
) -> None:
    """25 platforms with ordered subscriptions, two listen streams each (raw HTTP, as above);
    1,000 events over 125 bookings: each stream gets its platform's 40, once, in order per
    booking, each verifying under the business's keys with its own subscription id signed in."""
    profiles = [f"https://platform{n}.example/profile.json" for n in range(25)]
    keys = {}
    with db.session(engine) as session:
        for n, profile in enumerate(profiles):
            keys[profile] = access.issue_api_key(session, f"platform{n}")
    for profile in profiles:
        async with modern(f"{base_url}/mcp", key=keys[profile]) as client:
            await subscribe(client, profile, ordering="subject")
    hub = endpoint.hub
    assert hub is not None
    bookings = {profile: [f"bkg_{n}_{b}" for b in range(5)] for n, profile in enumerate(profiles)}
    streams: dict[tuple[str, int], list[dict[str, Any]]] = {}

    async def listen_raw(http: httpx.AsyncClient, profile: str, index: int) -> None:
        frames = streams[(profile, index)] = []
        request = {
            "jsonrpc": "2.0",
            "id": f"{index}",
            "method": "subscriptions/listen",
            "params": {
                "notifications": {LISTEN_FILTER_KEY: True},
                "_meta": META | {"usp": {"profile": profile}},
            },
        }
        headers = HEADERS | {"Authorization": f"Bearer {keys[profile]}"}
        async with http.stream("POST", f"{base_url}/mcp", json=request, headers=headers) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    frames.append(json.loads(line.removeprefix("data:")))
                    if len(frames) == 41:  # the acknowledgment and 40 events
                        return

    async with (
        httpx.AsyncClient(
            timeout=httpx.Timeout(30, read=PATIENCE * 4), limits=httpx.Limits(max_connections=60)
        ) as http,
        anyio.create_task_group() as task_group,
    ):
        for profile in profiles:
            for index in range(2):
                task_group.start_soon(listen_raw, http, profile, index)
        await wait_until(lambda: len(hub.session_keys) == 50)
        sent: dict[str, list[str]] = {profile: [] for profile in profiles}
        for n in range(1000):
            profile = profiles[n % 25]
            booking_id = bookings[profile][(n // 25) % 5]
            body = event("booking.confirmed", booking_id=booking_id)
            body["data"] = body["data"] | {"id": booking_id}
            with db.session(engine) as session:
                outbox.emit(session, body, audience=profile)
                session.commit()
            sent[profile].append(body["event_id"])
    platforms = {profile: Platform(business_keys) for profile in profiles}
    for (profile, index), frames in streams.items():
        acknowledged, *pushed = frames
        assert acknowledged["method"] == "notifications/subscriptions/acknowledged"
        ids = [frame["params"]["event_id"] for frame in pushed]
        assert sorted(ids) == sorted(sent[profile])  # once each, none of another platform's
        for booking_id in bookings[profile]:
            mine = [f["params"]["event_id"] for f in pushed if f["params"]["booking_id"] == booking_id]
            assert mine == [e for e in sent[profile] if e in set(mine)]  # in the order written
        assert {frame["params"]["_meta"][SUBSCRIPTION_ID] for frame in pushed} == {f"{index}"}
        if index == 0:  # every notification of one stream per platform verified in full
            for frame in pushed:
                assert await platforms[profile].binding.handle(frame["params"]) is not None
    for profile, platform in platforms.items():
        assert platform.event_ids == sent[profile]
        assert platform.binding.stats.rejected == 0
