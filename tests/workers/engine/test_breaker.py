"""The circuit breaker and 429 back-pressure, against a real server and both databases.

A breaker's state lives on the subscription row, so what one ``deliver_batch`` call decides,
the next one (any worker's) obeys; the clock is moved forward instead of sleeping through
cool-downs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial

import anyio
import httpx
import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, func, select

from tests.workers.conftest import MakeSettings
from tests.workers.endpoints import Answer, App, Hub, Message, Receive, Scope, Send
from tests.workers.support import (
    Clock,
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
from usp_receiver import JWKS
from usp_workers.engine.delivery import BatchReport, deliver_batch
from usp_workers.engine.health import (
    NOTICE_BREAKER_CLOSED,
    NOTICE_BREAKER_OPENED,
    NOTICE_BREAKER_REOPENED,
    claim_probe,
)
from usp_workers.runtime import tasks
from usp_workers.storage.models import Attempt, BreakerState, Delivery, DeliveryStatus, Notice

pytestmark = pytest.mark.anyio


@dataclass
class Switch:
    """Fails every request (500) until ``up`` is set, then hands over to ``then``.

    (Not the verifying receiver: the tests move the clock minutes ahead, and a receiver would
    rightly refuse a signature ``created`` in its future.)"""

    then: App
    up: bool = False
    calls: list[str | None] = field(default_factory=list)  #: USP-Delivery-Id of each request
    failed: int = 0  #: requests answered 500

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])
        self.calls.append(headers.get(b"usp-delivery-id", b"").decode() or None)
        if self.up:
            await self.then(scope, receive, send)
        else:
            self.failed += 1
            await Answer(500, body=b"down")(scope, receive, send)


def tried(report: BatchReport) -> int:
    return sum(result.attempt_number is not None for result in report.results)


def notices(engine: Engine, subscription_id: str) -> list[str]:
    with Session(engine) as s:
        rows = s.exec(
            select(Notice).where(Notice.subscription_id == subscription_id).order_by(col(Notice.id))
        )
        return [row.kind for row in rows]


async def test_breaker_opens_pauses_without_spending_attempts_probes_and_closes_on_recovery(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,  # the signing key exists
    endpoints: Endpoints,
    hub: Hub,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    settings = make_settings(
        breaker_threshold=3,
        breaker_cooldown_seconds=60.0,
        breaker_max_cooldown_seconds=600.0,
        retry_schedule=(1.0,) * 10,
    )
    switch = Switch(Answer(204))
    sub = add_subscription(database, endpoints.add("flaky", switch))
    ids = [emit_event(database)[1][0] for _ in range(3)]

    async def run(batch: list[str]) -> BatchReport:
        return await deliver_batch(database, settings, batch, client=client, now=clock)

    # Three failed tries in a row: the breaker opens, with a notice, for the cool-down from the
    # moment it opened (somewhere within the batch: bounded by the clock before and after it).
    started = clock()
    report = await run(ids)
    ended = clock()
    assert report.retrying == 3
    row = subscription(database, sub.id)
    assert row.breaker_state == BreakerState.OPEN
    assert row.consecutive_failures == 3
    assert row.breaker_opens == 1
    assert row.breaker_until is not None
    opened_until = row.breaker_until
    assert started + timedelta(seconds=60) <= opened_until <= ended + timedelta(seconds=60)
    assert notices(database, sub.id) == [NOTICE_BREAKER_OPENED]

    # While it is open nothing is sent: the retries and two fresh deliveries are paused to the
    # end of the cool-down, and no attempt is spent.
    ids += [emit_event(database)[1][0] for _ in range(2)]
    clock.advance(5)
    report = await run(ids)
    assert report.paused == 5
    assert len(switch.calls) == 3
    for delivery_id, tries in zip(ids, [1, 1, 1, 0, 0], strict=True):
        row_d = delivery(database, delivery_id)
        assert row_d.status == DeliveryStatus.PENDING
        assert row_d.attempt_count == tries
        assert row_d.next_attempt_at == opened_until
        assert len(attempts(database, delivery_id)) == tries

    # Cool-down over, endpoint still down: exactly one probe; it fails, and the breaker re-opens
    # for twice as long.
    clock.advance_to(opened_until)
    started = clock()
    report = await run(ids)
    ended = clock()
    assert len(switch.calls) == 4
    assert tried(report) == 1
    assert report.paused == 4
    row = subscription(database, sub.id)
    assert row.breaker_state == BreakerState.OPEN
    assert row.breaker_opens == 2
    assert row.breaker_until is not None
    assert started + timedelta(seconds=120) <= row.breaker_until <= ended + timedelta(seconds=120)
    reopened_until = row.breaker_until
    assert notices(database, sub.id) == [NOTICE_BREAKER_OPENED, NOTICE_BREAKER_REOPENED]

    # Half an hour later the endpoint is back; after the cool-down one probe succeeds and closes
    # the breaker, and then everything goes through.
    switch.up = True
    clock.advance_to(reopened_until)
    report = await run(ids)
    assert report.succeeded == 1
    assert len(switch.calls) == 5
    row = subscription(database, sub.id)
    assert row.breaker_state == BreakerState.CLOSED
    assert row.breaker_until is None
    assert row.breaker_opens == 0
    assert row.consecutive_failures == 0
    assert row.failing_since is None
    assert row.last_success_at is not None
    assert notices(database, sub.id) == [
        NOTICE_BREAKER_OPENED,
        NOTICE_BREAKER_REOPENED,
        NOTICE_BREAKER_CLOSED,
    ]

    for _ in range(3):
        pending = [i for i in ids if delivery(database, i).status == DeliveryStatus.PENDING]
        if not pending:
            break
        clock.advance_to(max(delivery(database, i).next_attempt_at for i in pending))
        await run(pending)
    # Every delivery arrived, and each one's attempt count is exactly the requests it made:
    # the paused rounds cost nothing.
    for delivery_id in ids:
        row_d = delivery(database, delivery_id)
        assert row_d.status == DeliveryStatus.SUCCEEDED
        made = switch.calls.count(delivery_id)
        assert row_d.attempt_count == made == len(attempts(database, delivery_id))
    assert len(switch.calls) == 3 + 1 + 5  # three failures, a failed probe, five successes


async def test_only_one_of_concurrent_workers_sends_the_half_open_probe(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,  # the signing key exists
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    settings = make_settings(breaker_threshold=2, breaker_cooldown_seconds=30.0, retry_schedule=(1.0,) * 5)
    switch = Switch(Answer(204))
    sub = add_subscription(database, endpoints.add("probe", switch))
    ids = [emit_event(database)[1][0] for _ in range(6)]
    await deliver_batch(database, settings, ids[:2], client=client, now=clock)
    row = subscription(database, sub.id)
    assert row.breaker_state == BreakerState.OPEN
    assert row.breaker_until is not None
    clock.advance_to(row.breaker_until)

    # Three "workers" wake at once with disjoint deliveries of the same subscription.
    async with anyio.create_task_group() as group:
        for part in (ids[0:2], ids[2:4], ids[4:6]):
            group.start_soon(partial(deliver_batch, database, settings, part, client=client, now=clock))

    assert len(switch.calls) == 2 + 1
    assert subscription(database, sub.id).breaker_state == BreakerState.OPEN
    assert sum(delivery(database, i).attempt_count for i in ids) == 3


async def test_a_429_holds_back_the_subscriptions_other_deliveries(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,  # the signing key exists
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    settings = make_settings(retry_schedule=(20.0, 20.0), breaker_threshold=0)
    calls: list[Message] = []

    async def busy(scope: Scope, receive: Receive, send: Send) -> None:
        calls.append({"path": scope["path"]})
        await Answer(429, headers=[("Retry-After", "30")])(scope, receive, send)

    sub = add_subscription(database, endpoints.add("busy", busy))
    # Both emitted before the clock stops: a delivery emitted later (by the wall clock) would
    # not be due yet at the frozen moment, however loaded the machine.
    first, second = (emit_event(database)[1][0] for _ in range(2))
    clock.freeze()
    await deliver_batch(database, settings, [first], client=client, now=clock)
    row = subscription(database, sub.id)
    assert row.breaker_state == BreakerState.CLOSED
    assert row.breaker_until == clock() + timedelta(seconds=30)
    assert delivery(database, first).next_attempt_at == clock() + timedelta(seconds=30)  # 1x..2x of 20 s

    clock.advance(1)
    report = await deliver_batch(database, settings, [second], client=client, now=clock)
    assert report.paused == 1
    assert len(calls) == 1
    later = delivery(database, second)
    assert later.status == DeliveryStatus.PENDING
    assert later.attempt_count == 0
    assert later.next_attempt_at == row.breaker_until


async def test_a_probe_whose_worker_vanished_is_taken_over_after_its_deadline(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    settings = make_settings(breaker_threshold=1, breaker_cooldown_seconds=30.0, retry_schedule=(1.0,) * 5)
    switch = Switch(Answer(204))
    sub = add_subscription(database, endpoints.add("takeover", switch))
    first, second = (emit_event(database)[1][0] for _ in range(2))
    await deliver_batch(database, settings, [first], client=client, now=clock)
    row = subscription(database, sub.id)
    assert row.breaker_until is not None
    clock.advance_to(row.breaker_until)

    # A worker claims the probe, then dies before sending it (its claim is all that happened).
    with database.begin() as connection:
        deadline = clock() + timedelta(seconds=10)
        assert claim_probe(connection, sub.id, now=clock(), probe_until=deadline)
        assert not claim_probe(connection, sub.id, now=clock(), probe_until=deadline)  # one at a time
    report = await deliver_batch(database, settings, [second], client=client, now=clock)
    assert report.paused == 1  # the probe is still someone else's
    assert delivery(database, second).next_attempt_at == deadline
    assert len(switch.calls) == 1

    switch.up = True
    clock.advance_to(deadline)
    report = await deliver_batch(database, settings, [second], client=client, now=clock)
    assert report.succeeded == 1
    assert subscription(database, sub.id).breaker_state == BreakerState.CLOSED


@pytest.mark.parametrize("pipeline", [("redis", "postgresql")], indirect=True, ids=["redis-postgresql"])
def test_the_breaker_holds_across_real_worker_processes(
    pipeline: Pipeline,
    start_worker: StartWorker,
    start_relay: StartRelay,
    endpoints: Endpoints,
) -> None:
    pipeline.fields |= {
        "breaker_threshold": 3,
        "breaker_cooldown_seconds": 1.0,
        "retry_schedule": (0.5,) * 30,
    }
    switch = Switch(Answer(204))
    subscription_id = subscribe(pipeline.engine, endpoints.add("fleet", switch))
    workers = [start_worker(f"worker-{n}", concurrency=4) for n in range(2)]
    relay = start_relay()
    for process in (*workers, relay):
        process.wait_ready()
    tasks.install_enqueuer(pipeline.settings)
    logs = (*(w.output for w in workers), relay.output)

    emit_events(pipeline.engine, 6, per_transaction=6)

    # Open, one failed probe, re-opened for longer: meanwhile the retries (due every 0.5 s) stay
    # paused instead of hammering the endpoint.
    deadline = time.monotonic() + 30
    while subscription(pipeline.engine, subscription_id).breaker_opens < 2:
        assert time.monotonic() < deadline, "\n".join(log() for log in logs)
        time.sleep(0.05)
    switch.up = True
    wait_all_succeeded(pipeline.engine, 6, 60, *logs)

    row = subscription(pipeline.engine, subscription_id)
    assert row.breaker_state == BreakerState.CLOSED
    seen = notices(pipeline.engine, subscription_id)
    assert seen[0] == NOTICE_BREAKER_OPENED
    assert seen[-1] == NOTICE_BREAKER_CLOSED
    assert set(seen[1:-1]) == {NOTICE_BREAKER_REOPENED}
    assert switch.failed <= 6 + 3  # the first wave, then a probe per cool-down: no retry storm
    with Session(pipeline.engine) as s:
        for row_d in s.exec(select(Delivery)):
            made = switch.calls.count(row_d.id)
            assert row_d.attempt_count == made  # paused rounds spent nothing
            tried = s.exec(
                select(func.count()).select_from(Attempt).where(Attempt.delivery_id == row_d.id)
            ).one()
            assert tried == made
