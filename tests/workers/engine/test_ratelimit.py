"""The per-subscription rate limit: the starts it grants and the requests that follow them.

Several "workers" (concurrent ``deliver_batch`` calls, as a fleet's processes would make) drain a
backlog to a subscription limited to N deliveries per second. The limiter spaces *starts*, so the
timing is asserted on the starts the bucket granted (exact, whatever the machine's load) and on
the receiver only that nothing arrived before its start: never two starts closer than the
interval (no bursts), no one-second window with more than N plus the small burst, and every
delivery that had to wait starts at the bucket's next slot, one interval after the start before
it (the limiter adds no gap of its own). Deliveries held back wait or are deferred, never
failed: each ends with one attempt. Across real worker processes the starts are the ones the
workers recorded in their attempts.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial

import anyio
import httpx
import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from tests.workers.conftest import MakeSettings
from tests.workers.endpoints import Receive, Scope, Send, respond
from tests.workers.support import (
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
from usp_core.clock import utcnow
from usp_core.db import session
from usp_receiver import JWKS
from usp_workers.engine import ratelimit
from usp_workers.engine.delivery import deliver_batch
from usp_workers.engine.health import set_rate_limit
from usp_workers.engine.ratelimit import Reservation, burst_of
from usp_workers.runtime import tasks
from usp_workers.storage.models import Attempt, Delivery, DeliveryStatus, RateBucket

pytestmark = pytest.mark.anyio


class Stopwatch:
    """Answers 204 and records when each request arrived (POSIX seconds, as the starts are)."""

    def __init__(self) -> None:
        self.arrivals: list[float] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.arrivals.append(time.time())
        await respond(send, 204)


@dataclass(frozen=True)
class Grant:
    """A start the bucket granted (``at``) and the clock it read with the bucket locked (``now``),
    POSIX seconds: ``at > now`` when the delivery had to wait for its turn."""

    at: float
    now: float


class Grants(list[Grant]):
    @property
    def starts(self) -> list[float]:
        return sorted(grant.at for grant in self)


@pytest.fixture
def granted(monkeypatch: pytest.MonkeyPatch) -> Grants:
    """The starts the rate limiter grants in this process, as they were granted."""
    grants = Grants()
    reserve = ratelimit.reserve

    def recording(
        engine: Engine, subscription_id: str, rate: int, *, clock: Callable[[], datetime], max_wait: float
    ) -> Reservation:
        readings: list[datetime] = []

        def reading() -> datetime:
            readings.append(clock())
            return readings[-1]

        reservation = reserve(engine, subscription_id, rate, clock=reading, max_wait=max_wait)
        if reservation.granted:
            grants.append(Grant(reservation.at.timestamp(), readings[-1].timestamp()))
        return reservation

    monkeypatch.setattr(ratelimit, "reserve", recording)
    return grants


def paced(grants: Grants, interval: float) -> bool:
    """Each start that had to wait came exactly one interval after the start before it (the
    bucket's next slot: burst 1); one granted at once found the bucket idle, and the gap before
    it is the time nobody asked (here: the test's own loop, slower under load)."""
    starts = grants.starts
    for grant in grants:
        if grant.at > grant.now + 1e-6:
            before = max(start for start in starts if start < grant.at)
            if abs(grant.at - before - interval) > 1e-3:
                return False
    return True


def none_before_its_start(arrivals: list[float], starts: list[float]) -> bool:
    """Every request arrived at or after its start: the k-th arrival is no earlier than the
    k-th start (each arrival follows its own start, so the sorted lists compare element-wise)."""
    return len(arrivals) == len(starts) and all(
        a >= s - 0.005 for a, s in zip(sorted(arrivals), sorted(starts), strict=True)
    )


def busiest_second(arrivals: list[float]) -> int:
    """The most arrivals in any window [t, t + 1 s) starting at an arrival."""
    times = sorted(arrivals)
    return max((sum(1 for u in times if t <= u < t + 1.0) for t in times), default=0)


def measured_rate(arrivals: list[float]) -> float:
    """Arrivals per second from the first to the last."""
    times = sorted(arrivals)
    return (len(times) - 1) / (times[-1] - times[0])


def longest_gap(arrivals: list[float]) -> float:
    times = sorted(arrivals)
    return max(b - a for a, b in itertools.pairwise(times))


def show(capsys: pytest.CaptureFixture[str], where: str, limit: int, starts: list[float]) -> None:
    with capsys.disabled():
        print(
            f"\n[rate limit] {where}: {limit}/s configured, {measured_rate(starts):.2f}/s started over"
            f" {len(starts)} deliveries, busiest second {busiest_second(starts)},"
            f" longest gap {longest_gap(starts) * 1000:.0f} ms"
        )


@pytest.mark.parametrize("limit", [5])
async def test_a_backlog_flows_at_the_configured_rate_evenly(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    capsys: pytest.CaptureFixture[str],
    granted: Grants,
    limit: int,
) -> None:
    settings = make_settings()
    stopwatch = Stopwatch()
    sub = add_subscription(database, endpoints.add("limited", stopwatch))
    with session(database) as s:
        assert set_rate_limit(s, sub.id, limit) is not None
        s.commit()
    assert subscription(database, sub.id).rate_limit == limit
    ids = [emit_event(database)[1][0] for _ in range(4 * limit)]

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with Session(database) as s:
            pending = s.exec(
                select(Delivery.id, Delivery.next_attempt_at).where(
                    col(Delivery.id).in_(ids), Delivery.status == DeliveryStatus.PENDING
                )
            ).all()
        if not pending:
            break
        due = [i for i, at in pending if at <= utcnow()]
        # Three workers at once, each handed every due delivery (the claim splits them).
        async with anyio.create_task_group() as group:
            for _ in range(3):
                group.start_soon(partial(deliver_batch, database, settings, due, client=client))
        await anyio.sleep(0.05)

    assert len(stopwatch.arrivals) == len(ids)
    starts = granted.starts
    assert none_before_its_start(stopwatch.arrivals, starts)
    show(capsys, "3 concurrent workers", limit, starts)
    assert burst_of(limit) == 1
    assert min(b - a for a, b in itertools.pairwise(starts)) >= 1 / limit - 1e-3, "never in bursts"
    assert busiest_second(starts) <= limit + burst_of(limit)
    assert paced(granted, 1 / limit), "a waiting delivery starts at the bucket's next slot, no later"
    waited = sum(grant.at > grant.now + 1e-6 for grant in granted)
    assert waited >= len(ids) // 2, "the backlog queued on the bucket"
    for delivery_id in ids:
        row = delivery(database, delivery_id)
        assert row.status == DeliveryStatus.SUCCEEDED
        assert row.attempt_count == 1  # waits and deferrals burned no attempt
        assert len(attempts(database, delivery_id)) == 1


async def test_a_start_too_far_away_is_deferred_to_the_buckets_next_start(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    granted: Grants,
) -> None:
    """At 1/s, a batch of four sends three (now, +1 s, +2 s: waited for in the worker, within
    RATE_WAIT) and defers the fourth to +3 s, the bucket's next start."""
    settings = make_settings()
    stopwatch = Stopwatch()
    sub = add_subscription(database, endpoints.add("one", stopwatch))
    with session(database) as s:
        set_rate_limit(s, sub.id, 1)
        s.commit()
    ids = [emit_event(database)[1][0] for _ in range(4)]

    report = await deliver_batch(database, settings, ids, client=client)

    assert report.succeeded == 3
    assert report.paused == 1
    assert [round(b - a, 3) for a, b in itertools.pairwise(granted.starts)] == [1.0, 1.0]
    assert none_before_its_start(stopwatch.arrivals, granted.starts)
    [held] = [i for i in ids if delivery(database, i).status == DeliveryStatus.PENDING]
    row = delivery(database, held)
    assert row.attempt_count == 0
    with session(database) as s:
        bucket = s.get(RateBucket, sub.id)
    assert bucket is not None
    assert row.next_attempt_at == bucket.tat  # burst 1: the next start is the bucket's tat


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
    capsys: pytest.CaptureFixture[str],
) -> None:
    limit, count = 4, 24
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
    with Session(pipeline.engine) as s:
        assert {row.attempt_count for row in s.exec(select(Delivery))} == {1}
        starts = [row.started_at.timestamp() for row in s.exec(select(Attempt))]
    assert none_before_its_start(stopwatch.arrivals, starts)
    show(capsys, "2 worker processes", limit, starts)
    assert measured_rate(starts) >= 0.85 * limit
    # Recorded by the worker as its request went out, a few milliseconds after the granted start.
    assert busiest_second(starts) <= limit + burst_of(limit)
