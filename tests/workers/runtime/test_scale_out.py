"""Scale-out as docs/scaling.md describes it: two "machines", each with its own worker process and
scheduler, reaching the one broker and the one PostgreSQL by their own connections (the second
machine through TCP proxies, its own addresses), share the work without sending anything twice.
"""

from __future__ import annotations

import re
import time
from urllib.parse import urlsplit, urlunsplit

import pytest
import sqlalchemy as sa

from tests.faults import tcp_proxy
from tests.workers.endpoints import Hub, UspReceiver
from tests.workers.support import (
    Endpoints,
    Pipeline,
    StartRelay,
    StartWorker,
    emit_events,
    jwks_of,
    status_counts,
    subscribe,
    wait_all_succeeded,
)
from usp_workers.runtime import tasks
from usp_workers.storage.models import DeliveryStatus


def through(url: str, port: int) -> str:
    """``url`` with its port replaced (a database URL's query, with the schema, is kept)."""
    parts = urlsplit(url)
    host = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=f"{host}127.0.0.1:{port}"))


@pytest.mark.parametrize(
    "pipeline",
    [("redis", "postgresql"), ("amqp", "postgresql")],
    indirect=True,
    ids=["redis-postgresql", "rabbitmq-postgresql"],
)
def test_two_machines_share_the_work_and_send_nothing_twice(
    pipeline: Pipeline,
    start_worker: StartWorker,
    start_relay: StartRelay,
    endpoints: Endpoints,
    hub: Hub,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pipeline.fields["per_endpoint_concurrency"] = 32
    jwks = jwks_of(pipeline)
    receivers = {"a": UspReceiver(jwks), "b": UspReceiver(jwks)}
    for name, receiver in receivers.items():
        subscribe(pipeline.engine, endpoints.add(name, receiver))
    broker, database = (
        urlsplit(pipeline.settings.broker_url_resolved),
        urlsplit(pipeline.settings.database_url),
    )
    assert broker.port is not None
    assert database.port is not None
    with (
        tcp_proxy("127.0.0.1", broker.port) as broker_route,
        tcp_proxy("127.0.0.1", database.port) as database_route,
    ):
        second = {
            "USP_BROKER_URL": through(pipeline.settings.broker_url_resolved, broker_route.port),
            "USP_DATABASE_URL": through(pipeline.settings.database_url, database_route.port),
        }
        machines = [
            (start_worker("worker-1", concurrency=8), start_relay("relay-1")),
            (start_worker("worker-2", concurrency=8, env=second), start_relay("relay-2", env=second)),
        ]
        for worker, relay in machines:
            worker.wait_ready()
            relay.wait_ready()
        tasks.install_enqueuer(pipeline.settings)

        started = time.monotonic()
        event_ids = emit_events(pipeline.engine, 1500, per_transaction=15)
        finished = wait_all_succeeded(pipeline.engine, 3000, 150, *(w.diagnose for w, _ in machines))
        for worker, relay in machines:  # before their routes close
            worker.stop()
            relay.stop()

    for name, receiver in receivers.items():
        assert sorted(receiver.handled) == sorted(event_ids), name
    sent = sum(len(hub.seen(endpoints.path(name))) for name in receivers)
    with pipeline.engine.connect() as connection:
        attempts = connection.execute(sa.text("SELECT count(*) FROM usp_attempts")).scalar_one()
    assert status_counts(pipeline.engine) == {DeliveryStatus.SUCCEEDED.value: 3000}
    assert sent == attempts == 3000, "nothing failed, so nothing was sent twice"
    batches = [
        sum(int(n) for n in re.findall(r"batch of \d+: (\d+) claimed", w.output())) for w, _ in machines
    ]
    assert all(batches), f"both machines delivered: {batches} deliveries claimed"
    # Claimed once each, unless a batch found the endpoint's slots busy past SLOT_WAIT (a loaded
    # machine) and put some back unsent, no attempt spent: those are claimed again, once more.
    put_back = sum(
        int(n)
        for w, _ in machines
        for n in re.findall(r"batch of \d+: \d+ claimed, \d+ delivered, (\d+) to retry", w.output())
    )
    assert sum(batches) == 3000 + put_back
    assert broker_route.port != broker.port
    with capsys.disabled():
        print(
            f"\n[scale-out] {pipeline.broker}: 3000 deliveries in {finished - started:.1f} s over two"
            f" machines (claimed {batches[0]} and {batches[1]}), 0 sent twice"
        )
