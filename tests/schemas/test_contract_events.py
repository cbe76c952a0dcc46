"""Parsing, refusing and re-serializing webhook events: the envelope half of the contract."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from tests.schemas.samples import (
    ALL_EVENT_TYPES,
    EVENT_ID,
    SPEC_EVENT_TYPES,
    booking,
    sample,
    service,
    waitlist_entry,
)
from usp_schemas import (
    EVENT_TYPES,
    USP_VERSION,
    AvailabilityChange,
    AvailabilityChanged,
    Booking,
    BookingCancelled,
    BookingCompleted,
    BookingConfirmed,
    BookingCreated,
    BookingEvent,
    BookingNoShow,
    BookingRescheduled,
    ContentSubscription,
    Entitlement,
    EntitlementGranted,
    EntitlementRevoked,
    EventEnvelope,
    EventValidationError,
    Post,
    PostPublished,
    PostUpdated,
    Publication,
    PublicationUpdated,
    Service,
    ServiceCreated,
    ServiceDeleted,
    ServiceEvent,
    ServiceUpdated,
    SubscriptionActivated,
    SubscriptionCancelled,
    SubscriptionCreated,
    WaitlistConverted,
    WaitlistEntry,
    WaitlistEvent,
    WaitlistExpired,
    WaitlistJoined,
    WaitlistLeft,
    WaitlistOffered,
    new_event_id,
    parse_event,
)

EXPECTED_MODEL: dict[str, tuple[type[EventEnvelope], type[object]]] = {
    "booking.created": (BookingCreated, Booking),
    "booking.confirmed": (BookingConfirmed, Booking),
    "booking.rescheduled": (BookingRescheduled, Booking),
    "booking.cancelled": (BookingCancelled, Booking),
    "booking.completed": (BookingCompleted, Booking),
    "booking.no_show": (BookingNoShow, Booking),
    "catalog.service.created": (ServiceCreated, Service),
    "catalog.service.updated": (ServiceUpdated, Service),
    "catalog.service.deleted": (ServiceDeleted, Service),
    "catalog.availability.changed": (AvailabilityChanged, AvailabilityChange),
    "waitlist.joined": (WaitlistJoined, WaitlistEntry),
    "waitlist.offered": (WaitlistOffered, WaitlistEntry),
    "waitlist.converted": (WaitlistConverted, WaitlistEntry),
    "waitlist.expired": (WaitlistExpired, WaitlistEntry),
    "waitlist.left": (WaitlistLeft, WaitlistEntry),
    "content.post.published": (PostPublished, Post),
    "content.post.updated": (PostUpdated, Post),
    "content.publication.updated": (PublicationUpdated, Publication),
    "content.subscription.created": (SubscriptionCreated, ContentSubscription),
    "content.subscription.activated": (SubscriptionActivated, ContentSubscription),
    "content.subscription.canceled": (SubscriptionCancelled, ContentSubscription),
    "content.entitlement.granted": (EntitlementGranted, Entitlement),
    "content.entitlement.revoked": (EntitlementRevoked, Entitlement),
}


def test_event_types_are_the_spec_list() -> None:
    assert EVENT_TYPES == ALL_EVENT_TYPES
    assert EVENT_TYPES[: len(SPEC_EVENT_TYPES)] == SPEC_EVENT_TYPES
    assert set(EXPECTED_MODEL) == set(ALL_EVENT_TYPES)


@pytest.mark.parametrize("event_type", ALL_EVENT_TYPES)
@pytest.mark.parametrize("encode", ["bytes", "str", "dict"])
def test_every_event_type_parses_to_its_model(event_type: str, encode: str) -> None:
    body = sample(event_type)
    encodings: dict[str, bytes | str | dict[str, Any]] = {
        "bytes": json.dumps(body).encode(),
        "str": json.dumps(body),
        "dict": body,
    }

    event = parse_event(encodings[encode])

    model, data_model = EXPECTED_MODEL[event_type]
    assert type(event) is model
    assert type(event.data) is data_model
    assert event.event == event_type
    assert event.event_id == EVENT_ID
    assert event.correlation_id == "corr_7f3a"


@pytest.mark.parametrize("event_type", ALL_EVENT_TYPES)
def test_round_trip_through_json_is_lossless(event_type: str) -> None:
    body = sample(event_type)
    event = parse_event(body)

    wire = event.model_dump_json()

    assert parse_event(wire) == event
    assert json.loads(wire) == body  # same keys, same values: nothing added, nothing lost


def test_binding_example_without_version_gets_the_default() -> None:
    # The binding's own example envelope has no ``version``; it must still parse.
    body = sample("booking.confirmed")
    del body["version"], body["correlation_id"]

    event = parse_event(body)

    assert event.version == USP_VERSION
    assert json.loads(event.model_dump_json())["version"] == USP_VERSION


def test_timestamp_is_normalised_to_utc_and_serialised_with_z() -> None:
    body = sample("booking.confirmed") | {"timestamp": "2026-03-15T00:06:00.250+02:00"}

    event = parse_event(body)

    assert event.timestamp.utcoffset() == timedelta(0)
    assert json.loads(event.model_dump_json())["timestamp"] == "2026-03-14T22:06:00.250000Z"


def test_slot_times_keep_their_local_offset() -> None:
    event = parse_event(sample("booking.confirmed"))

    assert json.loads(event.model_dump_json())["data"]["start"] == "2026-03-15T09:00:00-04:00"


def test_unknown_fields_are_kept_at_every_level() -> None:
    body = sample("booking.confirmed")
    body["business_region"] = "eu-west"
    body["_meta"] = {"usp": {"signature": "eyJhbGciOiJFZERTQSJ9..c2ln"}}
    body["data"]["loyalty_tier"] = "gold"
    body["data"]["buyer"]["locale"] = None

    dumped = json.loads(parse_event(body).model_dump_json())

    assert dumped["business_region"] == "eu-west"
    assert dumped["_meta"] == {"usp": {"signature": "eyJhbGciOiJFZERTQSJ9..c2ln"}}
    assert dumped["data"]["loyalty_tier"] == "gold"
    assert "locale" in dumped["data"]["buyer"]  # an unknown null is passed on, not dropped


def test_unknown_optionals_are_left_out_not_null() -> None:
    body = sample("booking.created")
    del body["order_id"], body["correlation_id"], body["data"]["order_id"]

    dumped = json.loads(parse_event(body).model_dump_json())

    assert "order_id" not in dumped
    assert "correlation_id" not in dumped
    assert "order_id" not in dumped["data"]
    assert "cancellation_reason" not in dumped["data"]


def test_events_built_in_python_need_not_repeat_their_type() -> None:
    data = Booking.model_validate(booking("cancelled"))

    event = BookingCancelled(
        event_id=new_event_id(), timestamp=data.updated_at, booking_id=data.id, data=data
    )

    assert event.event == "booking.cancelled"
    assert parse_event(event.model_dump_json()) == event


def test_family_bases_allow_isinstance_dispatch() -> None:
    families = {
        "booking.no_show": BookingEvent,
        "catalog.service.updated": ServiceEvent,
        "waitlist.left": WaitlistEvent,
    }
    for event_type, family in families.items():
        assert isinstance(parse_event(sample(event_type)), family), event_type


def _without(body: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != key}


BAD_BODIES: dict[str, Any] = {
    "booking_id differs from data.id": sample("booking.confirmed") | {"booking_id": "bkg_other"},
    "service_id differs from data.id": sample("catalog.service.updated") | {"service_id": "svc_other"},
    "availability service differs": sample("catalog.availability.changed") | {"service_id": "svc_other"},
    "waitlist id differs": sample("waitlist.joined") | {"waitlist_entry_id": "wl_other"},
    "booking event service_id differs": sample("booking.created") | {"service_id": "svc_other"},
    "converted booking_id differs": sample("waitlist.converted") | {"booking_id": "bkg_other"},
    "order_id differs from data": sample("booking.confirmed") | {"order_id": "ord_other"},
    "missing subject id": _without(sample("booking.confirmed"), "booking_id"),
    "missing waitlist subject id": _without(sample("waitlist.offered"), "waitlist_entry_id"),
    "missing data": _without(sample("booking.confirmed"), "data"),
    "data of another type": sample("booking.confirmed") | {"data": service()},
    "data state impossible for the event": sample("booking.cancelled") | {"data": booking("confirmed")},
    "waitlist state impossible": sample("waitlist.left") | {"data": waitlist_entry("joined")},
    "missing event_id": _without(sample("booking.confirmed"), "event_id"),
    "event_id empty": sample("booking.confirmed") | {"event_id": ""},
    "event_id with junk": sample("booking.confirmed") | {"event_id": "evt_0123456789'; DROP"},
    "event_id too long": sample("booking.confirmed") | {"event_id": "evt_" + "a" * 77},
    "event_id not a string": sample("booking.confirmed") | {"event_id": 1234567890123},
    "timestamp without offset": sample("booking.confirmed") | {"timestamp": "2026-03-14T22:06:00"},
    "timestamp as unix seconds": sample("booking.confirmed") | {"timestamp": 1773525960},
    "timestamp as a date": sample("booking.confirmed") | {"timestamp": "2026-03-14"},
    "timestamp garbage": sample("booking.confirmed") | {"timestamp": "yesterday"},
    "timestamp impossible": sample("booking.confirmed") | {"timestamp": "2026-02-30T22:06:00Z"},
    "missing timestamp": _without(sample("booking.confirmed"), "timestamp"),
    "unknown event type": sample("booking.confirmed") | {"event": "booking.exploded"},
    "missing event type": _without(sample("booking.confirmed"), "event"),
    "other protocol version": sample("booking.confirmed") | {"version": "2025-01-01"},
    "not an object": [sample("booking.confirmed")],
}


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_bad_events_are_refused_with_a_typed_error(body: Any) -> None:
    with pytest.raises(EventValidationError) as caught:
        parse_event(json.dumps(body))

    assert isinstance(caught.value, ValueError)
    assert caught.value.errors, "the pydantic error details must be attached"
    assert all("input" not in error for error in caught.value.errors)  # no PII in logs


@pytest.mark.parametrize("raw", [b"", b"{", b"\xff\xfe", "null", '"booking.confirmed"'])
def test_undecodable_bodies_are_refused_with_a_typed_error(raw: bytes | str) -> None:
    with pytest.raises(EventValidationError, match="invalid USP event"):
        parse_event(raw)


def test_error_names_the_failing_location() -> None:
    with pytest.raises(EventValidationError) as caught:
        parse_event(sample("booking.confirmed") | {"event_id": "evt_with space"})

    assert [error["loc"] for error in caught.value.errors] == [("booking.confirmed", "event_id")]
    assert "event_id" in str(caught.value)


@pytest.mark.parametrize(
    "event_id",
    [
        "evt_01HX5K3V9Q8R7T6Y5W4E3D2C1B",  # ULID
        "evt_019a2b3c4d5e7000800000000000000a",  # UUIDv7 hex
        "evt_019a2b3c-4d5e-7000-8000-00000000000a",  # UUIDv7, hyphenated
        "evt_789abc",  # the binding's example
        "019a2b3c-4d5e-7000-8000-00000000000a",
        "e",
        "a" * 80,
    ],
)
def test_event_id_accepts_producer_chosen_ids_in_the_safe_alphabet(event_id: str) -> None:
    assert parse_event(sample("booking.confirmed") | {"event_id": event_id}).event_id == event_id


@pytest.mark.parametrize(
    "event_id", ["", "_evt", "evt 1", "evt/1", "evt.1", "évt_1", "evt_1\n", "a" * 81, "evt_1%2F"]
)
def test_event_id_outside_the_safe_alphabet_is_refused(event_id: str) -> None:
    with pytest.raises(EventValidationError) as caught:
        parse_event(sample("booking.confirmed") | {"event_id": event_id})
    assert [error["loc"] for error in caught.value.errors] == [("booking.confirmed", "event_id")]
