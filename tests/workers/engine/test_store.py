"""Claiming and recording, without the network: the races the conditional updates exist to win."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tests.workers.support import add_subscription, attempts, delivery, emit_event
from usp_core.clock import utcnow
from usp_workers.engine.store import AttemptRow, Claimed, DeliveryUpdate, claim, record
from usp_workers.storage.models import Attempt, DeliveryStatus


def test_racing_threads_claim_each_delivery_exactly_once(database: Engine) -> None:
    add_subscription(database, "http://127.0.0.1:9/a")
    add_subscription(database, "http://127.0.0.1:9/b")
    ids = [i for _ in range(50) for i in emit_event(database)[1]]
    start = threading.Barrier(8)
    claimed: list[Claimed] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        order = ids[n * 7 :] + ids[: n * 7]
        start.wait()
        now = utcnow()
        mine = claim(database, order, now=now, lease_until=now + timedelta(seconds=30))
        with lock:
            claimed.extend(mine)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)

    counts = Counter(c.id for c in claimed)
    assert sorted(counts) == sorted(ids)
    assert set(counts.values()) == {1}


def test_only_due_pending_or_expired_in_flight_deliveries_are_claimed(database: Engine) -> None:
    add_subscription(database, "http://127.0.0.1:9/a")
    ids = [emit_event(database)[1][0] for _ in range(3)]
    now = utcnow()
    lease = now + timedelta(seconds=30)

    assert [c.id for c in claim(database, ids[:1], now=now, lease_until=lease)] == ids[:1]
    assert claim(database, ids[:1], now=now + timedelta(seconds=29), lease_until=lease) == []  # held
    later = now + timedelta(seconds=31)
    [taken] = claim(database, ids[:1], now=later, lease_until=later + timedelta(seconds=30))
    assert taken.id == ids[0]  # the lease expired: its worker is presumed gone
    assert claim(database, ids[1:], now=now - timedelta(seconds=5), lease_until=lease) == []  # not due
    assert claim(database, [], now=now, lease_until=lease) == []


def test_record_is_fenced_by_the_lease(database: Engine) -> None:
    add_subscription(database, "http://127.0.0.1:9/a")
    [delivery_id] = emit_event(database)[1]
    now = utcnow()
    old_lease = now + timedelta(seconds=30)
    claim(database, [delivery_id], now=now, lease_until=old_lease)
    later = now + timedelta(seconds=31)
    new_lease = later + timedelta(seconds=30)
    claim(database, [delivery_id], now=later, lease_until=new_lease)

    stale = DeliveryUpdate(delivery_id, DeliveryStatus.DEAD, tried=True, last_error="stale")
    assert record(database, attempts=[], updates=[stale], lease_until=old_lease, now=later) == set()
    row = delivery(database, delivery_id)
    assert (row.status, row.attempt_count, row.lease_until) == (DeliveryStatus.IN_FLIGHT, 0, new_lease)

    fresh = DeliveryUpdate(delivery_id, DeliveryStatus.SUCCEEDED, tried=True)
    assert record(database, attempts=[], updates=[fresh], lease_until=new_lease, now=later) == {delivery_id}
    row = delivery(database, delivery_id)
    assert (row.status, row.attempt_count, row.lease_until) == (DeliveryStatus.SUCCEEDED, 1, None)


def test_record_writes_each_kind_of_outcome_in_one_call(database: Engine) -> None:
    """A success, a retry, a dead letter, a deferral (no try: keeps its last status, error and
    schedule) and a try whose attempt has no status code at all, recorded together."""
    add_subscription(database, "http://127.0.0.1:9/a")
    ids = sorted(emit_event(database)[1][0] for _ in range(5))
    now = utcnow()
    lease = now + timedelta(seconds=30)
    first = claim(database, ids[3:4], now=now, lease_until=lease)  # deferred later: tried once before
    retry_at = now + timedelta(seconds=60)
    record(
        database,
        attempts=[AttemptRow(ids[3], 1, now, 5.0, 503, "busy", None, "retry")],
        updates=[DeliveryUpdate(ids[3], DeliveryStatus.PENDING, tried=True, next_attempt_at=now,
                                last_status_code=503, last_error="HTTP 503")],
        lease_until=lease,
        now=now,
    )  # fmt: skip
    later = now + timedelta(seconds=1)
    lease = later + timedelta(seconds=30)
    assert [c.id for c in claim(database, ids, now=later, lease_until=lease)] == ids
    assert first[0].attempt_count == 0
    attempts = [
        AttemptRow(ids[0], 1, later, 12.5, 204, None, None, "succeeded"),
        AttemptRow(ids[1], 1, later, 3.0, None, None, "ConnectError", "retry"),
        AttemptRow(ids[2], 1, later, 4.0, None, "x" * 300, "ReadTimeout", "dead"),
    ]
    updates = [
        DeliveryUpdate(ids[0], DeliveryStatus.SUCCEEDED, tried=True, last_status_code=204),
        DeliveryUpdate(ids[1], DeliveryStatus.PENDING, tried=True, next_attempt_at=retry_at,
                       last_error="ConnectError: refused"),
        DeliveryUpdate(ids[2], DeliveryStatus.DEAD, tried=True, last_error="e" * 600),
        DeliveryUpdate(ids[3], DeliveryStatus.PENDING, tried=False, deferred=True, next_attempt_at=retry_at),
        DeliveryUpdate(ids[4], DeliveryStatus.PENDING, tried=False, deferred=True),
    ]  # fmt: skip
    assert record(database, attempts=attempts, updates=updates, lease_until=lease, now=later) == set(ids)

    rows = {i: delivery(database, i) for i in ids}
    got = {
        i: (r.status, r.attempt_count, r.last_status_code, r.last_error, r.completed_at, r.lease_until)
        for i, r in rows.items()
    }
    assert got == {
        ids[0]: (DeliveryStatus.SUCCEEDED, 1, 204, None, later, None),
        ids[1]: (DeliveryStatus.PENDING, 1, None, "ConnectError: refused", None, None),
        ids[2]: (DeliveryStatus.DEAD, 1, None, "e" * 512, later, None),
        ids[3]: (DeliveryStatus.PENDING, 1, 503, "HTTP 503", None, None),  # kept: no try was made
        ids[4]: (DeliveryStatus.PENDING, 0, None, None, None, None),
    }
    assert rows[ids[1]].next_attempt_at == retry_at
    assert rows[ids[3]].next_attempt_at == retry_at
    assert rows[ids[4]].next_attempt_at <= now  # no new time given: still due
    assert all(r.enqueued_at is None and r.updated_at == later for r in rows.values())
    written = [
        (a.attempt_number, a.status_code, a.error_class, a.outcome, a.duration_ms)
        for a in stored(database, ids[:3])
    ]
    assert written == [(1, 204, None, "succeeded", 12.5), (1, None, "ConnectError", "retry", 3.0),
                       (1, None, "ReadTimeout", "dead", 4.0)]  # fmt: skip


def stored(engine: Engine, delivery_ids: list[str]) -> list[Attempt]:
    return [a for i in delivery_ids for a in attempts(engine, i)]


def test_a_claim_skips_rows_another_transaction_holds_instead_of_waiting(database: Engine) -> None:
    if database.dialect.name != "postgresql":
        pytest.skip("SQLite has no row locks: it runs one writer at a time")
    add_subscription(database, "http://127.0.0.1:9/a")
    ids = [emit_event(database)[1][0] for _ in range(2)]
    now = utcnow()
    lease = now + timedelta(seconds=30)
    claimed: list[Claimed] = []
    with database.connect() as other:
        other.execute(sa.text("SELECT id FROM usp_deliveries WHERE id = :id FOR UPDATE"), {"id": ids[0]})
        claiming = threading.Thread(
            target=lambda: claimed.extend(claim(database, ids, now=now, lease_until=lease))
        )
        claiming.start()
        claiming.join(10)
        finished = not claiming.is_alive()
        other.rollback()  # a claim that waited on the lock is released here, and fails below
    claiming.join(10)
    assert finished
    assert [c.id for c in claimed] == ids[1:]
    assert [c.id for c in claim(database, ids, now=now, lease_until=lease)] == ids[:1]  # free now
