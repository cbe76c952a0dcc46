"""The whole pipeline with real processes: emit → broker → Celery worker subprocess → receiver.

A real ``celery -A usp_workers.celery_app worker`` runs as a child process, configured only by
``USP_*`` environment variables, exactly as deployed. Events are emitted in this process through
the outbox with the enqueuer installed (as the API does), and delivered to the receiver library's
own ASGI app on a real uvicorn server, which verifies every signature against the published JWKS.

Brokers: Redis (database 11, emptied before and after, and held by one test run at a time under
a lock in that database; nothing else on the server is touched) and the embedded SQLite broker.
Databases: a SQLite file and a PostgreSQL schema of its own.

The crash test kills a worker with SIGKILL while it holds a batch: the deliveries must come back
through their lease and the relay, and reach the receiver once the next worker runs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio.to_thread
import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, func, select

from usp_receiver import JWKS
from usp_schemas import BOOKING_CONFIRMED_EXAMPLE, new_event_id
from usp_workers import tasks
from usp_workers.db import make_engine, session, upgrade
from usp_workers.keys import ensure_signing_key, published_jwks
from usp_workers.models import Attempt, Delivery, DeliveryStatus, Subscription, utcnow
from usp_workers.outbox import emit
from usp_workers.relay import run_relay
from usp_workers.settings import Settings
from usp_workers.worker import worker_argv

from .endpoints import Hub, UspReceiver, respond
from .support import Endpoints

REDIS_DB = 11
REDIS_LOCK = "usp-tests:pipeline-lock"
WORKER_READY_TIMEOUT = 45.0

Scope = MutableMapping[str, Any]


# -- configuration: one dict becomes both the worker's environment and our Settings -----------------


@dataclass
class Pipeline:
    """A database, a broker and the settings both this process and the worker use."""

    fields: dict[str, Any]
    engine: Engine
    folder: Path
    broker: str

    @property
    def settings(self) -> Settings:
        return Settings(_env_file=None, **self.fields)

    def env(self) -> dict[str, str]:
        """The worker's environment: ours without any ``USP_*``, plus the pipeline's settings."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("USP_")}
        for name, value in self.fields.items():
            text = ",".join(str(v) for v in value) if isinstance(value, tuple) else str(value)
            env[f"USP_{name.upper()}"] = text
        env["PYTHONUNBUFFERED"] = "1"
        return env


def _redis_db_url(base: str) -> str:
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, f"/{REDIS_DB}", "", ""))


@pytest.fixture(
    params=[("redis", "sqlite"), ("redis", "postgresql"), ("embedded", "sqlite")],
    ids=["redis-sqlite", "redis-postgresql", "embedded-sqlite"],
)
def pipeline(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Pipeline]:
    broker_kind, database_kind = request.param
    client = None
    if broker_kind == "redis":
        broker = _redis_db_url(request.getfixturevalue("redis_url"))
        client = redis.Redis.from_url(broker)
    else:
        broker = f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}"
    with _exclusive(client), _database(request, database_kind, tmp_path) as url:
        fields: dict[str, Any] = {
            "database_url": url,
            "broker_url": broker,
            "allow_private_targets": True,
            "retry_schedule": (1.0, 1.0, 1.0),
            "retry_jitter": 0.0,
            "lease_seconds": 30.0,
            "requeue_after_seconds": 30.0,
            "relay_interval_seconds": 0.2,
            "connect_timeout": 2.0,
            "total_timeout": 5.0,
            "key_publish_lead_seconds": 0.0,
        }
        engine = make_engine(url)
        try:
            upgrade(engine)
            pipeline = Pipeline(fields, engine, tmp_path, broker_kind)
            with session(engine) as s:
                ensure_signing_key(s, pipeline.settings)
                s.commit()
            yield pipeline
        finally:
            tasks.uninstall_enqueuer()
            engine.dispose()


