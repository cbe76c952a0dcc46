"""Capacity under real concurrency: threads with their own sessions released by a barrier, on
SQLite and PostgreSQL. Every buyer first *sees* the seat free, then all try to book it at once;
the conditional ``UPDATE`` must let exactly as many through as there are seats."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import TypeVar

from sqlmodel import Session

from tests.dispatcher.scheduling.support import (
    ALICE,
    NOW,
    Catalog,
    count,
    event_types,
    ok,
    refused,
    run,
    slot_counts,
)
from usp_core import db
from usp_dispatcher.scheduling import (
    OFFER_TTL,
    Outcome,
    add_slot,
    cancel_booking,
    create_booking,
    expire_offers,
    get_waitlist_entry,
    join_waitlist,
    leave_waitlist,
    perform,
    query_availability,
    reschedule_booking,
)
from usp_dispatcher.scheduling.tables import BookingRow
from usp_schemas import INVALID_STATE_TRANSITION, SLOT_UNAVAILABLE, Booking, Buyer, TimeWindow

T = TypeVar("T")
ROUNDS = 5


def race(catalog: Catalog, attempts: list[Callable[[Session], T]]) -> list[T]:
    """Run each attempt in its own thread and session, all released at once; commit each."""
    barrier = threading.Barrier(len(attempts))

    def contend(attempt: Callable[[Session], T]) -> T:
        with db.session(catalog.engine) as session:
            session.connection()  # check out the connection before the start line
            barrier.wait(timeout=30)
            result = attempt(session)
            session.commit()
            return result

    with ThreadPoolExecutor(len(attempts)) as pool:
        futures = [pool.submit(contend, attempt) for attempt in attempts]
        return [future.result(timeout=120) for future in futures]


def buyer(n: int) -> Buyer:
    return Buyer(first_name=f"Buyer{n}", email=f"buyer{n}@example.com")


def sees_then_books(
    service_id: str, slot_id: str, n: int, seen: list[int], looked: threading.Barrier
) -> Callable[[Session], Booking | Outcome]:
    """An attempt that reads the slot's free seats (recording them), waits until every buyer has
    looked, then books it: each buyer acts on a count that is already stale for all but one."""
    day = (NOW + timedelta(days=1)).date()

    def attempt(session: Session) -> Booking | Outcome:
        found = ok(query_availability(session, service_id, day, day + timedelta(days=3), now=NOW))
        seen.extend(slot.remaining or 0 for slot in found.slots if slot.id == slot_id)
        looked.wait(timeout=30)
        return create_booking(session, service_id, slot_id, buyer(n), now=NOW)

    return attempt


def test_two_buyers_one_seat(catalog: Catalog) -> None:
    for round_ in range(ROUNDS):
        start = NOW + timedelta(days=3, hours=round_)
        slot = ok(run(catalog.engine, add_slot, catalog.cut, start, now=NOW, announce=False))
        seen: list[int] = []
        looked = threading.Barrier(2)
        results = race(catalog, [sees_then_books(catalog.cut, slot.id, n, seen, looked) for n in (1, 2)])
        assert seen == [1, 1], "both buyers must have seen the seat free before booking"
        booked = [r for r in results if isinstance(r, Booking)]
        outcomes = [r for r in results if isinstance(r, Outcome)]
        assert len(booked) == 1, f"round {round_}: {results}"
        refused(outcomes[0], SLOT_UNAVAILABLE)
        assert slot_counts(catalog.engine, slot.id) == (1, 0)
    assert count(catalog.engine, BookingRow) == ROUNDS
    assert event_types(catalog.engine).count("booking.created") == ROUNDS


def test_more_buyers_than_seats(catalog: Catalog) -> None:
    seen: list[int] = []
    looked = threading.Barrier(10)
    attempts = [sees_then_books(catalog.yoga, catalog.yoga_slot, n, seen, looked) for n in range(10)]
    results = race(catalog, attempts)
    assert seen == [4] * 10
    assert sum(isinstance(r, Booking) for r in results) == 4
    for outcome in (r for r in results if isinstance(r, Outcome)):
        refused(outcome, SLOT_UNAVAILABLE)
    assert slot_counts(catalog.engine, catalog.yoga_slot) == (4, 0)
    assert event_types(catalog.engine).count("booking.created") == 4


def cancel(booking_id: str) -> Callable[[Session], Booking | Outcome]:
    return lambda session: cancel_booking(session, booking_id, now=NOW)


def test_two_cancellations_free_one_seat(catalog: Catalog) -> None:
    for round_ in range(ROUNDS):
        mine = ok(
            run(catalog.engine, create_booking, catalog.yoga, catalog.yoga_slot, buyer(round_), now=NOW)
        )
        other = ok(run(catalog.engine, create_booking, catalog.yoga, catalog.yoga_slot, ALICE, now=NOW))
        results = race(catalog, [cancel(mine.id), cancel(mine.id)])
        assert sum(isinstance(r, Booking) and r.state == "cancelled" for r in results) == 1
        refused(next(r for r in results if isinstance(r, Outcome)), INVALID_STATE_TRANSITION)
        assert slot_counts(catalog.engine, catalog.yoga_slot) == (1, 0)  # ``other`` still holds its seat
        ok(run(catalog.engine, cancel_booking, other.id, now=NOW))
    assert event_types(catalog.engine).count("booking.cancelled") == 2 * ROUNDS


def book_with_key(slot_id: str, service_id: str, key: str) -> Callable[[Session], tuple[int, object, bool]]:
    """A create through :func:`perform` with an idempotency key, as the front ends do it."""
    ann = Buyer(first_name="Ann")
    arguments = {"service_id": service_id, "slot_id": slot_id, "buyer": ann.model_dump(mode="json")}

    def attempt(session: Session) -> tuple[int, object, bool]:
        answer = perform(
            session,
            lambda: create_booking(session, service_id, slot_id, ann, now=NOW),
            operation="bookings.create",
            arguments=arguments,
            idempotency_key=key,
            principal="test",
            created_status=201,
        )
        return answer.status_code, answer.body, answer.replayed

    return attempt


def test_one_idempotency_key_racing_books_once(catalog: Catalog) -> None:
    """Two seats, so the loser really books one too before its key insert fails and it all rolls back."""
    for round_ in range(ROUNDS):
        start = NOW + timedelta(days=3, hours=round_)
        slot = ok(run(catalog.engine, add_slot, catalog.yoga, start, capacity=2, now=NOW, announce=False))
        attempt = book_with_key(slot.id, catalog.yoga, f"key-{round_}")
        (status_a, body_a, replayed_a), (status_b, body_b, replayed_b) = race(catalog, [attempt, attempt])
        assert (status_a, status_b) == (201, 201)
        assert body_a == body_b
        assert sorted([replayed_a, replayed_b]) == [False, True]
        assert slot_counts(catalog.engine, slot.id) == (1, 0)
    assert count(catalog.engine, BookingRow) == ROUNDS
    assert event_types(catalog.engine).count("booking.created") == ROUNDS


def reschedule(booking_id: str, slot_id: str) -> Callable[[Session], Booking | Outcome]:
    return lambda session: reschedule_booking(session, booking_id, slot_id, now=NOW)


def test_swapping_reschedules_do_not_deadlock(catalog: Catalog) -> None:
    """X moves A → B while Y moves B → A: each takes its new seat, then frees its old one. Taken
    in opposite orders those row locks would deadlock on PostgreSQL."""
    for round_ in range(ROUNDS):
        start = NOW + timedelta(days=3, hours=round_)
        a, b = (
            ok(
                run(
                    catalog.engine,
                    add_slot,
                    catalog.yoga,
                    start + offset,
                    capacity=2,
                    now=NOW,
                    announce=False,
                )
            ).id
            for offset in (timedelta(0), timedelta(minutes=30))
        )
        x = ok(run(catalog.engine, create_booking, catalog.yoga, a, buyer(1), now=NOW))
        y = ok(run(catalog.engine, create_booking, catalog.yoga, b, buyer(2), now=NOW))
        moved_x, moved_y = race(catalog, [reschedule(x.id, b), reschedule(y.id, a)])
        assert (ok(moved_x).slot_id, ok(moved_y).slot_id) == (b, a)
        assert slot_counts(catalog.engine, a) == slot_counts(catalog.engine, b) == (1, 0)


def test_reschedule_racing_a_cancel(catalog: Catalog) -> None:
    for round_ in range(ROUNDS):
        start = NOW + timedelta(days=3, hours=round_)
        a, b = (
            ok(
                run(
                    catalog.engine,
                    add_slot,
                    catalog.yoga,
                    start + offset,
                    capacity=2,
                    now=NOW,
                    announce=False,
                )
            ).id
            for offset in (timedelta(0), timedelta(minutes=30))
        )
        x = ok(run(catalog.engine, create_booking, catalog.yoga, a, buyer(1), now=NOW))
        moved, cancelled = race(catalog, [reschedule(x.id, b), cancel(x.id)])
        assert isinstance(cancelled, Booking)  # a cancel always wins: before or after the move
        assert cancelled.state == "cancelled"
        assert isinstance(moved, Booking) or refused(moved, INVALID_STATE_TRANSITION)
        assert slot_counts(catalog.engine, a) == slot_counts(catalog.engine, b) == (0, 0)


def offered_entry(catalog: Catalog, round_: int) -> tuple[str, str]:
    """A fresh one-seat slot whose seat is offered to ``buyer(100 + round_)``: (slot id, entry id)."""
    start = NOW + timedelta(days=3, hours=round_)
    slot = ok(run(catalog.engine, add_slot, catalog.cut, start, now=NOW, announce=False)).id
    booking = ok(run(catalog.engine, create_booking, catalog.cut, slot, ALICE, now=NOW))
    window = TimeWindow(start=start, end=start + timedelta(hours=1))
    entry = ok(run(catalog.engine, join_waitlist, catalog.cut, window, buyer(100 + round_), now=NOW))
    ok(run(catalog.engine, cancel_booking, booking.id, now=NOW))
    assert slot_counts(catalog.engine, slot) == (0, 1)
    return slot, entry.id


def take_offer(
    service_id: str, slot_id: str, who: Buyer, at: datetime
) -> Callable[[Session], Booking | Outcome]:
    return lambda session: create_booking(session, service_id, slot_id, who, now=at)


def expire(at: datetime) -> Callable[[Session], int]:
    return lambda session: expire_offers(session, now=at)


def leave(entry_id: str, at: datetime) -> Callable[[Session], object]:
    return lambda session: leave_waitlist(session, entry_id, now=at)


def waitlist_events(catalog: Catalog, since: int) -> tuple[str, ...]:
    return tuple(e for e in event_types(catalog.engine)[since:] if e.startswith("waitlist."))


def test_taking_an_offer_racing_its_expiry(catalog: Catalog) -> None:
    """At the last instant the buyer books while the scheduler expires: one of the two wins, the
    buyer gets the seat either way (nobody else waits), and exactly one waitlist event says how."""
    lapse = NOW + OFFER_TTL
    for round_ in range(ROUNDS):
        slot, entry_id = offered_entry(catalog, round_)
        before = len(event_types(catalog.engine))
        attempts: list[Callable[[Session], object]] = [
            take_offer(catalog.cut, slot, buyer(100 + round_), lapse - timedelta(microseconds=1)),
            expire(lapse),
        ]
        booked, _expired = race(catalog, attempts)
        assert isinstance(booked, Booking), booked
        state = ok(run(catalog.engine, get_waitlist_entry, entry_id)).state
        outcome = (state, waitlist_events(catalog, before))
        assert outcome in {("converted", ("waitlist.converted",)), ("expired", ("waitlist.expired",))}
        assert slot_counts(catalog.engine, slot) == (1, 0)


def test_leaving_racing_expiry(catalog: Catalog) -> None:
    lapse = NOW + OFFER_TTL
    for round_ in range(ROUNDS):
        slot, entry_id = offered_entry(catalog, round_)
        before = len(event_types(catalog.engine))
        race(catalog, [leave(entry_id, lapse), expire(lapse)])
        state = ok(run(catalog.engine, get_waitlist_entry, entry_id)).state
        outcome = (state, waitlist_events(catalog, before))
        assert outcome in {("left", ("waitlist.left",)), ("expired", ("waitlist.expired",))}
        assert slot_counts(catalog.engine, slot) == (0, 0)
