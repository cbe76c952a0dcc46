"""Every USP MCP tool through the official client: its success path and each business outcome it
can answer, on the seeded demo catalog."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from mcp import Client
from sqlalchemy.engine import Engine
from sqlmodel import col, select

from tests.dispatcher.conftest import ADMIN_TOKEN, MakeSettings
from tests.dispatcher.mcp.conftest import connect
from tests.dispatcher.mcp.support import (
    ALICE,
    BOB,
    HAIRCUT,
    OTHER_PROFILE,
    PROFILE,
    book,
    free_slots,
    ok,
    outcome,
    refused,
    usp,
    window,
)
from usp_core import db
from usp_dispatcher.cli.config import Settings
from usp_dispatcher.mcp import build_server
from usp_dispatcher.mcp.live import LiveHub
from usp_dispatcher.mcp.server import STDIO_SESSION
from usp_dispatcher.scheduling.tables import BookingRow, WaitlistRow
from usp_workers.storage.models import EventRecord, Subscription

pytestmark = pytest.mark.anyio

TOOL_NAMES = {
    "usp_catalog_list": "public",
    "usp_availability_query": "public",
    "usp_bookings_create": "privileged_platform",
    "usp_bookings_get": "privileged_scoped",
    "usp_bookings_confirm": "business_only",
    "usp_bookings_cancel": "privileged_scoped",
    "usp_bookings_reschedule": "privileged_scoped",
    "usp_waitlist_join": "privileged_platform",
    "usp_waitlist_leave": "privileged_platform",
    "usp_feed_subscriptions_create": "privileged_platform",
    "usp_feed_subscriptions_list": "privileged_platform",
    "usp_feed_subscriptions_delete": "privileged_platform",
}


def business(**extra: Any) -> dict[str, Any]:
    return usp(profile=None, key=ADMIN_TOKEN, **extra)


async def test_tools_list_names_every_tool_with_its_access_class(
    mcp_engine: Engine, settings: Settings
) -> None:
    async with connect(mcp_engine, settings) as client:
        listed = (await client.list_tools()).tools
    tools = [t for t in listed if "x-usp-access" in (t.meta or {})]
    assert {t.name: (t.meta or {}).get("x-usp-access") for t in tools} == TOOL_NAMES
    for tool in tools:
        assert tool.description
        assert tool.input_schema["type"] == "object"
        assert "_meta" in tool.input_schema["properties"], tool.name
    # the rest are UCAP's five, defined by their own seed (tests/dispatcher/ucap/test_mcp.py)
    assert [t.name for t in listed if t not in tools] == [
        "search_catalog",
        "get_catalog_item",
        "read_content",
        "subscribe",
        "list_entitlements",
    ]


async def test_catalog_list(mcp_engine: Engine, settings: Settings) -> None:
    async with connect(mcp_engine, settings) as client:
        body = await ok(client, "usp_catalog_list", {})
    assert HAIRCUT in {s["id"] for s in body["services"]}
    assert body["usp"]["capabilities"] == {"dev.usp-protocol.services.catalog": [{"version": "2026-08-20"}]}


async def test_availability_query_and_its_outcomes(mcp_engine: Engine, settings: Settings) -> None:
    async with connect(mcp_engine, settings) as client:
        slots = await free_slots(client)
        assert all(s["service_id"] == HAIRCUT and s["state"] == "available" for s in slots)
        await outcome(
            client, "usp_availability_query", {"service_id": "svc_nope", **window()}, "service_not_found"
        )
        text = await refused(
            client,
            "usp_availability_query",
            {"service_id": HAIRCUT, "start_date": "2026-03-16", "end_date": "2026-03-15"},
            -32602,
        )
    assert "end_date" in text


async def test_bookings_create_and_its_outcomes(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    async with connect(mcp_engine, settings) as client:
        slot = (await free_slots(client))[0]
        body = await book(client, slot["id"], key=acme_key)
        booking = body["booking"]
        assert (booking["slot_id"], booking["state"], booking["buyer"]) == (slot["id"], "pending", ALICE)
        credential = body["booking_scoped_credential"]
        assert credential["mechanism"] == "booking_scoped_credential"
        assert credential["credential"]
        await outcome(
            client,
            "usp_bookings_create",
            {"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": BOB, **usp(key=acme_key)},
            "slot_unavailable",
        )
        await outcome(
            client,
            "usp_bookings_create",
            {"service_id": "svc_nope", "slot_id": slot["id"], "buyer": BOB, **usp(key=acme_key)},
            "service_not_found",
        )
    with db.session(mcp_engine) as session:
        row = session.get(BookingRow, booking["id"])
        assert row is not None
        assert row.platform_profile == PROFILE


async def test_bookings_get_and_booking_not_found(
    mcp_engine: Engine, settings: Settings, acme_key: str, globex_key: str
) -> None:
    async with connect(mcp_engine, settings) as client:
        booking = (await book(client, (await free_slots(client))[0]["id"], key=acme_key))["booking"]
        got = await ok(client, "usp_bookings_get", {"booking_id": booking["id"], **usp(key=acme_key)})
        assert got["booking"] == booking
        await outcome(
            client, "usp_bookings_get", {"booking_id": "bkg_nope", **usp(key=acme_key)}, "booking_not_found"
        )
        # Another platform's booking is, to this one, not there.
        other = {"booking_id": booking["id"], **usp(profile=OTHER_PROFILE, key=globex_key)}
        await outcome(client, "usp_bookings_get", other, "booking_not_found")
        # The business sees every booking (a privileged method: it names a profile too).
        as_business = {"booking_id": booking["id"], **usp(profile=OTHER_PROFILE, key=ADMIN_TOKEN)}
        assert (await ok(client, "usp_bookings_get", as_business))["booking"] == booking


async def test_bookings_confirm_by_the_business_and_invalid_state_transition(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    async with connect(mcp_engine, settings) as client:
        booking = (await book(client, (await free_slots(client))[0]["id"], key=acme_key))["booking"]
        confirmed = await ok(client, "usp_bookings_confirm", {"booking_id": booking["id"], **business()})
        assert confirmed["booking"]["state"] == "confirmed"
        await outcome(
            client,
            "usp_bookings_confirm",
            {"booking_id": booking["id"], **business()},
            "invalid_state_transition",
        )
        await outcome(
            client, "usp_bookings_confirm", {"booking_id": "bkg_nope", **business()}, "booking_not_found"
        )
        # A platform may not confirm, not even its own booking.
        await refused(
            client, "usp_bookings_confirm", {"booking_id": booking["id"], **usp(key=acme_key)}, -32003
        )


async def test_bookings_cancel_and_invalid_state_transition(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    async with connect(mcp_engine, settings) as client:
        slot = (await free_slots(client))[0]
        booking = (await book(client, slot["id"], key=acme_key))["booking"]
        arguments = {"booking_id": booking["id"], "reason": "buyer is ill", **usp(key=acme_key)}
        cancelled = await ok(client, "usp_bookings_cancel", arguments)
        assert cancelled["booking"]["state"] == "cancelled"
        assert cancelled["booking"]["cancellation_reason"] == "buyer is ill"
        await outcome(client, "usp_bookings_cancel", arguments, "invalid_state_transition")
        await outcome(
            client,
            "usp_bookings_cancel",
            {"booking_id": "bkg_nope", **usp(key=acme_key)},
            "booking_not_found",
        )
        # The seat is back on sale.
        assert slot["id"] in {s["id"] for s in await free_slots(client)}


async def test_bookings_reschedule_and_slot_unavailable(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    async with connect(mcp_engine, settings) as client:
        first, second, third = (s["id"] for s in (await free_slots(client))[:3])
        booking = (await book(client, first, key=acme_key))["booking"]
        await book(client, third, key=acme_key, buyer=BOB)
        moved = await ok(
            client,
            "usp_bookings_reschedule",
            {"booking_id": booking["id"], "slot_id": second, **usp(key=acme_key)},
        )
        assert moved["booking"]["slot_id"] == second
        await outcome(
            client,
            "usp_bookings_reschedule",
            {"booking_id": booking["id"], "slot_id": third, **usp(key=acme_key)},
            "slot_unavailable",
        )
        await outcome(
            client,
            "usp_bookings_reschedule",
            {"booking_id": "bkg_nope", "slot_id": third, **usp(key=acme_key)},
            "booking_not_found",
        )


def _window(start: datetime, hours: int) -> dict[str, str]:
    return {"start": start.isoformat(), "end": (start + timedelta(hours=hours)).isoformat()}


async def test_waitlist_join_leave_and_their_outcomes(
    mcp_engine: Engine, settings: Settings, acme_key: str, globex_key: str
) -> None:
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    async with connect(mcp_engine, settings) as client:
        joined = await ok(
            client,
            "usp_waitlist_join",
            {
                "service_id": HAIRCUT,
                "desired_window": _window(tomorrow, 8),
                "buyer": BOB,
                **usp(key=acme_key),
            },
        )
        entry = joined["waitlist_entry"]
        assert entry["state"] == "joined"
        past = datetime.now(UTC) - timedelta(days=2)
        await outcome(
            client,
            "usp_waitlist_join",
            {"service_id": HAIRCUT, "desired_window": _window(past, 2), "buyer": BOB, **usp(key=acme_key)},
            "waitlist_closed",
        )
        await outcome(
            client,
            "usp_waitlist_join",
            {
                "service_id": "svc_nope",
                "desired_window": _window(tomorrow, 2),
                "buyer": BOB,
                **usp(key=acme_key),
            },
            "service_not_found",
        )
        leave = {"waitlist_entry_id": entry["id"], **usp(key=acme_key)}
        await outcome(
            client,
            "usp_waitlist_leave",
            {"waitlist_entry_id": entry["id"], **usp(profile=OTHER_PROFILE, key=globex_key)},
            "waitlist_entry_not_found",
        )
        left = await ok(client, "usp_waitlist_leave", leave)
        assert left["waitlist_entry"]["state"] == "left"
        await outcome(client, "usp_waitlist_leave", leave, "invalid_state_transition")
        await outcome(
            client,
            "usp_waitlist_leave",
            {"waitlist_entry_id": "wl_nope", **usp(key=acme_key)},
            "waitlist_entry_not_found",
        )
    with db.session(mcp_engine) as session:
        row = session.get(WaitlistRow, entry["id"])
        assert row is not None
        assert row.platform_profile == PROFILE


async def test_feed_subscriptions_belong_to_the_callers_profile(
    mcp_engine: Engine, settings: Settings, acme_key: str, globex_key: str
) -> None:
    acme, globex = usp(key=acme_key), usp(profile=OTHER_PROFILE, key=globex_key)
    async with connect(mcp_engine, settings) as client:
        created = await ok(
            client,
            "usp_feed_subscriptions_create",
            {"url": "http://127.0.0.1:9/hooks/usp", "event_types": ["booking.*"], **acme},
        )
        subscription = created["subscription"]
        assert (subscription["platform_profile"], subscription["state"]) == (PROFILE, "active")
        await ok(client, "usp_feed_subscriptions_create", {"url": "http://127.0.0.1:9/globex", **globex})
        listed = await ok(client, "usp_feed_subscriptions_list", acme)
        assert [s["id"] for s in listed["subscriptions"]] == [subscription["id"]]
        assert listed["next_cursor"] is None
        await outcome(
            client,
            "usp_feed_subscriptions_delete",
            {"subscription_id": subscription["id"], **globex},
            "subscription_not_found",
        )
        deleted = await ok(
            client, "usp_feed_subscriptions_delete", {"subscription_id": subscription["id"], **acme}
        )
        assert (deleted["subscription"]["state"], deleted["subscription"]["disabled_reason"]) == (
            "disabled",
            "deleted",
        )
        await outcome(
            client,
            "usp_feed_subscriptions_delete",
            {"subscription_id": "sub_nope", **acme},
            "subscription_not_found",
        )
        text = await refused(
            client,
            "usp_feed_subscriptions_create",
            {"url": "http://127.0.0.1:9/x", "event_types": ["bookings.*"], **acme},
            -32602,
        )
        assert "bookings.*" in text
    with db.session(mcp_engine) as session:
        profiles = session.exec(select(Subscription.platform_profile).order_by(col(Subscription.id))).all()
    assert profiles == [PROFILE, OTHER_PROFILE]


async def test_correlation_id_is_carried_into_the_events(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    async with connect(mcp_engine, settings) as client:
        slot = (await free_slots(client))[0]
        booking = (await book(client, slot["id"], key=acme_key, correlation_id="corr-42"))["booking"]
    with db.session(mcp_engine) as session:
        records = session.exec(
            select(EventRecord).where(col(EventRecord.event_type) == "booking.created")
        ).all()
    ((record),) = records
    assert record.correlation_id == "corr-42"
    assert booking["id"] in record.payload


async def test_correlation_id_is_echoed_on_the_result(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    async with connect(mcp_engine, settings) as client:
        echoed = await client.call_tool("usp_catalog_list", usp(profile=None, correlation_id="corr-7"))
        assert echoed.meta == {"usp": {"correlation_id": "corr-7"}}
        slot = (await free_slots(client))[0]
        arguments = {"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": ALICE}
        booked = await client.call_tool(
            "usp_bookings_create", {**arguments, **usp(key=acme_key, correlation_id="c-9")}
        )
        assert booked.meta == {"usp": {"correlation_id": "c-9"}}
        assert not (await client.call_tool("usp_catalog_list", {})).meta


async def test_an_anonymous_platform_with_a_long_profile_keeps_its_idempotency_keys(
    mcp_engine: Engine, make_settings: MakeSettings
) -> None:
    """Without authentication the profile names the key's owner; a 2000-character profile URI
    still fits the key table."""
    open_policy = make_settings(require_authentication=False)
    profile = "https://agent.example/" + "p" * 2000
    async with connect(mcp_engine, open_policy) as client:
        slot = (await free_slots(client))[0]
        arguments = {"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": ALICE}
        meta = usp(profile=profile, idempotency_key="retry-me")
        first = await ok(client, "usp_bookings_create", {**arguments, **meta})
        again = await ok(client, "usp_bookings_create", {**arguments, **meta})
    assert again["booking"] == first["booking"]


async def test_only_an_authenticated_principals_session_receives_live_webhooks(
    mcp_engine: Engine, make_settings: MakeSettings, acme_key: str
) -> None:
    """With anonymous platforms allowed, an anonymous caller may book for the profile it names,
    but its session is never attached to the live hub: it could name any platform's profile and
    would then be pushed that platform's bookings (buyer details). An API key's session is."""
    open_policy = make_settings(require_authentication=False)
    hub = LiveHub()
    async with Client(build_server(mcp_engine, open_policy, hub=hub), mode="legacy") as client:
        slot = (await free_slots(client))[0]
        arguments = {"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": ALICE}
        await ok(client, "usp_bookings_create", {**arguments, **usp()})
        assert hub.session_keys == frozenset()
        await ok(client, "usp_feed_subscriptions_list", usp(key=acme_key))
        assert hub.session_keys == frozenset({STDIO_SESSION})
        hub.detach(STDIO_SESSION)


async def test_an_anonymous_caller_naming_a_profile_gets_none_of_that_profiles_objects(
    mcp_engine: Engine, make_settings: MakeSettings, acme_key: str
) -> None:
    """With anonymous platforms allowed, naming a profile proves nothing: an anonymous caller
    may not read, cancel or leave what an authenticated platform of that profile made, nor list,
    delete or create the profile's feed subscriptions (a subscription of its own for the
    profile would deliver that platform's bookings, buyer details included, to any URL). Its own
    bookings stay in reach through their booking-scoped credentials."""
    open_policy = make_settings(require_authentication=False)
    hook = "http://127.0.0.1:9/hooks/usp"
    async with connect(mcp_engine, open_policy) as client:
        slots = await free_slots(client)
        booking_id = (await book(client, slots[0]["id"], key=acme_key))["booking"]["id"]
        entry = await ok(
            client,
            "usp_waitlist_join",
            {
                "service_id": HAIRCUT,
                "desired_window": _window(datetime.now(UTC) + timedelta(days=1), 8),
                "buyer": BOB,
                **usp(key=acme_key),
            },
        )
        entry_id = entry["waitlist_entry"]["id"]
        sub = await ok(client, "usp_feed_subscriptions_create", {"url": hook, **usp(key=acme_key)})
        ref = {"booking_id": booking_id, **usp()}
        await outcome(client, "usp_bookings_get", ref, "booking_not_found")
        await outcome(client, "usp_bookings_cancel", ref, "booking_not_found")
        await outcome(
            client, "usp_waitlist_leave", {"waitlist_entry_id": entry_id, **usp()}, "waitlist_entry_not_found"
        )
        await refused(client, "usp_feed_subscriptions_list", usp(), -32001)
        await refused(
            client,
            "usp_feed_subscriptions_delete",
            {"subscription_id": sub["subscription"]["id"], **usp()},
            -32001,
        )
        await refused(client, "usp_feed_subscriptions_create", {"url": hook, **usp()}, -32001)
        # the anonymous platform's own booking: through its credential
        mine = await ok(
            client,
            "usp_bookings_create",
            {"service_id": HAIRCUT, "slot_id": slots[1]["id"], "buyer": ALICE, **usp()},
        )
        scoped = {"booking_id": mine["booking"]["id"], **usp(credential=mine["booking_scoped_credential"])}
        assert (await ok(client, "usp_bookings_get", scoped))["booking"]["id"] == mine["booking"]["id"]
    with db.session(mcp_engine) as session:
        assert session.get(BookingRow, booking_id).state == "pending"  # type: ignore[union-attr]


async def test_the_business_reusing_a_key_for_another_profile_is_a_conflict_not_a_replay(
    mcp_engine: Engine, settings: Settings
) -> None:
    """The business acts for whichever profile it names, under one principal: a key it used for
    one platform's booking must not replay that booking (with a credential issued to the other
    platform) when it names another profile."""
    async with connect(mcp_engine, settings) as client:
        slot = (await free_slots(client))[0]
        arguments = {"service_id": HAIRCUT, "slot_id": slot["id"], "buyer": ALICE}
        await ok(
            client, "usp_bookings_create", {**arguments, **usp(key=ADMIN_TOKEN, idempotency_key="biz-1")}
        )
        await outcome(
            client,
            "usp_bookings_create",
            {**arguments, **usp(profile=OTHER_PROFILE, key=ADMIN_TOKEN, idempotency_key="biz-1")},
            "idempotency_conflict",
        )


async def test_the_booking_input_is_described_in_each_tools_input_schema(
    mcp_engine: Engine, settings: Settings
) -> None:
    from usp_dispatcher.api.discovery import business_profile

    async with connect(mcp_engine, settings) as client:
        listed = {tool.name: tool.input_schema for tool in (await client.list_tools()).tools}
    published = {tool["name"]: tool["inputSchema"] for tool in business_profile(settings)["tools"]}
    for name in ("usp_bookings_create", "usp_waitlist_join"):
        for schema in (listed[name], published[name]):
            buyer = schema["$defs"]["Buyer"]
            assert buyer["required"] == ["first_name"]
            assert set(buyer["properties"]) == {"first_name", "last_name", "email", "phone"}
            assert all(p.get("description") for p in buyer["properties"].values())
            assert ">>>" not in str(schema)
            assert "buyer" in schema["required"]
