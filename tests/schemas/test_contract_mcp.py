"""The MCP dual envelope: ``structuredContent`` (usp, messages, tool data) and ``content`` text."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from tests.schemas.samples import slot
from usp_schemas import (
    OUTCOME_CODES,
    USP_VERSION,
    Message,
    Slot,
    StructuredContent,
    TextContent,
    ToolResult,
    UspMeta,
)

AVAILABILITY_RESULT: dict[str, Any] = {  # the binding's availability response, result member
    "structuredContent": {
        "usp": {
            "version": "2026-08-20",
            "capabilities": {"dev.usp-protocol.services.availability": [{"version": "2026-08-20"}]},
        },
        "service_id": "svc_haircut_001",
        "slots": [
            {
                "id": "slot_20260315_0900",
                "service_id": "svc_haircut_001",
                "start": "2026-03-15T09:00:00-04:00",
                "end": "2026-03-15T10:00:00-04:00",
                "duration": "PT60M",
                "state": "available",
            }
        ],
        "messages": [],
    },
    "content": [
        {"type": "text", "text": "Found 1 available slot for svc_haircut_001 on 2026-03-15: 09:00-10:00 ET."}
    ],
}

BUSINESS_ERROR_RESULT: dict[str, Any] = {  # the binding's business outcome error, result member
    "structuredContent": {
        "usp": {"version": "2026-08-20"},
        "messages": [
            {
                "type": "error",
                "code": "slot_unavailable",
                "content": "The requested slot is no longer available.",
                "severity": "recoverable",
            }
        ],
    },
    "content": [{"type": "text", "text": "Error: The requested slot is no longer available."}],
}


class AvailabilityResult(StructuredContent):
    service_id: str
    slots: list[Slot]


@pytest.mark.parametrize(
    "example", [AVAILABILITY_RESULT, BUSINESS_ERROR_RESULT], ids=["availability", "error"]
)
def test_binding_examples_round_trip(example: dict[str, Any]) -> None:
    assert ToolResult.model_validate(example).model_dump(mode="json") == example


def test_tool_data_can_be_typed_by_subclassing() -> None:
    typed = AvailabilityResult.model_validate(AVAILABILITY_RESULT["structuredContent"])

    assert typed.slots[0].duration == "PT60M"
    assert typed.usp.capabilities is not None
    assert typed.usp.capabilities["dev.usp-protocol.services.availability"][0].version == USP_VERSION


def test_typed_tool_data_still_validates() -> None:
    broken = AVAILABILITY_RESULT["structuredContent"] | {"slots": [slot() | {"state": "maybe"}]}

    with pytest.raises(ValidationError, match="state"):
        AvailabilityResult.model_validate(broken)


def test_a_new_result_sends_usp_version_and_empty_messages() -> None:
    result = ToolResult(structuredContent=StructuredContent(), content=[TextContent(text="OK")])

    assert result.model_dump(mode="json") == {
        "structuredContent": {"usp": {"version": USP_VERSION}, "messages": []},
        "content": [{"type": "text", "text": "OK"}],
    }


def test_usp_meta_without_capabilities_omits_them() -> None:
    assert UspMeta().model_dump(mode="json") == {"version": "2026-08-20"}


def test_outcome_codes_are_the_spec_list() -> None:
    assert OUTCOME_CODES == (
        "slot_unavailable",
        "service_not_found",
        "booking_not_found",
        "invalid_state_transition",
        "waitlist_closed",
        "idempotency_conflict",
    )


def test_content_items_are_text_only() -> None:
    with pytest.raises(ValidationError):
        ToolResult.model_validate(BUSINESS_ERROR_RESULT | {"content": [{"type": "image", "data": "..."}]})


def test_messages_are_validated_inside_results() -> None:
    message = {"type": "error", "code": "booking_not_found", "content": "No such booking."}

    with pytest.raises(ValidationError, match="severity"):
        StructuredContent.model_validate({"usp": {"version": USP_VERSION}, "messages": [message]})
    fixed = message | {"severity": "unrecoverable"}
    assert StructuredContent.model_validate({"messages": [fixed]}).messages == [Message.model_validate(fixed)]
