"""Realistic webhook bodies for every event type, as a business would send them."""

from __future__ import annotations

from typing import Any

from usp_schemas import USP_VERSION

# The list in SPEC-NOTES.md, written out again on purpose: the package must not drift from it.
SPEC_EVENT_TYPES = (
    "booking.created",
    "booking.confirmed",
    "booking.rescheduled",
    "booking.cancelled",
    "booking.completed",
    "booking.no_show",
    "catalog.service.created",
    "catalog.service.updated",
    "catalog.service.deleted",
    "catalog.availability.changed",
    "waitlist.joined",
    "waitlist.offered",
    "waitlist.converted",
    "waitlist.expired",
    "waitlist.left",
)
# The UCAP content events issue 16 names, in its order.
UCAP_EVENT_TYPES = (
    "content.post.published",
    "content.post.updated",
    "content.publication.updated",
    "content.subscription.created",
    "content.subscription.activated",
    "content.subscription.canceled",
    "content.entitlement.granted",
    "content.entitlement.revoked",
)
ALL_EVENT_TYPES = SPEC_EVENT_TYPES + UCAP_EVENT_TYPES

EVENT_ID = "evt_019a2b3c4d5e7000800000000000000a"
BUYER = {"first_name": "Alice", "last_name": "Ng", "email": "alice@example.com", "phone": "+15551234567"}

#: The booking's state right after each booking event.
BOOKING_STATE = {
    "booking.created": "pending",
    "booking.confirmed": "confirmed",
    "booking.rescheduled": "confirmed",
    "booking.cancelled": "cancelled",
    "booking.completed": "completed",
    "booking.no_show": "no_show",
}


def sample(event: str) -> dict[str, Any]:
    """A complete, valid body for ``event`` (a fresh dict: change it freely)."""
    body: dict[str, Any] = {
        "event": event,
        "event_id": EVENT_ID,
        "timestamp": "2026-03-14T22:06:00Z",
        "version": USP_VERSION,
    }
    if event.startswith("booking."):
        body |= {"booking_id": "bkg_456def", "order_id": "ord_ucp_001", "data": booking(BOOKING_STATE[event])}
    elif event.startswith("catalog.service."):
        body |= {"service_id": "svc_haircut_001", "data": service(active=event != "catalog.service.deleted")}
    elif event == "catalog.availability.changed":
        later = slot("slot_20260315_1000", "booked") | {
            "start": "2026-03-15T10:00:00-04:00",
            "end": "2026-03-15T11:00:00-04:00",
        }
        body |= {
            "service_id": "svc_haircut_001",
            "data": {"service_id": "svc_haircut_001", "slots": [slot(), later]},
        }
    elif event.startswith("content."):
        body |= content_sample(event)
    else:
        state = event.removeprefix("waitlist.")
        body |= {"waitlist_entry_id": "wl_01hx5k", "service_id": "svc_haircut_001"}
        body["data"] = waitlist_entry(state)
        if state == "converted":
            body["booking_id"] = "bkg_456def"
    body["correlation_id"] = "corr_7f3a"
    return body


def booking(state: str = "confirmed", **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": "bkg_456def",
        "service_id": "svc_haircut_001",
        "slot_id": "slot_20260315_0900",
        "state": state,
        "buyer": dict(BUYER),
        "start": "2026-03-15T09:00:00-04:00",
        "end": "2026-03-15T10:00:00-04:00",
        "created_at": "2026-03-14T22:05:12Z",
        "updated_at": "2026-03-14T22:06:00Z",
        "order_id": "ord_ucp_001",
    }
    if state == "cancelled":
        data["cancellation_reason"] = "buyer_request"
    return data | changes


def service(**changes: Any) -> dict[str, Any]:
    return {
        "id": "svc_haircut_001",
        "name": "Haircut",
        "description": "Wash, cut and style.",
        "duration": "PT60M",
        "price": {"amount": 4500, "currency": "USD"},
        "capacity": 1,
        "active": True,
    } | changes


