"""Webhook endpoints for the delivery engine's tests, served by one real uvicorn server.

:class:`Hub` is the server's ASGI app: it logs every request (path, headers, body) before
anything else sees it, so a test can prove a request did *not* arrive (an SSRF refusal, a
redirect target), and dispatches by path to the endpoint a test registered. Endpoints:

* :class:`UspReceiver` — the receiver library's own :class:`~usp_receiver.asgi.WebhookApp`:
  every REST delivery is verified exactly as a platform would verify it;
* :class:`JsonRpcReceiver` — verifies the HTTP signature and checks the body is a
  ``usp_webhook`` notification (no ``id``) carrying a valid event;
* steerable behaviours: fixed answers, failing the first k tries, hanging, trickling,
  huge bodies, blocking until released, measuring concurrency.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread

from usp_receiver import JWKS, ReceivedWebhook, VerificationError, Verifier, WebhookReceiver
from usp_receiver._url import request_url
from usp_receiver.asgi import WebhookApp
from usp_receiver.dedupe import MemoryDedupe, Processed, process_once
from usp_schemas import WEBHOOK_METHOD, parse_event

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class Seen:
    """One request as it arrived at the server."""

    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def event_id(self) -> str | None:
        """The ``event_id`` of a REST body or JSON-RPC notification (None if neither)."""
        try:
            message = json.loads(self.body)
        except ValueError:
            return None
        if isinstance(message, dict) and isinstance(message.get("params"), dict):
            message = message["params"]
        value = message.get("event_id") if isinstance(message, dict) else None
        return value if isinstance(value, str) else None


class Hub:
    """The server's app: log, then dispatch by exact path (404 for unknown paths)."""

    def __init__(self) -> None:
        self.port = 0  #: set once the server listens
        self.routes: dict[str, App] = {}
        self.log: list[Seen] = []
        self._lock = threading.Lock()

    def seen(self, path: str) -> list[Seen]:
        with self._lock:
            return [s for s in self.log if s.path == path]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        with self._lock:
            self.log.append(Seen(scope["path"], headers, body))
        app = self.routes.get(scope["path"])
        if app is None:
            await respond(send, 404, b"no such endpoint")
            return
        await app(scope, _replay(body, receive), send)


async def read_body(receive: Receive) -> bytes:
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    return bytes(body)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the already-read body to the endpoint once, then defers."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        return pending.pop() if pending else await receive()

    return replay


async def respond(
    send: Send, status: int, body: bytes = b"", headers: Sequence[tuple[str, str]] = ()
) -> None:
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


# -- receivers ------------------------------------------------------------------------------------


class UspReceiver:
    """The receiver library verifying REST deliveries; ``handled`` lists handled event ids (its
    dedupe runs the handler once per event), ``handled_at`` when each was handled (monotonic).
    ``delay``: seconds each request waits before it is verified, as a real endpoint's work
    would (a worker then holds its claimed deliveries for at least that long)."""

    def __init__(self, jwks: JWKS, *, delay: float = 0.0) -> None:
        self.handled: list[str] = []
        self.handled_at: dict[str, float] = {}
        self.delay = delay
        self.app = WebhookApp(WebhookReceiver(Verifier(jwks), self._handle))

    def _handle(self, hook: ReceivedWebhook) -> None:
        self.handled_at.setdefault(hook.event.event_id, time.monotonic())
        self.handled.append(hook.event.event_id)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.delay:
            await anyio.sleep(self.delay)
        await self.app(scope, receive, send)


class JsonRpcReceiver:
    """Verifies the HTTP signature of a JSON-RPC delivery and that it is a ``usp_webhook``
    notification, then deduplicates on the params' ``event_id`` as the receiver library does
    (:func:`~usp_receiver.dedupe.process_once`); ``handled`` lists the event ids handled (once
    each), ``duplicates`` counts the repeats answered without handling, ``refused`` the reasons
    for anything refused."""

    def __init__(self, jwks: JWKS) -> None:
        self.verifier = Verifier(jwks)
        self.dedupe = MemoryDedupe()
        self.handled: list[str] = []
        self.duplicates = 0
        self.refused: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(receive)
        try:
            self.verifier.verify("POST", request_url(scope), scope["headers"], body)
        except VerificationError as exc:
            self.refused.append(exc.reason)
            await respond(send, 401, exc.reason.encode())
            return
        message = json.loads(body)
        problem = _notification_problem(message)
        if problem:
            self.refused.append(problem)
            await respond(send, 400, problem.encode())
            return
        event_id = parse_event(message["params"]).event_id

        async def handle() -> None:
            self.handled.append(event_id)

        processed = await process_once(self.dedupe, event_id, handle)
        if processed is Processed.DUPLICATE:
            self.duplicates += 1
        if processed in (Processed.ACCEPTED, Processed.DUPLICATE):
            await respond(send, 204)
        else:
            await respond(send, 409 if processed is Processed.IN_PROGRESS else 500, processed.value.encode())


