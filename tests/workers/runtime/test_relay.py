"""The scheduler pass (``relay_once``) on SQLite and PostgreSQL, and the embedded broker's pruning.

``enqueue`` is a recorder here: these tests are about which deliveries the relay sends, when, and
in which batches; the real broker is exercised in ``test_pipeline.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from kombu.connection import Connection
from sqlalchemy.engine import Engine
from sqlmodel import Session, SQLModel, select

from tests.workers.conftest import MakeSettings
from usp_core.clock import utcnow
from usp_core.ids import new_id
from usp_dispatcher.cli.config import Settings
from usp_workers.engine import health
from usp_workers.runtime.embedded_broker import TRANSPORT_PATH, make_broker_engine, prune_consumed
from usp_workers.runtime.relay import RelayReport, endpoint_batch_size, plan_batches, relay_once
from usp_workers.storage.models import BreakerState, Delivery, DeliveryStatus, EventRecord, Subscription

REDIS_NOT_CONTACTED = "redis://127.0.0.1:6379/11"  # relay_once never connects: enqueue is ours


class Recorder:
    """An ``enqueue`` that records batches; ``fail_on`` makes the n-th call (1-based) raise."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: list[list[str]] = []
        self.calls = 0
        self.fail_on = fail_on
        self._lock = threading.Lock()

    def __call__(self, ids: Sequence[str]) -> None:
        with self._lock:
            self.calls += 1
            if self.calls == self.fail_on:
                raise ConnectionError("broker down")
            self.batches.append(list(ids))

    @property
    def ids(self) -> list[str]:
        return [i for batch in self.batches for i in batch]


@pytest.fixture
def relay_settings(make_settings: MakeSettings) -> Settings:
    return make_settings(broker_url=REDIS_NOT_CONTACTED, requeue_after_seconds=30.0, lease_seconds=30.0)


_deliveries: sa.Table = SQLModel.metadata.tables[Delivery.__tablename__]


def subscription(engine: Engine, name: str = "a") -> str:
    with Session(engine) as s:
        row = Subscription(url=f"https://{name}.example/hooks")
        s.add(row)
        s.commit()
        return row.id


def deliveries(engine: Engine, subscription_id: str, count: int, **fields: Any) -> list[str]:
    """Insert ``count`` deliveries (one event each) with ``fields`` (defaults: pending, due)."""
    now = utcnow()
    events = []
    rows = []
    for _ in range(count):
        event_id = new_id("evt")
        events.append(
            {
                "id": event_id,
                "event_type": "booking.confirmed",
                "occurred_at": now,
                "created_at": now,
                "payload": "{}",
            }
        )
        row = {
            "id": new_id("dlv"),
            "event_id": event_id,
            "subscription_id": subscription_id,
            "status": DeliveryStatus.PENDING.value,
            "attempt_count": 0,
            "next_attempt_at": now - timedelta(seconds=1),
            "enqueued_at": None,
            "lease_until": None,
            "created_at": now,
            "updated_at": now,
        }
        rows.append(row | fields)
    with engine.begin() as connection:
        connection.execute(sa.insert(SQLModel.metadata.tables[EventRecord.__tablename__]), events)
        connection.execute(sa.insert(_deliveries), rows)
    return [str(row["id"]) for row in rows]


def row(engine: Engine, delivery_id: str) -> Delivery:
    with Session(engine) as s:
        found = s.get(Delivery, delivery_id)
        assert found is not None
        s.expunge(found)
        return found


def subscription_of(engine: Engine) -> dict[str, str]:
    with Session(engine) as s:
        return {d.id: d.subscription_id for d in s.exec(select(Delivery)).all()}


# -- leases ----------------------------------------------------------------------------------------


