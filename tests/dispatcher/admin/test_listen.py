"""``usp-webhooks listen``: a verifying receiver on this machine, subscribed while it runs; what it
forwards, how every way of stopping it removes its subscription, and the lease that removes it
when the listener dies without a word."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import httpx
from fastapi import FastAPI
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select
from typer.testing import Result

from tests.dispatcher.admin.live import WAIT, Live, wait_until
from tests.dispatcher.conftest import ADMIN
from tests.servers import free_port
from tests.workers.endpoints import Answer
from usp_dispatcher.cli.listen import LEASE_SECONDS
from usp_dispatcher.webhooks.samples import sample_event
from usp_receiver import ReceivedWebhook, RemoteJWKS, Verifier, WebhookReceiver
from usp_receiver.dedupe import MemoryDedupe
from usp_receiver.fastapi import webhook_router
from usp_schemas import parse_event
from usp_workers.operations import LEASE_LAPSED
from usp_workers.runtime.relay import relay_once
from usp_workers.settings import SchedulerSettings
from usp_workers.storage.models import Notice, Subscription


def test_listen_prints_verified_events_forwards_them_and_unsubscribes(live: Live) -> None:
    forward_url, forward_path = live.endpoint("forward", Answer(200))
    body, result = listen_for_one_event(live, "--forward-to", forward_url)
    event_id = parse_event(body).event_id
    assert re.search(rf"verified booking\.confirmed {event_id} \(key ", result.output), result.output
    assert f"-> {forward_url}: 200" in result.output
    (seen,) = live.hub.seen(forward_path)
    assert seen.body == body.encode()
    for name in ("signature", "signature-input", "content-digest", "content-type"):
        assert name in seen.headers, f"{name} forwarded as it arrived"
    (temporary,) = listening(live.engine)
    assert (temporary.state, temporary.disabled_reason) == ("disabled", "deleted")


def test_a_receiver_that_refuses_the_forwarded_delivery_is_told_why_and_the_fix(live: Live) -> None:
    """The README's receiver, verifying against its own URL: the signature covers the URL the
    delivery was sent to (listen's), so it answers 401; listen prints the reason and the fix."""
    handled: list[str] = []
    target, _ = live.endpoint("strict", readme_receiver(live, "/cli/strict", handled, public_url=None))
    _, result = listen_for_one_event(live, "--forward-to", target)
    assert re.search(rf"-> {re.escape(target)}: 401 \w+", result.output), result.output
    (local,) = re.findall(r"listening on (\S+) as", result.output)
    assert f'public_url="{local}"' in result.output, result.output
    assert "--port" in result.output
    assert handled == []


def test_listen_asks_for_standard_webhooks_and_verifies_them(live: Live) -> None:
    """``--signatures standard-webhooks``: the temporary subscription is made with them, and
    listen verifies the delivery with the secret it was given (RFC 9421 behind it)."""
    body, result = listen_for_one_event(live, "--signatures", "standard-webhooks")
    event_id = parse_event(body).event_id
    assert f"verified booking.confirmed {event_id} (key standard-webhooks v1)" in result.output, result.output
    (temporary,) = listening(live.engine)
    assert temporary.signatures == '["rfc9421", "standard-webhooks"]'


def test_listen_into_the_readmes_receiver_and_stopped_by_sigterm(live: Live, tmp_path: Path) -> None:
    """As the README says: the receiver takes listen's URL as its ``public_url``, listen runs on
    that fixed port and forwards to it; the receiver verifies the delivery and handles it. A
    SIGTERM (``kill``) then stops listen as Ctrl-C does: its subscription is removed."""
    port = free_port()
    handled: list[str] = []
    target, _ = live.endpoint(
        "readme",
        readme_receiver(live, "/cli/readme", handled, public_url=f"http://127.0.0.1:{port}/webhooks"),
    )
    with listen_process(live, tmp_path, "--port", str(port), "--forward-to", target) as (process, output):
        body = post_event(live)
        event_id = parse_event(body).event_id
        wait_until(lambda: handled == [event_id], "the README's receiver handled the forwarded event", live)
        wait_until(lambda: f"-> {target}: 200" in output(), "listen reported the 200", live)
        process.send_signal(signal.SIGTERM)
        assert process.wait(WAIT) == 0, output()
    assert "stopping on SIGTERM" in output()
    (temporary,) = listening(live.engine)
    assert f"subscription {temporary.id} removed" in output()
    assert (temporary.state, temporary.disabled_reason) == ("disabled", "deleted")


def test_a_closed_terminal_removes_the_subscription_too(live: Live, tmp_path: Path) -> None:
    with listen_process(live, tmp_path) as (process, output):
        process.send_signal(signal.SIGHUP)
        assert process.wait(WAIT) == 0, output()
    assert "stopping on SIGHUP" in output()
    (temporary,) = listening(live.engine)
    assert (temporary.state, temporary.disabled_reason) == ("disabled", "deleted")


def test_a_listener_killed_outright_loses_its_subscription_when_the_lease_lapses(
    live: Live, tmp_path: Path
) -> None:
    with listen_process(live, tmp_path) as (process, output):
        process.kill()  # SIGKILL: no handler runs, nothing is removed
        process.wait(WAIT)
    assert "removed" not in output()
    (orphan,) = listening(live.engine)
    assert orphan.state == "active"
    assert orphan.lease_until is not None
    left = orphan.lease_until - orphan.created_at
    assert timedelta(seconds=LEASE_SECONDS - 5) < left <= timedelta(seconds=LEASE_SECONDS)

    settings = SchedulerSettings(_env_file=None, database_url=live.env["USP_DATABASE_URL"])
    assert relay_once(live.engine, settings, lambda _ids: None, now=orphan.lease_until).lapsed == 0
    after = orphan.lease_until + timedelta(seconds=1)
    assert relay_once(live.engine, settings, lambda _ids: None, now=after).lapsed == 1
    (gone,) = listening(live.engine)
    assert (gone.state, gone.disabled_reason) == ("disabled", "deleted")
    with Session(live.engine) as s:
        notices = s.exec(select(Notice).where(col(Notice.subscription_id) == gone.id)).all()
        assert [(n.kind, n.detail) for n in notices] == [("subscription.disabled", LEASE_LAPSED)]


# -- helpers ---------------------------------------------------------------------------------------


def listen_for_one_event(live: Live, *options: str) -> tuple[str, Result]:
    """``listen … --max-events 1`` (in this process, on a thread) while one event is posted; the
    event's body and listen's result, which succeeded."""
    results: list[Result] = []
    args = ("listen", *options, "--max-events", "1")
    listener = threading.Thread(target=lambda: results.append(live.run(*args)), daemon=True)
    listener.start()
    wait_until(lambda: len(listening(live.engine)) == 1, "the temporary subscription", live)
    body = post_event(live)
    listener.join(WAIT)
    assert not listener.is_alive(), live.worker.output()
    (result,) = results
    assert result.exit_code == 0, result.output
    return body, result


def readme_receiver(live: Live, path: str, handled: list[str], *, public_url: str | None) -> FastAPI:
    """The README's FastAPI receiver (its JWKS this service's, its dedupe in memory) at ``path``."""
    keys = RemoteJWKS(live.base + "/.well-known/usp/jwks.json", allow_insecure_http=True)

    async def on_event(hook: ReceivedWebhook) -> None:
        handled.append(hook.event.event_id)

    receiver = WebhookReceiver(Verifier(keys), on_event, dedupe=MemoryDedupe())
    app = FastAPI()
    app.include_router(webhook_router(receiver, path=path, public_url=public_url))
    return app


@contextmanager
def listen_process(
    live: Live, folder: Path, *args: str
) -> Iterator[tuple[subprocess.Popen[bytes], Callable[[], str]]]:
    """``usp-webhooks listen`` in a process of its own, subscribed; yields it and its output so far."""
    log = folder / f"listen-{time.monotonic_ns()}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("USP_")}
    env |= {"USP_ADMIN_URL": live.base, "USP_ADMIN_TOKEN": ADMIN["Authorization"].removeprefix("Bearer ")}
    env |= {"PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "usp_dispatcher.cli", "listen", *args],
            env=env,
            cwd=folder,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )

    def output() -> str:
        return log.read_text(errors="replace")

    try:
        wait_until(
            lambda: "listening on" in output() or process.poll() is not None, "listen subscribed", live
        )
        assert process.poll() is None, output()
        yield process, output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(WAIT)


def post_event(live: Live) -> str:
    body = sample_event("booking.confirmed")
    response = httpx.post(
        live.base + "/events", content=body, headers=ADMIN | {"Content-Type": "application/json"}
    )
    assert response.status_code == 202, response.text
    return body


def listening(engine: Engine) -> list[Subscription]:
    with Session(engine) as s:
        rows = list(s.exec(select(Subscription).where(col(Subscription.url).endswith("/webhooks"))).all())
        for row in rows:
            s.expunge(row)
        return rows
