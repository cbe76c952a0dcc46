"""JSON-RPC 2.0 shapes the protocol uses: the ``usp_webhook`` notification and the error object.

A notification is a message *without* ``id`` (JSON-RPC 2.0 section 4.1): a receiver must not answer
it. These models refuse unknown fields so that an ``id`` can never slip in, and serialize none.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import ConfigDict, Field

from usp_schemas._base import WireModel, always_sent
from usp_schemas._events import EventEnvelope

__all__ = [
    "ERROR_CODE_WORDS",
    "FORBIDDEN",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "UNAUTHENTICATED",
    "WEBHOOK_METHOD",
    "JsonRpcError",
    "JsonRpcErrorData",
    "JsonRpcNotification",
    "WebhookNotification",
    "notification_for",
]

#: The JSON-RPC method of webhook notifications.
WEBHOOK_METHOD: Final = "usp_webhook"

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
UNAUTHENTICATED: Final = -32001
#: For instance a ``_meta.usp.profile`` that differs from the one bound to the principal.
FORBIDDEN: Final = -32003

#: The code word a protocol error's ``message`` carries, by code.
ERROR_CODE_WORDS: Final[dict[int, str]] = {
    PARSE_ERROR: "parse_error",
    INVALID_REQUEST: "invalid_request",
    METHOD_NOT_FOUND: "method_not_found",
    INVALID_PARAMS: "invalid_params",
    INTERNAL_ERROR: "internal_error",
    UNAUTHENTICATED: "unauthenticated",
    FORBIDDEN: "forbidden",
}


class JsonRpcNotification(WireModel):
    """A JSON-RPC 2.0 notification. There is no ``id`` field, and an input that has one is refused
    (it would be a request, which expects an answer).

    >>> JsonRpcNotification(method="ping").model_dump()
    {'jsonrpc': '2.0', 'method': 'ping'}
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra=always_sent("jsonrpc", "method"))

    jsonrpc: Literal["2.0"] = "2.0"
    method: str = Field(min_length=1)
    params: dict[str, Any] | None = None


class WebhookNotification(JsonRpcNotification):
    """A webhook delivered as a ``usp_webhook`` notification (HTTP POST, or inside an MCP session).

    ``params`` stays a plain dict: it is the event envelope, plus ``_meta.usp.signature`` when
    signed in band, and the signature covers its exact JSON. Verify first, then ``parse_event(params)``.
    """

    method: Literal["usp_webhook"] = WEBHOOK_METHOD
    params: dict[str, Any]


def notification_for(event: EventEnvelope) -> dict[str, Any]:
    """The JSON-RPC notification carrying ``event``, as a JSON-ready dict (no ``id``).

    >>> from usp_schemas import parse_event, BOOKING_CONFIRMED_EXAMPLE
    >>> message = notification_for(parse_event(BOOKING_CONFIRMED_EXAMPLE))
    >>> sorted(message), message["params"]["event"]
    (['jsonrpc', 'method', 'params'], 'booking.confirmed')
    """
    return WebhookNotification(params=event.model_dump(mode="json")).model_dump(mode="json")


class JsonRpcErrorData(WireModel):
    """``error.data``: ``content`` is the human-readable text; further keys are allowed."""

    content: str


class JsonRpcError(WireModel):
    """The ``error`` member of a JSON-RPC response, used for protocol failures only. Business
    outcomes go in ``structuredContent.messages[]`` instead.

    >>> JsonRpcError.for_code(INVALID_REQUEST, "Missing required field: service_id").model_dump()
    {'code': -32600, 'message': 'invalid_request', 'data': {'content': 'Missing required field: service_id'}}
    """

    code: int
    message: str = Field(description="the code word, e.g. invalid_request")
    data: JsonRpcErrorData | None = None

    @classmethod
    def for_code(cls, code: int, content: str) -> JsonRpcError:
        """The error for one of the protocol's codes, with its code word as ``message``."""
        return cls(code=code, message=ERROR_CODE_WORDS[code], data=JsonRpcErrorData(content=content))
