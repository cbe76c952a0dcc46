"""The REST API's edge: a NUL in the path, query or JSON body (``usp_dispatcher.text``), JSON
nested too deep, or a body over the size limit, is refused before a route sees it.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.web.request_guard``.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Final
from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from usp_dispatcher.text import NUL_REFUSED, TOO_DEEP, contains_nul, json_too_deep
from usp_dispatcher.web.problems import problem_response

__all__ = ["MAX_BODY_BYTES", "RefuseNul"]

#: Largest request body the REST API takes.
MAX_BODY_BYTES: Final = 1024 * 1024


class RefuseNul:
    """ASGI middleware: 422 for a NUL in the path, query or a JSON body string; 400
    ``malformed_json`` for a JSON body nested deeper than ``MAX_JSON_DEPTH``; 413 for a body over
    :data:`MAX_BODY_BYTES`. Paths in ``skip`` (the MCP endpoint) pass untouched."""

    def __init__(self, app: ASGIApp, *, skip: Collection[str] = ()) -> None:
        self.app = app
        self.skip = frozenset(skip)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.skip:
            await self.app(scope, receive, send)
            return
        where = _nul_in_url(scope)
        if where is not None:
            await _refuse_nul(where)(scope, receive, send)
            return
        if _declared_length(scope) > MAX_BODY_BYTES:
            await _too_large()(scope, receive, send)
            return
        messages, body = await _read_body(receive)
        if body is None:
            await _too_large()(scope, receive, send)
            return
        if body.lstrip()[:1] in (b"{", b"[") and json_too_deep(body):
            await _too_deep()(scope, receive, send)
            return
        if _json_has_nul(body):
            await _refuse_nul("the JSON body")(scope, receive, send)
            return
        await self.app(scope, _replay(messages, receive), send)


def _nul_in_url(scope: Scope) -> str | None:
    if "\x00" in scope["path"]:
        return "the path"
    if b"\x00" in unquote_to_bytes(scope.get("query_string", b"")):
        return "the query"
    return None


def _declared_length(scope: Scope) -> int:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0  # the server refuses a malformed length itself
    return 0


async def _read_body(receive: Receive) -> tuple[list[Message], bytes | None]:
    """The request's body messages and their bytes (``None``: more than :data:`MAX_BODY_BYTES`)."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, b""  # the client went away: the app hears it from the replay
        size += len(message.get("body", b""))
        if size > MAX_BODY_BYTES:
            return messages, None
        if not message.get("more_body", False):
            return messages, b"".join(m.get("body", b"") for m in messages)


def _json_has_nul(body: bytes) -> bool:
    if b"\\u0000" not in body and b"\x00" not in body:
        return False
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return False  # not JSON: the route refuses it as such
    return contains_nul(parsed)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that hands out the messages already read, then the real one's."""
    queued = list(messages)

    async def replay() -> Message:
        return queued.pop(0) if queued else await receive()

    return replay


def _refuse_nul(where: str) -> ASGIApp:
    return problem_response(422, "invalid_request", "Invalid request", f"{NUL_REFUSED}: {where} has one.")


def _too_deep() -> ASGIApp:
    return problem_response(400, "malformed_json", "Malformed JSON", f"{TOO_DEEP}.")


def _too_large() -> ASGIApp:
    return problem_response(
        413, "payload_too_large", "Payload too large", f"request bodies are at most {MAX_BODY_BYTES} bytes"
    )