def test_an_expired_lease_becomes_pending_and_is_sent_again(
    database: Engine, relay_settings: Settings
) -> None:
    sub = subscription(database)
    now = utcnow()
    [expired] = deliveries(
        database,
        sub,
        1,
        status=DeliveryStatus.IN_FLIGHT.value,
        attempt_count=2,
        lease_until=now - timedelta(seconds=1),
        enqueued_at=now - timedelta(seconds=40),
    )
    [held] = deliveries(
        database, sub, 1, status=DeliveryStatus.IN_FLIGHT.value, lease_until=now + timedelta(seconds=20)
    )
    enqueue = Recorder()

    report = relay_once(database, relay_settings, enqueue, now=now)

    assert report == RelayReport(reclaimed=1, enqueued=1, batches=1)
    assert enqueue.batches == [[expired]]
    reclaimed = row(database, expired)
    assert reclaimed.status == DeliveryStatus.PENDING
    assert reclaimed.lease_until is None
    assert reclaimed.attempt_count == 2, "the interrupted attempt never finished: it is not counted"
    assert reclaimed.enqueued_at == now
    untouched = row(database, held)
    assert untouched.status == DeliveryStatus.IN_FLIGHT
    assert untouched.lease_until == now + timedelta(seconds=20)


# -- what is due -----------------------------------------------------------------------------------


def test_sends_due_deliveries_never_sent_or_sent_longer_than_requeue_after_ago(
    database: Engine, relay_settings: Settings
) -> None:
    sub = subscription(database)
    now = utcnow()
    [never_sent] = deliveries(database, sub, 1)
    [just_sent] = deliveries(database, sub, 1, enqueued_at=now - timedelta(seconds=10))
    [lost] = deliveries(database, sub, 1, enqueued_at=now - timedelta(seconds=31))
    [later] = deliveries(database, sub, 1, next_attempt_at=now + timedelta(seconds=5))
    [done] = deliveries(database, sub, 1, status=DeliveryStatus.SUCCEEDED.value)
    [dead] = deliveries(database, sub, 1, status=DeliveryStatus.DEAD.value)
    enqueue = Recorder()

    first = relay_once(database, relay_settings, enqueue, now=now)

    assert sorted(enqueue.ids) == sorted([never_sent, lost])
    assert first.enqueued == 2
    assert row(database, never_sent).enqueued_at == now
    assert row(database, lost).enqueued_at == now
    assert row(database, just_sent).enqueued_at == now - timedelta(seconds=10)
    for untouched in (later, done, dead):
        assert row(database, untouched).enqueued_at is None

    # The same moment again: everything due was just marked, so nothing is sent twice.
    assert relay_once(database, relay_settings, enqueue, now=now) == RelayReport()
    # Past requeue_after (and the retry's due time), still pending: sent again.
    relay_once(database, relay_settings, enqueue, now=now + timedelta(seconds=31))
    assert sorted(enqueue.ids[2:]) == sorted([never_sent, lost, just_sent, later])


