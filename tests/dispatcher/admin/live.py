"""A running service for end-to-end operator tests: the API under uvicorn on the test's
database with the embedded broker, a real Celery worker subprocess configured only by ``USP_*``
variables, and a server of receivers (:class:`tests.workers.endpoints.Hub`)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select
from typer.testing import CliRunner, Result

from tests.dispatcher.conftest import ADMIN, ADMIN_TOKEN, MakeSettings, Serve
from tests.workers.conftest import hub_server
from tests.workers.endpoints import Hub
from tests.workers.support import Pipeline, RelayProcess, WorkerProcess
from usp_dispatcher import cli
from usp_dispatcher.api.app import create_app
from usp_receiver import JWKS
from usp_workers.storage.models import Delivery

WAIT = 60.0
#: Seals the service's Standard Webhooks secrets (USP_SECRETS_KEY), in the API and the worker.
SECRETS_KEY = "test-secrets-key-" + "0" * 32


@dataclass
class Live:
    """A running service: its API's base URL, the database, the receivers' server."""

    base: str
    engine: Engine
    hub: Hub
    jwks: JWKS
    worker: WorkerProcess
    env: dict[str, str]  #: a child process's environment: the service's settings as ``USP_*``

    def run(self, *args: str, token: str | None = ADMIN_TOKEN, columns: int = 80) -> Result:
        env = {"USP_ADMIN_URL": self.base, "COLUMNS": str(columns)}
        env["USP_ADMIN_TOKEN"] = token or ""
        return CliRunner().invoke(cli.app, list(args), env=env)

    def ok(self, *args: str, columns: int = 80) -> str:
        result = self.run(*args, columns=columns)
        assert result.exit_code == 0, result.output
        return result.output

    def subscribe(self, url: str, **extra: Any) -> str:
        response = httpx.post(
            self.base + "/services/feed/subscriptions", json={"url": url, **extra}, headers=ADMIN
        )
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    def endpoint(self, name: str, app: Any) -> tuple[str, str]:
        path = f"/cli/{name}"
        self.hub.routes[path] = app
        return f"http://127.0.0.1:{self.hub.port}{path}", path


@contextmanager
def running_service(
    make_settings: MakeSettings,
    serve: Serve,
    engine: Engine,
    tmp_path: Path,
    *,
    scheduler: bool = False,
    **extra: Any,
) -> Iterator[Live]:
    """The service; with ``scheduler``, the scheduler too (it sends retries when they fall due).
    ``extra`` settings apply to the API and the worker alike."""
    settings = make_settings(
        retry_schedule=(0.2, 0.2), retry_jitter=0.0, secrets_key=SecretStr(SECRETS_KEY), **extra
    )
    base = serve(create_app(settings))
    jwks = JWKS.from_dict(httpx.get(base + "/.well-known/usp/jwks.json").json())
    fields = {
        "database_url": settings.database_url,
        "broker_url": settings.broker_url,
        "secrets_key": SECRETS_KEY,
        "allow_private_targets": True,
        "retry_schedule": (0.2, 0.2),
        "retry_jitter": 0.0,
        "connect_timeout": 2.0,
        "total_timeout": 5.0,
        **extra,
    }
    pipeline = Pipeline(fields, engine, tmp_path, "embedded")
    worker = WorkerProcess(pipeline, "worker")
    relay = RelayProcess(pipeline) if scheduler else None
    try:
        worker.wait_ready()
        if relay is not None:
            relay.wait_ready()
        with hub_server() as hub:
            yield Live(base, engine, hub, jwks, worker, pipeline.env())
    finally:
        code = worker.stop()
        print(f"----- worker (exit {code}) -----\n{worker.output()}")
        if relay is not None:
            print(f"----- scheduler (exit {relay.stop()}) -----\n{relay.output()}")


def wait_until(condition: Callable[[], bool], what: str, live: Live) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {WAIT} s: {what}\n{live.worker.output()}")
        time.sleep(0.05)


def event_id_in(output: str) -> str:
    found = re.search(r"evt_[0-9a-f]{32}", output)
    assert found, output
    return found.group(0)


def deliveries(engine: Engine) -> list[Delivery]:
    with Session(engine) as s:
        rows = list(s.exec(select(Delivery).order_by(col(Delivery.id))).all())
        for row in rows:
            s.expunge(row)
        return rows
