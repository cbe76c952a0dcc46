"""Protocol errors: the JSON-RPC error objects of the USP MCP binding, and the one place that
makes them.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.mcp.protocol``.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Final

import mcp_types as types
from mcp.server.context import CallNext, HandlerResult, ServerMiddleware, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import ErrorData
from pydantic import ValidationError

from usp_dispatcher.text import TOO_DEEP, json_too_deep, shown_part, validation_text
from usp_schemas import (
    ERROR_CODE_WORDS,
    FORBIDDEN,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    UNAUTHENTICATED,
)

__all__ = [
    "CODE_WORDS",
    "FORBIDDEN",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "MISSING_FIELD",
    "PARSE_ERROR",
    "UNAUTHENTICATED",
    "ProtocolErrors",
    "argument_error",
    "error_object",
    "parse_message",
    "protocol_error",
    "wire_error",
]

logger = logging.getLogger("usp_dispatcher.mcp")

#: How the binding's example says an argument is missing (``-32600``).
MISSING_FIELD: Final = "Missing required field"

#: ``error.message`` of each code (SPEC-NOTES "MCP surface"): the wire contract's table.
CODE_WORDS: Final = ERROR_CODE_WORDS

_GENERIC: Final[dict[int, str]] = {
    PARSE_ERROR: "The message is not valid JSON.",
    INVALID_REQUEST: "The message is not a valid JSON-RPC 2.0 request.",
    METHOD_NOT_FOUND: "This server has no such method.",
    INVALID_PARAMS: "The request's parameters are not valid for this method.",
    INTERNAL_ERROR: "The server failed to handle this request; it was logged. Retrying may help.",
    UNAUTHENTICATED: "This method needs a valid credential.",
    FORBIDDEN: "This credential may not do this.",
}


def protocol_error(code: int, content: str | None = None) -> MCPError:
    """The exception that becomes our JSON-RPC error ``code`` (``content``: the human text).

    >>> protocol_error(-32602, "service_id is required").error.model_dump()
    {'code': -32602, 'message': 'invalid_params', 'data': {'content': 'service_id is required'}}
    """
    return MCPError(code=code, message=CODE_WORDS[code], data={"content": content or _GENERIC[code]})


def error_object(code: int, content: str | None = None) -> dict[str, Any]:
    """The JSON-RPC ``error`` member for ``code`` (for transports that answer by themselves)."""
    return protocol_error(code, content).error.model_dump(mode="json")


def wire_error(error: ErrorData) -> ErrorData:
    """``error`` as it should leave the server: ours unchanged, an SDK-made one with one of our
    codes in our shape (its own sentence kept as ``data.content``: the SDK writes those, never an
    exception's text; an ``internal_error`` gets the generic text all the same). Codes we do not
    use (the SDK's protocol-version ones) pass as they are.

    >>> wire_error(ErrorData(code=-32600, message="this connection serves another era")).model_dump()
    {'code': -32600, 'message': 'invalid_request', 'data': {'content': 'this connection serves another era'}}
    """
    if error.code not in CODE_WORDS:
        return error
    exc = MCPError(code=error.code, message=error.message, data=error.data)
    if _is_ours(exc) or error.code in (METHOD_NOT_FOUND, INTERNAL_ERROR):
        return _ours(exc).error
    text = error.message if 0 < len(error.message) <= 300 and error.message.isprintable() else None
    return protocol_error(error.code, text).error


def argument_error(exc: ValidationError) -> MCPError:
    """The protocol error for a tool's bad arguments: a missing required one is the binding's own
    example verbatim (``-32600 invalid_request``, "Missing required field: service_id"), any other
    problem ``-32602 invalid_params`` naming the field, never the rejected input.

    >>> from pydantic import BaseModel
    >>> class M(BaseModel):
    ...     service_id: str
    ...     n: int = 0
    >>> try:
    ...     M.model_validate({"n": "x"})
    ... except ValidationError as exc:
    ...     argument_error(exc).error.model_dump()
    {'code': -32600, 'message': 'invalid_request', 'data': {'content': 'Missing required field: service_id'}}
    """
    missing = [
        ".".join(shown_part(part) for part in error["loc"])
        for error in exc.errors(include_input=False, include_url=False)
        if error["type"] == "missing"
    ]
    if len(missing) == 1:
        return protocol_error(INVALID_REQUEST, f"{MISSING_FIELD}: {missing[0]}")
    if missing:
        return protocol_error(INVALID_REQUEST, f"{MISSING_FIELD}s: {', '.join(missing[:10])}")
    return protocol_error(INVALID_PARAMS, validation_text(exc))


def bad_arguments(content: str) -> MCPError:
    """``argument_error`` for a check made by hand: ``content`` starting with
    :data:`MISSING_FIELD` is ``-32600``, anything else ``-32602``."""
    return protocol_error(INVALID_REQUEST if content.startswith(MISSING_FIELD) else INVALID_PARAMS, content)


class ProtocolErrors(ServerMiddleware[Any]):
    """Server middleware: every error leaving the request chain in the binding's shape."""

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        try:
            return await call_next(ctx)
        except MCPError as exc:
            raise _ours(exc) from None
        except ValidationError as exc:
            # The SDK's own params models (``tools/call`` without a ``name`` …).
            raise argument_error(exc) from None
        except Exception:
            logger.exception("MCP %s failed", ctx.method)
            raise protocol_error(INTERNAL_ERROR) from None


def _ours(exc: MCPError) -> MCPError:
    """``exc`` in our shape: already ours, or one of the SDK's with its code kept."""
    code = exc.code
    data = exc.data
    if _is_ours(exc):
        return exc
    if code == METHOD_NOT_FOUND:
        method = data if isinstance(data, str) and len(data) <= 100 and data.isprintable() else None
        return protocol_error(code, f"This server has no method {method!r}." if method else None)
    if code in CODE_WORDS:
        return protocol_error(code)
    return exc  # the SDK's protocol-version negotiation errors, and the like: left as they are


def _is_ours(exc: MCPError) -> bool:
    data = exc.data
    return (
        isinstance(data, dict)
        and isinstance(data.get("content"), str)
        and exc.message == CODE_WORDS.get(exc.code)
    )


def parse_message(text: str | bytes) -> types.JSONRPCMessage | types.JSONRPCError:
    """The JSON-RPC message in ``text`` (a stdio line, an HTTP body), or the error that answers it:
    ``-32700`` when it is not JSON, ``-32600`` when it is JSON but not a JSON-RPC message (with
    its ``id`` when one can be read). Both transports answer broken input through this one check.

    >>> parse_message("{not json").error.message
    'parse_error'
    >>> error = parse_message('{"jsonrpc": "2.0", "id": 7, "method": 42}')
    >>> error.id, error.error.code
    (7, -32600)
    """
    if json_too_deep(text):
        return _error(None, PARSE_ERROR, f"{TOO_DEEP}.")
    try:
        document = json.loads(text, parse_constant=_no_constants)
    except ValueError:
        return _error(None, PARSE_ERROR)
    try:
        message: types.JSONRPCMessage = types.jsonrpc_message_adapter.validate_python(document, by_name=False)
    except ValidationError:
        return _error(_request_id(document), INVALID_REQUEST)
    return message


def _error(request_id: Any, code: int, content: str | None = None) -> types.JSONRPCError:
    return types.JSONRPCError(
        jsonrpc="2.0", id=request_id, error=types.ErrorData.model_validate(error_object(code, content))
    )


def _request_id(document: Any) -> int | str | None:
    """The id of a broken request, when it is one JSON-RPC allows (a string or an integer)."""
    if not isinstance(document, dict):
        return None
    candidate = document.get("id")
    if isinstance(candidate, bool) or not isinstance(candidate, int | str):
        return None
    return candidate


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
