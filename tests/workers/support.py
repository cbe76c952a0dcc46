"""Helpers for the delivery engine's tests: a controllable clock, per-test endpoints, rows; and
the real-process pipeline (a database, a broker, Celery worker and scheduler subprocesses) that
``test_pipeline.py`` and ``test_resilience.py`` share (its fixtures are in ``conftest.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from redis.lock import Lock
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, func, select

from tests import forked
from tests.workers.endpoints import App, Hub
from usp_core.clock import utcnow
from usp_core.db import session
from usp_core.keys import published_jwks
from usp_dispatcher.cli.config import Settings
from usp_receiver import JWKS
from usp_schemas import BOOKING_CONFIRMED_EXAMPLE, new_event_id
from usp_workers.engine.outbox import emit
from usp_workers.runtime.celery_app import QUEUE, make_celery
from usp_workers.storage.models import Attempt, Delivery, DeliveryStatus, Subscription, Transport


class Clock:
    """``utcnow`` shifted by an offset the test moves forward (no sleeping for retries); or
    frozen at one moment when a test compares computed times exactly."""

    def __init__(self) -> None:
        self.offset = timedelta(0)
        self.frozen: datetime | None = None

    def __call__(self) -> datetime:
        return self.frozen if self.frozen is not None else utcnow() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)
        if self.frozen is not None:
            self.frozen += timedelta(seconds=seconds)

    def advance_to(self, moment: datetime) -> None:
        """Move on until ``moment`` has passed."""
        gap = (moment - self()).total_seconds()
        if gap >= 0:
            self.advance(gap + 0.001)

    def freeze(self) -> datetime:
        self.frozen = self()
        return self.frozen


class Endpoints:
    """Registers apps on the hub under paths unique to one test; removes them afterwards."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.prefix = f"/t/{uuid.uuid4().hex[:12]}"
        self.paths: list[str] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.hub.port}"

    def add(self, name: str, app: App) -> str:
        """Serve ``app`` at a fresh path; return its URL."""
        path = f"{self.prefix}/{name}"
        self.hub.routes[path] = app
        self.paths.append(path)
        return self.base + path

    def path(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def close(self) -> None:
        for path in self.paths:
            self.hub.routes.pop(path, None)


# -- rows ----------------------------------------------------------------------------------------


def add_subscription(engine: Engine, url: str, transport: Transport = Transport.REST) -> Subscription:
    with session(engine) as s:
        subscription = Subscription(url=url, transport=transport)
        s.add(subscription)
        s.commit()
        return subscription


def emit_event(engine: Engine, event_id: str | None = None) -> tuple[str, list[str]]:
    """Emit a fresh booking.confirmed event through the outbox; its id and its delivery ids."""
    event = json.loads(BOOKING_CONFIRMED_EXAMPLE)
    event["event_id"] = event_id or new_event_id()
    event["timestamp"] = utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")
    with session(engine) as s:
        record = emit(s, event)
        s.commit()
        ids = list(s.exec(select(Delivery.id).where(Delivery.event_id == record.id)).all())
    return record.id, ids


def delivery(engine: Engine, delivery_id: str) -> Delivery:
    with Session(engine) as s:
        row = s.get(Delivery, delivery_id)
        assert row is not None
        s.expunge(row)
        return row


def attempts(engine: Engine, delivery_id: str) -> list[Attempt]:
    with Session(engine) as s:
        rows = s.exec(
            select(Attempt).where(Attempt.delivery_id == delivery_id).order_by(col(Attempt.id))
        ).all()
        for row in rows:
            s.expunge(row)
        return list(rows)


def subscription(engine: Engine, subscription_id: str) -> Subscription:
    with Session(engine) as s:
        row = s.get(Subscription, subscription_id)
        assert row is not None
        s.expunge(row)
        return row


# -- the real-process pipeline ---------------------------------------------------------------------

#: The Redis databases the pipeline tests' brokers use, one per pytest-xdist worker (workers beyond
#: the fourth share them, taking turns through the lock): nothing else in the suite touches them
#: (0: dedupe keys, 12: RabbitMQ's lock, 14: the ACL test, 15: the broker-outage test).
REDIS_DBS = (11, 13, 10, 9)
#: The key that serialises the tests sharing one of those databases (see :func:`exclusive`).
REDIS_LOCK = "usp-tests:pipeline-lock"
#: The database holding the lock of RabbitMQ's delivery queue (see :func:`amqp_exclusive`): apart
#: from :data:`REDIS_DBS`, which the Redis pipeline tests empty.
AMQP_LOCK_DB = 12
AMQP_LOCK = "usp-tests:rabbitmq-queue-lock"
WORKER_READY_TIMEOUT = 45.0


@dataclass
class Pipeline:
    """A database, a broker and the settings both this process and the worker use.

    ``fields`` are the settings; a test may change them before it starts a child process (each
    child reads them from its environment when it starts). ``redis`` and ``lock`` are set when
    the broker is Redis: the client on the broker's database, and this run's hold on it.
    """

    fields: dict[str, Any]
    engine: Engine
    folder: Path
    broker: str
    redis: redis.Redis | None = None
    lock: Lock | None = None

    @property
    def settings(self) -> Settings:
        return Settings(_env_file=None, **self.fields)

    def env(self) -> dict[str, str]:
        """A child's environment: ours without any ``USP_*``, plus the pipeline's settings."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("USP_")}
        for name, value in self.fields.items():
            text = ",".join(str(v) for v in value) if isinstance(value, tuple) else str(value)
            env[f"USP_{name.upper()}"] = text
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def queued(self) -> int:
        """Messages waiting in the broker's delivery queue (Redis or RabbitMQ)."""
        if self.broker == "amqp":
            with amqp_queue(self.settings.broker_url_resolved) as queue:
                return int(queue.queue_declare(passive=True).message_count)
        assert self.redis is not None, "a Redis pipeline"
        return int(self.redis.llen(QUEUE))

    def flush_broker(self) -> int:
        """``FLUSHDB`` the broker's Redis database, as one atomic step that also puts back this
        run's lock; return how many messages were waiting in the queue at that moment.

        Every key the broker had goes: queued messages, the unacknowledged ones workers hold, the
        bindings. For the broker (it uses this database alone) that is exactly what ``FLUSHALL``
        does to it. ``FLUSHALL`` itself would also wipe the other databases of the server (other
        test runs' dedupe keys) and, here, the lock: another run's pipeline test could then start
        sharing the queue mid-test. Hence ``FLUSHDB`` and the lock's token and expiry put back
        inside the same ``MULTI``.
        """
        if self.broker == "amqp":  # what waits in the queue; the unacknowledged stay with workers
            with amqp_queue(self.settings.broker_url_resolved) as queue:
                return int(queue.purge() or 0)
        assert self.redis is not None, "a Redis pipeline"
        assert self.lock is not None
        token = self.lock.local.token
        assert token is not None, "the lock is held"
        ttl = int(self.redis.pttl(REDIS_LOCK))
        with self.redis.pipeline(transaction=True) as transaction:
            transaction.llen(QUEUE)
            transaction.flushdb()
            transaction.set(REDIS_LOCK, token, px=max(ttl, 1000))
            waiting, _, _ = transaction.execute()
        return int(waiting)


@contextmanager
def consuming(celery: Any) -> Iterator[tuple[Any, list[Any]]]:
    """A consumer of the delivery queue on ``celery``'s broker, for the block: its connection (to
    drain) and the bodies it took so far, each acknowledged."""
    got: list[Any] = []

    def take(body: Any, message: Any) -> None:
        got.append(body)
        message.ack()

    with (
        celery.connection_for_read() as connection,
        connection.Consumer(celery.amqp.queues[QUEUE], callbacks=[take], accept=["json"]),
    ):
        yield connection, got


def redis_db_url(base: str, db: int | None = None) -> str:
    """``base`` (the suite's Redis URL) on database ``db`` (by default, :func:`pipeline_redis_db`)."""
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, f"/{pipeline_redis_db() if db is None else db}", "", ""))


