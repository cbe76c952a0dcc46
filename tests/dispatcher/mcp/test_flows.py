"""End to end through MCP: a booking's event delivered to a platform's REST receiver, the slot
capacity held under two racing sessions, and the cancel → waitlist offer → booking flow."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import anyio
import pytest
from sqlalchemy.engine import Engine
from sqlmodel import col, select

from tests.dispatcher.conftest import ADMIN_TOKEN
from tests.dispatcher.mcp.conftest import connect
from tests.dispatcher.mcp.support import ALICE, BOB, HAIRCUT, PROFILE, book, free_slots, ok, usp
from tests.workers.conftest import hub_server
from tests.workers.endpoints import UspReceiver
from tests.workers.support import Endpoints
from usp_core import db, keys
from usp_dispatcher.cli.config import Settings
from usp_dispatcher.scheduling.tables import BookingRow
from usp_receiver import JWKS
from usp_workers.engine.background import close_background_runtime
from usp_workers.engine.delivery import deliver_batch_sync
from usp_workers.storage.models import Delivery, EventRecord

pytestmark = pytest.mark.anyio


@pytest.fixture
def webhooks() -> Iterator[Endpoints]:
    """A real webhook server (uvicorn on 127.0.0.1) for this test's receivers."""
    with hub_server() as hub:
        registry = Endpoints(hub)
        yield registry
        registry.close()
    close_background_runtime()


def _jwks(engine: Engine, settings: Settings) -> JWKS:
    with db.session(engine) as session:
        return JWKS.from_dict(keys.published_jwks(session, settings))


async def test_a_booking_made_over_mcp_reaches_a_rest_receiver_as_booking_created(
    mcp_engine: Engine, settings: Settings, acme_key: str, webhooks: Endpoints
) -> None:
    receiver = UspReceiver(_jwks(mcp_engine, settings))
    url = webhooks.add("acme", receiver)
    async with connect(mcp_engine, settings) as client:
        await ok(
            client,
            "usp_feed_subscriptions_create",
            {"url": url, "event_types": ["booking.created"], **usp(key=acme_key)},
        )
        booking = (
            await book(client, (await free_slots(client))[0]["id"], key=acme_key, correlation_id="c-1")
        )["booking"]
    with db.session(mcp_engine) as session:
        (record,) = session.exec(
            select(EventRecord).where(col(EventRecord.event_type) == "booking.created")
        ).all()
        delivery_ids = list(
            session.exec(select(Delivery.id).where(col(Delivery.event_id) == record.id)).all()
        )
    assert len(delivery_ids) == 1
    report = await anyio.to_thread.run_sync(lambda: deliver_batch_sync(mcp_engine, settings, delivery_ids))
    assert report.succeeded == 1
    assert receiver.handled == [record.id]
    assert booking["id"] in record.payload
    assert record.correlation_id == "c-1"
    assert webhooks.hub.seen(webhooks.path("acme"))


async def test_two_sessions_racing_for_the_last_seat_get_one_booking_and_one_slot_unavailable(
    mcp_engine: Engine, settings: Settings, acme_key: str, globex_key: str
) -> None:
    rounds = 4
    async with connect(mcp_engine, settings) as first, connect(mcp_engine, settings) as second:
        slots = [s["id"] for s in (await free_slots(first))[:rounds]]
        for slot_id in slots:
            answers: list[dict[str, Any]] = []

            async with anyio.create_task_group() as tg:
                tg.start_soon(_take, answers, first, slot_id, acme_key, ALICE)
                tg.start_soon(_take, answers, second, slot_id, globex_key, BOB)
            booked = [a for a in answers if "booking" in a]
            refused = [a["messages"][0]["code"] for a in answers if "booking" not in a]
            assert len(booked) == 1, answers
            assert refused == ["slot_unavailable"]
    with db.session(mcp_engine) as session:
        rows = session.exec(select(BookingRow.slot_id)).all()
    assert sorted(rows) == sorted(slots)


async def _take(
    answers: list[dict[str, Any]], client: Any, slot_id: str, key: str, buyer: dict[str, str]
) -> None:
    arguments = {"service_id": HAIRCUT, "slot_id": slot_id, "buyer": buyer, **usp(key=key)}
    result = await client.call_tool("usp_bookings_create", arguments)
    answers.append(result.structured_content)


async def test_cancel_offers_the_seat_to_the_waitlist_and_the_buyer_books_it(
    mcp_engine: Engine, settings: Settings, acme_key: str
) -> None:
    async with connect(mcp_engine, settings) as client:
        slot = (await free_slots(client))[0]
        booking = (await book(client, slot["id"], key=acme_key))["booking"]
        start = datetime.fromisoformat(slot["start"])
        desired = {
            "start": (start - timedelta(hours=1)).isoformat(),
            "end": (start + timedelta(hours=2)).isoformat(),
        }
        entry = (
            await ok(
                client,
                "usp_waitlist_join",
                {"service_id": HAIRCUT, "desired_window": desired, "buyer": BOB, **usp(key=acme_key)},
            )
        )["waitlist_entry"]
        await ok(client, "usp_bookings_cancel", {"booking_id": booking["id"], **usp(key=acme_key)})
        # The freed seat is held for Bob, not put back on sale.
        assert slot["id"] not in {s["id"] for s in await free_slots(client)}
        booked = await book(client, slot["id"], key=acme_key, buyer=BOB)
        assert booked["booking"]["slot_id"] == slot["id"]
        # Only the business may read an entry directly; the platform's leave now finds it converted.
        left = await client.call_tool(
            "usp_waitlist_leave", {"waitlist_entry_id": entry["id"], **usp(profile=PROFILE, key=ADMIN_TOKEN)}
        )
        assert left.structured_content is not None
        assert left.structured_content["messages"][0]["code"] == "invalid_state_transition"
    with db.session(mcp_engine) as session:
        types = session.exec(select(EventRecord.event_type).order_by(col(EventRecord.id))).all()
    assert "waitlist.offered" in types
    assert "waitlist.converted" in types
    assert (
        types.index("booking.cancelled") < types.index("waitlist.offered") < types.index("waitlist.converted")
    )
