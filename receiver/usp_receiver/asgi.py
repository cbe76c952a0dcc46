"""Receive USP webhooks with any ASGI server, no web framework needed.

:class:`WebhookApp` is the thinnest HTTP skin over :class:`~usp_receiver.WebhookReceiver`: it
reads the body (never more than ``max_body_bytes``: the signature can only be checked once the
whole body is in memory, so the cap is what bounds a hostile sender), rebuilds the URL the sender
signed, and sends back the receiver's :class:`~usp_receiver.Outcome` as JSON. It imports nothing
beyond the standard library and this package, so it runs under uvicorn, hypercorn or granian, and
can be mounted into any ASGI framework.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, MutableMapping
from contextlib import aclosing
from typing import Any

from usp_receiver._receive import Outcome, WebhookReceiver, problem_outcome
from usp_receiver._url import check_public_url, request_url

__all__ = ["DEFAULT_MAX_BODY_BYTES", "WebhookApp"]

logger = logging.getLogger("usp_receiver")

#: The default body cap: 1 MiB, far above any USP event (a few KiB).
DEFAULT_MAX_BODY_BYTES = 1 << 20

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class WebhookApp:
    """An ASGI 3 application that receives USP webhooks on POST, at whatever path it is mounted.

    Pass ``public_url`` when a proxy stands between the sender and this app: the signature covers
    the URL the sender used (``https://platform.example/hooks``), not the one the app sees.

    >>> from usp_receiver import JWKS, Verifier, WebhookReceiver
    >>> receiver = WebhookReceiver(Verifier(JWKS([])), lambda hook: None)
    >>> app = WebhookApp(receiver, public_url="https://platform.example/hooks")
    >>> # uvicorn.run(app, host="0.0.0.0", port=8000)
    """

    def __init__(
        self,
        receiver: WebhookReceiver,
        *,
        public_url: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        if max_body_bytes < 0:
            raise ValueError("max_body_bytes must not be negative")
        self.receiver = receiver
        self.public_url = None if public_url is None else check_public_url(public_url)
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await _lifespan(receive, send)
        elif kind == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008})  # before accept: HTTP 403
        else:
            raise ValueError(f"WebhookApp does not handle ASGI scope type {kind!r}")

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        if method != "POST":
            await send_outcome(send, method_not_allowed())
            return
        headers = scope["headers"]
        declared = declared_length(headers)
        if declared is not None and declared > self.max_body_bytes:
            await send_outcome(send, payload_too_large(self.max_body_bytes))
            return
        try:
            body = await read_limited(_asgi_chunks(receive), self.max_body_bytes)
        except _ClientDisconnected:
            return  # nobody left to answer; the sender retries
        if body is None:
            await send_outcome(send, payload_too_large(self.max_body_bytes))
            return
        outcome = await self.receiver.receive(method, request_url(scope, self.public_url), headers, body)
        await send_outcome(send, outcome)


def declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The request's ``Content-Length`` as a number, or None (absent, or not a plain number: the
    server refuses those itself)."""
    for name, value in headers:
        if bytes(name).lower() == b"content-length":
            text = bytes(value).strip()
            return int(text) if text.isdigit() else None
    return None


async def read_limited(chunks: AsyncGenerator[bytes, None], limit: int) -> bytes | None:
    """The whole body, or None as soon as it grows past ``limit`` bytes (the rest is not read)."""
    body = bytearray()
    async with aclosing(chunks):
        async for chunk in chunks:
            body += chunk
            if len(body) > limit:
                return None
    return bytes(body)


def payload_too_large(limit: int) -> Outcome:
    """The 413 problem for a body over ``limit`` bytes."""
    detail = f"the body exceeds {limit} bytes"
    return problem_outcome(413, "payload_too_large", "Payload too large", detail)


def method_not_allowed() -> Outcome:
    """The 405 problem for anything but POST; ``Allow`` says what works."""
    return problem_outcome(
        405, "method_not_allowed", "Method not allowed", "webhooks are delivered by POST", {"Allow": "POST"}
    )


async def send_outcome(send: Send, outcome: Outcome) -> None:
    """Send ``outcome`` as a complete JSON (or problem+JSON) response."""
    payload = json.dumps(outcome.body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    headers = [
        (b"content-type", outcome.media_type.encode("ascii")),
        (b"content-length", str(len(payload)).encode("ascii")),
    ]
    headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in outcome.headers.items()]
    await send({"type": "http.response.start", "status": outcome.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class _ClientDisconnected(Exception):
    """The client went away before sending the whole body."""


async def _asgi_chunks(receive: Receive) -> AsyncGenerator[bytes, None]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientDisconnected
        yield bytes(message.get("body", b""))
        if not message.get("more_body", False):
            return


async def _lifespan(receive: Receive, send: Send) -> None:
    """Nothing to start or stop: acknowledge both so servers with ``lifespan="on"`` are happy."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
