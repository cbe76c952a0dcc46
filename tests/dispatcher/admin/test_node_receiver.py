"""Real deliveries from our worker to a platform's Express app built on the TypeScript receiver
(``receiver-js/test/express-app.mjs``): events verified against the business's JWKS and handled
once, through a signing-key rotation; a tampered body refused; a captured delivery replayed inside
the window answered as a duplicate and past it refused; a handler failure retried by the worker
and processed; the Redis store; ``usp-webhooks probe`` against it; and the README's Node.js
quick start, as written."""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import Engine

from tests.dispatcher.admin.live import Live, deliveries, event_id_in, running_service, wait_until
from tests.dispatcher.conftest import MakeSettings, Serve
from tests.nodejs import RECEIVER_JS, build_receiver_js
from tests.readme_blocks import block_after
from tests.servers import free_port
from usp_receiver import content_digest

pytestmark = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@dataclass
class NodeApp:
    """The Express app's process: its base URL and what it printed, one JSON object per line."""

    process: subprocess.Popen[str]
    base: str = ""
    lines: list[dict[str, Any]] = field(default_factory=list)

    def handled(self, route: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("route") == route and "event_id" in line]

    def recorded(self, route: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("recorded") == route]


@pytest.fixture
def live(make_settings: MakeSettings, serve: Serve, engine: Engine, tmp_path: Path) -> Iterator[Live]:
    """The service with its scheduler (which sends retries), and a rotated-in key that signs at
    once (no publish lead)."""
    with running_service(
        make_settings, serve, engine, tmp_path, scheduler=True, key_publish_lead_seconds=0.0
    ) as service:
        yield service


