"""Tool results in the binding's dual envelope: ``structuredContent`` for programs, a line of
text in ``content`` for people.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.mcp.results``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import mcp_types as types

from usp_schemas import USP_VERSION

__all__ = ["CAPABILITIES", "envelope", "summary"]

#: The capabilities this business offers, by the tool family that serves them.
CAPABILITIES: Final[dict[str, str]] = {
    "catalog": "dev.usp-protocol.services.catalog",
    "availability": "dev.usp-protocol.services.availability",
    "bookings": "dev.usp-protocol.services.bookings",
    "waitlist": "dev.usp-protocol.services.waitlist",
    "feed": "dev.usp-protocol.services.feed",
}


def envelope(
    body: Mapping[str, Any], *, capability: str, correlation_id: str | None = None
) -> types.CallToolResult:
    """The ``tools/call`` result of ``body`` (a structured answer: ``usp``, data, ``messages``),
    echoing the request's join id as ``_meta.usp.correlation_id`` when it had one."""
    structured = dict(body)
    structured["usp"] = {
        **dict(structured.get("usp") or {}),
        "version": USP_VERSION,
        "capabilities": {capability: [{"version": USP_VERSION}]},
    }
    structured.setdefault("messages", [])
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=summary(structured))],
        structured_content=structured,
        _meta={"usp": {"correlation_id": correlation_id}} if correlation_id is not None else None,
    )


def summary(body: Mapping[str, Any]) -> str:
    """One human-readable line for ``body``.

    >>> summary({"messages": [{"type": "error", "content": "The slot s is no longer available."}]})
    'Error: The slot s is no longer available.'
    >>> summary({"messages": [], "booking": {"id": "bkg_1", "service_id": "svc_a",
    ...          "start": "2026-03-15T09:00:00-04:00", "state": "pending"}})
    'Booking bkg_1 for svc_a at 2026-03-15T09:00:00-04:00 is pending.'
    """
    errors = [m.get("content", "") for m in body.get("messages") or [] if m.get("type") == "error"]
    if errors:
        return "Error: " + " ".join(errors)
    if "booking" in body:
        b = body["booking"]
        text = f"Booking {b['id']} for {b['service_id']} at {b['start']} is {b['state']}."
        if "booking_scoped_credential" in body:
            text += " A booking-scoped credential for it is in structuredContent.booking_scoped_credential."
        return text
    if "waitlist_entry" in body:
        entry = body["waitlist_entry"]
        return f"Waitlist entry {entry['id']} for {entry['service_id']} is {entry['state']}."
    if "slots" in body:
        return _slots(body)
    if "services" in body:
        services: Sequence[Mapping[str, Any]] = body["services"]
        names = ", ".join(f"{s['name']} ({s['id']})" for s in services)
        return f"{_count(len(services), 'service')}: {names}." if services else "The catalog is empty."
    if "subscription" in body:
        sub = body["subscription"]
        return f"Subscription {sub['id']} to {sub['url']} is {sub['state']}."
    if "subscriptions" in body:
        return f"{_count(len(body['subscriptions']), 'subscription')}."
    return "Done."


def _slots(body: Mapping[str, Any]) -> str:
    slots: Sequence[Mapping[str, Any]] = body["slots"]
    span = f"{body.get('service_id')} from {body.get('start_date')} to {body.get('end_date')}"
    if not slots:
        return f"No available slot for {span}."
    shown = ", ".join(f"{s['start']} ({s['id']})" for s in slots[:5])
    more = f", and {len(slots) - 5} more" if len(slots) > 5 else ""
    return f"Found {_count(len(slots), 'available slot')} for {span}: {shown}{more}."


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
