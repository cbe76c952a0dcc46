"""The waitlist: join, leave, and a freed seat offered, held, converted or passed on."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from tests.dispatcher.scheduling.support import (
    ALICE,
    BOB,
    CAROL,
    NOW,
    Catalog,
    event_types,
    events,
    ok,
    refused,
    run,
    slot_counts,
)
from usp_dispatcher.scheduling import (
    OFFER_TTL,
    WAITLIST_ENTRY_NOT_FOUND,
    WAITLIST_LIMIT_REACHED,
    cancel_booking,
    create_booking,
    expire_offers,
    get_waitlist_entry,
    join_waitlist,
    leave_waitlist,
    reschedule_booking,
)
from usp_dispatcher.scheduling.waitlist import same_buyer
from usp_schemas import (
    INVALID_STATE_TRANSITION,
    SERVICE_NOT_FOUND,
    SLOT_UNAVAILABLE,
    WAITLIST_CLOSED,
    AvailabilityChanged,
    Booking,
    Buyer,
    TimeWindow,
    WaitlistConverted,
    WaitlistEntry,
    WaitlistJoined,
    WaitlistOffered,
)

DAN = Buyer(first_name="Dan", email="dan@example.com")
#: Contains the first two ``cut`` slots (NOW + 1 d, NOW + 1 d 1 h), not the third (NOW + 2 d).
DAY_ONE = TimeWindow(start=NOW + timedelta(days=1), end=NOW + timedelta(days=1, hours=2))
WHOLE_WEEK = TimeWindow(start=NOW, end=NOW + timedelta(days=7))
LATER_ONLY = TimeWindow(start=NOW + timedelta(days=1, hours=1), end=NOW + timedelta(days=3))


def join(catalog: Catalog, buyer: Buyer, window: TimeWindow = DAY_ONE, **kwargs: object) -> WaitlistEntry:
    return ok(run(catalog.engine, join_waitlist, catalog.cut, window, buyer, now=NOW, **kwargs))


def entry(catalog: Catalog, entry_id: str) -> WaitlistEntry:
    return ok(run(catalog.engine, get_waitlist_entry, entry_id))


def full_first_slot(catalog: Catalog) -> Booking:
    return ok(run(catalog.engine, create_booking, catalog.cut, catalog.cut_slots[0], ALICE, now=NOW))


def test_join_emits_joined(catalog: Catalog) -> None:
    joined = join(catalog, BOB, correlation_id="wl-flow")
    assert (joined.state, joined.buyer, joined.service_id) == ("joined", BOB, catalog.cut)
    assert joined.id.startswith("wl_")
    assert joined.desired_window.start.isoformat() == "2030-03-15T12:00:00-04:00"
    (event,) = events(catalog.engine)
    assert isinstance(event, WaitlistJoined)
    assert (event.data, event.correlation_id, event.waitlist_entry_id) == (joined, "wl-flow", joined.id)


def test_join_refusals(catalog: Catalog) -> None:
    refused(run(catalog.engine, join_waitlist, "svc_nope", DAY_ONE, BOB, now=NOW), SERVICE_NOT_FOUND)
    past = TimeWindow(start=NOW - timedelta(days=2), end=NOW)
    message = refused(run(catalog.engine, join_waitlist, catalog.cut, past, BOB, now=NOW), WAITLIST_CLOSED)
    assert message.severity == "requires_buyer_input"
    assert event_types(catalog.engine) == []


def test_a_platform_holds_a_bounded_number_of_open_entries(catalog: Catalog) -> None:
    """Each entry may be offered a held seat: an unbounded list would let one platform sit on the
    business's capacity. Entries that left free their place; other platforms and the business are
    not held back."""
    acme, globex = "https://acme.example/profile.json", "https://globex.example/profile.json"
    first = join(catalog, BOB, platform_profile=acme, max_open=2)
    join(catalog, CAROL, platform_profile=acme, max_open=2)
    message = refused(
        run(
            catalog.engine,
            join_waitlist,
            catalog.cut,
            DAY_ONE,
            DAN,
            platform_profile=acme,
            now=NOW,
            max_open=2,
        ),
        WAITLIST_LIMIT_REACHED,
    )
    assert "2 open waitlist entries" in message.content
    join(catalog, DAN, platform_profile=globex, max_open=2)
    join(catalog, DAN, max_open=2)  # the business's own
    ok(run(catalog.engine, leave_waitlist, first.id, now=NOW))
    join(catalog, DAN, platform_profile=acme, max_open=2)
    assert event_types(catalog.engine).count("waitlist.joined") == 5


def test_concurrent_joins_cannot_both_take_the_last_place(catalog: Catalog) -> None:
    """The bound is a count, then an insert: under the lock, of two joins racing for the last
    place exactly one gets it."""
    acme = "https://acme.example/profile.json"
    barrier = threading.Barrier(4)

    def attempt(buyer: Buyer) -> object:
        barrier.wait()
        return run(
            catalog.engine,
            join_waitlist,
            catalog.cut,
            DAY_ONE,
            buyer,
            platform_profile=acme,
            now=NOW,
            max_open=1,
        )

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(attempt, [BOB, CAROL, DAN, ALICE]))
    assert sum(isinstance(result, WaitlistEntry) for result in results) == 1
    assert event_types(catalog.engine).count("waitlist.joined") == 1


def test_cancel_offers_the_seat_to_the_oldest_matching_entry(catalog: Catalog) -> None:
    booking = full_first_slot(catalog)
    not_matching = join(catalog, CAROL, LATER_ONLY)  # oldest, but its window misses the slot
    first = join(catalog, BOB, DAY_ONE, correlation_id="bob-flow")
    second = join(catalog, DAN, WHOLE_WEEK)
    before = len(events(catalog.engine))

    ok(run(catalog.engine, cancel_booking, booking.id, correlation_id="alice-flow", now=NOW))

    offered = entry(catalog, first.id)
    assert offered.state == "offered"
    assert offered.offered_slot_id == catalog.cut_slots[0]
    assert offered.offer_expires_at == NOW + OFFER_TTL
    assert entry(catalog, second.id).state == "joined"
    assert entry(catalog, not_matching.id).state == "joined"
    assert slot_counts(catalog.engine, catalog.cut_slots[0]) == (0, 1)  # held for Bob
    cancelled, offer = events(catalog.engine)[before:]  # no availability change: the seat is held
    assert cancelled.event == "booking.cancelled"
    assert isinstance(offer, WaitlistOffered)
    assert offer.data == offered
    assert offer.correlation_id == "bob-flow"  # Bob's flow, not the canceller's

    # The held seat is not for sale: neither to a stranger nor to the next in line.
    for buyer in (ALICE, DAN):
        refused(
            run(catalog.engine, create_booking, catalog.cut, catalog.cut_slots[0], buyer, now=NOW),
            SLOT_UNAVAILABLE,
        )


def test_offered_buyer_converts_by_booking_the_slot(catalog: Catalog) -> None:
    booking = full_first_slot(catalog)
    waiting = join(catalog, BOB)
    ok(run(catalog.engine, cancel_booking, booking.id, now=NOW))
    before = len(events(catalog.engine))
    later = NOW + timedelta(minutes=5)
    same_bob = Buyer(first_name="Robert", email="BOB@example.com")  # same e-mail, other spelling

    converted_booking = ok(
        run(
            catalog.engine,
            create_booking,
            catalog.cut,
            catalog.cut_slots[0],
            same_bob,
            correlation_id="conv",
            now=later,
        )
    )

    assert converted_booking.state == "pending"
    converted = entry(catalog, waiting.id)
    assert (converted.state, converted.booking_id) == ("converted", converted_booking.id)
    assert slot_counts(catalog.engine, catalog.cut_slots[0]) == (1, 0)
    created, conversion = events(catalog.engine)[before:]
    assert created.event == "booking.created"
    assert isinstance(conversion, WaitlistConverted)
    assert conversion.data == converted
    assert conversion.booking_id == converted_booking.id
    assert conversion.correlation_id == "conv"
    # Converted is final.
    refused(run(catalog.engine, leave_waitlist, waiting.id, now=later), INVALID_STATE_TRANSITION)


def test_offered_buyer_may_book_another_slot_without_converting(catalog: Catalog) -> None:
    booking = full_first_slot(catalog)
    waiting = join(catalog, BOB)
    ok(run(catalog.engine, cancel_booking, booking.id, now=NOW))
    ok(run(catalog.engine, create_booking, catalog.cut, catalog.cut_slots[1], BOB, now=NOW))
    assert entry(catalog, waiting.id).state == "offered"
    assert slot_counts(catalog.engine, catalog.cut_slots[0]) == (0, 1)


def test_expired_offer_passes_the_seat_to_the_next_in_line(catalog: Catalog) -> None:
    booking = full_first_slot(catalog)
    first = join(catalog, BOB)
    second = join(catalog, DAN, WHOLE_WEEK)
    ok(run(catalog.engine, cancel_booking, booking.id, now=NOW))
    before = len(events(catalog.engine))

    assert run(catalog.engine, expire_offers, now=NOW + OFFER_TTL - timedelta(seconds=1)) == 0
    lapsed = NOW + OFFER_TTL
    # Too late for Bob even before the scheduler ran: the offer is not live any more.
    refused(
        run(catalog.engine, create_booking, catalog.cut, catalog.cut_slots[0], BOB, now=lapsed),
        SLOT_UNAVAILABLE,
    )
    assert run(catalog.engine, expire_offers, now=lapsed) == 1
    assert run(catalog.engine, expire_offers, now=lapsed) == 0

    expired = entry(catalog, first.id)
    assert expired.state == "expired"
    assert expired.offered_slot_id == catalog.cut_slots[0]
    offered = entry(catalog, second.id)
    assert (offered.state, offered.offer_expires_at) == ("offered", lapsed + OFFER_TTL)
    assert slot_counts(catalog.engine, catalog.cut_slots[0]) == (0, 1)
    assert event_types(catalog.engine)[before:] == ["waitlist.expired", "waitlist.offered"]

    # Nobody else waits: when Dan's offer lapses too, the seat is back on sale.
    assert run(catalog.engine, expire_offers, now=lapsed + OFFER_TTL) == 1
    assert slot_counts(catalog.engine, catalog.cut_slots[0]) == (0, 0)
    *_, dan_expired, back = events(catalog.engine)
    assert dan_expired.event == "waitlist.expired"
    assert isinstance(back, AvailabilityChanged)
    assert back.data.slots[0].remaining == 1
    ok(run(catalog.engine, create_booking, catalog.cut, catalog.cut_slots[0], CAROL, now=lapsed + OFFER_TTL))


def test_offer_never_outlives_the_slot(catalog: Catalog) -> None:
    booking = full_first_slot(catalog)
    waiting = join(catalog, BOB)
    shortly_before = NOW + timedelta(days=1) - timedelta(minutes=5)
    ok(run(catalog.engine, cancel_booking, booking.id, now=shortly_before))
    assert entry(catalog, waiting.id).offer_expires_at == NOW + timedelta(days=1)


def test_joined_entries_expire_when_their_window_ends(catalog: Catalog) -> None:
    waiting = join(catalog, BOB)
    assert run(catalog.engine, expire_offers, now=DAY_ONE.end - timedelta(seconds=1)) == 0
    assert run(catalog.engine, expire_offers, now=DAY_ONE.end) == 1
    assert entry(catalog, waiting.id).state == "expired"
    assert event_types(catalog.engine) == ["waitlist.joined", "waitlist.expired"]


def test_leaving(catalog: Catalog) -> None:
    waiting = join(catalog, BOB)
    left = ok(run(catalog.engine, leave_waitlist, waiting.id, correlation_id="bye", now=NOW))
    assert left.state == "left"
    assert events(catalog.engine)[-1].event == "waitlist.left"
    assert events(catalog.engine)[-1].correlation_id == "bye"
    message = refused(run(catalog.engine, leave_waitlist, waiting.id, now=NOW), INVALID_STATE_TRANSITION)
    assert "left" in message.content
    refused(run(catalog.engine, leave_waitlist, "wl_missing", now=NOW), WAITLIST_ENTRY_NOT_FOUND)
    refused(run(catalog.engine, get_waitlist_entry, "wl_missing"), WAITLIST_ENTRY_NOT_FOUND)
    assert event_types(catalog.engine) == ["waitlist.joined", "waitlist.left"]


def test_leaving_with_an_offer_passes_the_seat_on(catalog: Catalog) -> None:
    booking = full_first_slot(catalog)
    first = join(catalog, BOB)
    second = join(catalog, DAN)
    ok(run(catalog.engine, cancel_booking, booking.id, now=NOW))
    before = len(events(catalog.engine))
    ok(run(catalog.engine, leave_waitlist, first.id, now=NOW))
    assert entry(catalog, second.id).state == "offered"
    assert slot_counts(catalog.engine, catalog.cut_slots[0]) == (0, 1)
    assert event_types(catalog.engine)[before:] == ["waitlist.left", "waitlist.offered"]
    ok(run(catalog.engine, leave_waitlist, second.id, now=NOW))
    assert slot_counts(catalog.engine, catalog.cut_slots[0]) == (0, 0)
    assert event_types(catalog.engine)[-2:] == ["waitlist.left", "catalog.availability.changed"]


def test_reschedule_frees_the_old_seat_for_the_waitlist(catalog: Catalog) -> None:
    booking = full_first_slot(catalog)
    waiting = join(catalog, BOB)
    before = len(events(catalog.engine))
    ok(run(catalog.engine, reschedule_booking, booking.id, catalog.cut_slots[2], now=NOW))
    assert entry(catalog, waiting.id).offered_slot_id == catalog.cut_slots[0]
    rescheduled, offered, changed = events(catalog.engine)[before:]
    assert (rescheduled.event, offered.event) == ("booking.rescheduled", "waitlist.offered")
    assert isinstance(changed, AvailabilityChanged)
    assert [s.id for s in changed.data.slots] == [catalog.cut_slots[2]]  # the old seat is held, not on sale


def test_no_offer_for_a_slot_that_has_started(catalog: Catalog) -> None:
    booking = full_first_slot(catalog)
    waiting = join(catalog, BOB)
    ok(run(catalog.engine, cancel_booking, booking.id, now=NOW + timedelta(days=1, minutes=1)))
    assert entry(catalog, waiting.id).state == "joined"
    assert slot_counts(catalog.engine, catalog.cut_slots[0]) == (0, 0)


@pytest.mark.parametrize(
    ("offered_to", "buyer", "same"),
    [
        (BOB, Buyer(first_name="Bobby", email="Bob@Example.com"), True),
        (BOB, Buyer(first_name="Bob", email="bob@elsewhere.example"), False),
        (CAROL, Buyer(first_name="C", phone="+1 (555) 0100"), True),
        (CAROL, Buyer(first_name="Carol", phone="+1 555 0199"), False),
        (Buyer(first_name="Eve", last_name="Lee"), Buyer(first_name="eve", last_name="LEE"), True),
        (Buyer(first_name="Eve", last_name="Lee"), Buyer(first_name="Eve"), False),
    ],
)
def test_same_buyer(offered_to: Buyer, buyer: Buyer, same: bool) -> None:
    assert same_buyer(offered_to, buyer) is same
