"""The USP MCP tools: the scheduling operations each tool runs, with the name, description and
``inputSchema`` that ``tools/list`` shows.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.mcp.tools``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from usp_dispatcher.mcp.results import CAPABILITIES
from usp_dispatcher.scheduling.service import OPERATIONS, Operation
from usp_schemas.generate import readable_schema

__all__ = ["TOOLS", "TOOLS_BY_NAME", "ToolSpec"]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool: what ``tools/list`` shows, and the operation it runs."""

    name: str
    description: str
    operation: Operation

    @property
    def capability(self) -> str:
        return CAPABILITIES[self.operation.family]

    @property
    def input_schema(self) -> dict[str, Any]:
        """The arguments' JSON Schema with ``_meta`` admitted beside them."""
        schema: dict[str, Any] = readable_schema(self.operation.arguments.model_json_schema())
        schema.setdefault("properties", {})["_meta"] = _META_SCHEMA
        schema.pop("title", None)
        return schema


_META_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "description": "USP request metadata: _meta.usp.profile (the platform profile URI, required on "
    "privileged tools), idempotency_key (UUID v4 on state changes), correlation_id, authorization "
    "({mechanism, credential, proof}), platform_key (the platform's public JWK, to bind a "
    "booking-scoped credential to)",
    "properties": {
        "usp": {
            "type": "object",
            "properties": {
                "profile": {"type": "string"},
                "idempotency_key": {"type": "string"},
                "correlation_id": {"type": "string"},
                "authorization": {"type": "object"},
                "platform_key": {"type": "object"},
            },
        }
    },
}


def _tool(name: str, description: str) -> ToolSpec:
    return ToolSpec(name, description, OPERATIONS[name])


#: The binding's tools. The business's own operations (complete, no-show) and the waitlist entry
#: read are REST routes only: the binding defines no tool for them.
TOOLS: Final[tuple[ToolSpec, ...]] = (
    _tool(
        "usp_catalog_list",
        "List the business's bookable services (id, name, duration, price, capacity).",
    ),
    _tool(
        "usp_availability_query",
        "Find a service's slots with a free seat between two dates (inclusive, the business's "
        "local dates), soonest first.",
    ),
    _tool(
        "usp_bookings_create",
        "Book a slot for a buyer: a pending booking, or slot_unavailable. Returns a "
        "booking_scoped_credential for later get/cancel/reschedule calls on this booking.",
    ),
    _tool(
        "usp_bookings_get",
        "Read a booking as it is now.",
    ),
    _tool(
        "usp_bookings_confirm",
        "Confirm a pending booking (the business's own call; never with a booking-scoped credential).",
    ),
    _tool(
        "usp_bookings_cancel",
        "Cancel a pending or confirmed booking; its seat goes to the waitlist or back on sale.",
    ),
    _tool(
        "usp_bookings_reschedule",
        "Move a pending or confirmed booking to another slot of the same service.",
    ),
    _tool(
        "usp_waitlist_join",
        "Put a buyer on a service's waitlist for a seat inside a time window; a freed seat in "
        "the window is offered (waitlist.offered) and held for a while.",
    ),
    _tool(
        "usp_waitlist_leave",
        "Take a waitlist entry off the waitlist; a seat held for it goes to the next in line.",
    ),
    _tool(
        "usp_feed_subscriptions_create",
        "Subscribe a webhook URL of your platform to event types (the events your profile may receive).",
    ),
    _tool(
        "usp_feed_subscriptions_list",
        "List your platform's webhook subscriptions, oldest first.",
    ),
    _tool(
        "usp_feed_subscriptions_delete",
        "Delete (disable for good) one of your platform's webhook subscriptions.",
    ),
)

TOOLS_BY_NAME: Final[dict[str, ToolSpec]] = {tool.name: tool for tool in TOOLS}