def slot(slot_id: str = "slot_20260315_0900", state: str = "available") -> dict[str, Any]:
    return {
        "id": slot_id,
        "service_id": "svc_haircut_001",
        "start": "2026-03-15T09:00:00-04:00",
        "end": "2026-03-15T10:00:00-04:00",
        "duration": "PT60M",
        "state": state,
        "capacity": 1,
        "remaining": 1 if state == "available" else 0,
    }


def waitlist_entry(state: str, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": "wl_01hx5k",
        "service_id": "svc_haircut_001",
        "state": state,
        "buyer": dict(BUYER),
        "desired_window": {"start": "2026-03-15T08:00:00-04:00", "end": "2026-03-15T12:00:00-04:00"},
        "created_at": "2026-03-13T10:00:00Z",
        "updated_at": "2026-03-14T22:06:00Z",
    }
    if state in ("offered", "expired", "converted"):
        data["offered_slot_id"] = "slot_20260315_0900"
        data["offer_expires_at"] = "2026-03-14T23:06:00Z"
    if state == "converted":
        data["booking_id"] = "bkg_456def"
    return data | changes


PRICE = {"amount": 500, "currency": "USD", "interval": "month"}
AGENT = {
    "key_directory": "https://registry.example/jwks/alice-bot.json",
    "key_thumbprint": "poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U",
}


def content_sample(event: str) -> dict[str, Any]:
    """The subject ids and ``data`` of a ``content.*`` event."""
    body: dict[str, Any] = {"publisher_id": "pub_ai_weekly"}
    if event.startswith("content.post."):
        body |= {"post_id": "post_agents_2026", "data": post()}
    elif event == "content.publication.updated":
        body["data"] = publication()
    elif event.startswith("content.subscription."):
        states = {"created": "pending_payment", "activated": "active", "canceled": "cancelled"}
        body |= {"subscription_id": "csub_01", "data": subscription(states[event.rsplit(".", 1)[1]])}
    else:
        state = "active" if event.endswith("granted") else "cancelled"
        body |= {"entitlement_id": "ent_01", "subscription_id": "csub_01", "data": entitlement(state)}
    return body


def post(**changes: Any) -> dict[str, Any]:
    return {
        "id": "post_agents_2026",
        "publisher_id": "pub_ai_weekly",
        "title": "Agents that pay for what they read",
        "author": "Ada Lovelace",
        "excerpt": "How 402 became useful.",
        "categories": ["ai", "payments"],
        "language": "en",
        "word_count": 1200,
        "access": "paid",
        "tier_ids": ["tier_pro"],
        "published_at": "2026-11-30T09:00:00Z",
        "updated_at": "2026-11-30T09:00:00Z",
    } | changes


def publication(**changes: Any) -> dict[str, Any]:
    return {
        "id": "pub_ai_weekly",
        "slug": "ai-weekly",
        "name": "AI Weekly",
        "categories": ["ai"],
        "external_ids": ["patreon:123456"],
        "language": "en",
        "tiers": [
            {"tier_id": "tier_pro", "tier_name": "Pro", "price": dict(PRICE), "features": ["all posts"]}
        ],
    } | changes


def subscription(status: str, **changes: Any) -> dict[str, Any]:
    return {
        "id": "csub_01",
        "publisher_id": "pub_ai_weekly",
        "tier_id": "tier_pro",
        "agent": dict(AGENT),
        "status": status,
        "payment_method": "usdc",
        "price": dict(PRICE),
        "created_at": "2026-12-01T10:00:00Z",
    } | changes


def entitlement(status: str, **changes: Any) -> dict[str, Any]:
    return {
        "id": "ent_01",
        "publisher_id": "pub_ai_weekly",
        "tier_id": "tier_pro",
        "subscription_id": "csub_01",
        "agent": dict(AGENT),
        "status": status,
        "price": dict(PRICE),
        "granted_at": "2026-12-01T10:05:00Z",
        "renews_at": "2027-01-01T10:05:00Z",
    } | changes
