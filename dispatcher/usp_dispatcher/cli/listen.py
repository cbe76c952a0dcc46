"""``usp-webhooks listen``: a verifying receiver on this machine, subscribed for as long as it runs."""

from __future__ import annotations

import contextvars
import json
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from types import FrameType
from typing import Annotated, Any

import httpx
import typer
from rich.text import Text

from usp_dispatcher.cli.admin import DEFAULT_URL, AdminClient, Token, Url, console, fail
from usp_receiver import ReceivedWebhook, RemoteJWKS, Verifier, WebhookReceiver
from usp_receiver.asgi import WebhookApp
from usp_receiver.dedupe import MemoryDedupe
from usp_receiver.standard_webhooks import StandardWebhooksVerifier

__all__ = ["LEASE_SECONDS", "RENEW_EVERY", "listen"]

#: The listener's subscription lapses this long after its last renewal: a listener killed
#: without a word (``kill -9``, a crash, the machine off) stops costing deliveries within a
#: minute and a scheduler pass.
LEASE_SECONDS = 60
#: Renewed this often: two renewals may fail (the API restarting) before the lease lapses.
RENEW_EVERY = 20.0
#: The stops besides Ctrl-C that still unsubscribe: ``kill``, the terminal closed.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
#: Not forwarded: they describe this hop, not the delivery.
_HOP_BY_HOP = frozenset(
    {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "expect"}
)

_received_headers: contextvars.ContextVar[list[tuple[str, str]]] = contextvars.ContextVar("received_headers")


def listen(
    forward_to: Annotated[
        str | None,
        typer.Option(help="Also POST each verified delivery here, as it arrived: headers and body."),
    ] = None,
    events: Annotated[
        list[str] | None, typer.Option("--events", help="Event type patterns (default *).")
    ] = None,
    host: Annotated[str, typer.Option(help="Where the local receiver listens.")] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option(min=0, max=65535, help="Its port (0: any free one; fix it for --forward-to)."),
    ] = 0,
    max_events: Annotated[int | None, typer.Option(min=1, help="Stop after this many events.")] = None,
    signatures: Annotated[
        list[str] | None,
        typer.Option(
            "--signatures",
            help="Also ask for standard-webhooks and/or standard-webhooks-v1a (rfc9421 always); listen"
            " then verifies those, falling back to RFC 9421.",
        ),
    ] = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
) -> None:
    """Subscribe a receiver on this machine while this runs and print each event, verified against
    the service's JWKS (or, with --signatures, its Standard Webhooks secret).

    The subscription is removed when listen stops (Ctrl-C, SIGTERM, a closed terminal) and is
    leased for 60 s, renewed every 20 s, so the scheduler removes it within about a minute if
    listen dies without a word. The service must be able to reach this machine (`up --dev`).
    """
    done = threading.Event()
    seen = 0
    forward = httpx.Client(timeout=10.0) if forward_to else None
    address: list[str] = []  #: the local receiver's URL, once it listens

    def on_event(hook: ReceivedWebhook) -> None:
        nonlocal seen
        event = hook.event
        console.print(
            Text.assemble(
                f"{datetime.now(UTC):%H:%M:%S} ",
                ("verified", "green"),
                f" {event.event} {event.event_id} (key {hook.verified.kid})",
            )
        )
        if forward is not None and forward_to is not None:
            received = _received_headers.get([])
            forward_delivery(forward, forward_to, hook.body, received, listening_at=address[0])
        seen += 1
        if max_events is not None and seen >= max_events:
            done.set()

    jwks_url = url.rstrip("/") + "/.well-known/usp/jwks.json"
    keys = RemoteJWKS(jwks_url, allow_insecure_http=_is_loopback(jwks_url))
    verifying = WebhookReceiver(Verifier(keys), on_event, dedupe=MemoryDedupe())
    app = _ClosingOnShutdown(_KeepingHeaders(WebhookApp(verifying)), keys.aclose)
    schemes = ["rfc9421", *(s for s in signatures or () if s != "rfc9421")]
    with (
        AdminClient(url, token) as api,
        _serve(app, host, port) as local,
        _stopped_by(STOP_SIGNALS, done) as why,
    ):
        address.append(local)
        subscription = api.call(
            "POST",
            "/services/feed/subscriptions",
            json={
                "url": local,
                "event_types": events or ["*"],
                "lease_seconds": LEASE_SECONDS,
                "signatures": schemes,
            },
        )
        sub_id = subscription["id"]
        secret, public = subscription.get("webhook_secret"), subscription.get("webhook_public_key")
        if secret or public:  # verify what was asked for, RFC 9421 still behind it
            verifying.verifier = StandardWebhooksVerifier(
                secrets=[secret] if secret else [],
                public_keys=[public] if public else [],
                rfc9421=Verifier(keys),
            )
        console.print(
            f"listening on {local} as subscription {sub_id}"
            + (f", forwarding to {forward_to}" if forward_to else "")
            + " (Ctrl-C to stop)",
            markup=False,
        )
        lapsed = False
        try:
            lapsed = _renew_until(done, api, sub_id)
        except KeyboardInterrupt:
            pass
        finally:
            if why:
                console.print(f"stopping on {why[0]}", markup=False)
            if not lapsed:
                api.call("DELETE", f"/services/feed/subscriptions/{sub_id}")
                console.print(f"subscription {sub_id} removed", markup=False)
            if forward is not None:
                forward.close()
        if lapsed:
            fail(f"subscription {sub_id} was deleted (its lease lapsed, or by hand): run listen again")


