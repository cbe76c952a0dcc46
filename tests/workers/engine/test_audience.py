"""Who an event reaches: ``reaches`` (the one rule) and the delivery rows ``emit`` writes by it.

A booking event carries the buyer's name, e-mail and phone. Platform B subscribing to
``booking.*`` must not receive platform A's bookings; the business's own subscriptions (no
profile) receive everything. What proves it is the ``usp_deliveries`` table, not the function.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import col, select

from tests.workers.support import booking_event
from usp_core.db import session
from usp_workers.engine import outbox
from usp_workers.engine.outbox import emit, reaches
from usp_workers.storage.models import Delivery, EventRecord, Subscription, SubscriptionState

A = "https://a.example/.well-known/ucp"
B = "https://b.example/.well-known/ucp"


@pytest.fixture(autouse=True)
def _no_enqueuer_left() -> Iterator[None]:
    yield
    outbox.set_enqueuer(None)


@pytest.mark.parametrize(
    ("subscription_profile", "audience", "expected"),
    [
        # public: everyone
        (None, None, True),
        (A, None, True),
        # business only: the business's own subscriptions, no platform
        (None, "", True),
        (A, "", False),
        # one platform's: that platform and the business
        (None, A, True),
        (A, A, True),
        (B, A, False),
        # profiles are opaque strings: nothing "close enough" reaches
        (A + "/", A, False),
        (A.upper(), A, False),
        (A[:-1], A, False),
        # a subscription with an empty profile is a platform's (not the business's): fail closed
        ("", "", False),
        ("", A, False),
        ("", None, True),
    ],
)
def test_reaches(subscription_profile: str | None, audience: str | None, expected: bool) -> None:
    assert reaches(subscription_profile, audience) is expected


def subscribe(
    engine: Engine,
    name: str,
    profile: str | None,
    patterns: str = '["*"]',
    state: SubscriptionState = SubscriptionState.ACTIVE,
) -> str:
    with session(engine) as s:
        subscription = Subscription(
            url=f"https://{name}.example/hooks", event_types=patterns, platform_profile=profile, state=state
        )
        s.add(subscription)
        s.commit()
        return subscription.id


def reached(engine: Engine, event_id: str) -> set[str]:
    """The subscriptions that got a delivery of the event, read from the delivery rows."""
    with session(engine) as s:
        rows = s.exec(select(Delivery.subscription_id).where(col(Delivery.event_id) == event_id)).all()
    assert len(rows) == len(set(rows)), "one delivery per subscription"
    return set(rows)


def stored_audience(engine: Engine, event_id: str) -> str | None:
    with session(engine) as s:
        record = s.get(EventRecord, event_id)
        assert record is not None
        return record.audience


def test_emit_writes_deliveries_only_for_the_subscriptions_the_audience_reaches(database: Engine) -> None:
    business = subscribe(database, "business", None)
    business_bookings = subscribe(database, "business-bookings", None, '["booking.*"]')
    a = subscribe(database, "a", A, '["booking.*"]')
    a_waitlist_only = subscribe(database, "a-waitlist", A, '["waitlist.*"]')
    b = subscribe(database, "b", B, '["booking.*"]')
    subscribe(database, "a-disabled", A, '["*"]', SubscriptionState.DISABLED)
    handed_off: list[str] = []
    outbox.set_enqueuer(handed_off.extend)

    audiences: dict[str, str | None] = {
        "public": None,
        "business": "",
        "a": A,
        "b": B,
        "c": "https://c.example/p",
    }
    event_ids: dict[str, str] = {}
    with session(database) as s:
        for name, audience in audiences.items():
            event_ids[name] = emit(s, booking_event(), audience=audience).id
        s.commit()

    everyone = {business, business_bookings, a, b}
    assert reached(database, event_ids["public"]) == everyone
    assert reached(database, event_ids["business"]) == {business, business_bookings}
    assert reached(database, event_ids["a"]) == {business, business_bookings, a}
    assert reached(database, event_ids["b"]) == {business, business_bookings, b}
    assert reached(database, event_ids["c"]) == {business, business_bookings}, "no platform of that profile"
    assert a_waitlist_only not in set().union(*(reached(database, e) for e in event_ids.values()))
    for name, audience in audiences.items():
        assert stored_audience(database, event_ids[name]) == audience

    # Only the deliveries written were handed to the broker, each once.
    with session(database) as s:
        written = s.exec(select(Delivery.id)).all()
    assert sorted(handed_off) == sorted(written)
    assert len(written) == 4 + 2 + 3 + 3 + 2


def test_emit_without_an_audience_is_public(database: Engine) -> None:
    """Callers that predate audiences (``POST /events``, the bench) keep delivering to all."""
    subscriptions = {
        subscribe(database, "business", None),
        subscribe(database, "a", A),
        subscribe(database, "b", B),
    }
    with session(database) as s:
        record = emit(s, booking_event())
        s.commit()
        event_id = record.id
    assert reached(database, event_id) == subscriptions
    assert stored_audience(database, event_id) is None


def test_the_per_transaction_cache_routes_by_profile_and_sees_added_subscriptions(database: Engine) -> None:
    """The subscriptions (profiles included) are read once per transaction however many events
    it emits, to however many audiences; a subscription added in the transaction is seen."""
    business = subscribe(database, "business", None)
    a = subscribe(database, "a", A)
    b = subscribe(database, "b", B)
    selects: list[str] = []

    def count_subscription_reads(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "usp_subscriptions" in statement:
            selects.append(statement)

    sa.event.listen(database, "before_cursor_execute", count_subscription_reads)
    try:
        with session(database) as s:
            first = [emit(s, booking_event(), audience=(A, B, "", None)[n % 4]).id for n in range(40)]
            assert len(selects) == 1, "one read for the whole transaction"
            late = Subscription(url="https://a2.example/hooks", platform_profile=A)
            s.add(late)  # seen by the next emit, without a flush
            after = emit(s, booking_event(), audience=A).id
            s.commit()
            late_id = late.id
    finally:
        sa.event.remove(database, "before_cursor_execute", count_subscription_reads)

    assert len(selects) == 2, "read again only because a subscription was added"
    for n, event_id in enumerate(first):
        expected = ({business, a}, {business, b}, {business}, {business, a, b})[n % 4]
        assert reached(database, event_id) == expected
    assert reached(database, after) == {business, a, late_id}
