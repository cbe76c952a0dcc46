"""Who hears about a booking: its platform and the business, never another platform.

Three subscriptions watch everything: the business's own (no profile), platform A's and platform
B's. Each test drives the domain as the tools and routes do and reads back which subscription got
a delivery of which event (the ``usp_deliveries`` rows), so what is proven is what would be sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from tests.dispatcher.scheduling.support import ALICE, BOB, CAROL, NOW, Catalog, call, ok, refused, run
from usp_core import db
from usp_dispatcher.scheduling import (
    OFFER_TTL,
    ServiceSpec,
    add_slot,
    booking_platform,
    cancel_booking,
    complete_booking,
    confirm_booking,
    create_booking,
    create_service,
    expire_offers,
    get_booking,
    get_waitlist_entry,
    join_waitlist,
    leave_waitlist,
    mark_no_show,
    reschedule_booking,
    waitlist_entry_platform,
)
from usp_schemas import SLOT_UNAVAILABLE, TimeWindow
from usp_workers.storage.models import Delivery, EventRecord, Subscription

A = "https://a.example/.well-known/ucp"
B = "https://b.example/.well-known/ucp"
DAY_ONE = TimeWindow(start=NOW + timedelta(days=1), end=NOW + timedelta(days=1, hours=2))

#: Who hears what (names of the subscriptions below).
EVERYONE = frozenset({"business", "a", "b"})
A_AND_BUSINESS = frozenset({"business", "a"})
B_AND_BUSINESS = frozenset({"business", "b"})
BUSINESS = frozenset({"business"})


@dataclass(frozen=True)
class Watchers:
    """The subscriptions, by name, and where the events recorded so far have gone."""

    engine: Engine
    ids: dict[str, str]

    def routed(self, since: int = 0) -> list[tuple[str, frozenset[str]]]:
        """(event type, names of the subscriptions it has a delivery for) per recorded event,
        oldest first, from the ``since``-th on."""
        names = {subscription_id: name for name, subscription_id in self.ids.items()}
        with db.session(self.engine) as session:
            records = session.exec(
                select(EventRecord.id, EventRecord.event_type).order_by(col(EventRecord.id))
            ).all()
            deliveries = session.exec(select(Delivery.event_id, Delivery.subscription_id)).all()
        reached: dict[str, set[str]] = {event_id: set() for event_id, _ in records}
        for event_id, subscription_id in deliveries:
            reached[event_id].add(names[subscription_id])
        return [(event_type, frozenset(reached[event_id])) for event_id, event_type in records][since:]

    def audiences(self) -> list[tuple[str, str | None]]:
        with db.session(self.engine) as session:
            return list(
                session.exec(
                    select(EventRecord.event_type, EventRecord.audience).order_by(col(EventRecord.id))
                ).all()
            )


@pytest.fixture
def watchers(catalog: Catalog) -> Watchers:
    ids: dict[str, str] = {}
    with db.session(catalog.engine) as session:
        for name, profile, patterns in (
            ("business", None, '["*"]'),
            ("a", A, '["*"]'),
            ("b", B, '["booking.*", "waitlist.*", "catalog.*"]'),
        ):
            subscription = Subscription(
                url=f"https://{name}.example/hooks", event_types=patterns, platform_profile=profile
            )
            session.add(subscription)
            session.flush()
            ids[name] = subscription.id
        session.commit()
    return Watchers(catalog.engine, ids)


def test_a_platforms_booking_events_reach_it_and_the_business_never_another_platform(
    catalog: Catalog, watchers: Watchers
) -> None:
    engine = catalog.engine
    first, second, third = catalog.cut_slots
    booking = ok(run(engine, create_booking, catalog.cut, first, ALICE, platform_profile=A, now=NOW))
    ok(run(engine, confirm_booking, booking.id, now=NOW))
    ok(run(engine, reschedule_booking, booking.id, second, now=NOW))
    ok(run(engine, cancel_booking, booking.id, "changed plans", now=NOW))
    other = ok(run(engine, create_booking, catalog.cut, third, BOB, platform_profile=A, now=NOW))
    ok(run(engine, confirm_booking, other.id, now=NOW))
    ok(run(engine, complete_booking, other.id, now=NOW))
    yoga = ok(
        run(engine, create_booking, catalog.yoga, catalog.yoga_slot, CAROL, platform_profile=A, now=NOW)
    )
    ok(run(engine, confirm_booking, yoga.id, now=NOW))
    ok(run(engine, mark_no_show, yoga.id, now=NOW))

    assert watchers.routed() == [
        ("booking.created", A_AND_BUSINESS),
        ("catalog.availability.changed", EVERYONE),
        ("booking.confirmed", A_AND_BUSINESS),
        ("booking.rescheduled", A_AND_BUSINESS),
        ("catalog.availability.changed", EVERYONE),
        ("booking.cancelled", A_AND_BUSINESS),
        ("catalog.availability.changed", EVERYONE),
        ("booking.created", A_AND_BUSINESS),
        ("catalog.availability.changed", EVERYONE),
        ("booking.confirmed", A_AND_BUSINESS),
        ("booking.completed", A_AND_BUSINESS),
        ("booking.created", A_AND_BUSINESS),
        ("catalog.availability.changed", EVERYONE),
        ("booking.confirmed", A_AND_BUSINESS),
        ("booking.no_show", A_AND_BUSINESS),
    ]
    assert {audience for kind, audience in watchers.audiences() if kind.startswith("booking.")} == {A}
    assert {audience for kind, audience in watchers.audiences() if kind.startswith("catalog.")} == {None}
    assert run(engine, booking_platform, booking.id) == (True, A)


def test_the_business_own_booking_reaches_the_business_alone(catalog: Catalog, watchers: Watchers) -> None:
    booking = ok(run(catalog.engine, create_booking, catalog.cut, catalog.cut_slots[0], ALICE, now=NOW))
    ok(run(catalog.engine, cancel_booking, booking.id, now=NOW))

    assert watchers.routed() == [
        ("booking.created", BUSINESS),
        ("catalog.availability.changed", EVERYONE),
        ("booking.cancelled", BUSINESS),
        ("catalog.availability.changed", EVERYONE),
    ]
    assert [audience for kind, audience in watchers.audiences() if kind.startswith("booking.")] == ["", ""]
    assert run(catalog.engine, booking_platform, booking.id) == (True, None)


@pytest.mark.parametrize("booker", [B, None], ids=["the-platform", "the-business"])
def test_a_converted_offer_belongs_to_the_entrys_platform(
    catalog: Catalog, watchers: Watchers, booker: str | None
) -> None:
    engine = catalog.engine
    slot = catalog.cut_slots[0]
    taken = ok(run(engine, create_booking, catalog.cut, slot, ALICE, platform_profile=A, now=NOW))
    before = len(watchers.routed())
    entry = ok(run(engine, join_waitlist, catalog.cut, DAY_ONE, BOB, platform_profile=B, now=NOW))
    ok(run(engine, cancel_booking, taken.id, now=NOW))  # A's booking; the seat is offered to B's buyer
    later = NOW + timedelta(minutes=5)
    converted = ok(run(engine, create_booking, catalog.cut, slot, BOB, platform_profile=booker, now=later))

    assert ok(run(engine, get_waitlist_entry, entry.id)).booking_id == converted.id
    assert watchers.routed(before) == [
        ("waitlist.joined", B_AND_BUSINESS),
        ("booking.cancelled", A_AND_BUSINESS),
        ("waitlist.offered", B_AND_BUSINESS),
        ("booking.created", B_AND_BUSINESS),
        ("waitlist.converted", B_AND_BUSINESS),
    ]
    assert run(engine, booking_platform, converted.id) == (True, B)
    assert run(engine, waitlist_entry_platform, entry.id) == (True, B)

    # The booking's later life goes to B too, whoever changes it.
    ok(run(engine, confirm_booking, converted.id, now=later))
    assert watchers.routed()[-1] == ("booking.confirmed", B_AND_BUSINESS)


def test_a_platform_cannot_take_another_platforms_offer(catalog: Catalog, watchers: Watchers) -> None:
    engine = catalog.engine
    slot = catalog.cut_slots[0]
    taken = ok(run(engine, create_booking, catalog.cut, slot, ALICE, now=NOW))
    entry = ok(run(engine, join_waitlist, catalog.cut, DAY_ONE, BOB, platform_profile=B, now=NOW))
    ok(run(engine, cancel_booking, taken.id, now=NOW))
    before = len(watchers.routed())

    # The same buyer through platform A: the seat is held for B's entry, so it is not A's to book.
    refused(
        run(engine, create_booking, catalog.cut, slot, BOB, platform_profile=A, now=NOW), SLOT_UNAVAILABLE
    )

    assert ok(run(engine, get_waitlist_entry, entry.id)).state == "offered"
    assert watchers.routed(before) == []


def test_waitlist_expiry_and_leaving_go_to_the_entrys_platform(catalog: Catalog, watchers: Watchers) -> None:
    engine = catalog.engine
    taken = ok(run(engine, create_booking, catalog.cut, catalog.cut_slots[0], ALICE, now=NOW))
    lapsing = ok(run(engine, join_waitlist, catalog.cut, DAY_ONE, BOB, platform_profile=B, now=NOW))
    leaving = ok(run(engine, join_waitlist, catalog.cut, DAY_ONE, CAROL, platform_profile=A, now=NOW))
    ok(run(engine, cancel_booking, taken.id, now=NOW))
    before = len(watchers.routed())

    assert run(engine, expire_offers, now=NOW + OFFER_TTL) == 1  # B's lapses; A's entry is offered
    ok(run(engine, leave_waitlist, leaving.id, now=NOW + OFFER_TTL))  # A's leaves: back on sale

    assert watchers.routed(before) == [
        ("waitlist.expired", B_AND_BUSINESS),
        ("waitlist.offered", A_AND_BUSINESS),
        ("waitlist.left", A_AND_BUSINESS),
        ("catalog.availability.changed", EVERYONE),
    ]
    assert ok(run(engine, get_waitlist_entry, lapsing.id)).state == "expired"


def test_catalog_events_reach_everyone(catalog: Catalog, watchers: Watchers) -> None:
    def build(session: Session) -> None:
        service = create_service(session, ServiceSpec(name="Massage", duration_minutes=30), now=NOW)
        session.flush()
        ok(add_slot(session, service.id, NOW + timedelta(days=3), now=NOW))

    call(catalog.engine, build)
    assert watchers.routed() == [
        ("catalog.service.created", EVERYONE),
        ("catalog.availability.changed", EVERYONE),
    ]
    assert [audience for _, audience in watchers.audiences()] == [None, None]


def test_owner_lookups(catalog: Catalog) -> None:
    engine = catalog.engine
    mine = ok(
        run(engine, create_booking, catalog.yoga, catalog.yoga_slot, ALICE, platform_profile=A, now=NOW)
    )
    theirs = ok(run(engine, create_booking, catalog.yoga, catalog.yoga_slot, BOB, now=NOW))
    entry = ok(run(engine, join_waitlist, catalog.cut, DAY_ONE, CAROL, platform_profile=A, now=NOW))
    business_entry = ok(run(engine, join_waitlist, catalog.cut, DAY_ONE, BOB, now=NOW))

    assert run(engine, booking_platform, mine.id) == (True, A)
    assert run(engine, booking_platform, theirs.id) == (True, None)
    assert run(engine, booking_platform, "bkg_missing") == (False, None)
    assert run(engine, waitlist_entry_platform, entry.id) == (True, A)
    assert run(engine, waitlist_entry_platform, business_entry.id) == (True, None)
    assert run(engine, waitlist_entry_platform, "wl_missing") == (False, None)
    # Ownership changes nothing of what the booking reads as.
    assert ok(run(engine, get_booking, mine.id)) == mine
