"""The receiver behind a real server: uvicorn on a local port, signed deliveries sent by httpx.

Every case runs against the FastAPI router and the plain ASGI app alike (``kind``), through the
whole stack a platform deploys: sockets, HTTP parsing, body reading with the cap, URL rebuilding,
verification, dedupe and the handler. Bodies are realistic USP events with fresh ids.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute

from tests.servers import running
from usp_receiver import JWKS, ReceivedWebhook, SigningKey, Verifier, WebhookReceiver, sign_request
from usp_receiver._url import request_url
from usp_receiver.asgi import WebhookApp
from usp_receiver.fastapi import webhook_router
from usp_schemas import BOOKING_CONFIRMED_EXAMPLE, new_event_id

KEY = SigningKey.generate()
PATH = "/webhooks/usp"
PUBLIC_URL = "https://platform.example/hooks"
PROBLEM_TYPE = "urn:usp-webhooks:problem:"

Serve = Callable[[Any], str]


class Recorder:
    """The handler under test: counts calls, may fail its first call, may block until released."""

    def __init__(self, *, fail_first: bool = False, block: bool = False) -> None:
        self.fail_first = fail_first
        self.block = block
        self.calls = 0
        self.handled: list[str] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, hook: ReceivedWebhook) -> None:
        with self._lock:
            self.calls += 1
            call = self.calls
        self.entered.set()
        if self.block and not self.release.wait(10):
            raise AssertionError("the test never released the handler")
        if self.fail_first and call == 1:
            raise RuntimeError("cannot reach the database: password=hunter2")
        with self._lock:
            self.handled.append(hook.event.event_id)


def event_body(event_id: str) -> bytes:
    event = json.loads(BOOKING_CONFIRMED_EXAMPLE)
    event["event_id"] = event_id
    event["timestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return json.dumps(event).encode()


def signed(url: str, body: bytes) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    return headers | sign_request("POST", url, headers, body, [KEY])


def post(base: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(base + PATH, content=body, headers=headers, timeout=10)


def deliver(base: str, event_id: str | None = None) -> tuple[str, bytes, dict[str, str]]:
    """A fresh signed delivery for ``base``: its event id, body and headers."""
    event_id = event_id or new_event_id()
    body = event_body(event_id)
    return event_id, body, signed(base + PATH, body)


def assert_problem(response: httpx.Response, status: int, reason: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem: dict[str, Any] = response.json()
    assert problem["status"] == status
    assert problem["reason"] == reason
    assert problem["type"] == PROBLEM_TYPE + reason
    return problem


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Start servers for the test (``serve(app) -> base URL``); all stop when it ends."""
    with ExitStack() as stack:
        yield lambda app: stack.enter_context(running(app))