@contextmanager
def _exclusive(client: redis.Redis | None) -> Iterator[None]:
    """Hold Redis database 11 alone, emptied, for one test.

    Several test runs may share the server (engineers and CI on one machine): their workers
    consume the same queue, and one run's worker would take the other's messages. A lock in the
    database itself serialises the runs; it expires on its own if a run dies holding it. The
    database is emptied like ``flushdb`` does, except for the lock.
    """
    if client is None:
        yield
        return
    lock = client.lock(REDIS_LOCK, timeout=600, blocking_timeout=600)
    if not lock.acquire():
        pytest.fail(f"another test run held Redis database {REDIS_DB} for 10 minutes")
    try:
        _empty(client)
        yield
    finally:
        _empty(client)
        lock.release()
        client.close()


def _empty(client: redis.Redis) -> None:
    for key in client.scan_iter(count=1000):
        if key != REDIS_LOCK.encode():
            client.delete(key)


class _database:
    """A fresh database URL: a SQLite file, or a PostgreSQL schema (dropped afterwards)."""

    def __init__(self, request: pytest.FixtureRequest, kind: str, folder: Path) -> None:
        self.request, self.kind, self.folder = request, kind, folder
        self.schema: str | None = None
        self.admin: Engine | None = None

    def __enter__(self) -> str:
        if self.kind == "sqlite":
            return f"sqlite:///{self.folder / 'usp.sqlite3'}"
        base: str = self.request.getfixturevalue("postgres_url")
        self.schema = f"usp_test_{uuid.uuid4().hex[:12]}"
        self.admin = sa.create_engine(base)
        with self.admin.begin() as connection:
            connection.execute(sa.text(f'CREATE SCHEMA "{self.schema}"'))
        url = sa.make_url(base).update_query_dict({"options": f"-csearch_path={self.schema}"})
        return url.render_as_string(hide_password=False)

    def __exit__(self, *exc: object) -> None:
        if self.admin is not None:
            with self.admin.begin() as connection:
                connection.execute(sa.text(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE'))
            self.admin.dispose()


# -- worker processes ------------------------------------------------------------------------------------


class WorkerProcess:
    """``celery -A usp_workers.celery_app worker`` in a child process, its output in a file."""

    def __init__(self, pipeline: Pipeline, name: str, concurrency: int = 8) -> None:
        self.log_path = pipeline.folder / f"{name}.log"
        command = [sys.executable, "-m", "celery", "-A", "usp_workers.celery_app"]
        command += worker_argv(concurrency=concurrency)
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            command,
            cwd=pipeline.folder,  # no stray .env is read, nothing is written outside tmp
            env=pipeline.env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # our Ctrl-C is not its Ctrl-C; we stop it ourselves
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def diagnose(self) -> str:
        """The output, after asking a live worker for a traceback of every thread (Celery dumps
        them on SIGUSR1): what a stuck batch is waiting for."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
        return self.output()

    def wait_ready(self, timeout: float = WORKER_READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while " ready." not in self.output():
            if self.process.poll() is not None:
                pytest.fail(f"the worker exited with {self.process.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"the worker was not ready within {timeout} s:\n{self.output()}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: no warm shutdown, no acknowledgement, no cleanup (a crash)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (Celery's warm shutdown), SIGKILL if it does not exit within ``timeout``."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()
        return self.process.returncode


@pytest.fixture
def start_worker(pipeline: Pipeline) -> Iterator[Callable[..., WorkerProcess]]:
    """Start workers (``start_worker(name)``); all are stopped at the end, and their output is
    printed (pytest shows it when the test failed)."""
    started: list[WorkerProcess] = []

    def start(name: str = "worker", **kw: Any) -> WorkerProcess:
        worker = WorkerProcess(pipeline, name, **kw)
        started.append(worker)
        return worker

    try:
        yield start
    finally:
        for worker in started:
            code = worker.stop()
            print(f"----- {worker.log_path.name} (exit {code}) -----\n{worker.output()}")


# -- helpers --------------------------------------------------------------------------------------------


def jwks_of(pipeline: Pipeline) -> JWKS:
    with session(pipeline.engine) as s:
        return JWKS.from_dict(published_jwks(s, pipeline.settings))


def subscribe(engine: Engine, url: str) -> str:
    with Session(engine) as s:
        row = Subscription(url=url)
        s.add(row)
        s.commit()
        return row.id


def emit_events(engine: Engine, count: int, *, per_transaction: int = 1) -> list[str]:
    """Emit ``count`` fresh booking.confirmed events; each commit hands its deliveries off."""
    event_ids: list[str] = []
    template = json.loads(BOOKING_CONFIRMED_EXAMPLE)
    while len(event_ids) < count:
        with session(engine) as s:
            for _ in range(min(per_transaction, count - len(event_ids))):
                event = template | {
                    "event_id": new_event_id(),
                    "timestamp": utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
                event_ids.append(emit(s, event).id)
            s.commit()
    return event_ids


def status_counts(engine: Engine) -> dict[str, int]:
    with Session(engine) as s:
        rows = s.exec(select(Delivery.status, func.count()).group_by(col(Delivery.status))).all()
    return {str(status): int(n) for status, n in rows}


def wait_all_succeeded(engine: Engine, total: int, timeout: float, *logs: Callable[[], str]) -> float:
    """Poll until ``total`` deliveries succeeded; return the moment (monotonic) it happened."""
    deadline = time.monotonic() + timeout
    while True:
        counts = status_counts(engine)
        if counts.get(DeliveryStatus.SUCCEEDED.value, 0) == total:
            return time.monotonic()
        if time.monotonic() > deadline:
            output = "\n".join(log() for log in logs)
            pytest.fail(f"not all {total} deliveries succeeded within {timeout} s: {counts}\n{output}")
        time.sleep(0.05)


def assert_delivered_once(
    engine: Engine, hub: Hub, path: str, receiver: UspReceiver, event_ids: list[str]
) -> None:
    """Every event reached the receiver, verified, exactly once; one attempt each."""
    assert sorted(receiver.handled) == sorted(event_ids), "each event handled once"
    assert len(hub.seen(path)) == len(event_ids), "no delivery was sent twice"
    with Session(engine) as s:
        rows = s.exec(select(Delivery)).all()
        assert {d.attempt_count for d in rows} == {1}
        assert s.exec(select(func.count()).select_from(Attempt)).one() == len(event_ids)


# -- tests ------------------------------------------------------------------------------------------------


def test_a_real_worker_delivers_emitted_events_once_each(
    pipeline: Pipeline,
    start_worker: Callable[..., WorkerProcess],
    endpoints: Endpoints,
    hub: Hub,
) -> None:
    receiver = UspReceiver(jwks_of(pipeline))
    subscribe(pipeline.engine, endpoints.add("usp", receiver))
    worker = start_worker()
    worker.wait_ready()
    tasks.install_enqueuer(pipeline.settings)

    event_ids = emit_events(pipeline.engine, 20)

    wait_all_succeeded(pipeline.engine, 20, 60, worker.diagnose)
    assert_delivered_once(pipeline.engine, hub, endpoints.path("usp"), receiver, event_ids)


@pytest.mark.parametrize("pipeline", [("redis", "sqlite")], indirect=True, ids=["redis-sqlite"])
def test_throughput_of_one_worker(
    pipeline: Pipeline,
    start_worker: Callable[..., WorkerProcess],
    endpoints: Endpoints,
    hub: Hub,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """2000 deliveries (200 events to 10 platforms) through one worker process with the default
    8 threads; prints deliveries per second. The deliveries are written first and then handed
    over in batches of 50, so the clock measures the pipeline, not the writing. The receivers
    (verifying every signature) share one uvicorn in this process: they bound the rate too."""
    pipeline.fields["per_endpoint_concurrency"] = 32  # the ten platforms are one endpoint here
    receivers = [UspReceiver(jwks_of(pipeline)) for _ in range(10)]
    paths = []
    for number, receiver in enumerate(receivers):
        subscribe(pipeline.engine, endpoints.add(f"usp{number}", receiver))
        paths.append(endpoints.path(f"usp{number}"))
    event_ids = emit_events(pipeline.engine, 200, per_transaction=50)  # no enqueuer yet
    with Session(pipeline.engine) as s:
        ids = list(s.exec(select(Delivery.id)).all())
    assert len(ids) == 2000
    worker = start_worker()
    worker.wait_ready()
    celery = tasks.install_enqueuer(pipeline.settings)
    stop = threading.Event()
    relay = threading.Thread(target=run_relay, args=(pipeline.settings,), kwargs={"stop": stop})

    started = time.monotonic()
    tasks.enqueue_deliveries(ids, app=celery)
    relay.start()  # as in production; it only has work if a try fails
    try:
        finished = wait_all_succeeded(pipeline.engine, 2000, 120, worker.diagnose)
    finally:
        stop.set()
        relay.join(30)

    posts = sum(len(hub.seen(p)) for p in paths)
    rate = 2000 / (finished - started)
    with capsys.disabled():
        print(
            f"\n[throughput] 2000 deliveries in {finished - started:.2f} s: {rate:.0f} deliveries/s "
            f"({posts - 2000} retried)"
        )
    for receiver in receivers:
        assert sorted(receiver.handled) == sorted(event_ids), "every platform got every event once"


@dataclass
class Gate:
    """Holds every request until ``opened`` is set, then passes requests on to ``app``.

    A held request's sender is killed meanwhile; when the gate opens, its answer goes to a closed
    connection (uvicorn drops it).
    """

    app: UspReceiver
    held: int = 0
    entered: threading.Event = field(default_factory=threading.Event)
    opened: threading.Event = field(default_factory=threading.Event)

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if not self.opened.is_set():
            self.held += 1
            self.entered.set()
            await anyio.to_thread.run_sync(self.opened.wait, 60)
            await respond(send, 503)
            return
        await self.app(scope, receive, send)


# The crash path runs through the database (leases, the relay): SQLite with each broker suffices.
@pytest.mark.parametrize(
    "pipeline", [("redis", "sqlite"), ("embedded", "sqlite")], indirect=True, ids=["redis", "embedded"]
)
def test_deliveries_held_by_a_killed_worker_are_delivered_by_the_next(
    pipeline: Pipeline,
    start_worker: Callable[..., WorkerProcess],
    endpoints: Endpoints,
    hub: Hub,
) -> None:
    pipeline.fields["lease_seconds"] = 3.0
    receiver = UspReceiver(jwks_of(pipeline))
    gate = Gate(receiver)
    subscribe(pipeline.engine, endpoints.add("usp", gate))
    first = start_worker("first")
    first.wait_ready()
    tasks.install_enqueuer(pipeline.settings)

    event_ids = emit_events(pipeline.engine, 10, per_transaction=10)  # one batch of 10
    assert gate.entered.wait(30), first.output()
    deadline = time.monotonic() + 10
    while status_counts(pipeline.engine).get(DeliveryStatus.IN_FLIGHT.value) != 10:
        assert time.monotonic() < deadline, status_counts(pipeline.engine)
        time.sleep(0.05)
    first.kill()
    gate.opened.set()

    stop = threading.Event()
    relay = threading.Thread(target=run_relay, args=(pipeline.settings,), kwargs={"stop": stop})
    relay.start()
    try:
        second = start_worker("second")
        second.wait_ready()
        wait_all_succeeded(pipeline.engine, 10, 60, first.output, second.diagnose)
    finally:
        stop.set()
        relay.join(30)
    assert not relay.is_alive(), "the relay did not stop"

    assert sorted(receiver.handled) == sorted(event_ids), "each event handled once by the receiver"
    with Session(pipeline.engine) as s:
        rows = s.exec(select(Delivery)).all()
        # The killed worker's tries never finished: not counted, not recorded.
        assert {d.attempt_count for d in rows} == {1}
        assert s.exec(select(func.count()).select_from(Attempt)).one() == 10
    assert gate.held >= 1