@pytest.fixture
def node_app(live: Live, tmp_path: Path) -> Iterator[NodeApp]:
    build_receiver_js()
    env = os.environ | {
        "USP_JWKS_URL": live.base + "/.well-known/usp/jwks.json",
        "USP_REDIS_URL": "redis://127.0.0.1:6379/0",
        "USP_REDIS_PREFIX": f"usp:test:{time.time_ns()}:",
        "USP_RECORD": "1",
    }
    errors = tmp_path / "express-app.stderr"
    with errors.open("w") as stderr:
        process = subprocess.Popen(
            ["node", "test/express-app.mjs"],
            cwd=RECEIVER_JS,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    app = NodeApp(process)
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            found = re.match(r"listening (\d+)", line)
            if found:
                app.base = f"http://127.0.0.1:{found.group(1)}"
                ready.set()
            elif line.startswith("{"):
                app.lines.append(json.loads(line))

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(30):
        process.kill()
        pytest.fail(f"the Express app did not start: {errors.read_text()}")
    try:
        yield app
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        assert process.stdout is not None
        process.stdout.close()
        print(f"----- the Express app's stderr -----\n{errors.read_text()}")


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def handled_once(app: NodeApp, route: str) -> bool:
    return len(app.handled(route)) == 1


def resend(
    app: NodeApp, recorded: dict[str, Any], *, body: bytes | None = None, **headers: str
) -> httpx.Response:
    """A captured delivery sent again as it arrived, with ``body`` or ``headers`` changed."""
    raw = recorded["headers"]
    fields = [(raw[i], raw[i + 1]) for i in range(0, len(raw), 2)]
    fields = [
        (n, headers.get(n.lower(), v)) for n, v in fields if n.lower() not in ("content-length", "host")
    ]
    content = base64.b64decode(recorded["body"]) if body is None else body
    return httpx.post(app.base + recorded["recorded"], content=content, headers=fields)


def test_deliveries_to_the_express_receiver(live: Live, node_app: NodeApp) -> None:
    for route in ("/hooks", "/hooks-short", "/hooks-flaky", "/hooks-redis"):
        live.subscribe(node_app.base + route)
    first = event_id_in(live.ok("trigger", "booking.confirmed"))
    for route in ("/hooks", "/hooks-short", "/hooks-flaky", "/hooks-redis"):
        wait_until(partial(handled_once, node_app, route), f"{first} handled at {route}", live)
        (line,) = node_app.handled(route)
        assert (line["event_id"], line["event"], line["label"]) == (first, "booking.confirmed", "sig1")
    (old_kid,) = {line["kid"] for line in node_app.lines if "kid" in line}

    # The flaky handler failed the first try with a 500; the worker retried and it was processed.
    wait_until(
        lambda: sum(d.event_id == first and d.status == "succeeded" for d in deliveries(live.engine)) == 4,
        "every first delivery answered 2xx",
        live,
    )
    retried = [d for d in deliveries(live.engine) if d.event_id == first and d.attempt_count > 1]
    assert len(retried) == 1, "only the flaky route needed a second try"

    # A captured delivery, replayed: inside the window a duplicate (not handled again; the Redis
    # store says so), tampered with refused, and past the window (2 s on /hooks-short) refused.
    (captured,) = node_app.recorded("/hooks-redis")
    again = resend(node_app, captured)
    assert (again.status_code, again.json()["status"]) == (200, "duplicate")
    body = base64.b64decode(captured["body"])
    forged = body.replace(b"confirmed", b"cancelled")
    tampered = resend(node_app, captured, body=forged)
    assert (tampered.status_code, tampered.json()["reason"]) == (401, "digest_mismatch")
    redigested = resend(node_app, captured, body=forged, **{"content-digest": content_digest(forged)})
    assert (redigested.status_code, redigested.json()["reason"]) == (401, "bad_signature")
    assert len(node_app.handled("/hooks-redis")) == 1
    (short,) = node_app.recorded("/hooks-short")
    time.sleep(3.2)
    late = resend(node_app, short)
    assert (late.status_code, late.json()["reason"]) == (401, "stale")
    assert len(node_app.handled("/hooks-short")) == 1

    # A duplicate from the sender: the operator replays the event; every route answers 2xx, none runs twice.
    live.ok("replay", first)
    wait_until(
        lambda: sum(d.event_id == first and d.status == "succeeded" for d in deliveries(live.engine)) == 8,
        "the replayed deliveries, each answered 2xx",
        live,
    )
    for route in ("/hooks", "/hooks-short", "/hooks-flaky", "/hooks-redis"):
        assert len(node_app.handled(route)) == 1, route

    # A key rotation: the new key signs sig1 beside the old one's sig2; the app finds it in the JWKS.
    rotated = live.ok("keys", "rotate")
    new_kid = next(kid for kid in re.findall(r"[A-Za-z0-9_-]{43}", rotated) if kid != old_kid)

    def signed_by_the_new_key() -> bool:
        if not any(line.get("kid") == new_kid for line in node_app.handled("/hooks")):
            live.ok("trigger", "booking.confirmed")
            time.sleep(1)
            return False
        return True

    wait_until(signed_by_the_new_key, "a delivery verified under the rotated-in key", live)
    newest = node_app.handled("/hooks")[-1]
    assert (newest["kid"], newest["label"]) == (new_kid, "sig1")


def test_usp_webhooks_probe_passes_the_express_receiver(live: Live, node_app: NodeApp) -> None:
    output = live.ok("probe", node_app.base + "/hooks", columns=160)
    assert "endpoint verifies signatures correctly" in output, output
    assert node_app.handled("/hooks") == [], "a probe is verified and acted on by nobody"


def test_the_readme_s_node_quick_start_receives_a_delivery(live: Live, tmp_path: Path) -> None:
    """The README's Node.js block, as written but for the business (this service's JWKS, over
    plain http) and the port, in a folder where `npm install @usp-webhooks/receiver express`
    would have put both packages: it prints each verified event once."""
    build_receiver_js()
    code = block_after("**On Node.js**", "js")
    jwks = '"https://business.example/.well-known/usp/jwks.json"'
    assert jwks in code
    assert ".listen(8080)" in code
    port = free_port()
    code = code.replace(jwks, f'"{live.base}/.well-known/usp/jwks.json", {{ allowInsecureHttp: true }}')
    code = code.replace(".listen(8080)", f".listen({port})")
    (tmp_path / "receiver.mjs").write_text(code)
    modules = tmp_path / "node_modules"
    (modules / "@usp-webhooks").mkdir(parents=True)
    (modules / "@usp-webhooks" / "receiver").symlink_to(RECEIVER_JS)
    (modules / "express").symlink_to(RECEIVER_JS / "node_modules" / "express")
    with (tmp_path / "output.log").open("w") as output:
        process = subprocess.Popen(
            ["node", "receiver.mjs"], cwd=tmp_path, stdout=output, stderr=subprocess.STDOUT
        )
    try:
        wait_until(partial(listening, port), "the README's receiver listening", live)
        live.subscribe(f"http://127.0.0.1:{port}/webhooks/usp")
        first = event_id_in(live.ok("trigger", "booking.confirmed"))
        printed = lambda: f"booking.confirmed {first} signed by" in (tmp_path / "output.log").read_text()  # noqa: E731
        wait_until(printed, "the README's receiver printing the event", live)
        live.ok("replay", first)
        wait_until(
            lambda: (
                sum(d.event_id == first and d.status == "succeeded" for d in deliveries(live.engine)) == 2
            ),
            "the replay answered 2xx",
            live,
        )
        assert (tmp_path / "output.log").read_text().count(first) == 1, "handled once"
    finally:
        process.terminate()
        process.wait(10)
