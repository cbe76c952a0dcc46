"""The payload models: what they accept, what they refuse, and what they put on the wire."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from tests.schemas.samples import booking, service, slot, waitlist_entry
from usp_schemas import (
    AvailabilityChange,
    Booking,
    Buyer,
    Message,
    Money,
    Service,
    Slot,
    WaitlistEntry,
)


@pytest.mark.parametrize("duration", ["PT60M", "PT1H30M", "P1D", "P1W", "PT45S", "PT0.5S", "P1DT2H"])
def test_iso_durations_are_accepted_and_kept_verbatim(duration: str) -> None:
    parsed = Service.model_validate(service(duration=duration))

    assert parsed.model_dump()["duration"] == duration


@pytest.mark.parametrize("duration", ["60", "P", "PT", "P1DT", "PT60", "pt60m", "-PT60M", "1 hour", "PT1.5H"])
def test_malformed_durations_are_refused(duration: str) -> None:
    with pytest.raises(ValidationError, match="ISO 8601 duration"):
        Service.model_validate(service(duration=duration))


INVALID: list[tuple[type[BaseModel], dict[str, Any], str]] = [
    (Slot, slot() | {"end": "2026-03-15T09:00:00-04:00"}, "end must be after start"),
    (Slot, slot() | {"remaining": 2}, "remaining cannot exceed capacity"),
    (Slot, slot() | {"state": "reserved"}, "state"),
    (Slot, slot() | {"id": "20260315_0900"}, "pattern"),
    (Slot, slot() | {"start": "2026-03-15T09:00:00"}, "RFC 3339"),
    (Booking, booking() | {"start": "2026-03-15T11:00:00-04:00"}, "end must be after start"),
    (Booking, booking() | {"id": "svc_456def"}, "pattern"),
    (Booking, booking() | {"state": "rescheduled"}, "state"),
    (Booking, {k: v for k, v in booking().items() if k != "buyer"}, "buyer"),
    (Buyer, {"first_name": ""}, "first_name"),
    (Buyer, {"first_name": "Alice", "email": "not-an-address"}, "email"),
    (Money, {"amount": 45.5, "currency": "USD"}, "amount"),
    (Money, {"amount": -1, "currency": "USD"}, "amount"),
    (Money, {"amount": 4500, "currency": "usd"}, "currency"),
    (Service, service(capacity=0), "capacity"),
    (WaitlistEntry, waitlist_entry("offered", offer_expires_at=None), "offered entry needs"),
    (WaitlistEntry, waitlist_entry("converted", booking_id=None), "converted entry needs"),
    (
        WaitlistEntry,
        waitlist_entry(
            "joined", desired_window={"start": "2026-03-15T12:00:00Z", "end": "2026-03-15T08:00:00Z"}
        ),
        "end must be after start",
    ),
    (WaitlistEntry, waitlist_entry("joined", id="wait_01"), "pattern"),
    (AvailabilityChange, {"service_id": "svc_other", "slots": [slot()]}, "slots\\[0\\].service_id"),
    (Message, {"type": "error", "code": "slot_unavailable", "content": "Taken."}, "needs a severity"),
    (Message, {"type": "error", "code": "x", "content": "y", "severity": "fatal"}, "severity"),
]


@pytest.mark.parametrize(
    ("model", "data", "reason"), INVALID, ids=[f"{m.__name__}-{r}" for m, _, r in INVALID]
)
def test_inconsistent_payloads_are_refused(model: type[BaseModel], data: dict[str, Any], reason: str) -> None:
    with pytest.raises(ValidationError, match=reason):
        model.model_validate(data)


def test_warnings_and_infos_may_omit_severity() -> None:
    message = Message(type="info", code="slot_held", content="We hold the slot for 10 minutes.")

    assert message.model_dump() == {
        "type": "info",
        "code": "slot_held",
        "content": "We hold the slot for 10 minutes.",
    }


def test_buyer_needs_only_a_first_name() -> None:
    # The binding's usp_bookings_create example sends first_name and email only.
    assert Buyer.model_validate({"first_name": "Alice", "email": "alice@example.com"}).last_name is None


def test_money_is_minor_units() -> None:
    assert Service.model_validate(service()).price == Money(amount=4500, currency="USD")


def test_binding_slot_example_round_trips() -> None:
    example = {
        "id": "slot_20260315_0900",
        "service_id": "svc_haircut_001",
        "start": "2026-03-15T09:00:00-04:00",
        "end": "2026-03-15T10:00:00-04:00",
        "duration": "PT60M",
        "state": "available",
    }

    assert Slot.model_validate(example).model_dump(mode="json") == example


def test_payload_extras_survive_and_service_defaults_are_sent() -> None:
    minimal = {"id": "svc_x1", "name": "Massage", "duration": "PT30M", "room": "B"}

    dumped = Service.model_validate(minimal).model_dump(mode="json")

    assert dumped == minimal | {"capacity": 1, "active": True}