def pipeline_redis_db() -> int:
    """This pytest-xdist worker's broker database: the Redis pipeline tests of different workers
    run side by side instead of waiting for each other (up to a minute and a half each)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return REDIS_DBS[int(worker.removeprefix("gw")) % len(REDIS_DBS)]


@contextmanager
def exclusive(client: redis.Redis) -> Iterator[Lock]:
    """Hold the client's Redis database (one of :data:`REDIS_DBS`) alone, emptied, for one test;
    yield the lock.

    Several test runs may share the server (engineers and CI on one machine): their workers
    consume the same queue, and one run's worker would take the other's messages. A lock in the
    database itself serialises the runs; it expires on its own if a run dies holding it. The
    database is emptied like ``flushdb`` does, except for the lock.
    """
    database = client.connection_pool.connection_kwargs.get("db", 0)
    with _held(client, REDIS_LOCK, f"Redis database {database}") as lock:
        empty(client)
        try:
            yield lock
        finally:
            empty(client)


@contextmanager
def _held(client: redis.Redis, name: str, what: str) -> Iterator[Lock]:
    """The lock ``name`` in ``client``'s database, waited for up to 10 minutes; it expires on its
    own after as long if the run holding it dies."""
    lock = client.lock(name, timeout=600, blocking_timeout=600)
    if not lock.acquire():
        pytest.fail(f"another test run held {what} for 10 minutes")
    try:
        yield lock
    finally:
        lock.release()


@contextmanager
def amqp_exclusive(redis_url: str, amqp_url: str) -> Iterator[None]:
    """Hold RabbitMQ's delivery queue alone, emptied, for one test: the same reason as
    :func:`exclusive`, its own lock (in :data:`AMQP_LOCK_DB`), so that a RabbitMQ test and a Redis
    one run side by side (on two xdist workers)."""
    with (
        redis.Redis.from_url(redis_db_url(redis_url, AMQP_LOCK_DB)) as client,
        _held(client, AMQP_LOCK, "RabbitMQ's delivery queue"),
        emptied_amqp_queue(amqp_url),
    ):
        yield


@contextmanager
def amqp_queue(url: str) -> Iterator[Any]:
    """The delivery queue on the RabbitMQ at ``url``, as the Celery app declares it, bound to a
    channel (a kombu ``Queue``)."""
    celery = make_celery(Settings(_env_file=None, broker_url=url))
    with celery.connection_for_write() as connection:
        queue = celery.amqp.queues[QUEUE](connection.default_channel)
        queue.declare()
        yield queue


@contextmanager
def emptied_amqp_queue(url: str) -> Iterator[None]:
    """The delivery queue on RabbitMQ emptied before and after a test (another run's messages,
    or this one's leftovers, would be consumed by the wrong workers)."""
    with amqp_queue(url) as queue:
        queue.purge()
    try:
        yield
    finally:
        with amqp_queue(url) as queue:
            queue.purge()


def empty(client: redis.Redis) -> None:
    """Delete every key of the client's database except the lock."""
    for key in client.scan_iter(count=1000):
        if key != REDIS_LOCK.encode():
            client.delete(key)


class ServiceProcess:
    """A child process of the pipeline (worker, scheduler, a script), configured only by the
    pipeline's ``USP_*`` environment, in its own process group, its output in a file."""

    #: A line the child prints once it is ready (``None``: ready at once).
    ready_marker: str | None = None

    def __init__(
        self,
        pipeline: Pipeline,
        name: str,
        command: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
        *,
        code: str | None = None,
    ) -> None:
        """Run ``command``, or the Python ``code`` (as ``python -c`` would, forked from
        :mod:`tests.forked`'s pre-imported server)."""
        self.name = name
        self.log_path = pipeline.folder / f"{name}.log"
        self._log = self.log_path.open("wb")
        child_env = pipeline.env() | (env or {})
        # Either way in pipeline.folder: no stray .env is read, nothing is written outside tmp.
        self.process: subprocess.Popen[bytes] | forked.Child
        if code is not None:
            self.process = forked.start(code, cwd=pipeline.folder, env=child_env, log=self.log_path)
            return
        assert command is not None, "a command or code"
        self.process = subprocess.Popen(
            list(command),
            cwd=pipeline.folder,
            env=child_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # our Ctrl-C is not its Ctrl-C; and killpg reaches it all
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def diagnose(self) -> str:
        return self.output()

    def wait_ready(self, timeout: float = WORKER_READY_TIMEOUT) -> None:
        if self.ready_marker is None:
            return
        deadline = time.monotonic() + timeout
        while self.ready_marker not in self.output():
            if self.process.poll() is not None:
                pytest.fail(f"{self.name} exited with {self.process.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                pytest.fail(f"{self.name} was not ready within {timeout} s:\n{self.output()}")
            time.sleep(0.1)

    def wait(self, timeout: float) -> int:
        """Wait for the child to exit by itself; its exit code."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} did not exit within {timeout} s:\n{self.output()}")

    def kill(self) -> None:
        """SIGKILL its whole process group: no shutdown, no acknowledgement, no cleanup (a crash)."""
        if self.process.poll() is None:
            self._signal_group(signal.SIGKILL)
            self.process.wait(10)

    def kill_holding(self, held: Callable[[], int], at_least: int, timeout: float = 60.0) -> int:
        """SIGKILL it at a moment ``held()`` counts at least ``at_least`` of its claims; return the
        count. The group is stopped (SIGSTOP) before each look, and a look that finds enough is
        made again 50 ms later before the kill: a commit the worker had sent just before it
        stopped (a whole batch's record) still lands, and must not be counted as held."""
        deadline = time.monotonic() + timeout
        while True:
            self._signal_group(signal.SIGSTOP)
            if held() >= at_least:
                time.sleep(0.05)
                count = held()
                if count >= at_least:
                    self.kill()
                    return count
            self._signal_group(signal.SIGCONT)
            if time.monotonic() > deadline:
                pytest.fail(f"{self.name}: the moment to kill it never came in {timeout} s:\n{self.output()}")
            time.sleep(0.01)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (a warm shutdown), SIGKILL to the group if it does not exit within ``timeout``."""
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait(10)
        else:
            self._signal_group(signal.SIGKILL)  # anything it left behind in its group
        self._log.close()
        return self.process.returncode

    def _signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)  # its own session: the group id is its pid


class WorkerProcess(ServiceProcess):
    """A delivery worker (threads pool) as ``usp-webhooks worker`` runs it
    (:func:`usp_workers.runtime.worker.run_worker`), without the dispatcher's CLI. ``celery -A
    usp_workers.runtime.celery_app worker`` is tested in ``tests/workers/runtime/test_logs.py``."""

    ready_marker = " ready."

    def __init__(
        self, pipeline: Pipeline, name: str, concurrency: int | None = None, env: dict[str, str] | None = None
    ) -> None:
        script = (
            "from usp_workers.runtime.worker import run_worker; from usp_workers.settings import "
            f"WorkerSettings; run_worker(WorkerSettings(), concurrency={concurrency!r})"
        )
        super().__init__(pipeline, name, env=env, code=script)

    def diagnose(self) -> str:
        """The output, after asking a live worker for a traceback of every thread (Celery dumps
        them on SIGUSR1): what a stuck batch is waiting for."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
        return self.output()


#: The scheduler as ``usp-webhooks scheduler`` runs it, without the dispatcher's CLI: what it
#: emits itself (operational events) reaches the broker at once.
RELAY_SCRIPT = (
    "from usp_workers.runtime.relay import run_relay; from usp_workers.runtime import tasks; "
    "from usp_dispatcher.cli.config import Settings; settings = Settings()\n"
    "with tasks.handing_off(settings):\n    run_relay(settings)"
)


class RelayProcess(ServiceProcess):
    """The scheduler (:func:`usp_workers.runtime.relay.run_relay`) in a child process."""

    ready_marker = "scheduler started"

    def __init__(self, pipeline: Pipeline, name: str = "relay", env: dict[str, str] | None = None) -> None:
        super().__init__(pipeline, name, env=env, code=RELAY_SCRIPT)


StartWorker = Callable[..., WorkerProcess]
StartRelay = Callable[..., RelayProcess]


# -- pipeline helpers --------------------------------------------------------------------------------


def jwks_of(pipeline: Pipeline) -> JWKS:
    with session(pipeline.engine) as s:
        return JWKS.from_dict(published_jwks(s, pipeline.settings))


def subscribe(engine: Engine, url: str, transport: Transport = Transport.REST) -> str:
    with Session(engine) as s:
        row = Subscription(url=url, transport=transport)
        s.add(row)
        s.commit()
        return row.id


def booking_event() -> dict[str, Any]:
    """A fresh booking.confirmed event body."""
    event: dict[str, Any] = json.loads(BOOKING_CONFIRMED_EXAMPLE)
    event["event_id"] = new_event_id()
    event["timestamp"] = utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")
    return event


def emit_events(engine: Engine, count: int, *, per_transaction: int = 1) -> list[str]:
    """Emit ``count`` fresh booking.confirmed events; each commit hands its deliveries off."""
    event_ids: list[str] = []
    while len(event_ids) < count:
        with session(engine) as s:
            for _ in range(min(per_transaction, count - len(event_ids))):
                event_ids.append(emit(s, booking_event()).id)
            s.commit()
    return event_ids


def in_flight_under_lease(engine: Engine, seconds: float) -> int:
    """Deliveries in flight under a lease of ``seconds`` (``lease_until - updated_at``, both set
    by the claim): tells one worker's claims from another's when their leases differ."""
    with Session(engine) as s:
        rows = s.exec(
            select(Delivery.lease_until, Delivery.updated_at).where(
                col(Delivery.status) == DeliveryStatus.IN_FLIGHT
            )
        ).all()
    return sum(
        1
        for lease_until, claimed_at in rows
        if lease_until is not None and abs((lease_until - claimed_at).total_seconds() - seconds) < 0.01
    )


def status_counts(engine: Engine) -> dict[str, int]:
    with Session(engine) as s:
        rows = s.exec(select(Delivery.status, func.count()).group_by(col(Delivery.status))).all()
    return {str(status): int(n) for status, n in rows}


def wait_for_status(
    engine: Engine, status: DeliveryStatus, total: int, timeout: float, *logs: Callable[[], str]
) -> float:
    """Poll until ``total`` deliveries have ``status``; return the moment (monotonic) it happened."""
    deadline = time.monotonic() + timeout
    while True:
        counts = status_counts(engine)
        if counts.get(status.value, 0) >= total:
            return time.monotonic()
        if time.monotonic() > deadline:
            output = "\n".join(log() for log in logs)
            pytest.fail(f"not {total} deliveries {status.value} within {timeout} s: {counts}\n{output}")
        time.sleep(0.05)


def wait_all_succeeded(engine: Engine, total: int, timeout: float, *logs: Callable[[], str]) -> float:
    """Poll until ``total`` deliveries succeeded; return the moment (monotonic) it happened."""
    return wait_for_status(engine, DeliveryStatus.SUCCEEDED, total, timeout, *logs)