def test_a_paused_subscriptions_deliveries_wait_until_its_breaker_until_passes(
    database: Engine, make_settings: MakeSettings
) -> None:
    relay_settings = make_settings(broker_url=REDIS_NOT_CONTACTED, requeue_after_seconds=3600.0)
    tripped, backed_off, healthy = (
        subscription(database, "a"),
        subscription(database, "b"),
        subscription(database, "c"),
    )
    now = utcnow()
    policy = health.HealthPolicy(breaker_threshold=3, cooldown=60.0)
    with database.begin() as connection:  # the engine's own health writes: a breaker opens, a 429
        failing = health.Tally(tripped)
        for _ in range(3):
            failing.failure()
        throttled = health.Tally(backed_off)
        throttled.back_off(now + timedelta(seconds=20))
        health.apply(connection, [failing, throttled], policy, now=now)
    with Session(database) as s:
        rows = {sub: s.get(Subscription, sub) for sub in (tripped, backed_off)}
        assert all(row is not None for row in rows.values())
        assert rows[tripped].breaker_state == BreakerState.OPEN  # type: ignore[union-attr]
        assert rows[backed_off].breaker_state == BreakerState.CLOSED  # type: ignore[union-attr]
    paused = deliveries(database, tripped, 3)
    waiting = deliveries(database, backed_off, 2)
    free = deliveries(database, healthy, 2)
    enqueue = Recorder()

    report = relay_once(database, relay_settings, enqueue, now=now)
    assert sorted(enqueue.ids) == sorted(free), "nothing of a paused subscription goes to the broker"
    assert report.enqueued == 2
    assert all(row(database, d).enqueued_at is None for d in paused + waiting)

    # The 429's pause is over (20 s), the breaker's cool-down (60 s) is not.
    relay_once(database, relay_settings, enqueue, now=now + timedelta(seconds=21))
    assert sorted(enqueue.ids[2:]) == sorted(waiting)

    # The cool-down is over: the breaker is due for its half-open probe, so its deliveries go.
    later = now + timedelta(seconds=61)
    with Session(database) as s:
        opened = s.get(Subscription, tripped)
        assert opened is not None
        assert health.gate(opened, later) is health.Gate.PROBE
    relay_once(database, relay_settings, enqueue, now=later)
    assert sorted(enqueue.ids[4:]) == sorted(paused)


def test_a_full_round_is_followed_by_another(database: Engine, relay_settings: Settings) -> None:
    ids = deliveries(database, subscription(database), 250)
    enqueue = Recorder()

    report = relay_once(database, relay_settings, enqueue, now=utcnow(), limit=100)

    assert report.enqueued == 250
    assert sorted(enqueue.ids) == sorted(ids)


def test_a_broker_failure_stops_the_pass_and_the_rest_is_resent_after_requeue_after(
    database: Engine, relay_settings: Settings
) -> None:
    subs = [subscription(database, f"s{i}") for i in range(3)]
    ids = [i for sub in subs for i in deliveries(database, sub, 20)]  # 20 > 8: a batch each
    enqueue = Recorder(fail_on=2)
    now = utcnow()

    report = relay_once(database, relay_settings, enqueue, now=now)

    assert report.batches == 1
    assert report.enqueued == 20
    assert report.failed == 40
    assert relay_once(database, relay_settings, enqueue, now=now + timedelta(seconds=5)).enqueued == 0
    relay_once(database, relay_settings, enqueue, now=now + timedelta(seconds=31))
    assert sorted(enqueue.ids) == sorted(ids + enqueue.batches[0])


# -- concurrent relays -------------------------------------------------------------------------------


def test_two_relays_at_once_send_disjoint_sets(database: Engine, relay_settings: Settings) -> None:
    subs = [subscription(database, f"s{i}") for i in range(30)]
    ids = [i for sub in subs for i in deliveries(database, sub, 100)]
    recorders = [Recorder(), Recorder()]
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def relay(enqueue: Recorder) -> None:
        try:
            start.wait(5)
            # 20 rounds of 100 at most: neither relay can take all 3000 alone.
            relay_once(database, relay_settings, enqueue, now=utcnow(), limit=100)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=relay, args=(r,)) for r in recorders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors

    first, second = (set(r.ids) for r in recorders)
    assert first, "both relays took part"
    assert second, "both relays took part"
    assert not first & second, "a delivery was sent by both relays"
    assert sorted(first | second) == sorted(ids)
    assert len(recorders[0].ids) + len(recorders[1].ids) == len(ids)


# -- batching ------------------------------------------------------------------------------------------