@pytest.fixture(params=["fastapi", "asgi"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_app(kind: str, handler: Recorder, **options: Any) -> Any:
    receiver = WebhookReceiver(Verifier(JWKS([KEY.public])), handler)
    if kind == "asgi":
        return WebhookApp(receiver, **options)
    app = FastAPI()
    app.include_router(webhook_router(receiver, path=PATH, **options))
    return app


def test_valid_delivery_is_accepted_and_handled_once(serve: Serve, kind: str) -> None:
    handler = Recorder()
    base = serve(make_app(kind, handler))
    event_id, body, headers = deliver(base)

    response = post(base, body, headers)

    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {"status": "accepted", "event_id": event_id}
    assert handler.handled == [event_id]


def test_replayed_delivery_is_a_duplicate_and_not_handled_again(serve: Serve, kind: str) -> None:
    handler = Recorder()
    base = serve(make_app(kind, handler))
    event_id, body, headers = deliver(base)
    assert post(base, body, headers).status_code == 200

    replay = post(base, body, headers)

    assert replay.status_code == 200, replay.text
    assert replay.json() == {"status": "duplicate", "event_id": event_id}
    assert handler.calls == 1


def test_failing_handler_gets_500_without_its_text_and_the_retry_runs(serve: Serve, kind: str) -> None:
    handler = Recorder(fail_first=True)
    base = serve(make_app(kind, handler))
    event_id, body, headers = deliver(base)

    failed = post(base, body, headers)

    assert_problem(failed, 500, "handler_failed")
    assert "hunter2" not in failed.text
    assert "RuntimeError" not in failed.text
    assert handler.handled == []

    retry = post(base, body, signed(base + PATH, body))  # the sender re-signs each attempt

    assert retry.status_code == 200, retry.text
    assert retry.json() == {"status": "accepted", "event_id": event_id}
    assert handler.calls == 2
    assert handler.handled == [event_id]


def test_tampered_body_is_refused_with_digest_mismatch(serve: Serve, kind: str) -> None:
    handler = Recorder()
    base = serve(make_app(kind, handler))
    _, body, headers = deliver(base)
    tampered = body.replace(b"Alice", b"Malice")
    assert tampered != body

    response = post(base, tampered, headers)

    problem = assert_problem(response, 401, "digest_mismatch")
    assert problem["type"].endswith("digest_mismatch")
    assert response.headers["www-authenticate"].startswith("Signature")
    assert handler.calls == 0


def test_unsigned_delivery_is_refused_with_missing_signature(serve: Serve, kind: str) -> None:
    handler = Recorder()
    base = serve(make_app(kind, handler))
    _, body, _ = deliver(base)

    response = post(base, body, {"Content-Type": "application/json"})

    assert_problem(response, 401, "missing_signature")
    assert handler.calls == 0


def test_signed_body_that_is_not_an_event_is_400(serve: Serve, kind: str) -> None:
    handler = Recorder()
    base = serve(make_app(kind, handler))
    body = b'{"hello": "world"}'

    response = post(base, body, signed(base + PATH, body))

    assert_problem(response, 400, "invalid_event")
    assert handler.calls == 0


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_body_over_the_cap_is_413(serve: Serve, kind: str, framing: str) -> None:
    handler = Recorder()
    base = serve(make_app(kind, handler, max_body_bytes=1024))
    body = b'{"padding": "' + b"x" * 2048 + b'"}'
    headers = signed(base + PATH, body)
    # A generator makes httpx send the body chunked, with no Content-Length to refuse up front.
    content: bytes | Iterator[bytes] = body if framing == "content-length" else iter([body[:512], body[512:]])

    response = httpx.post(base + PATH, content=content, headers=headers, timeout=10)

    assert_problem(response, 413, "payload_too_large")
    assert handler.calls == 0


def test_a_body_at_the_cap_is_read(serve: Serve, kind: str) -> None:
    handler = Recorder()
    event_id = new_event_id()
    body = event_body(event_id)
    base = serve(make_app(kind, handler, max_body_bytes=len(body)))

    response = post(base, body, signed(base + PATH, body))

    assert response.status_code == 200, response.text
    assert handler.handled == [event_id]


def test_get_is_405_with_allow(serve: Serve, kind: str) -> None:
    handler = Recorder()
    base = serve(make_app(kind, handler))

    response = httpx.get(base + PATH, timeout=10)

    assert response.status_code == 405
    assert "POST" in response.headers["allow"]
    assert handler.calls == 0


def test_concurrent_deliveries_of_one_event_run_the_handler_once(serve: Serve, kind: str) -> None:
    handler = Recorder(block=True)
    base = serve(make_app(kind, handler))
    event_id, body, headers = deliver(base)

    with ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(post, base, body, headers)
        try:
            assert handler.entered.wait(10), "the first delivery never reached the handler"
            second = post(base, body, headers)
        finally:
            handler.release.set()
        first_response = first.result(timeout=10)

    assert first_response.status_code == 200, first_response.text
    assert first_response.json() == {"status": "accepted", "event_id": event_id}
    assert_problem(second, 409, "in_progress")
    assert int(second.headers["retry-after"]) > 0
    assert handler.calls == 1
    assert handler.handled == [event_id]


def test_public_url_is_what_the_signature_is_checked_against(serve: Serve, kind: str) -> None:
    event_id = new_event_id()
    body = event_body(event_id)
    headers = signed(PUBLIC_URL, body)  # the sender's URL; a proxy forwards to 127.0.0.1:port
    plain, proxied = Recorder(), Recorder()
    plain_base = serve(make_app(kind, plain))
    proxied_base = serve(make_app(kind, proxied, public_url=PUBLIC_URL))

    refused = post(plain_base, body, headers)
    accepted = post(proxied_base, body, headers)

    assert_problem(refused, 401, "bad_signature")
    assert plain.calls == 0
    assert accepted.status_code == 200, accepted.text
    assert proxied.handled == [event_id]


def test_openapi_documents_the_route_without_a_body_model(serve: Serve) -> None:
    router = webhook_router(WebhookReceiver(Verifier(JWKS([KEY.public])), Recorder()), path=PATH)
    app = FastAPI()
    app.include_router(router)
    base = serve(app)

    spec = httpx.get(base + "/openapi.json", timeout=10).json()

    assert set(spec["paths"]) == {PATH}
    operation = spec["paths"][PATH]["post"]
    assert "webhook" in operation["summary"].lower()
    assert {"200", "400", "401", "409", "500", "503"} <= set(operation["responses"])
    assert "application/problem+json" in operation["responses"]["401"]["content"]
    assert "422" not in operation["responses"]  # FastAPI validates nothing before the signature
    assert "$ref" not in json.dumps(operation.get("requestBody", {}))
    assert "schemas" not in spec.get("components", {})
    (route,) = router.routes
    assert isinstance(route, APIRoute)
    assert route.body_field is None
    assert route.dependant.body_params == []


@pytest.mark.anyio
async def test_plain_asgi_app_closes_websockets_and_refuses_unknown_scopes() -> None:
    app = WebhookApp(WebhookReceiver(Verifier(JWKS([KEY.public])), Recorder()))
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await app({"type": "websocket", "path": PATH, "headers": []}, receive, send)

    assert sent == [{"type": "websocket.close", "code": 1008}]
    with pytest.raises(ValueError, match="telepathy"):
        await app({"type": "telepathy"}, receive, send)


@pytest.mark.parametrize(
    ("scope", "public_url", "expected"),
    [
        (
            {"scheme": "http", "headers": [(b"host", b"h.example:8080")], "raw_path": b"/a%2Fb"},
            None,
            "http://h.example:8080/a%2Fb",
        ),
        (
            {"scheme": "https", "headers": [], "server": ("::1", 443), "path": "/caf\u00e9 x"},
            None,
            "https://[::1]/caf%C3%A9%20x",
        ),
        (
            {
                "scheme": "http",
                "headers": [],
                "server": ("10.0.0.1", 8000),
                "raw_path": b"/p?x=1",
                "query_string": b"x=1",
            },
            None,
            "http://10.0.0.1:8000/p?x=1",
        ),
        (
            {
                "scheme": "http",
                "headers": [(b"Host", b"10.0.0.1")],
                "raw_path": b"/internal/hook",
                "query_string": b"t=2",
            },
            PUBLIC_URL,
            PUBLIC_URL + "?t=2",
        ),
    ],
)
def test_request_url_rebuilds_what_the_sender_signed(
    scope: dict[str, Any], public_url: str | None, expected: str
) -> None:
    assert request_url(scope, public_url) == expected


@pytest.mark.parametrize(
    "public_url", ["/hooks", "ftp://platform.example/hooks", "https://platform.example/hooks?x=1"]
)
def test_a_bad_public_url_is_refused_at_start_up(public_url: str) -> None:
    receiver = WebhookReceiver(Verifier(JWKS([KEY.public])), Recorder())
    with pytest.raises(ValueError, match="public_url"):
        WebhookApp(receiver, public_url=public_url)
    with pytest.raises(ValueError, match="public_url"):
        webhook_router(receiver, public_url=public_url)
