"""The per-subscription rate limit, measured where it matters: at the receiver.

Several "workers" (concurrent ``deliver_batch`` calls, as a fleet's processes would make) drain a
backlog to a subscription limited to N deliveries per second; the receiver timestamps every
arrival, and no one-second window may hold more than N of them. Deliveries held back are
deferred, never failed: each ends with exactly one attempt.
"""

from __future__ import annotations

import time
from datetime import timedelta
from functools import partial

import anyio
import httpx
import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from usp_receiver import JWKS
from usp_workers import tasks
from usp_workers.db import session
from usp_workers.delivery import deliver_batch
from usp_workers.health import set_rate_limit
from usp_workers.models import Delivery, DeliveryStatus, RateSlot, utcnow

from .conftest import MakeSettings
from .endpoints import Receive, Scope, Send, respond
from .support import (
    Endpoints,
    Pipeline,
    StartRelay,
    StartWorker,
    add_subscription,
    attempts,
    delivery,
    emit_event,
    emit_events,
    subscribe,
    subscription,
    wait_all_succeeded,
)

pytestmark = pytest.mark.anyio


class Stopwatch:
    """Answers 204 and records when each request arrived (monotonic seconds)."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.arrivals.append(time.monotonic())
        await respond(send, 204)


def busiest_second(arrivals: list[float]) -> int:
    """The most arrivals in any window [t, t + 1 s) starting at an arrival."""
    times = sorted(arrivals)
    return max((sum(1 for u in times if t <= u < t + 1.0) for t in times), default=0)


@pytest.mark.parametrize("limit", [3])
async def test_never_more_than_n_deliveries_in_any_second_at_the_receiver(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    limit: int,
) -> None:
    settings = make_settings(rate_limit_margin_seconds=0.15)
    stopwatch = Stopwatch()
    sub = add_subscription(database, endpoints.add("limited", stopwatch))
    with session(database) as s:
        assert set_rate_limit(s, sub.id, limit) is not None
        s.commit()
    assert subscription(database, sub.id).rate_limit == limit
    ids = [emit_event(database)[1][0] for _ in range(4 * limit)]

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pending = [i for i in ids if delivery(database, i).status == DeliveryStatus.PENDING]
        if not pending:
            break
        due = [i for i in pending if delivery(database, i).next_attempt_at <= utcnow()]
        # Three workers at once, each handed every due delivery (the claim splits them).
        async with anyio.create_task_group() as group:
            for _ in range(3):
                group.start_soon(partial(deliver_batch, database, settings, due, client=client))
        await anyio.sleep(0.05)

    assert len(stopwatch.arrivals) == len(ids)
    assert busiest_second(stopwatch.arrivals) <= limit
    for delivery_id in ids:
        row = delivery(database, delivery_id)
        assert row.status == DeliveryStatus.SUCCEEDED
        assert row.attempt_count == 1  # deferrals burned no attempt
        assert len(attempts(database, delivery_id)) == 1


async def test_a_delivery_over_the_limit_is_deferred_to_when_a_slot_frees(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
) -> None:
    settings = make_settings(rate_limit_margin_seconds=0.0)
    stopwatch = Stopwatch()
    sub = add_subscription(database, endpoints.add("one", stopwatch))
    with session(database) as s:
        set_rate_limit(s, sub.id, 1)
        s.commit()
    first, second = (emit_event(database)[1][0] for _ in range(2))

    started = utcnow()
    # One clock reading for the batch: the two deliveries take their slot concurrently, and one
    # that finds the slot locked by the other's uncommitted stamp dates the slot's freeing from its
    # own reading of the clock, microseconds off the other's.
    report = await deliver_batch(database, settings, [first, second], client=client, now=lambda: started)

    assert report.succeeded == 1
    assert report.paused == 1
    assert len(stopwatch.arrivals) == 1
    [held] = [i for i in (first, second) if delivery(database, i).status == DeliveryStatus.PENDING]
    row = delivery(database, held)
    assert row.attempt_count == 0
    # Due exactly when the one slot frees: a window (1 s, no margin) after the first start. Read
    # against the slot's own stamp, not the test's clock, which a loaded machine stretches.
    with session(database) as s:
        [slot] = s.exec(select(RateSlot).where(RateSlot.subscription_id == sub.id)).all()
    assert slot.last_start_at is not None
    assert slot.last_start_at >= started
    assert row.next_attempt_at == slot.last_start_at + timedelta(seconds=1)


async def test_lifting_the_limit_and_refusing_a_nonsense_one(database: Engine, endpoints: Endpoints) -> None:
    sub = add_subscription(database, endpoints.add("any", Stopwatch()))
    with session(database) as s:
        with pytest.raises(ValueError, match="at least 1"):
            set_rate_limit(s, sub.id, 0)
        assert set_rate_limit(s, "sub_missing", 5) is None
        set_rate_limit(s, sub.id, 5)
        s.commit()
        set_rate_limit(s, sub.id, None)
        s.commit()
    assert subscription(database, sub.id).rate_limit is None


@pytest.mark.parametrize("pipeline", [("redis", "postgresql")], indirect=True, ids=["redis-postgresql"])
def test_the_limit_holds_across_real_worker_processes(
    pipeline: Pipeline,
    start_worker: StartWorker,
    start_relay: StartRelay,
    endpoints: Endpoints,
) -> None:
    limit, count = 4, 24
    pipeline.fields["rate_limit_margin_seconds"] = 0.15
    stopwatch = Stopwatch()
    subscription_id = subscribe(pipeline.engine, endpoints.add("fleet", stopwatch))
    with session(pipeline.engine) as s:
        set_rate_limit(s, subscription_id, limit)
        s.commit()
    workers = [start_worker(f"worker-{n}", concurrency=4) for n in range(2)]
    relay = start_relay()
    for worker in workers:
        worker.wait_ready()
    relay.wait_ready()
    tasks.install_enqueuer(pipeline.settings)

    emit_events(pipeline.engine, count, per_transaction=count)  # one burst, handed off at once

    wait_all_succeeded(pipeline.engine, count, 60, *(w.output for w in workers), relay.output)
    assert len(stopwatch.arrivals) == count
    assert busiest_second(stopwatch.arrivals) <= limit
    with Session(pipeline.engine) as s:
        assert {row.attempt_count for row in s.exec(select(Delivery))} == {1}
