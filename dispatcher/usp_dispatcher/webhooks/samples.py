"""Realistic sample events of every type, for ``usp-webhooks trigger`` and the portal's test event."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from usp_dispatcher.ucap.samples import content_sample
from usp_schemas import BOOKING_CONFIRMED_EXAMPLE, EVENT_TYPES, new_event_id, parse_event

__all__ = ["sample_event"]

_BOOKING_STATES = {
    "booking.created": "pending",
    "booking.confirmed": "confirmed",
    "booking.rescheduled": "confirmed",
    "booking.cancelled": "cancelled",
    "booking.completed": "completed",
    "booking.no_show": "no_show",
}
_SAMPLE_DURATION = "PT60M"


def sample_event(event_type: str) -> str:
    """A valid sample event of ``event_type`` (any type) as JSON: the schemas' booking example
    and its buyer, service and slot, shaped for the type (for ``content.*``, the demo publication's
    post, subscription and entitlement), with a fresh ``event_id``."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"no sample for {event_type!r}; choose one of: {', '.join(EVENT_TYPES)}")
    example = json.loads(BOOKING_CONFIRMED_EXAMPLE)
    booking = example["data"]
    service_id = booking["service_id"]
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body: dict[str, Any] = {"version": example["version"]}
    body |= {"event": event_type, "event_id": new_event_id(), "timestamp": now}
    if event_type.startswith("booking."):
        state = _BOOKING_STATES[event_type]
        body |= {"booking_id": booking["id"], "service_id": service_id, "order_id": example["order_id"]}
        body["data"] = booking
        body["data"] |= {"state": state, "updated_at": now}
        if state == "cancelled":
            body["data"]["cancellation_reason"] = "buyer_request"
    elif event_type == "catalog.availability.changed":
        slot = {k: booking[k] for k in ("start", "end")} | {
            "id": booking["slot_id"],
            "service_id": service_id,
            "duration": _SAMPLE_DURATION,
            "state": "booked",
            "capacity": 1,
            "remaining": 0,
        }
        body |= {"service_id": service_id, "data": {"service_id": service_id, "slots": [slot]}}
    elif event_type.startswith("content."):
        body |= content_sample(event_type, now)
    elif event_type.startswith("catalog.service."):
        service: dict[str, Any] = {"id": service_id, "name": "Haircut", "duration": _SAMPLE_DURATION}
        service["active"] = event_type != "catalog.service.deleted"
        body |= {"service_id": service_id, "data": service}
    else:
        state = event_type.removeprefix("waitlist.")
        entry: dict[str, Any] = {
            "id": "wl_sample",
            "service_id": service_id,
            "state": state,
            "buyer": booking["buyer"],
            "desired_window": {"start": booking["start"], "end": booking["end"]},
            "created_at": now,
            "updated_at": now,
        }
        if state in ("offered", "expired", "converted"):
            entry |= {"offered_slot_id": booking["slot_id"], "offer_expires_at": now}
        if state == "converted":
            entry["booking_id"] = body["booking_id"] = booking["id"]
        body |= {"waitlist_entry_id": entry["id"], "service_id": service_id, "data": entry}
    return parse_event(body).model_dump_json()  # validated by the models it claims to be