def _notification_problem(message: Any) -> str | None:
    if not isinstance(message, dict):
        return "not an object"
    if "id" in message:
        return "has an id: a request, not a notification"
    if set(message) != {"jsonrpc", "method", "params"}:
        return f"unexpected members {sorted(message)}"
    if message["jsonrpc"] != "2.0" or message["method"] != WEBHOOK_METHOD:
        return "not a usp_webhook JSON-RPC 2.0 notification"
    return None


# -- steerable behaviours --------------------------------------------------------------------------


@dataclass
class Answer:
    """Always the same answer."""

    status: int
    headers: Sequence[tuple[str, str]] = ()
    body: bytes = b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await respond(send, self.status, self.body, self.headers)


@dataclass
class Sequenced:
    """The n-th request goes to ``apps[n]``; requests past the end go to the last one."""

    apps: Sequence[App]
    calls: int = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        index = min(self.calls, len(self.apps) - 1)
        self.calls += 1
        await self.apps[index](scope, receive, send)


def failing_first(times: int, then: App, status: int = 500) -> Sequenced:
    """Fail the first ``times`` requests with ``status``, then hand over to ``then``."""
    return Sequenced([*([Answer(status, body=b"try again")] * times), then])


@dataclass
class Hang:
    """Answer only after ``seconds`` (longer than the test's timeout)."""

    seconds: float

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await anyio.sleep(self.seconds)
        await respond(send, 200)


@dataclass
class Unresponsive:
    """Never answer: hold each request until the client gives up (or ``seconds`` pass), then
    drop it. Unlike :class:`Hang`, nothing outlives the client: the server stops cleanly."""

    seconds: float

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with anyio.move_on_after(self.seconds):
            while (await receive())["type"] != "http.disconnect":
                pass


@dataclass
class Trickle:
    """Send the status at once, then one byte every ``interval`` for ``chunks`` chunks: each
    read is quick, only the total is long."""

    chunks: int
    interval: float

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(self.chunks):
            await send({"type": "http.response.body", "body": b".", "more_body": True})
            await anyio.sleep(self.interval)
        await send({"type": "http.response.body", "body": b""})


@dataclass
class Huge:
    """A 2xx with a body of ``size`` bytes in 64 KiB chunks, stopping when the client hangs up
    (``hung_up``; ``sent`` counts what was handed to the server until then)."""

    size: int
    sent: int = 0
    hung_up: threading.Event = field(default_factory=threading.Event)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunk = b"x" * 65536
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                self.hung_up.set()
                group.cancel_scope.cancel()

            group.start_soon(watch)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            while self.sent < self.size:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                self.sent += len(chunk)
                await anyio.lowlevel.checkpoint()  # uvicorn's send may not yield: let watch() run
            await send({"type": "http.response.body", "body": b""})
            group.cancel_scope.cancel()


@dataclass
class Blocking:
    """Hold each request until ``release`` is set, then answer ``status`` (or hand over to
    ``then``); ``entered`` is set when the first request arrives."""

    status: int = 500
    then: App | None = None
    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.entered.set()
        if not await anyio.to_thread.run_sync(self.release.wait, 10):
            raise AssertionError("the test never released the endpoint")
        if self.then is not None:
            await self.then(scope, receive, send)
        else:
            await respond(send, self.status)


@dataclass
class ConcurrencyProbe:
    """Answer 200 after ``hold`` seconds, recording how many requests were in at once."""

    hold: float
    current: int = 0
    peak: int = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.current += 1
        self.peak = max(self.peak, self.current)
        try:
            await anyio.sleep(self.hold)
        finally:
            self.current -= 1
        await respond(send, 200)