def _renew_until(done: threading.Event, api: AdminClient, subscription_id: str) -> bool:
    """Renew the lease every :data:`RENEW_EVERY` seconds until ``done``; True when the
    subscription is gone (a failed renewal is retried at the next turn)."""
    path = f"/services/feed/subscriptions/{subscription_id}/lease"
    next_renewal = time.monotonic() + RENEW_EVERY
    while not done.wait(0.2):
        if time.monotonic() < next_renewal:
            continue
        next_renewal = time.monotonic() + RENEW_EVERY
        try:
            response = api.http.post(path, json={"lease_seconds": LEASE_SECONDS})
        except httpx.HTTPError as exc:
            console.print(Text(f"lease not renewed ({type(exc).__name__}); trying again", style="yellow"))
            continue
        if response.status_code in (404, 409):
            return True
    return False


def forward_delivery(
    client: httpx.Client,
    target: str,
    body: bytes,
    headers: list[tuple[str, str]],
    *,
    listening_at: str,
) -> None:
    """POST the delivery to ``target`` as it arrived (its signature headers and body, byte for
    byte); when ``target`` refuses it, print why and what to change."""
    kept = [(name, value) for name, value in headers if name.lower() not in _HOP_BY_HOP]
    try:
        response = client.post(target, content=body, headers=kept)
    except httpx.HTTPError as exc:
        console.print(Text.assemble(f"  -> {target}: ", (f"{type(exc).__name__}: {exc}", "red")))
        return
    if response.is_success:
        console.print(f"  -> {target}: {response.status_code}", markup=False)
        return
    console.print(
        Text.assemble(f"  -> {target}: ", (f"{response.status_code} {_why(response)}", "red")),
    )
    if response.status_code == 401:
        console.print(
            f"     the signature covers the URL it was sent to, {listening_at}, not {target}: verify"
            f' against it (webhook_router(..., public_url="{listening_at}")), and give listen a fixed'
            " --port so it stays the same",
            markup=False,
        )


def _why(response: httpx.Response) -> str:
    """The problem's ``reason: detail`` (RFC 9457), or the start of whatever the body is."""
    try:
        problem = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if isinstance(problem, Mapping):
        parts = [str(problem[k]) for k in ("reason", "detail") if problem.get(k)]
        if parts:
            return ": ".join(parts)
    return json.dumps(problem)[:200]


@contextmanager
def _stopped_by(signals: tuple[signal.Signals, ...], done: threading.Event) -> Iterator[list[str]]:
    """Make ``signals`` end the listen loop as Ctrl-C does (so the subscription is removed);
    yield the list their name is put in. Only the main thread may set handlers: elsewhere (a
    test's thread) the lease alone cleans up."""
    why: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield why
        return

    def stop(signum: int, _frame: FrameType | None) -> None:
        why.append(signal.Signals(signum).name)
        done.set()

    previous = {signum: signal.signal(signum, stop) for signum in signals}
    try:
        yield why
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextmanager
def _serve(app: Any, host: str, port: int) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread; yield its webhook URL."""
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", ws="none")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                fail("the local receiver did not start", code=2)
            time.sleep(0.02)
        bound = sock.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        yield f"http://{shown}:{bound}/webhooks"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


class _KeepingHeaders:
    """``app``, with each request's headers (as sent, in order) where the handler can read them."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            _received_headers.set([(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]])
        await self.app(scope, receive, send)


class _ClosingOnShutdown:
    """``app``, plus an ASGI lifespan that runs ``on_shutdown`` when the server stops: the JWKS
    client was opened on the server's event loop and must be closed on it."""

    def __init__(self, app: Any, on_shutdown: Callable[[], Awaitable[None]]) -> None:
        self.app = app
        self.on_shutdown = on_shutdown

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.on_shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _is_loopback(url: str) -> bool:
    host = httpx.URL(url).host
    return host in ("localhost", "127.0.0.1", "::1")
