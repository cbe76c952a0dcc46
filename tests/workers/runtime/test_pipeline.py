"""The whole pipeline with real processes: emit → broker → Celery worker subprocess → receiver.

A real ``celery -A usp_workers.runtime.celery_app worker`` runs as a child process, configured only by
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

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, func, select

from tests.workers.endpoints import Hub, Scope, UspReceiver, respond
from tests.workers.support import (
    Endpoints,
    Pipeline,
    StartWorker,
    emit_events,
    jwks_of,
    status_counts,
    subscribe,
    wait_all_succeeded,
)
from usp_workers.runtime import tasks
from usp_workers.runtime.relay import run_relay
from usp_workers.storage.models import Attempt, Delivery, DeliveryStatus

# -- helpers --------------------------------------------------------------------------------------------


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


@pytest.mark.parametrize(
    "pipeline",
    [("redis", "sqlite"), ("redis", "postgresql"), ("embedded", "sqlite"), ("amqp", "postgresql")],
    indirect=True,
    ids=["redis-sqlite", "redis-postgresql", "embedded-sqlite", "rabbitmq-postgresql"],
)
def test_a_real_worker_delivers_emitted_events_once_each(
    pipeline: Pipeline,
    start_worker: StartWorker,
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
    start_worker: StartWorker,
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
# RabbitMQ hands the killed worker's unacknowledged message out again at once (its connection
# dropped); the claim finds the deliveries still leased and skips them until the lease expires.
@pytest.mark.parametrize(
    "pipeline",
    [("redis", "sqlite"), ("embedded", "sqlite"), ("amqp", "sqlite")],
    indirect=True,
    ids=["redis", "embedded", "rabbitmq"],
)
def test_deliveries_held_by_a_killed_worker_are_delivered_by_the_next(
    pipeline: Pipeline,
    start_worker: StartWorker,
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