def test_batches_are_grouped_by_subscription(database: Engine, make_settings: MakeSettings) -> None:
    settings = make_settings(
        broker_url=REDIS_NOT_CONTACTED,
        batch_size=50,
        per_endpoint_concurrency=8,
        lease_seconds=30.0,
        total_timeout=5.0,
    )
    assert endpoint_batch_size(settings) == 40  # 8 per wave, 30 s lease / 5 s timeout - 1 wave
    busy = subscription(database, "busy")
    nine = subscription(database, "nine")
    small = [subscription(database, f"small{i}") for i in range(30)]
    deliveries(database, busy, 100)
    deliveries(database, nine, 9)
    for sub in small:
        deliveries(database, sub, 2)
    enqueue = Recorder()

    relay_once(database, settings, enqueue, now=utcnow())

    owner = subscription_of(database)
    assert len(enqueue.ids) == 100 + 9 + 60
    assert len(set(enqueue.ids)) == len(enqueue.ids)
    for batch in enqueue.batches:
        subs = {owner[i] for i in batch}
        assert len(batch) <= 50
        if busy in subs or nine in subs:
            assert len(subs) == 1, "a subscription with a backlog shares its batches with nobody"
            assert len(batch) <= 40
        else:
            assert subs <= set(small)
    busy_batches = [b for b in enqueue.batches if owner[b[0]] == busy]
    assert sorted(len(b) for b in busy_batches) == [20, 40, 40]
    shared = [b for b in enqueue.batches if owner[b[0]] in small]
    assert sorted(len(b) for b in shared) == [10, 50], "small subscriptions share full batches"


def test_plan_batches_never_splits_a_small_subscription_needlessly(make_settings: MakeSettings) -> None:
    settings = make_settings(batch_size=4, per_endpoint_concurrency=2, lease_seconds=30.0, total_timeout=5.0)
    rows = [("d1", "a"), ("d2", "b"), ("d3", "a"), ("d4", "c"), ("d5", "c"), ("d6", "c")]
    assert plan_batches(rows, settings) == [["d4", "d5", "d6"], ["d1", "d3", "d2"]]
    assert plan_batches([], settings) == []


# -- the embedded broker ---------------------------------------------------------------------------------


def broker_connection(url: str) -> Any:
    """A kombu connection to the embedded broker at ``url`` (kombu's API is untyped)."""
    return Connection(url, transport=TRANSPORT_PATH)  # type: ignore[no-untyped-call]


def test_consumed_embedded_broker_messages_are_pruned(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'broker.sqlite3'}"
    engine = make_broker_engine("sqla+" + url)
    try:
        assert prune_consumed(engine) == 0, "no table yet: nothing to do, no error"
        with broker_connection(url) as connection:
            queue = connection.SimpleQueue("prune-test")
            for number in range(10):
                queue.put({"n": number})
            for _ in range(6):
                queue.get(timeout=5).ack()
            queue.close()
        assert prune_consumed(engine) == 0, "consumed under a minute ago: kept for now"
        later = utcnow() + timedelta(minutes=2)
        assert prune_consumed(engine, now=later, chunk=4) == 6
        with engine.connect() as connection:
            left = connection.execute(sa.text("SELECT count(*), sum(visible) FROM kombu_message")).one()
        assert tuple(left) == (4, 4), "unconsumed messages stay"
        with broker_connection(url) as connection:
            queue = connection.SimpleQueue("prune-test")
            assert sorted(queue.get(timeout=5).payload["n"] for _ in range(4)) == [6, 7, 8, 9]
            queue.close()
    finally:
        engine.dispose()


def test_relay_prunes_the_embedded_broker_it_uses(
    database: Engine, make_settings: MakeSettings, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'relay-broker.sqlite3'}"
    settings = make_settings(broker_url="sqla+" + url)
    with broker_connection(url) as connection:
        queue = connection.SimpleQueue("relay-prune")
        queue.put({"n": 1})
        queue.get(timeout=5).ack()
        queue.close()
    broker = make_broker_engine(settings.broker_url_resolved)
    try:
        later: datetime = utcnow() + timedelta(minutes=2)
        report = relay_once(database, settings, Recorder(), now=later, broker_engine=broker)
        assert report.pruned == 1
    finally:
        broker.dispose()
