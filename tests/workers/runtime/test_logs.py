"""Structured logs: every delivery log line carries the ids an operator searches by, and no
secret (signature, private key, admin token) ever reaches a log line."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from tests.workers.conftest import MakeSettings
from tests.workers.endpoints import Answer, Hub, UspReceiver
from tests.workers.support import (
    Clock,
    Endpoints,
    Pipeline,
    ServiceProcess,
    StartWorker,
    add_subscription,
    emit_events,
    subscribe,
    wait_for_status,
)
from usp_core.clock import utcnow
from usp_core.db import session
from usp_core.keys import SigningKeyRecord
from usp_receiver import JWKS
from usp_schemas import BOOKING_CONFIRMED_EXAMPLE, new_event_id
from usp_workers.engine.delivery import deliver_batch
from usp_workers.engine.outbox import emit
from usp_workers.runtime import tasks
from usp_workers.runtime.logs import JsonFormatter, configure_logging, redact
from usp_workers.runtime.worker import worker_argv
from usp_workers.storage.models import Delivery, DeliveryStatus

pytestmark = pytest.mark.anyio

ADMIN_TOKEN = "admin-token-4f1d9c2b7e"
#: A line of Celery's text log format: ``[2026-03-14 22:00:00,123: INFO/MainProcess] ...``.
CELERY_TEXT_LOG = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+: [A-Z]+/")


class Lines(logging.Handler):
    """Every record, formatted by :class:`JsonFormatter`, as it would be written."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    engine_logger = logging.getLogger("usp_workers")
    previous = engine_logger.level
    engine_logger.addHandler(handler)
    engine_logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        engine_logger.removeHandler(handler)
        engine_logger.setLevel(previous)


def emit_with_correlation(engine: Engine, correlation_id: str) -> str:
    event = json.loads(BOOKING_CONFIRMED_EXAMPLE)
    event |= {"event_id": new_event_id(), "timestamp": utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")}
    event["correlation_id"] = correlation_id
    with session(engine) as s:
        record = emit(s, event)
        s.commit()
    return record.id


async def test_delivery_log_lines_carry_the_ids_and_never_a_secret(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    hub: Hub,
    client: httpx.AsyncClient,
    clock: Clock,
    lines: Lines,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = make_settings(admin_token=SecretStr(ADMIN_TOKEN), retry_schedule=(0.01,))
    caplog.set_level(logging.DEBUG)
    ok = add_subscription(database, endpoints.add("ok", UspReceiver(jwks)))
    failing = add_subscription(database, endpoints.add("failing", Answer(500, body=b"no")))
    gone = add_subscription(database, endpoints.add("gone", Answer(410)))
    event_id = emit_with_correlation(database, "corr-7d3a")

    for _ in range(3):  # success, 500 then dead, 410
        await deliver_batch(database, settings, _ids(database, event_id), client=client, now=clock)
        clock.advance(1)

    # The secrets that existed during those deliveries.
    signatures = [
        seen.headers["signature"]
        for path in ("ok", "failing", "gone")
        for seen in hub.seen(endpoints.path(path))
    ]
    assert len(signatures) == 4
    secrets = [ADMIN_TOKEN]
    for value in signatures:
        secrets.append(value)
        secrets.extend(part.split(":")[1] for part in value.split(", "))  # the bare base64 values
    with Session(database) as s:
        for key in s.exec(select(SigningKeyRecord)):
            secrets.append(json.loads(key.private_jwk)["d"])
    assert all(len(secret) > 16 for secret in secrets)

    everything = "\n".join(lines.lines) + "\n" + caplog.text
    for secret in secrets:
        assert secret not in everything

    parsed = [json.loads(line) for line in lines.lines]
    by_subscription: dict[str, list[dict[str, Any]]] = {}
    for line in parsed:
        if "delivery_id" in line:
            by_subscription.setdefault(line["subscription_id"], []).append(line)
    assert [line["outcome"] for line in by_subscription[ok.id]] == ["succeeded"]
    assert [line["outcome"] for line in by_subscription[failing.id]] == ["retry", "dead"]
    assert [line["outcome"] for line in by_subscription[gone.id]] == ["disabled"]
    for line in (line for group in by_subscription.values() for line in group):
        assert line["event_id"] == event_id
        assert line["correlation_id"] == "corr-7d3a"
        assert line["delivery_id"].startswith("dlv_")
        assert {"ts", "level", "logger", "message"} <= set(line)
    assert by_subscription[failing.id][1]["level"] == "WARNING"
    assert by_subscription[failing.id][0]["status_code"] == 500


def _ids(engine: Engine, event_id: str) -> list[str]:
    with Session(engine) as s:
        return list(s.exec(select(Delivery.id).where(Delivery.event_id == event_id)).all())


def test_a_secret_that_slips_into_a_message_is_masked() -> None:
    record = logging.LogRecord(
        "usp_workers",
        logging.ERROR,
        __file__,
        1,
        "request failed: Authorization: Bearer %s; Signature: sig1=:%s:; key %s",
        (ADMIN_TOKEN, "QUJDREVGR0hJSktMTU5PUFFSU1RVVg==", '{"kty": "OKP", "d": "c2VjcmV0LXByaXZhdGUta2V5"}'),
        None,
    )
    line = JsonFormatter().format(record)
    assert ADMIN_TOKEN not in line
    assert "QUJDREVGR0hJSktMTU5PUFFSU1RVVg==" not in line
    assert "c2VjcmV0LXByaXZhdGUta2V5" not in line
    assert json.loads(line)["message"].count("[redacted]") == 3
    assert redact("nothing to hide") == "nothing to hide"


def test_json_format_puts_one_object_per_line_on_the_root_logger(make_settings: MakeSettings) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging(make_settings(log_format="json"))
        [handler] = root.handlers
        assert isinstance(handler, logging.StreamHandler)
        stream = io.StringIO()
        handler.setStream(stream)
        logging.getLogger("usp_workers").info(
            "delivered", extra={"delivery_id": "dlv_1", "event_id": "evt_1", "subscription_id": "sub_1"}
        )
        line = json.loads(stream.getvalue().strip().splitlines()[-1])
        assert (line["message"], line["delivery_id"], line["event_id"]) == ("delivered", "dlv_1", "evt_1")
        assert line["level"] == "INFO"
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])


