"""End-to-end delivery throughput and latency: emit → broker → Celery workers → one local receiver.

Run: ``uv run python bench/pipeline.py [--events 10000] [--workers 2] [--skip naive,verify]``

Everything runs on this machine, talking to 127.0.0.1 only, with real processes as deployed:

* a **receiver**: a minimal ASGI app under uvicorn in a subprocess, which records when each
  event first arrived (``USP-Event-Id``) and answers 204. The *fast* receiver skips signature
  verification, so that the rows measure the pipeline rather than the receiver (it shares the
  CPU); the *verifying* receiver runs ``usp_receiver``'s own ``WebhookApp`` (digest, signature,
  policy, dedupe) on every delivery, against the JWKS the database publishes;
* **workers**: ``celery -A usp_workers.runtime.celery_app worker`` subprocesses (threads pool) configured
  only by ``USP_*`` variables, and the **relay** (``run_relay``) in a subprocess;
* the **emitter** is this process: ``usp_workers.engine.outbox.emit`` with the enqueuer installed, as
  the API does. Its CPU is part of the measurement.

Per configuration it measures:

1. **deliveries/s**: ``--events`` events (one subscription, so one delivery each) emitted in
   transactions of ``--transaction`` events; from the first emit to the last 2xx at the receiver;
2. **enqueue→2xx latency p50/p99** at about half that rate: events emitted in one transaction
   every 10 ms (paced), each timed from its commit (which hands it to the broker) to its first
   arrival at the receiver.

Configurations: Redis broker + PostgreSQL (fast receiver; and verifying receiver), RabbitMQ +
PostgreSQL (``--amqp-url``), the same with the subscription ordered by subject (events spread
over ``--subjects`` bookings, each booking's one at a time), the embedded broker + SQLite (fast
receiver), and the **naive design** (one Celery task per delivery, a sync
``httpx.Client`` built once per worker process, prefork pool, Redis + PostgreSQL; implemented
below, not in the product); and the three **broker destinations** (a subscription to a RabbitMQ
queue, a NATS JetStream subject, a Redis stream on this machine, read by a consumer subprocess
that stands in for the receiver: ``to-rabbitmq``, ``to-nats``, ``to-redis-stream``). Plus raw
Ed25519 signs/s (``cryptography``) and our ``sign_request``.

Redis database 12 is used (and only it is flushed), RabbitMQ's delivery queue is purged;
PostgreSQL gets a schema of its own, dropped at the end. Every subprocess runs in its own process
group and is stopped on exit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import redis
import sqlalchemy as sa
from celery import Celery
from celery.signals import after_setup_logger
from cryptography.hazmat.primitives.asymmetric import ed25519
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, func, select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for bench.api_process
from bench.api_process import cpu_seconds, group_cpu_seconds, or_zero
from usp_core.clock import utcnow
from usp_core.db import make_engine, session
from usp_core.keycache import current_signing_keys
from usp_core.keys import ensure_signing_key, published_jwks
from usp_dispatcher.cli.config import Settings
from usp_receiver import SigningKey, sign_request
from usp_schemas import BOOKING_CONFIRMED_EXAMPLE, new_event_id
from usp_workers.engine import outbox, store, tracing
from usp_workers.engine.payloads import build_delivery_request
from usp_workers.runtime import tasks
from usp_workers.runtime.celery_app import QUEUE, make_celery
from usp_workers.runtime.heap import freeze_startup_heap
from usp_workers.runtime.worker import worker_argv
from usp_workers.storage.migrate import upgrade
from usp_workers.storage.models import Attempt, Delivery, DeliveryStatus, Ordering, Subscription

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_REDIS = "redis://127.0.0.1:6379/12"
DEFAULT_AMQP = "amqp://guest:guest@127.0.0.1:5672//"
DEFAULT_POSTGRES = os.environ.get(
    "USP_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
READY_TIMEOUT = 60.0
PACE_TICK = 0.01  #: seconds between the latency phase's transactions

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Any]
Send = Callable[[Message], Any]


# ============================================================================ the receiver process


class Recorder:
    """The receiver's ASGI app: ``POST /hook`` records the first arrival of each event id and
    answers 204 (or hands the request to ``verifying``, which records from its handler);
    ``GET /stats`` and ``GET /arrivals`` report, ``POST /reset`` forgets."""

    def __init__(self, verifying: Any | None = None) -> None:
        self.arrivals: dict[str, float] = {}
        self.posts = 0
        self.refused = 0
        self.verifying = verifying

    def record(self, event_id: str) -> None:
        self.arrivals.setdefault(event_id, time.time())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/hook":
            self.posts += 1
            if self.verifying is not None:
                status: list[int] = []

                async def watch(message: Message) -> None:
                    if message["type"] == "http.response.start":
                        status.append(message["status"])
                    await send(message)

                await self.verifying(scope, receive, watch)
                if status and not 200 <= status[0] < 300:
                    self.refused += 1
                return
            while (await receive()).get("more_body"):
                pass
            for name, value in scope["headers"]:
                if name == b"usp-event-id":
                    self.record(value.decode())
                    break
            await _respond(send, 204, b"")
        elif path == "/stats":
            body = {"posts": self.posts, "unique": len(self.arrivals), "refused": self.refused}
            await _respond(send, 200, json.dumps(body).encode())
        elif path == "/arrivals":
            await _respond(send, 200, json.dumps(self.arrivals).encode())
        elif path == "/reset":
            self.arrivals.clear()
            self.posts = self.refused = 0
            await _respond(send, 204, b"")
        else:
            await _respond(send, 404, b"")


async def _respond(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json")] if body else []
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def run_receiver(port: int, jwks_path: str | None) -> None:
    """The receiver subprocess (``pipeline.py receiver PORT [JWKS]``)."""
    import uvicorn

    from usp_receiver import JWKS, ReceivedWebhook, Verifier, WebhookReceiver
    from usp_receiver.asgi import WebhookApp

    verifying = None
    recorder = Recorder()
    if jwks_path is not None:
        jwks = JWKS.from_dict(json.loads(Path(jwks_path).read_text()))

        async def handle(hook: ReceivedWebhook) -> None:
            recorder.record(hook.event.event_id)

        verifying = WebhookApp(WebhookReceiver(Verifier(jwks), handle))
        recorder.verifying = verifying
    uvicorn.run(
        recorder,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        ws="none",
        http="h11",
    )


# ============================================================================ broker destinations

_RABBITMQ, _NATS, _REDIS = ("127.0.0.1", 5672), ("127.0.0.1", 4222), ("127.0.0.1", 6379)


def make_destination(kind: str) -> tuple[str, str]:
    """A fresh queue, JetStream stream or Redis stream on this machine's broker: the
    subscription's URL, and the name its consumer reads."""
    import asyncio

    import aio_pika
    import nats

    tag = uuid.uuid4().hex[:10]
    if kind == "amqp":
        name = f"usp-bench-{tag}"

        async def declare() -> None:
            connection = await aio_pika.connect(host=_RABBITMQ[0], port=_RABBITMQ[1])
            async with connection:
                await (await connection.channel()).declare_queue(name, auto_delete=False, durable=True)

        asyncio.run(declare())
        return f"amqp://guest:guest@{_RABBITMQ[0]}:{_RABBITMQ[1]}/%2F?exchange=&routing_key={name}", name
    if kind == "nats":
        name = f"usp.bench.{tag}"

        async def add_stream() -> None:
            client = await nats.connect(f"nats://{_NATS[0]}:{_NATS[1]}")
            try:
                await client.jetstream().add_stream(name=name.replace(".", "_").upper(), subjects=[name])
            finally:
                await client.close()

        asyncio.run(add_stream())
        return f"nats://{_NATS[0]}:{_NATS[1]}?subject={name}", name
    name = f"usp:bench:{tag}"
    return f"redis://{_REDIS[0]}:{_REDIS[1]}/0?stream={name}&maxlen=1000000", name


