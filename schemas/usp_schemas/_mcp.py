"""The MCP result envelope: ``structuredContent`` for programs, ``content`` text for people.

Business outcomes (a slot already taken, an unknown booking) are results with ``messages[]``, not
JSON-RPC errors, mirroring the REST binding's HTTP 200 with ``messages[]``.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import ConfigDict, Field

from usp_schemas._base import WireModel, always_sent
from usp_schemas._payloads import Message
from usp_schemas._version import USP_VERSION

__all__ = [
    "BOOKING_NOT_FOUND",
    "IDEMPOTENCY_CONFLICT",
    "INVALID_STATE_TRANSITION",
    "OUTCOME_CODES",
    "SERVICE_NOT_FOUND",
    "SLOT_UNAVAILABLE",
    "WAITLIST_CLOSED",
    "CapabilityVersion",
    "StructuredContent",
    "TextContent",
    "ToolResult",
    "UspMeta",
]

SLOT_UNAVAILABLE: Final = "slot_unavailable"
SERVICE_NOT_FOUND: Final = "service_not_found"
BOOKING_NOT_FOUND: Final = "booking_not_found"
INVALID_STATE_TRANSITION: Final = "invalid_state_transition"
WAITLIST_CLOSED: Final = "waitlist_closed"
#: The same idempotency key came back with different arguments.
IDEMPOTENCY_CONFLICT: Final = "idempotency_conflict"

#: The business outcome codes of ``messages[].code`` this contract names. Businesses may use others.
OUTCOME_CODES: Final[tuple[str, ...]] = (
    SLOT_UNAVAILABLE,
    SERVICE_NOT_FOUND,
    BOOKING_NOT_FOUND,
    INVALID_STATE_TRANSITION,
    WAITLIST_CLOSED,
    IDEMPOTENCY_CONFLICT,
)


class CapabilityVersion(WireModel):
    """One version of a capability a business supports."""

    version: str


class UspMeta(WireModel):
    """``structuredContent.usp``: the protocol version and, where relevant, the capabilities.

    >>> UspMeta().model_dump()
    {'version': '2026-08-20'}
    """

    version: str = USP_VERSION
    capabilities: dict[str, list[CapabilityVersion]] | None = Field(
        default=None, description="e.g. {'dev.usp-protocol.services.availability': [{'version': ...}]}"
    )


class StructuredContent(WireModel):
    """``result.structuredContent``. Tool-specific data sits beside ``usp`` and ``messages``:
    subclass to type it, or read it from the extra fields.

    >>> class AvailabilityResult(StructuredContent):
    ...     service_id: str
    >>> AvailabilityResult(service_id="svc_haircut_001").model_dump()
    {'usp': {'version': '2026-08-20'}, 'messages': [], 'service_id': 'svc_haircut_001'}
    """

    model_config = ConfigDict(json_schema_extra=always_sent("usp"))

    usp: UspMeta = Field(default_factory=UspMeta)
    messages: list[Message] = Field(default_factory=list)


class TextContent(WireModel):
    """A ``result.content[]`` item: the human-readable summary MCP clients render."""

    type: Literal["text"] = "text"
    text: str


class ToolResult(WireModel):
    """An MCP ``tools/call`` result in the USP dual envelope. Field names follow MCP's camelCase.

    >>> result = ToolResult(
    ...     structuredContent=StructuredContent(messages=[Message(
    ...         type="error", code=SLOT_UNAVAILABLE, content="Taken.", severity="recoverable")]),
    ...     content=[TextContent(text="Error: Taken.")])
    >>> result.structuredContent.messages[0].code
    'slot_unavailable'
    """

    structuredContent: StructuredContent
    content: list[TextContent] = Field(default_factory=list)