class CeleryCommandWorker(ServiceProcess):
    """``celery -A usp_workers.runtime.celery_app worker``, as a deployment may start it (every
    other test's worker runs as ``usp-webhooks worker`` does, through ``run_worker``)."""

    ready_marker = " ready."

    def __init__(self, pipeline: Pipeline) -> None:
        command = [sys.executable, "-m", "celery", "-A", "usp_workers.runtime.celery_app"]
        super().__init__(pipeline, "celery-json-worker", command + worker_argv(node=uuid.uuid4().hex[:8]))


@pytest.fixture
def start_celery_command_worker(
    pipeline: Pipeline, _children: list[ServiceProcess]
) -> Callable[[], CeleryCommandWorker]:
    def start() -> CeleryCommandWorker:
        worker = CeleryCommandWorker(pipeline)
        _children.append(worker)
        return worker

    return start


@pytest.mark.parametrize("pipeline", [("redis", "sqlite")], indirect=True, ids=["redis-sqlite"])
def test_a_real_worker_logs_json_lines_with_ids_and_no_secret(
    pipeline: Pipeline,
    endpoints: Endpoints,
    hub: Hub,
    start_worker: StartWorker,
) -> None:
    pipeline.fields |= {"log_format": "json", "admin_token": ADMIN_TOKEN, "retry_schedule": (0.2,)}
    subscription_id = subscribe(pipeline.engine, endpoints.add("failing", Answer(500)))
    worker = start_worker("json-worker", concurrency=2)
    worker.wait_ready()
    tasks.install_enqueuer(pipeline.settings)
    event_id = emit_events(pipeline.engine, 1)[0]
    # No relay runs: the retry is handed over by hand once due (a retry's wake-up is the relay's).
    wait_for_status(pipeline.engine, DeliveryStatus.PENDING, 1, 30, worker.output)
    deadline = time.monotonic() + 30
    while len(hub.seen(endpoints.path("failing"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.3)
        tasks.enqueue_deliveries(_ids(pipeline.engine, event_id))
    wait_for_status(pipeline.engine, DeliveryStatus.DEAD, 1, 30, worker.output)
    worker.stop()

    output = worker.output()
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    tries = [line for line in lines if line.get("delivery_id")]
    assert [line["outcome"] for line in tries] == ["retry", "dead"]
    for line in tries:
        assert (line["event_id"], line["subscription_id"]) == (event_id, subscription_id)
    assert any("ready." in line["message"] for line in lines)  # Celery's own lines are JSON too
    secrets = [ADMIN_TOKEN]
    for seen in hub.seen(endpoints.path("failing")):
        secrets.append(seen.headers["signature"])
        secrets.extend(part.split(":")[1] for part in seen.headers["signature"].split(", "))
    with Session(pipeline.engine) as s:
        secrets.extend(json.loads(key.private_jwk)["d"] for key in s.exec(select(SigningKeyRecord)))
    for secret in secrets:
        assert secret not in output
    assert_root_explained_once(output)


@pytest.mark.parametrize("pipeline", [("redis", "sqlite")], indirect=True, ids=["redis-sqlite"])
def test_a_celery_started_worker_logs_json_too(
    pipeline: Pipeline,
    endpoints: Endpoints,
    hub: Hub,
    start_celery_command_worker: Callable[[], CeleryCommandWorker],
) -> None:
    """``celery -A usp_workers.runtime.celery_app worker``, as deployed and as the benchmarks start it:
    no ``run_worker`` in between, only ``USP_LOG_FORMAT=json`` in its environment."""
    pipeline.fields |= {"log_format": "json", "admin_token": ADMIN_TOKEN}
    # 410: one try, logged as a warning (successes are DEBUG lines, below the worker's INFO).
    subscription_id = subscribe(pipeline.engine, endpoints.add("gone", Answer(410)))
    worker = start_celery_command_worker()
    worker.wait_ready()
    tasks.install_enqueuer(pipeline.settings)
    event_id = emit_events(pipeline.engine, 1)[0]
    wait_for_status(pipeline.engine, DeliveryStatus.DEAD, 1, 30, worker.output)
    worker.stop()

    output = worker.output()
    text_logs = [line for line in output.splitlines() if CELERY_TEXT_LOG.match(line)]
    assert text_logs == [], "Celery's own text set-up ran"
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    (delivered,) = [line for line in lines if line.get("delivery_id")]
    assert (delivered["event_id"], delivered["subscription_id"]) == (event_id, subscription_id)
    assert (delivered["outcome"], delivered["level"]) == ("disabled", "WARNING")
    assert any(line["logger"].startswith("celery") and "ready." in line["message"] for line in lines)
    assert ADMIN_TOKEN not in output
    assert_root_explained_once(output)


def assert_root_explained_once(output: str) -> None:
    """Started as root (as here and in CI, and in a container without a USER), the worker says
    once, in one line, why that is safe for it, instead of Celery's screenful of SecurityWarning."""
    assert "SecurityWarning" not in output
    assert "superuser privileges" not in output
    explained = output.count("running as root: safe from Celery's pickle risk")
    assert explained == (1 if os.geteuid() == 0 else 0), output
