"""JSON-RPC shapes: the ``usp_webhook`` notification (never an ``id``) and protocol errors."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from tests.schemas.samples import ALL_EVENT_TYPES, sample
from usp_schemas import (
    ERROR_CODE_WORDS,
    FORBIDDEN,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    UNAUTHENTICATED,
    JsonRpcError,
    JsonRpcNotification,
    WebhookNotification,
    notification_for,
    parse_event,
)


@pytest.mark.parametrize("event_type", ALL_EVENT_TYPES)
def test_notification_carries_the_envelope_and_no_id(event_type: str) -> None:
    event = parse_event(sample(event_type))

    message = notification_for(event)

    assert message.keys() == {"jsonrpc", "method", "params"}
    assert message["jsonrpc"] == "2.0"
    assert message["method"] == "usp_webhook"
    assert "id" not in json.loads(json.dumps(message))
    assert parse_event(message["params"]) == event


def test_binding_notification_example_parses() -> None:
    example = {
        "jsonrpc": "2.0",
        "method": "usp_webhook",
        "params": sample("booking.confirmed")
        | {"_meta": {"usp": {"signature": "eyJhbGciOiJFZERTQSJ9..c2ln"}}},
    }

    notification = WebhookNotification.model_validate(example)

    assert notification.params["_meta"]["usp"]["signature"] == "eyJhbGciOiJFZERTQSJ9..c2ln"
    assert parse_event(notification.params).event == "booking.confirmed"
    assert notification.model_dump(mode="json") == example


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "method": "usp_webhook", "params": {}, "id": 1},
        {"jsonrpc": "2.0", "method": "usp_webhook", "params": {}, "id": None},
        {"jsonrpc": "1.0", "method": "usp_webhook", "params": {}},
        {"jsonrpc": "2.0", "method": "tools/call", "params": {}},
        {"jsonrpc": "2.0", "method": "usp_webhook"},
    ],
    ids=["request with id", "null id", "old version", "other method", "no params"],
)
def test_messages_that_are_not_webhook_notifications_are_refused(message: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        WebhookNotification.model_validate(message)


def test_generic_notification_omits_absent_params() -> None:
    assert JsonRpcNotification(method="notifications/initialized").model_dump_json() == (
        '{"jsonrpc":"2.0","method":"notifications/initialized"}'
    )


def test_error_codes_are_the_spec_values() -> None:
    codes = (
        PARSE_ERROR,
        INVALID_REQUEST,
        METHOD_NOT_FOUND,
        INVALID_PARAMS,
        INTERNAL_ERROR,
        UNAUTHENTICATED,
        FORBIDDEN,
    )

    assert codes == (-32700, -32600, -32601, -32602, -32603, -32001, -32003)
    assert [ERROR_CODE_WORDS[code] for code in codes] == [
        "parse_error",
        "invalid_request",
        "method_not_found",
        "invalid_params",
        "internal_error",
        "unauthenticated",
        "forbidden",
    ]
    assert len(ERROR_CODE_WORDS) == len(codes)


def test_error_object_matches_the_binding_example() -> None:
    error = JsonRpcError.for_code(INVALID_REQUEST, "Missing required field: service_id")

    assert error.model_dump(mode="json") == {
        "code": -32600,
        "message": "invalid_request",
        "data": {"content": "Missing required field: service_id"},
    }


def test_error_for_an_unknown_code_is_a_programming_error() -> None:
    with pytest.raises(KeyError):
        JsonRpcError.for_code(-32099, "server-defined")