def run_consumer(kind: str, name: str, port: int) -> None:
    """The broker consumer subprocess (``pipeline.py consumer KIND NAME PORT``): records the first
    arrival of each event id, and answers ``/stats`` and ``/arrivals`` as the receiver does."""
    import asyncio

    import uvicorn

    recorder = Recorder()

    def seen(event_id: str | None) -> None:
        recorder.posts += 1  # a message, as a post is for the receiver: a repeat is a duplicate
        if event_id:
            recorder.record(event_id)

    async def consume() -> None:
        if kind == "amqp":
            import aio_pika

            connection = await aio_pika.connect(host=_RABBITMQ[0], port=_RABBITMQ[1])
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=1000)
            queue = await channel.get_queue(name)

            async def on_delivery(message: Any) -> None:
                seen(message.message_id)

            await queue.consume(on_delivery, no_ack=True)
            await asyncio.Event().wait()
        elif kind == "nats":
            import nats

            client = await nats.connect(f"nats://{_NATS[0]}:{_NATS[1]}")

            async def on_message(message: Any) -> None:
                seen((message.headers or {}).get("Nats-Msg-Id"))

            await client.jetstream().subscribe(name, cb=on_message, manual_ack=False)
            await asyncio.Event().wait()
        else:
            import redis.asyncio

            streams = redis.asyncio.Redis(host=_REDIS[0], port=_REDIS[1])
            last: Any = "0-0"
            while True:
                read: Any = await streams.xread({name: last}, block=1000, count=1000)
                for _, entries in read:
                    for entry_id, fields in entries:
                        last = entry_id
                        seen(fields[b"event_id"].decode())

    async def main() -> None:
        server = uvicorn.Server(
            uvicorn.Config(recorder, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
        )
        await asyncio.gather(server.serve(), consume())

    asyncio.run(main())


def run_span_sink(port: int) -> None:
    """The OTLP/HTTP collector stand-in of ``--tracing`` (``pipeline.py sink PORT``): takes every
    export and throws it away, so the figures are what tracing costs the pipeline's processes."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Sink(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    print("sink ready", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), Sink).serve_forever()


# ============================================================================ the naive design

NAIVE_QUEUE = "bench.naive"
NAIVE_TASK = "bench.naive_deliver"


def _naive_app() -> Celery:
    broker = os.environ.get("USP_BROKER_URL", DEFAULT_REDIS)
    app = Celery("bench_naive", broker=broker, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        task_default_queue=NAIVE_QUEUE,
        broker_connection_retry_on_startup=True,
        worker_cancel_long_running_tasks_on_connection_loss=False,
    )
    return app


def _quiet_naive_worker(**_: Any) -> None:
    """As the product's workers do: no log line per task (it would cost the naive design CPU
    that has nothing to do with its shape)."""
    for name in ("httpx", "httpcore", "celery.app.trace", "celery.worker.strategy"):
        logging.getLogger(name).setLevel(logging.WARNING)


after_setup_logger.connect(_quiet_naive_worker, weak=False)

#: ``celery -A pipeline:naive_app worker`` (with ``bench/`` on ``PYTHONPATH``).
naive_app = _naive_app()
_naive_state: dict[str, Any] = {}


def _naive_deliver(delivery_id: str) -> str:
    """One delivery per task: claim it, sign it, POST it with the process's sync client, record
    it. The same store and signing code as the engine; only the shape differs."""
    if _naive_state.get("pid") != os.getpid():  # built once per (forked) worker process
        settings = Settings()
        _naive_state.update(
            pid=os.getpid(),
            settings=settings,
            engine=make_engine(settings),
            client=httpx.Client(timeout=settings.total_timeout, trust_env=False),
        )
    settings, engine = _naive_state["settings"], _naive_state["engine"]
    client: httpx.Client = _naive_state["client"]
    keys = current_signing_keys(engine, settings)
    now = utcnow()
    lease = now + timedelta(seconds=settings.lease_seconds)
    claimed, events, subscriptions = store.claim_and_load(engine, [delivery_id], now=now, lease_until=lease)
    if not claimed:
        return "skipped"
    [item] = claimed
    event, subscription = events[item.event_id], subscriptions[item.subscription_id]
    body, headers = build_delivery_request(
        event, subscription, keys, created=int(now.timestamp()), delivery_id=item.id
    )
    started = time.perf_counter()
    response = client.post(subscription.url, content=body, headers=headers)
    ok = 200 <= response.status_code < 300
    store.record(
        engine,
        attempts=[
            store.AttemptRow(
                item.id,
                1,
                now,
                (time.perf_counter() - started) * 1000,
                response.status_code,
                None,
                None,
                "succeeded" if ok else "retry",
            )
        ],
        updates=[
            store.DeliveryUpdate(
                item.id,
                DeliveryStatus.SUCCEEDED if ok else DeliveryStatus.PENDING,
                tried=True,
                next_attempt_at=None if ok else utcnow(),
                last_status_code=response.status_code,
            )
        ],
        lease_until=lease,
        now=utcnow(),
    )
    return "delivered"


naive_app.task(name=NAIVE_TASK, ignore_result=True)(_naive_deliver)


# ============================================================================ processes


class Process:
    """A subprocess in its own process group, its output in a file."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], folder: Path) -> None:
        self.name = name
        self.log_path = folder / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            list(argv),
            cwd=folder,
            env=dict(env),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def cpu_seconds(self) -> float:
        """CPU time (user + system) used so far by every live process of this one's group
        (a prefork worker's children included)."""
        return group_cpu_seconds(self.process.pid)

    def wait_for(self, text: str, timeout: float = READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready within {timeout} s:\n{self.output()}")
            time.sleep(0.1)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM to the whole group, SIGKILL if it lingers."""
        if self.process.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # stragglers (prefork children)
        self._log.close()


@dataclass
class Stack:
    """Everything one configuration started; stopped in reverse order."""

    processes: list[Process] = field(default_factory=list)

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str], folder: Path) -> Process:
        process = Process(name, argv, env, folder)
        self.processes.append(process)
        return process

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()


APP_NAME = "usp-bench"


def postgres_cpu(engine: Engine) -> dict[int, float]:
    """CPU seconds so far of each PostgreSQL backend serving this bench (its connections carry
    ``application_name=usp-bench``), by backend pid; empty on SQLite."""
    if engine.dialect.name != "postgresql":
        return {}
    with engine.connect() as connection:
        pids = connection.execute(
            sa.text("SELECT pid FROM pg_stat_activity WHERE application_name = :name"), {"name": APP_NAME}
        ).scalars()
        return {pid: or_zero(cpu_seconds, pid) for pid in pids}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# ============================================================================ databases, brokers


@contextmanager
def database(kind: str, folder: Path, postgres_url: str, pg_options: str = "") -> Iterator[str]:
    """A fresh database URL: a SQLite file, or a PostgreSQL schema of its own (dropped after)."""
    if kind == "sqlite":
        yield f"sqlite:///{folder / 'usp.sqlite3'}"
        return
    schema = f"usp_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(postgres_url)
    try:
        with admin.begin() as connection:
            connection.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        url = sa.make_url(postgres_url).update_query_dict(
            {"options": f"-csearch_path={schema} {pg_options}".strip(), "application_name": APP_NAME}
        )
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as connection:
            connection.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


def empty_broker(kind: str, url: str) -> None:
    """Redis: flush database 12 (the URL names it: only it is emptied); RabbitMQ: purge the
    delivery queue."""
    if kind == "redis":
        import redis

        client = redis.Redis.from_url(url)
        try:
            client.flushdb()
        finally:
            client.close()
    elif kind == "amqp":
        celery = make_celery(Settings(_env_file=None, broker_url=url))
        with celery.connection_for_write() as connection:
            queue = celery.amqp.queues[QUEUE](connection.default_channel)
            queue.declare()
            queue.purge()


# ============================================================================ one configuration


@dataclass(frozen=True)
class Config:
    name: str
    broker: str  #: "redis", "amqp" (RabbitMQ) or "embedded"
    database: str  #: "postgresql" or "sqlite"
    verify: bool = False
    naive: bool = False
    ordered: bool = False  #: the subscription orders by subject (events spread over --subjects)
    #: a broker destination instead of the http receiver: "amqp", "nats" or "redis" (a stream)
    destination: str | None = None


@dataclass
class Result:
    config: Config
    rate: float | None = None
    seconds: float | None = None
    p50: float | None = None
    p99: float | None = None
    paced_rate: float | None = None
    paced_events: int = 0
    duplicates: int = 0
    note: str = ""
    cpu_us: dict[str, float] = field(default_factory=dict)  #: CPU µs per delivery, by component


class Receiver:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.http = httpx.Client(timeout=10, trust_env=False)

    def wait_ready(self, process: Process) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                self.stats()
                return
            except httpx.TransportError:
                if process.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the receiver did not start:\n{process.output()}") from None
                time.sleep(0.1)

    def stats(self) -> dict[str, int]:
        stats: dict[str, int] = self.http.get(self.base + "/stats").json()
        return stats

    def arrivals(self) -> dict[str, float]:
        arrivals: dict[str, float] = self.http.get(self.base + "/arrivals").json()
        return arrivals

    def reset(self) -> None:
        self.http.post(self.base + "/reset")

    def wait_for(self, ids: set[str], timeout: float) -> dict[str, float]:
        """Poll until every id in ``ids`` arrived; their first arrival times."""
        deadline = time.monotonic() + timeout
        while self.stats()["unique"] < len(ids):
            if time.monotonic() > deadline:
                got = self.stats()
                raise RuntimeError(f"only {got['unique']} of {len(ids)} events arrived in {timeout:.0f} s")
            time.sleep(0.05)
        arrivals = self.arrivals()
        return {event_id: arrivals[event_id] for event_id in ids}


def event_body() -> dict[str, Any]:
    event: dict[str, Any] = json.loads(BOOKING_CONFIRMED_EXAMPLE)
    return event


#: Bookings the emitted events are about, in turn (``--subjects``): under subject ordering each
#: booking's events go one at a time, so this is the ordered configuration's parallelism.
SUBJECTS = 1000


def about(template: dict[str, Any], event_id: str, stamp: str, number: int, subjects: int) -> dict[str, Any]:
    """An event of ``template`` about the ``number``-th of ``subjects`` bookings, in turn."""
    booking = f"bkg_{number % subjects:05d}"
    return template | {
        "event_id": event_id,
        "timestamp": stamp,
        "booking_id": booking,
        "data": template["data"] | {"id": booking},
    }


def emit_burst(engine: Engine, count: int, per_transaction: int, subjects: int) -> dict[str, float]:
    """Emit ``count`` events; each event's commit time (its hand-off to the broker)."""
    template = event_body()
    committed: dict[str, float] = {}
    while len(committed) < count:
        ids: list[str] = []
        with session(engine) as s:
            stamp = utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")
            for _ in range(min(per_transaction, count - len(committed))):
                event_id = new_event_id()
                outbox.emit(s, about(template, event_id, stamp, len(committed) + len(ids), subjects))
                ids.append(event_id)
            s.commit()
        moment = time.time()
        committed.update(dict.fromkeys(ids, moment))
    return committed


def emit_paced(engine: Engine, rate: float, seconds: float, subjects: int) -> dict[str, float]:
    """Emit at ``rate`` events/s for ``seconds``: one transaction every :data:`PACE_TICK`."""
    template = event_body()
    committed: dict[str, float] = {}
    started = time.monotonic()
    tick = 0
    while (elapsed := time.monotonic() - started) < seconds:
        due = int(rate * min(elapsed + PACE_TICK, seconds)) - len(committed)
        if due > 0:
            ids: list[str] = []
            with session(engine) as s:
                stamp = utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")
                for _ in range(due):
                    event_id = new_event_id()
                    outbox.emit(s, about(template, event_id, stamp, len(committed) + len(ids), subjects))
                    ids.append(event_id)
                s.commit()
            moment = time.time()
            committed.update(dict.fromkeys(ids, moment))
        tick += 1
        pause = started + tick * PACE_TICK - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    return committed


def unsettled(engine: Engine) -> int:
    """Deliveries still pending or in flight (the due index answers: cheap beside a preload)."""
    with Session(engine) as s:
        open_states = [DeliveryStatus.PENDING.value, DeliveryStatus.IN_FLIGHT.value]
        statement = select(func.count()).where(col(Delivery.status).in_(open_states))
        return int(s.exec(statement).one())


RETENTION_DAYS = 30


def preload(engine: Engine, count: int, subscription_id: str, *, purge: bool) -> None:
    """Fill the tables with ``count`` delivered events, each with its succeeded delivery and one
    attempt, before anything is measured (PostgreSQL only: ``generate_series``). Their times
    spread over the 25 days before now, or, with ``purge``, over the 25 days before the retention
    cutoff, so the scheduler deletes all of them during the measurement."""
    if engine.dialect.name != "postgresql":
        raise SystemExit("--preload needs PostgreSQL")
    end = utcnow() - (timedelta(days=RETENTION_DAYS + 1) if purge else timedelta(hours=1))
    begin = end - timedelta(days=25)
    payload = json.dumps(about(event_body(), "evt_preload", "2026-01-01T00:00:00Z", 0, SUBJECTS))
    # The n-th preloaded row of every table, numbered by a series: (g, n = g zero-padded, its time t).
    rows = (
        "FROM (SELECT g, lpad(g::text, 12, '0') AS n, "
        "CAST(:begin AS timestamptz) + (g * CAST(:step AS float8)) * interval '1 second' AS t "
        "FROM generate_series(1, :count) AS g) AS numbered"
    )
    statements = [
        "INSERT INTO usp_events (id, event_type, subject_id, occurred_at, created_at, payload) "
        "SELECT 'evt_preload_' || n, 'booking.confirmed', 'bkg_' || (g % 1000), t, t, :payload " + rows,
        "INSERT INTO usp_deliveries (id, event_id, subscription_id, status, attempt_count, next_attempt_at, "
        "enqueued_at, last_status_code, created_at, updated_at, completed_at) "
        "SELECT 'dlv_preload_' || n, 'evt_preload_' || n, :subscription, 'succeeded', 1, t, t, 204, t, t, t "
        + rows,
        "INSERT INTO usp_attempts "
        "(delivery_id, attempt_number, started_at, duration_ms, status_code, outcome) "
        "SELECT 'dlv_preload_' || n, 1, t, 12.5, 204, 'succeeded' " + rows,
    ]
    step = (end - begin).total_seconds() / count
    values = {
        "begin": begin,
        "step": step,
        "count": count,
        "payload": payload,
        "subscription": subscription_id,
    }
    started = time.monotonic()
    with engine.begin() as connection:
        for statement in statements:
            connection.execute(sa.text(statement), values)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        # Statistics for the planner, and the bulk insert's WAL written out now, not by a
        # checkpoint in the middle of the measurement.
        connection.execute(sa.text("VACUUM ANALYZE"))
        connection.execute(sa.text("CHECKPOINT"))
    print(f"  preloaded {count:,} delivered events in {time.monotonic() - started:.0f} s")


def run_config(config: Config, args: argparse.Namespace, folder: Path) -> Result:
    result = Result(config)
    stack = Stack()
    broker = {"redis": args.redis_url, "amqp": args.amqp_url}.get(
        config.broker, f"sqla+sqlite:///{folder / 'broker.sqlite3'}"
    )
    empty_broker(config.broker, broker)
    with database(config.database, folder, args.postgres_url, args.pg_options) as url:
        fields: dict[str, Any] = {
            "database_url": url,
            "broker_url": broker,
            "allow_private_targets": True,
            "batch_size": args.batch_size,
            "per_endpoint_concurrency": args.endpoint_concurrency,
            "relay_interval_seconds": 0.5,
            "key_publish_lead_seconds": 0.0,
            "handoff_interval_seconds": args.handoff_interval,
            # A preload dated within the retention window is kept; --purge dates it past the
            # window, so the scheduler prunes it while the bench measures.
            "retention_days": RETENTION_DAYS,
        }
        settings = Settings(_env_file=None, **fields)
        env = {k: v for k, v in os.environ.items() if not k.startswith("USP_")}
        env |= {f"USP_{k.upper()}": str(v) for k, v in fields.items()}
        env["PYTHONUNBUFFERED"] = "1"
        if args.tracing:  # every process exports its spans to a local sink over OTLP/HTTP
            sink_port = free_port()
            sink = [sys.executable, str(Path(__file__).resolve()), "sink", str(sink_port)]
            stack.start("sink", sink, env, folder).wait_for("sink ready")
            env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{sink_port}"
            os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = env["OTEL_EXPORTER_OTLP_ENDPOINT"]
            tracing.configure("usp-bench-emitter")  # this process emits, as the API does
        engine = make_engine(settings)
        try:
            upgrade(engine)
            with session(engine) as s:
                ensure_signing_key(s, settings)
                s.commit()
                jwks = published_jwks(s, settings)
            jwks_path = folder / "jwks.json"
            jwks_path.write_text(json.dumps(jwks))
            port = free_port()
            receiver_argv = [sys.executable, str(Path(__file__).resolve()), "receiver", str(port)]
            if config.verify:
                receiver_argv.append(str(jwks_path))
            target = None
            if config.destination is not None:  # a consumer of the broker stands in for the receiver
                target, name = make_destination(config.destination)
                here = str(Path(__file__).resolve())
                receiver_argv = [sys.executable, here, "consumer", config.destination, name, str(port)]
            receiver = Receiver(port)
            receiver.wait_ready(stack.start("receiver", receiver_argv, env, folder))
            ordering = Ordering.SUBJECT if config.ordered else Ordering.NONE
            with session(engine) as s:
                subscription = Subscription(url=target or f"{receiver.base}/hook", ordering=ordering)
                s.add(subscription)
                s.commit()
            if args.preload:
                preload(engine, args.preload, subscription.id, purge=args.purge)
            celery = start_workers(config, args, stack, env, folder)
            if celery is not None:
                outbox.set_enqueuer(lambda ids: _send_naive(celery, ids))
            else:
                tasks.install_enqueuer(settings)
                relay = [
                    sys.executable,
                    "-c",
                    "from usp_workers.runtime.relay import run_relay; "
                    "from usp_dispatcher.cli.config import Settings; run_relay(Settings())",
                ]
                stack.start("relay", relay, env, folder).wait_for("scheduler started")
            # This process commits and hands off the events, as the API does, so it freezes
            # its start-up heap as the API's lifespan does once started (usp_workers.runtime.heap).
            freeze_startup_heap()
            measure(result, engine, receiver, stack, args)
        finally:
            outbox.set_enqueuer(None)
            tasks.uninstall_enqueuer()
            stack.stop()
            engine.dispose()
    empty_broker(config.broker, broker)
    return result


def start_workers(
    config: Config, args: argparse.Namespace, stack: Stack, env: dict[str, str], folder: Path
) -> Celery | None:
    """The worker processes of ``config``, started and ready; for the naive design, the app to
    send its tasks with."""
    workers = []
    for number in range(args.workers):
        if config.naive:
            argv = [sys.executable, "-m", "celery", "-A", "pipeline:naive_app", "worker",
                    "--pool=prefork", f"--concurrency={args.naive_concurrency}", f"--queues={NAIVE_QUEUE}",
                    "--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
                    f"--hostname=naive-{number}@%h"]  # fmt: skip
            worker_env = env | {"PYTHONPATH": os.pathsep.join([str(BENCH_DIR), env.get("PYTHONPATH", "")])}
        else:
            argv = [sys.executable, "-m", "celery", "-A", "usp_workers.runtime.celery_app"]
            argv += [a for a in worker_argv(concurrency=args.concurrency) if not a.startswith("--hostname")]
            argv.append(f"--hostname=bench-{number}@%h")
            worker_env = env
        workers.append(stack.start(f"worker-{number}", argv, worker_env, folder))
    for worker in workers:
        worker.wait_for(" ready.")
    if config.naive:
        celery = _naive_app()
        celery.conf.broker_url = env["USP_BROKER_URL"]
        return celery
    return None


def _send_naive(celery: Celery, ids: Sequence[str]) -> None:
    for delivery_id in ids:
        celery.send_task(NAIVE_TASK, args=[delivery_id], queue=NAIVE_QUEUE)


def measure(
    result: Result, engine: Engine, receiver: Receiver, stack: Stack, args: argparse.Namespace
) -> None:
    """Phase 1: a burst of ``--events``; phase 2: paced at half the burst's rate."""
    timeout = args.timeout
    broker_pid = redis_server_pid(args.redis_url) if result.config.broker == "redis" else None
    meter = CpuMeter(stack, engine, broker_pid)
    started = time.time()
    committed = emit_burst(engine, args.events, args.transaction, args.subjects)
    emitter = meter.own_seconds()
    arrivals = receiver.wait_for(set(committed), timeout)
    finished = max(arrivals.values())
    result.cpu_us = {k: v * 1e6 / len(committed) for k, v in meter.used(emitter).items()}
    result.seconds = finished - started
    result.rate = len(committed) / result.seconds
    deadline = time.monotonic() + 30
    while unsettled(engine) and time.monotonic() < deadline:
        time.sleep(0.1)  # the 2xx is in; the batch records it a moment later
    stats = receiver.stats()
    result.duplicates = stats["posts"] - stats["unique"]
    if stats.get("refused"):
        result.note += f"{stats['refused']} refused by the receiver; "
    if args.latency_seconds <= 0:
        return
    receiver.reset()
    paced = result.rate * args.paced_fraction
    meter = CpuMeter(stack, engine, broker_pid)
    committed = emit_paced(engine, paced, args.latency_seconds, args.subjects)
    emitter = meter.own_seconds()
    arrivals = receiver.wait_for(set(committed), timeout)
    paced_cpu, paced_wall = meter.used(emitter), meter.wall_seconds()
    latencies = sorted((arrivals[i] - committed[i]) * 1000 for i in committed)
    result.paced_rate = len(committed) / args.latency_seconds
    result.paced_events = len(committed)
    result.p50 = statistics.median(latencies)
    result.p99 = p99_of(latencies)
    if args.timeline:
        print_timeline(committed, arrivals)
        print_stages(engine, committed, arrivals)
        per_delivery = {k: v * 1e6 / len(committed) for k, v in paced_cpu.items()}
        cores = sum(paced_cpu.values()) / paced_wall
        print(f"  paced: CPU µs/delivery {' · '.join(f'{k} {v:,.0f}' for k, v in per_delivery.items())}; "
              f"{cores:.2f} cores busy")  # fmt: skip


def redis_server_pid(url: str) -> int | None:
    """The pid of the Redis server at ``url`` when it runs on this machine (its CPU is then
    counted as ``broker``), else None."""
    client = redis.Redis.from_url(url)
    try:
        pid = int(client.info("server")["process_id"])
    finally:
        client.close()
    host = client.connection_pool.connection_kwargs.get("host", "localhost")
    local = host in ("localhost", "127.0.0.1", "::1") and Path(f"/proc/{pid}/stat").exists()
    return pid if local else None


class CpuMeter:
    """CPU seconds used from its creation on, by component: the stack's processes (by name
    prefix), PostgreSQL's backends serving the bench, a local Redis broker (the whole server:
    nothing else uses it during a run) and this process (the emitter)."""

    def __init__(self, stack: Stack, engine: Engine, broker_pid: int | None = None) -> None:
        self.stack = stack
        self.engine = engine
        self.broker_pid = broker_pid
        self.before = {p.name: p.cpu_seconds() for p in stack.processes}
        self.postgres_before = postgres_cpu(engine)
        self.broker_before = or_zero(cpu_seconds, broker_pid) if broker_pid else 0.0
        self.own = time.process_time()
        self.wall = time.monotonic()

    def own_seconds(self) -> float:
        """This process's CPU seconds since creation."""
        return time.process_time() - self.own

    def wall_seconds(self) -> float:
        return time.monotonic() - self.wall

    def used(self, emitter: float) -> dict[str, float]:
        """Seconds used since creation; ``emitter``: this process's share to count."""
        used: dict[str, float] = {"emitter": emitter}
        if self.postgres_before or self.engine.dialect.name == "postgresql":
            after = postgres_cpu(self.engine)
            used["postgres"] = sum(after.values()) - sum(self.postgres_before.get(pid, 0.0) for pid in after)
        if self.broker_pid:
            used["broker"] = or_zero(cpu_seconds, self.broker_pid) - self.broker_before
        for process in self.stack.processes:
            kind = process.name.split("-")[0]
            used[kind] = used.get(kind, 0.0) + process.cpu_seconds() - self.before[process.name]
        return used


def print_timeline(committed: Mapping[str, float], arrivals: Mapping[str, float]) -> None:
    """Per second of the paced phase: events, p50, p99 and max latency (where the tail sits)."""
    start = min(committed.values())
    seconds: dict[int, list[float]] = {}
    for event_id, moment in committed.items():
        seconds.setdefault(int(moment - start), []).append((arrivals[event_id] - moment) * 1000)
    for second, values in sorted(seconds.items()):
        values.sort()
        print(f"  t={second:>2}s  n={len(values):>5}  p50={statistics.median(values):6.1f}  "
              f"p99={p99_of(values):6.1f}  max={values[-1]:6.1f} ms")  # fmt: skip


def print_stages(engine: Engine, committed: Mapping[str, float], arrivals: Mapping[str, float]) -> None:
    """Where the paced phase's latency goes: from the commit to the start of the first try (the
    hand-off's wait, the broker, the worker's claim and signing), and from there to the first
    arrival (the HTTP exchange and the receiver), from the attempts the workers recorded."""
    statement = (
        select(Delivery.event_id, func.min(Attempt.started_at))
        .join(Attempt, col(Attempt.delivery_id) == col(Delivery.id))
        .group_by(col(Delivery.event_id))
    )
    with Session(engine) as s:
        rows = s.exec(statement).all()
    started = {event_id: moment.timestamp() for event_id, moment in rows if event_id in committed}
    if not started:
        print("  stages: no attempts recorded")
        return
    before = sorted((started[i] - committed[i]) * 1000 for i in started)
    after = sorted((arrivals[i] - started[i]) * 1000 for i in started)
    print(f"  stages: commit → try start p50 {statistics.median(before):.1f} p99 {p99_of(before):.1f} ms · "
          f"try start → arrival p50 {statistics.median(after):.1f} p99 {p99_of(after):.1f} ms")  # fmt: skip


def p99_of(ordered: Sequence[float]) -> float:
    """The 99th percentile of ascending ``ordered`` (nearest rank, never past the last)."""
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


# ============================================================================ signing


def sign_rates(seconds: float = 1.0) -> tuple[float, float, int]:
    """Raw Ed25519 signs/s (``cryptography``, a 300-byte message: about a signature base's
    size), and ``sign_request`` signs/s (content digest + signature base + signature) on the
    event body the pipeline sends."""
    raw = ed25519.Ed25519PrivateKey.generate()
    message = b"x" * 300
    key = SigningKey.generate()
    body = json.dumps(event_body() | {"event_id": new_event_id()}).encode()
    headers = {"Content-Type": "application/json"}

    def rate(operation: Callable[[int], object]) -> float:
        for i in range(100):
            operation(i)
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(200):
                operation(done)
                done += 1
        return done / (time.perf_counter() - start)

    raw_rate = rate(lambda i: raw.sign(message))
    ours = rate(
        lambda i: sign_request(
            "POST", "http://127.0.0.1:9/hook", headers, body, [key], created=1_800_000_000 + i
        )
    )
    return raw_rate, ours, len(body)


# ============================================================================ the table


CONFIGS = {
    "redis": Config("engine (batches, per-origin pools)", "redis", "postgresql"),
    "rabbitmq": Config("engine (batches, per-origin pools)", "amqp", "postgresql"),
    "ordered": Config("engine, subject ordering", "redis", "postgresql", ordered=True),
    "embedded": Config("engine (batches, per-origin pools)", "embedded", "sqlite"),
    "verify": Config("engine, receiver verifies (usp_receiver)", "redis", "postgresql", verify=True),
    "naive": Config("naive: 1 task/delivery, sync httpx.Client", "redis", "postgresql", naive=True),
    "to-rabbitmq": Config(
        "engine → RabbitMQ destination (confirms)", "redis", "postgresql", destination="amqp"
    ),
    "to-nats": Config(
        "engine → NATS JetStream destination (acks)", "redis", "postgresql", destination="nats"
    ),
    "to-redis-stream": Config(
        "engine → Redis Streams destination", "redis", "postgresql", destination="redis"
    ),
}


RIGHT = {"deliveries/s", "paced at", "p50 ms", "p99 ms"}
CPU_PARTS = ("worker", "receiver", "emitter", "relay", "postgres", "broker")


def cpu_text(result: Result) -> str:
    """CPU per delivery by component, e.g. ``worker 420 · receiver 160 · emitter 230 · relay 4 ·
    postgres 150 · broker 60`` (``postgres``: the backends serving this bench; ``broker``: a
    local Redis server, RabbitMQ is not counted)."""
    return " · ".join(f"{part} {result.cpu_us[part]:,.0f}" for part in CPU_PARTS if part in result.cpu_us)


def summary(result: Result) -> str:
    if result.rate is None:
        return result.note
    latency = "" if result.p50 is None else f", p50 {result.p50:.1f} ms, p99 {result.p99:.1f} ms"
    return f"{result.rate:,.0f} deliveries/s{latency}; CPU µs/delivery: {cpu_text(result)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000, help="events in the burst (one delivery each)")
    parser.add_argument("--transaction", type=int, default=500, help="events per emitting transaction")
    parser.add_argument("--latency-seconds", type=float, default=8.0, help="length of the paced phase")
    parser.add_argument("--paced-fraction", type=float, default=0.5, help="paced rate / burst rate")
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=8, help="threads per engine worker")
    parser.add_argument("--naive-concurrency", type=int, default=2, help="prefork children per naive worker")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument(
        "--handoff-interval",
        type=float,
        default=Settings.model_fields["handoff_interval_seconds"].default,
        help="USP_HANDOFF_INTERVAL_SECONDS (0: one publish per commit)",
    )
    parser.add_argument("--endpoint-concurrency", type=int, default=8, help="USP_PER_ENDPOINT_CONCURRENCY")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for a phase")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated: redis,rabbitmq,ordered,embedded,verify,naive,"
        "to-rabbitmq,to-nats,to-redis-stream",
    )
    parser.add_argument("--skip", default="", help="comma-separated configurations to skip")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS)
    parser.add_argument("--amqp-url", default=DEFAULT_AMQP, help="the RabbitMQ of the rabbitmq row")
    parser.add_argument("--subjects", type=int, default=SUBJECTS, help="bookings the events are about")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES)
    parser.add_argument(
        "--preload",
        type=int,
        default=0,
        help="delivered events (with attempts) in the tables before measuring",
    )
    parser.add_argument(
        "--purge",
        action="store_true",
        help="date the preload past retention: the scheduler prunes it meanwhile",
    )
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="OpenTelemetry on in every process (OTLP/HTTP to a local sink that drops the spans)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs folder")
    parser.add_argument(
        "--timeline", action="store_true", help="print the paced phase's latency by second and stage"
    )
    parser.add_argument(
        "--pg-options",
        default="",
        help="more options for every PostgreSQL session, to diagnose: e.g. "
        "'-csession_preload_libraries=auto_explain -cauto_explain.log_min_duration=10 "
        "-cauto_explain.log_analyze=on' logs the plans of slow statements",
    )
    args = parser.parse_args()

    chosen = [c.strip() for c in args.only.split(",") if c.strip()] or list(CONFIGS)
    chosen = [c for c in chosen if c not in {s.strip() for s in args.skip.split(",")}]
    console = Console(width=max(160, shutil.get_terminal_size().columns))
    folder = Path(tempfile.mkdtemp(prefix="usp-bench-"))
    results: list[Result] = []
    try:
        for name in chosen:
            config = CONFIGS[name]
            console.print(f"[bold]{config.name}[/] ({config.broker} + {config.database}) …")
            sub = folder / name
            sub.mkdir()
            try:
                results.append(run_config(config, args, sub))
            except Exception as exc:  # the table still prints; the row says why
                results.append(Result(config, note=f"failed: {exc}"[:300]))
                console.print(f"[red]{name} failed[/]: {exc}")
            console.print(f"  {summary(results[-1])}")
        raw, ours, body_size = sign_rates()
    finally:
        if args.keep:
            console.print(f"logs kept in {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)

    table = Table(
        title=f"USP webhook pipeline, {os.cpu_count()} cores (nproc), {args.events:,} events → one local "
        f"receiver; {args.workers} worker processes{'; tracing on (OTLP/HTTP)' if args.tracing else ''}"
    )
    for column in ("design", "broker + database", "receiver", "deliveries/s", "paced at", "p50 ms", "p99 ms",
                   "CPU µs/delivery (burst)", "notes"):  # fmt: skip
        table.add_column(column, justify="right" if column in RIGHT else "left")
    for result in results:
        config = result.config
        table.add_row(
            config.name,
            f"{config.broker} + {config.database}",
            f"{config.destination} consumer"
            if config.destination
            else ("verifies" if config.verify else "fast (no verify)"),
            "—" if result.rate is None else f"{result.rate:,.0f}",
            "—" if result.paced_rate is None else f"{result.paced_rate:,.0f}/s",
            "—" if result.p50 is None else f"{result.p50:.1f}",
            "—" if result.p99 is None else f"{result.p99:.1f}",
            cpu_text(result),
            (result.note + (f"{result.duplicates} duplicate posts" if result.duplicates else "")).strip("; "),
        )
    table.add_row(
        "raw Ed25519 sign (cryptography)", "", "", f"{raw:,.0f} signs/s", "", "", "", "", "one core"
    )
    table.add_row(
        "sign_request (digest + base + Ed25519)", "", "", f"{ours:,.0f} signs/s", "", "", "", "",
        f"{100 * ours / raw:.0f}% of raw; {body_size}-byte body",
    )  # fmt: skip
    console.print(table)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "receiver":
        run_receiver(int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
    elif len(sys.argv) == 3 and sys.argv[1] == "sink":
        run_span_sink(int(sys.argv[2]))
    elif len(sys.argv) == 5 and sys.argv[1] == "consumer":
        run_consumer(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
