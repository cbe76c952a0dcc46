"""Any API process serves any 2026 listener: two ``usp-webhooks api`` processes on one PostgreSQL
and one Redis (their broker).
A platform listens on the first with the official client in its default mode; a booking made on
the second (and an event a third party writes to the database) reaches it, woken by the
outbox's ``NOTIFY`` rather than the next poll."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx
import pytest
import redis
from sqlalchemy.engine import Engine

from tests.dispatcher.conftest import ADMIN_TOKEN
from tests.dispatcher.mcp.support import PROFILE, book, free_slots
from tests.dispatcher.mcp_live.support import Platform, emit, wait_until
from tests.dispatcher.mcp_live.test_listen import listening, modern, subscribe
from tests.servers import free_port
from tests.workers.support import exclusive, redis_db_url
from usp_core import db
from usp_dispatcher import access
from usp_receiver import JWKS

pytestmark = [pytest.mark.anyio, pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)]


@contextmanager
def api_process(database_url: str, broker_url: str, folder: Path, name: str) -> Iterator[str]:
    """``usp-webhooks api`` on a free port, configured by ``USP_*`` only; its base URL once it
    answers ``/healthz``."""
    port = free_port()
    env = os.environ | {
        "USP_DATABASE_URL": database_url,
        "USP_BROKER_URL": broker_url,
        "USP_ADMIN_TOKEN": ADMIN_TOKEN,
        "USP_ALLOW_PRIVATE_TARGETS": "true",
        "USP_PUBLIC_BASE_URL": f"http://127.0.0.1:{port}",
    }
    log = (folder / f"{name}.log").open("wb")
    command = [sys.executable, "-m", "usp_dispatcher.cli", "api", "--port", str(port)]
    process = subprocess.Popen(command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{name} did not start:\n{(folder / f'{name}.log').read_text()}")
            time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        log.close()


async def test_a_listener_on_one_api_process_hears_a_booking_made_on_another(
    database_url: str, redis_url: str, engine: Engine, tmp_path: Path
) -> None:
    broker = redis_db_url(redis_url)  # this test worker's database, held alone (what it hands off is dropped)
    with (
        redis.Redis.from_url(broker) as client,
        exclusive(client),
        api_process(database_url, broker, tmp_path, "api-a") as a,
        api_process(database_url, broker, tmp_path, "api-b") as b,
    ):
        with db.session(engine) as session:
            key = access.issue_api_key(session, "acme")
        async with httpx.AsyncClient() as http:
            keys = JWKS.from_json((await http.get(f"{a}/.well-known/usp/jwks.json")).content)
        acme = Platform(keys)
        async with (
            modern(f"{a}/mcp", acme, key=key) as listener,
            modern(f"{b}/mcp", key=key) as booker,
            anyio.create_task_group() as task_group,
        ):
            await subscribe(listener)
            async with listening(listener, task_group):
                await anyio.sleep(0.5)  # the stream is attached on A
                slot = (await free_slots(booker))[0]
                booked = await book(booker, slot["id"], key=key)
                booking_id = booked["booking"]["id"]
                await wait_until(lambda: bool(acme.received))
                elsewhere = emit(engine, "booking.confirmed", audience=PROFILE)  # a third process
                await acme.wait_for(elsewhere)
    (created, confirmed) = acme.received
    assert created.event.event == "booking.created"
    assert created.params["booking_id"] == booking_id
    assert confirmed.event.event_id == elsewhere
    assert acme.binding.stats.rejected == 0
