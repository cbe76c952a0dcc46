"""Bookings: every transition with its event, every refusal without one."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from sqlmodel import Session

from tests.dispatcher.scheduling.support import (
    ALICE,
    BOB,
    NOW,
    Catalog,
    call,
    count,
    event_types,
    events,
    ok,
    refused,
    run,
    slot_counts,
)
from usp_core import db
from usp_dispatcher.scheduling import (
    cancel_booking,
    complete_booking,
    confirm_booking,
    create_booking,
    get_booking,
    mark_no_show,
    reschedule_booking,
)
from usp_dispatcher.scheduling.tables import BookingRow, ServiceRow
from usp_schemas import (
    BOOKING_NOT_FOUND,
    INVALID_STATE_TRANSITION,
    SERVICE_NOT_FOUND,
    SLOT_UNAVAILABLE,
    AvailabilityChanged,
    Booking,
    BookingCancelled,
    BookingCreated,
    BookingRescheduled,
)
from usp_workers.storage.models import EventRecord

Action = Callable[[Session, str], Any]

CONFIRM: Action = lambda s, b: confirm_booking(s, b, now=NOW)  # noqa: E731
COMPLETE: Action = lambda s, b: complete_booking(s, b, now=NOW)  # noqa: E731
NO_SHOW: Action = lambda s, b: mark_no_show(s, b, now=NOW)  # noqa: E731
CANCEL: Action = lambda s, b: cancel_booking(s, b, "changed plans", now=NOW)  # noqa: E731


def book(catalog: Catalog, slot: int = 0, **kwargs: Any) -> Booking:
    slot_id = catalog.cut_slots[slot]
    return ok(
        call(catalog.engine, lambda s: create_booking(s, catalog.cut, slot_id, ALICE, now=NOW, **kwargs))
    )


def act(catalog: Catalog, action: Action, booking_id: str) -> Any:
    return call(catalog.engine, lambda s: action(s, booking_id))


def booking_in(catalog: Catalog, state: str) -> Booking:
    """A booking brought to ``state`` through the service functions."""
    booking = book(catalog)
    steps: dict[str, list[Action]] = {
        "pending": [],
        "confirmed": [CONFIRM],
        "completed": [CONFIRM, COMPLETE],
        "no_show": [CONFIRM, NO_SHOW],
        "cancelled": [CANCEL],
    }
    for step in steps[state]:
        booking = ok(act(catalog, step, booking.id))
    assert booking.state == state
    return booking


def test_create_makes_a_pending_booking_and_takes_the_seat(catalog: Catalog) -> None:
    booking = book(catalog, correlation_id="corr-1", order_id="ord_ucp_001")
    assert booking.state == "pending"
    assert booking.id.startswith("bkg_")
    assert (booking.service_id, booking.slot_id, booking.buyer) == (catalog.cut, catalog.cut_slots[0], ALICE)
    assert booking.start.isoformat() == "2030-03-15T12:00:00-04:00"  # the service's local time
    assert booking.order_id == "ord_ucp_001"
    assert slot_counts(catalog.engine, catalog.cut_slots[0]) == (1, 0)

    created, changed = events(catalog.engine)
    assert isinstance(created, BookingCreated)
    assert created.data == booking
    assert (created.booking_id, created.service_id, created.order_id) == (
        booking.id,
        catalog.cut,
        "ord_ucp_001",
    )
    assert created.correlation_id == "corr-1"
    assert created.timestamp == NOW
    assert isinstance(changed, AvailabilityChanged)
    assert changed.correlation_id is None  # catalog news is nobody's flow
    ((slot),) = changed.data.slots
    assert (slot.id, slot.state, slot.remaining) == (catalog.cut_slots[0], "booked", 0)
    assert ok(call(catalog.engine, lambda s: get_booking(s, booking.id))) == booking


def test_group_slot_takes_one_seat_per_booking(catalog: Catalog) -> None:
    for buyer, remaining in ((ALICE, 3), (BOB, 2)):
        ok(run(catalog.engine, create_booking, catalog.yoga, catalog.yoga_slot, buyer, now=NOW))
        changed = events(catalog.engine)[-1]
        assert isinstance(changed, AvailabilityChanged)
        assert (changed.data.slots[0].state, changed.data.slots[0].remaining) == ("available", remaining)
    assert slot_counts(catalog.engine, catalog.yoga_slot) == (2, 0)


@pytest.mark.parametrize(
    ("action", "start", "end", "event"),
    [
        (CONFIRM, "pending", "confirmed", "booking.confirmed"),
        (COMPLETE, "confirmed", "completed", "booking.completed"),
        (NO_SHOW, "confirmed", "no_show", "booking.no_show"),
        (CANCEL, "pending", "cancelled", "booking.cancelled"),
        (CANCEL, "confirmed", "cancelled", "booking.cancelled"),
    ],
)
def test_transitions(catalog: Catalog, action: Action, start: str, end: str, event: str) -> None:
    booking = booking_in(catalog, start)
    before = len(events(catalog.engine))
    later = NOW + timedelta(minutes=5)
    changed = ok(call(catalog.engine, lambda s: action(s, booking.id)))
    assert changed.state == end
    assert changed.id == booking.id
    assert ok(call(catalog.engine, lambda s: get_booking(s, booking.id))) == changed
    new = events(catalog.engine)[before:]
    assert new[0].event == event
    assert new[0].data == changed
    assert later > new[0].timestamp


@pytest.mark.parametrize(
    ("action", "start"),
    [
        (CONFIRM, "confirmed"),
        (CONFIRM, "cancelled"),
        (CONFIRM, "completed"),
        (COMPLETE, "pending"),
        (COMPLETE, "cancelled"),
        (COMPLETE, "no_show"),
        (NO_SHOW, "pending"),
        (NO_SHOW, "completed"),
        (CANCEL, "cancelled"),
        (CANCEL, "completed"),
        (CANCEL, "no_show"),
    ],
)
def test_invalid_transitions_change_and_emit_nothing(catalog: Catalog, action: Action, start: str) -> None:
    booking = booking_in(catalog, start)
    before = events(catalog.engine)
    seats = slot_counts(catalog.engine, catalog.cut_slots[0])
    message = refused(call(catalog.engine, lambda s: action(s, booking.id)), INVALID_STATE_TRANSITION)
    assert start.replace("_", " ") in message.content or start in message.content
    assert message.severity == "unrecoverable"
    assert ok(call(catalog.engine, lambda s: get_booking(s, booking.id))) == booking
    assert events(catalog.engine) == before
    assert slot_counts(catalog.engine, catalog.cut_slots[0]) == seats


@pytest.mark.parametrize(
    "action",
    [
        CONFIRM,
        COMPLETE,
        NO_SHOW,
        CANCEL,
        lambda s, b: get_booking(s, b),
        lambda s, b: reschedule_booking(s, b, "slot_x", now=NOW),
    ],
)
def test_unknown_booking(catalog: Catalog, action: Action) -> None:
    message = refused(call(catalog.engine, lambda s: action(s, "bkg_missing")), BOOKING_NOT_FOUND)
    assert "bkg_missing" in message.content
    assert event_types(catalog.engine) == []


def test_cancel_frees_the_seat_and_records_the_reason(catalog: Catalog) -> None:
    booking = booking_in(catalog, "confirmed")
    cancelled = ok(
        call(catalog.engine, lambda s: cancel_booking(s, booking.id, "sick", correlation_id="c-2", now=NOW))
    )
    assert (cancelled.state, cancelled.cancellation_reason) == ("cancelled", "sick")
    assert slot_counts(catalog.engine, catalog.cut_slots[0]) == (0, 0)
    *_, event, changed = events(catalog.engine)
    assert isinstance(event, BookingCancelled)
    assert event.data.cancellation_reason == "sick"
    assert event.correlation_id == "c-2"
    assert isinstance(changed, AvailabilityChanged)
    assert (changed.data.slots[0].state, changed.data.slots[0].remaining) == ("available", 1)
    # Bookable again.
    ok(call(catalog.engine, lambda s: create_booking(s, catalog.cut, catalog.cut_slots[0], BOB, now=NOW)))


def test_cancel_after_the_slot_started_announces_nothing(catalog: Catalog) -> None:
    booking = book(catalog)
    during = NOW + timedelta(days=1, minutes=10)
    ok(call(catalog.engine, lambda s: cancel_booking(s, booking.id, now=during)))
    assert event_types(catalog.engine)[-1] == "booking.cancelled"
    assert slot_counts(catalog.engine, catalog.cut_slots[0]) == (0, 0)


def test_later_events_carry_the_creation_correlation_id_unless_given_another(catalog: Catalog) -> None:
    booking = book(catalog, correlation_id="platform-flow-1")
    ok(call(catalog.engine, lambda s: confirm_booking(s, booking.id, now=NOW)))
    ok(call(catalog.engine, lambda s: cancel_booking(s, booking.id, correlation_id="other-flow", now=NOW)))
    created, _changed, confirmed, cancelled, _freed = events(catalog.engine)
    assert created.correlation_id == confirmed.correlation_id == "platform-flow-1"
    assert cancelled.correlation_id == "other-flow"
    with db.session(catalog.engine) as session:
        record = session.get(EventRecord, cancelled.event_id)
        assert record is not None
        assert (record.correlation_id, record.subject_id) == ("other-flow", booking.id)


# ------------------------------------------------------------------------------------ refusals


def test_unknown_or_retired_service(catalog: Catalog) -> None:
    refused(
        call(catalog.engine, lambda s: create_booking(s, "svc_nope", catalog.cut_slots[0], ALICE, now=NOW)),
        SERVICE_NOT_FOUND,
    )
    with db.session(catalog.engine) as session:
        service = session.get(ServiceRow, catalog.cut)
        assert service is not None
        service.active = False
        session.add(service)
        session.commit()
    refused(
        call(catalog.engine, lambda s: create_booking(s, catalog.cut, catalog.cut_slots[0], ALICE, now=NOW)),
        SERVICE_NOT_FOUND,
    )
    assert count(catalog.engine, BookingRow) == 0
    assert event_types(catalog.engine) == []


@pytest.mark.parametrize("slot", ["slot_missing", "yoga"])
def test_slot_not_of_the_service(catalog: Catalog, slot: str) -> None:
    slot_id = catalog.yoga_slot if slot == "yoga" else slot
    message = refused(
        call(catalog.engine, lambda s: create_booking(s, catalog.cut, slot_id, ALICE, now=NOW)),
        SLOT_UNAVAILABLE,
    )
    assert (message.path, message.severity) == ("$.slot_id", "recoverable")
    assert count(catalog.engine, BookingRow) == 0
    assert slot_counts(catalog.engine, catalog.yoga_slot) == (0, 0)


def test_started_slot(catalog: Catalog) -> None:
    at_start = NOW + timedelta(days=1)
    refused(
        call(
            catalog.engine,
            lambda s: create_booking(s, catalog.cut, catalog.cut_slots[0], ALICE, now=at_start),
        ),
        SLOT_UNAVAILABLE,
    )
    assert slot_counts(catalog.engine, catalog.cut_slots[0]) == (0, 0)


def test_full_slot(catalog: Catalog) -> None:
    book(catalog)
    before = events(catalog.engine)
    refused(
        call(catalog.engine, lambda s: create_booking(s, catalog.cut, catalog.cut_slots[0], BOB, now=NOW)),
        SLOT_UNAVAILABLE,
    )
    assert count(catalog.engine, BookingRow) == 1
    assert events(catalog.engine) == before


# ------------------------------------------------------------------------------------ reschedule


@pytest.mark.parametrize("state", ["pending", "confirmed"])
def test_reschedule_moves_the_seat_and_keeps_the_state(catalog: Catalog, state: str) -> None:
    booking = booking_in(catalog, state)
    before = len(events(catalog.engine))
    moved = ok(
        call(
            catalog.engine,
            lambda s: reschedule_booking(s, booking.id, catalog.cut_slots[2], correlation_id="r-1", now=NOW),
        )
    )
    assert (moved.state, moved.slot_id) == (state, catalog.cut_slots[2])
    assert moved.start.isoformat() == "2030-03-16T12:00:00-04:00"
    assert slot_counts(catalog.engine, catalog.cut_slots[0]) == (0, 0)
    assert slot_counts(catalog.engine, catalog.cut_slots[2]) == (1, 0)
    rescheduled, changed = events(catalog.engine)[before:]
    assert isinstance(rescheduled, BookingRescheduled)
    assert rescheduled.data == moved
    assert rescheduled.correlation_id == "r-1"
    assert isinstance(changed, AvailabilityChanged)
    assert {(s.id, s.remaining) for s in changed.data.slots} == {
        (catalog.cut_slots[2], 0),
        (catalog.cut_slots[0], 1),
    }


def test_reschedule_to_the_same_slot_changes_nothing(catalog: Catalog) -> None:
    booking = book(catalog)
    before = events(catalog.engine)
    assert (
        ok(call(catalog.engine, lambda s: reschedule_booking(s, booking.id, booking.slot_id, now=NOW)))
        == booking
    )
    assert events(catalog.engine) == before
    assert slot_counts(catalog.engine, booking.slot_id) == (1, 0)


def test_reschedule_to_a_full_or_foreign_slot_is_refused(catalog: Catalog) -> None:
    mine = book(catalog, slot=0)
    ok(call(catalog.engine, lambda s: create_booking(s, catalog.cut, catalog.cut_slots[1], BOB, now=NOW)))
    before = events(catalog.engine)
    for target in (catalog.cut_slots[1], catalog.yoga_slot, "slot_missing"):
        refused(run(catalog.engine, reschedule_booking, mine.id, target, now=NOW), SLOT_UNAVAILABLE)
    assert ok(call(catalog.engine, lambda s: get_booking(s, mine.id))) == mine
    assert events(catalog.engine) == before
    assert slot_counts(catalog.engine, catalog.cut_slots[0]) == (1, 0)
    assert slot_counts(catalog.engine, catalog.cut_slots[1]) == (1, 0)
    assert slot_counts(catalog.engine, catalog.yoga_slot) == (0, 0)


@pytest.mark.parametrize("state", ["cancelled", "completed", "no_show"])
def test_reschedule_of_a_closed_booking(catalog: Catalog, state: str) -> None:
    booking = booking_in(catalog, state)
    refused(
        call(catalog.engine, lambda s: reschedule_booking(s, booking.id, catalog.cut_slots[2], now=NOW)),
        INVALID_STATE_TRANSITION,
    )
    assert slot_counts(catalog.engine, catalog.cut_slots[2]) == (0, 0)


def test_get_reads_a_booking_of_a_retired_service(catalog: Catalog) -> None:
    booking = book(catalog)
    with db.session(catalog.engine) as session:
        service = session.get(ServiceRow, catalog.cut)
        assert service is not None
        service.active = False
        session.add(service)
        session.commit()
    assert ok(call(catalog.engine, lambda s: get_booking(s, booking.id))) == booking
    assert ok(call(catalog.engine, lambda s: cancel_booking(s, booking.id, now=NOW))).state == "cancelled"
