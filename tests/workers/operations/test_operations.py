"""Operations on real databases and a real webhook server: list, replay, recover, redrive, health.

Deliveries are made by the engine itself (:func:`usp_workers.engine.delivery.deliver_batch`) against the
hub's real HTTP endpoints; time moves through a :class:`Clock` (no sleeping), so a 10-minute
outage takes a moment. Receivers here verify each signature at the clock's time, as a platform
whose clock agrees with ours would.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from tests.schemas.samples import sample
from tests.workers.conftest import MakeSettings
from tests.workers.endpoints import Answer, Hub, Receive, Scope, Send, UspReceiver, read_body, respond
from tests.workers.support import (
    Clock,
    Endpoints,
    Pipeline,
    StartRelay,
    StartWorker,
    emit_events,
    jwks_of,
    wait_for_status,
)
from tests.workers.support import subscribe as pipeline_subscribe
from usp_core.clock import utcnow
from usp_core.db import make_engine, session
from usp_dispatcher.cli.config import Settings
from usp_receiver import JWKS, VerificationError, Verifier
from usp_receiver._url import request_url
from usp_schemas import new_event_id
from usp_workers import operations
from usp_workers.engine.delivery import deliver_batch
from usp_workers.engine.outbox import emit
from usp_workers.operations import DeadLetterFilter, EventFilter
from usp_workers.runtime import tasks
from usp_workers.runtime.relay import relay_once, run_relay
from usp_workers.storage import retention
from usp_workers.storage.migrate import upgrade
from usp_workers.storage.models import (
    Attempt,
    Delivery,
    DeliveryStatus,
    EventRecord,
    Job,
    JobStatus,
    Notice,
    Subscription,
    SubscriptionState,
)

pytestmark = pytest.mark.anyio

PLATFORM_A = "https://platform-a.example/profile"
PLATFORM_B = "https://platform-b.example/profile"


# -- helpers ----------------------------------------------------------------------------------------


class ClockedReceiver:
    """Verifies every delivery at ``clock``'s time and answers 200, or 503 while ``down``.

    ``arrivals`` lists the event id of every verified request (a replay arrives again; the
    receiver library's dedupe would not run the handler twice, but here the count is the point).
    """

    def __init__(self, jwks: JWKS, clock: Clock) -> None:
        self.verifier = Verifier(jwks)
        self.clock = clock
        self.down = False
        self.arrivals: list[str] = []
        self.refused: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(receive)
        if self.down:
            await respond(send, 503, b"down for maintenance")
            return
        try:
            self.verifier.verify(
                "POST", request_url(scope), scope["headers"], body, now=self.clock().timestamp()
            )
        except VerificationError as exc:
            self.refused.append(exc.reason)
            await respond(send, 401, exc.reason.encode())
            return
        self.arrivals.append(json.loads(body)["event_id"])
        await respond(send, 200)


def event_body(event_type: str = "booking.confirmed", **changes: Any) -> dict[str, Any]:
    return sample(event_type) | {"event_id": new_event_id(), "timestamp": _stamp()} | changes


def _job_status(engine: Engine, job_id: str) -> str:
    with session(engine) as s:
        return operations.get_job(s, job_id).status


def _stamp() -> str:
    return utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")


def emit_one(engine: Engine, body: dict[str, Any] | None = None, *, audience: str | None = None) -> str:
    with session(engine) as s:
        record = emit(s, body or event_body(), audience=audience)
        s.commit()
        return record.id


def subscribe(engine: Engine, url: str, *, profile: str | None = None, types: str = '["*"]') -> str:
    with session(engine) as s:
        row = Subscription(url=url, platform_profile=profile, event_types=types)
        s.add(row)
        s.commit()
        return row.id


def deliveries_of(
    engine: Engine, *, event_id: str | None = None, subscription_id: str | None = None
) -> list[Delivery]:
    with Session(engine) as s:
        statement = select(Delivery).order_by(col(Delivery.id))
        if event_id is not None:
            statement = statement.where(Delivery.event_id == event_id)
        if subscription_id is not None:
            statement = statement.where(Delivery.subscription_id == subscription_id)
        rows = list(s.exec(statement).all())
        for row in rows:
            s.expunge(row)
        return rows


def attempt_count(engine: Engine) -> int:
    with Session(engine) as s:
        return len(s.exec(select(Attempt.id)).all())


async def deliver_due(engine: Engine, settings: Settings, client: httpx.AsyncClient, clock: Clock) -> int:
    """What relay + worker do: try every delivery due at the clock's time; how many were tried."""
    with Session(engine) as s:
        due = list(
            s.exec(
                select(Delivery.id).where(
                    Delivery.status == DeliveryStatus.PENDING, col(Delivery.next_attempt_at) <= clock()
                )
            ).all()
        )
    if due:
        await deliver_batch(engine, settings, due, client=client, now=clock)
    return len(due)


async def settle(engine: Engine, settings: Settings, client: httpx.AsyncClient, clock: Clock) -> None:
    """Deliver, moving the clock to the next due time, until nothing is pending."""
    for _ in range(50):
        await deliver_due(engine, settings, client, clock)
        with Session(engine) as s:
            pending = s.exec(
                select(Delivery.next_attempt_at).where(Delivery.status == DeliveryStatus.PENDING)
            ).all()
        if not pending:
            return
        clock.advance_to(min(pending))
    raise AssertionError("deliveries never settled")


def set_created_at(engine: Engine, event_id: str, moment: Any) -> None:
    with engine.begin() as connection:
        connection.execute(
            sa.update(EventRecord).where(col(EventRecord.id) == event_id).values(created_at=moment)
        )


def page_through(fetch: Any, *, limit: int) -> list[Any]:
    """Every item of a paginated listing, following ``next_cursor``; asserts pages are full."""
    items: list[Any] = []
    cursor = None
    for _ in range(100):
        page = fetch(cursor=cursor, limit=limit)
        items.extend(page.items)
        if page.next_cursor is None:
            return items
        assert len(page.items) == limit
        cursor = page.next_cursor
    raise AssertionError("pagination never ended")


@pytest.fixture
def settings(make_settings: MakeSettings) -> Settings:
    # No breaker: these tests are about what operators do after failures, not about the pause.
    return make_settings(retry_schedule=(5.0, 60.0, 300.0), breaker_threshold=0)


# -- listing ----------------------------------------------------------------------------------------


def test_events_list_filters_and_pages_by_cursor(database: Engine, endpoints: Endpoints) -> None:
    subscribe(database, endpoints.add("sink", Answer(200)), types='["booking.*"]')
    start = utcnow() - timedelta(hours=10)
    ids = []
    for n, event_type in enumerate(
        ["booking.confirmed", "waitlist.joined", "booking.cancelled", "catalog.service.updated"] * 3
    ):
        event_id = emit_one(database, event_body(event_type, correlation_id=f"corr_{n % 2}"))
        set_created_at(database, event_id, start + timedelta(hours=n % 6))
        ids.append(event_id)

    with session(database) as s:
        everything = page_through(lambda **kw: operations.list_events(s, EventFilter(), **kw), limit=5)
        # Newest accepted first (ids break ties), each once: never by the id's own layout.
        expected = sorted(((n % 6, event_id) for n, event_id in enumerate(ids)), reverse=True)
        assert [e.id for e in everything] == [event_id for _, event_id in expected]

        def only(**kw: Any) -> set[str]:
            return {e.id for e in operations.list_events(s, EventFilter(**kw), limit=200).items}

        assert only(event_type="waitlist.joined") == set(ids[1::4])
        assert only(subject_id="wl_01hx5k") == set(ids[1::4])
        assert only(correlation_id="corr_1") == set(ids[1::2])
        assert only(since=start + timedelta(hours=4)) == {i for n, i in enumerate(ids) if n % 6 >= 4}
        assert only(since=start + timedelta(hours=1), until=start + timedelta(hours=2)) == {
            i for n, i in enumerate(ids) if n % 6 == 1
        }
        # Only booking events had a subscriber: they alone have (pending) deliveries.
        booking = {i for n, i in enumerate(ids) if n % 4 in (0, 2)}
        assert only(delivery_status=DeliveryStatus.PENDING) == booking
        assert only(delivery_status=DeliveryStatus.SUCCEEDED) == set()
        paged = page_through(
            lambda **kw: operations.list_events(s, EventFilter(event_type="booking.confirmed"), **kw), limit=2
        )
        assert [e.id for e in paged] == [i for _, i in expected if i in set(ids[0::4])]
        summary = next(e for e in everything if e.id == ids[0])
        assert summary.deliveries == {"pending": 1}
        assert next(e for e in everything if e.id == ids[1]).deliveries == {}


@pytest.mark.parametrize("cursor", ["nope", "djE6", "x" * 300, operations.encode_cursor("evt_x")[:-2] + "!!"])
def test_a_cursor_we_did_not_issue_is_refused(database: Engine, cursor: str) -> None:
    with session(database) as s, pytest.raises(operations.InvalidRequest) as refused:
        operations.list_events(s, EventFilter(), cursor=cursor)
    assert refused.value.reason == "invalid_cursor"


def test_a_time_range_that_ends_before_it_starts_is_refused(database: Engine) -> None:
    now = utcnow()
    with session(database) as s, pytest.raises(operations.InvalidRequest) as refused:
        operations.list_events(s, EventFilter(since=now, until=now - timedelta(seconds=1)))
    assert refused.value.reason == "invalid_time_range"


# -- replay -----------------------------------------------------------------------------------------


async def test_replay_to_all_adds_deliveries_and_keeps_the_history(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    receiver = UspReceiver(jwks)
    first = subscribe(database, endpoints.add("first", receiver))
    flaky = ClockedReceiver(jwks, clock)
    flaky.down = True
    second = subscribe(database, endpoints.add("second", flaky))
    event_id = emit_one(database)
    await deliver_due(database, settings, client, clock)
    before = {d.id: d for d in deliveries_of(database, event_id=event_id)}
    assert {d.status for d in before.values()} == {DeliveryStatus.SUCCEEDED, DeliveryStatus.PENDING}

    flaky.down = False
    with session(database) as s:
        replayed = operations.replay_event(s, event_id, now=clock)
    assert sorted(sub for _, sub in replayed.deliveries) == sorted([first, second])
    assert not set(before) & {d for d, _ in replayed.deliveries}
    clock.advance(1)
    await deliver_due(database, settings, client, clock)

    with session(database) as s:
        detail = operations.event_detail(s, event_id)
    assert detail.payload["event_id"] == event_id
    assert [d.id for d in detail.deliveries] == sorted([*before, *(d for d, _ in replayed.deliveries)])
    # The originals are untouched: the failed one still waits for its retry, with its attempt.
    originals = {d.id: d for d in detail.deliveries if d.id in before}
    for delivery_id, view in originals.items():
        assert view.status == before[delivery_id].status
        assert view.attempt_count == before[delivery_id].attempt_count == len(view.attempts) == 1
    failed = next(v for v in originals.values() if v.subscription_id == second)
    assert (failed.attempts[0].status_code, failed.attempts[0].outcome) == (503, "retry")
    assert failed.attempts[0].response_excerpt == "down for maintenance"
    for view in detail.deliveries:
        if view.id not in before:
            assert view.status == DeliveryStatus.SUCCEEDED
            assert [a.outcome for a in view.attempts] == ["succeeded"]
    assert detail.event.deliveries == {"succeeded": 3, "pending": 1}
    # Same event_id both times; the receiver library ran its handler once (it deduplicates).
    assert receiver.handled == [event_id]
    assert flaky.arrivals == [event_id]


def test_a_replay_racing_retention_finds_no_event_instead_of_failing(database: Engine) -> None:
    """Retention locks an old event FOR UPDATE and deletes it while a replay of it starts: the
    replay waits for the prune, then answers "no such event", never a foreign-key error."""
    if database.dialect.name != "postgresql":
        pytest.skip("SQLite runs one writer at a time: the replay cannot interleave with a prune")
    subscribe(database, "http://127.0.0.1:9/a")
    event_id = emit_one(database)
    outcome: list[BaseException | operations.Replayed] = []

    def replay() -> None:
        try:
            with session(database) as s:
                outcome.append(operations.replay_event(s, event_id))
        except BaseException as exc:  # the test reports whatever it was
            outcome.append(exc)

    with database.connect() as pruner:
        pruner.execute(sa.text("SELECT id FROM usp_events WHERE id = :id FOR UPDATE"), {"id": event_id})
        pruner.execute(sa.text("DELETE FROM usp_deliveries WHERE event_id = :id"), {"id": event_id})
        pruner.execute(sa.text("DELETE FROM usp_events WHERE id = :id"), {"id": event_id})
        replaying = threading.Thread(target=replay)
        replaying.start()
        _wait_until_blocked_on_a_lock(database)
        pruner.commit()
    replaying.join(10)

    [result] = outcome
    assert isinstance(result, operations.NotFound), repr(result)
    assert result.reason == "event_not_found"


def test_a_replay_of_an_event_pruned_while_it_ran_answers_not_found_with_the_reason(
    database: Engine, make_settings: MakeSettings
) -> None:
    """Retention prunes the event between the replay's read and its insert (the replay's clock is
    the hook): on SQLite, which has no row lock to hold retention off, the insert meets the
    foreign key and the replay answers "pruned", not an IntegrityError; on PostgreSQL the replay's
    key-share lock makes retention skip the event and the replay goes through."""
    subscribe(database, "http://127.0.0.1:9/a")
    event_id = emit_one(database)
    with database.begin() as connection:  # its delivery finished (dead): the event may be pruned
        connection.execute(
            sa.text("UPDATE usp_deliveries SET status = 'dead' WHERE event_id = :id"), {"id": event_id}
        )
    settings = make_settings(retention_days=1)

    def prune_then_tell_time() -> datetime:
        retention.prune_once(database, settings, now=utcnow() + timedelta(days=2))
        return utcnow()

    with session(database) as s:
        if database.dialect.name == "postgresql":
            replayed = operations.replay_event(s, event_id, now=prune_then_tell_time)
            assert len(replayed.deliveries) == 1
            return
        with pytest.raises(operations.NotFound) as refused:
            operations.replay_event(s, event_id, now=prune_then_tell_time)
    assert refused.value.reason == "event_not_found"
    assert "pruned" in str(refused.value)
    assert deliveries_of(database, event_id=event_id) == []
    with session(database) as s, pytest.raises(operations.NotFound, match="USP_RETENTION_DAYS"):
        operations.replay_event(s, event_id)


def _wait_until_blocked_on_a_lock(database: Engine) -> None:
    """Until some session of this database waits for a row lock (or fail after 10 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with database.connect() as connection:
            waiting = connection.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND query LIKE '%usp_events%'"
                )
            ).scalar_one()
        if waiting:
            return
        time.sleep(0.02)
    pytest.fail("nothing waited for the lock")


async def test_replay_to_one_subscription_back_fills_one_created_after_the_event(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    early = ClockedReceiver(jwks, clock)
    early_id = subscribe(database, endpoints.add("early", early))
    event_id = emit_one(database)
    await deliver_due(database, settings, client, clock)
    late = ClockedReceiver(jwks, clock)
    late_id = subscribe(database, endpoints.add("late", late))
    assert deliveries_of(database, subscription_id=late_id) == []

    with session(database) as s:
        replayed = operations.replay_event(s, event_id, subscription_id=late_id, now=clock)
    assert [sub for _, sub in replayed.deliveries] == [late_id]
    await deliver_due(database, settings, client, clock)

    assert late.arrivals == [event_id]
    assert early.arrivals == [event_id], "the other subscription got nothing more"
    assert [d.status for d in deliveries_of(database, subscription_id=late_id)] == [DeliveryStatus.SUCCEEDED]
    assert len(deliveries_of(database, subscription_id=early_id)) == 1


def test_replay_goes_only_where_the_event_may_go(database: Engine, endpoints: Endpoints) -> None:
    url = endpoints.add("sink", Answer(200))
    business = subscribe(database, url)
    platform_a = subscribe(database, url, profile=PLATFORM_A)
    platform_b = subscribe(database, url, profile=PLATFORM_B)
    waitlist_only = subscribe(database, url, types='["waitlist.*"]')
    disabled = subscribe(database, url)
    with session(database) as s:
        row = s.get(Subscription, disabled)
        assert row is not None
        row.state = SubscriptionState.DISABLED
        s.add(row)
        s.commit()
    event_id = emit_one(database, audience=PLATFORM_A)

    with session(database) as s:
        replayed = operations.replay_event(s, event_id)
        assert sorted(sub for _, sub in replayed.deliveries) == sorted([business, platform_a])
        for target, reason in [
            (platform_b, "audience_mismatch"),
            (waitlist_only, "event_type_not_subscribed"),
            (disabled, "subscription_disabled"),
        ]:
            with pytest.raises(operations.Conflict) as refused:
                operations.replay_event(s, event_id, subscription_id=target)
            assert refused.value.reason == reason
        with pytest.raises(operations.NotFound):
            operations.replay_event(s, event_id, subscription_id="sub_missing")
        with pytest.raises(operations.NotFound):
            operations.replay_event(s, "evt_missing")
    assert deliveries_of(database, subscription_id=platform_b) == []
    assert len(deliveries_of(database, event_id=event_id)) == 4  # emit's two, the replay's two


# -- recover ----------------------------------------------------------------------------------------


async def test_recover_after_a_ten_minute_outage_delivers_every_missed_event_once_more(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    """One receiver is down for 10 minutes (schedule 5 s, 1 min, 5 min: early events go dead,
    late ones are still backing off when it returns). Recover re-sends each of them once; the
    healthy subscription sees nothing new."""
    outage_start = utcnow()
    down = ClockedReceiver(jwks, clock)
    down.down = True
    healthy = ClockedReceiver(jwks, clock)
    down_id = subscribe(database, endpoints.add("down", down))
    healthy_id = subscribe(database, endpoints.add("healthy", healthy))
    before_outage = emit_one(database)  # delivered to both before the outage: not to recover
    down.down = False
    await deliver_due(database, settings, client, clock)
    down.down = True

    missed: list[str] = []
    for second in range(0, 600, 5):
        if second % 60 == 0:
            missed.append(emit_one(database))
        await deliver_due(database, settings, client, clock)
        clock.advance(5)
    down.down = False  # back after 10 minutes

    statuses = Counter(d.status for d in deliveries_of(database, subscription_id=down_id))
    assert statuses[DeliveryStatus.DEAD] >= 3, statuses
    assert statuses[DeliveryStatus.PENDING] >= 3, statuses
    assert down.arrivals == [before_outage]
    healthy_before = {d.id: d for d in deliveries_of(database, subscription_id=healthy_id)}
    assert healthy.arrivals == [before_outage, *missed]

    with session(database) as s:
        job = operations.start_recover(s, down_id, since=outage_start, now=clock)
    assert (job.status, job.total, job.processed) == ("running", len(missed), 0)
    finished = operations.run_job(database, job.id, batch_size=3, now=clock)
    assert (finished.status, finished.processed, finished.total) == ("succeeded", len(missed), len(missed))
    await settle(database, settings, client, clock)

    assert sorted(down.arrivals) == sorted([before_outage, *missed]), "every missed event, once more"
    assert down.refused == []
    latest: dict[str, Delivery] = {}
    for row in deliveries_of(database, subscription_id=down_id):
        latest[row.event_id] = row
    assert {e: d.status for e, d in latest.items()} == dict.fromkeys(
        [before_outage, *missed], DeliveryStatus.SUCCEEDED
    )
    # The healthy subscription: no new rows, no new tries, nothing new at its receiver.
    after = {d.id: d for d in deliveries_of(database, subscription_id=healthy_id)}
    assert after.keys() == healthy_before.keys()
    assert all(after[i].attempt_count == healthy_before[i].attempt_count == 1 for i in after)
    assert healthy.arrivals == [before_outage, *missed]

    # Run again: nothing is failed any more, so nothing is sent.
    with session(database) as s:
        again = operations.start_recover(s, down_id, since=outage_start, now=clock)
    assert operations.run_job(database, again.id, now=clock).processed == 0
    await deliver_due(database, settings, client, clock)
    assert len(down.arrivals) == len(missed) + 1


async def test_recover_takes_only_its_time_range_and_refuses_a_disabled_subscription(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    target = subscribe(database, endpoints.add("gone", Answer(500)))
    old, recent = emit_one(database), emit_one(database)
    set_created_at(database, old, utcnow() - timedelta(days=3))
    await settle(database, settings, client, clock)
    assert {d.status for d in deliveries_of(database)} == {DeliveryStatus.DEAD}

    with session(database) as s:
        job = operations.start_recover(s, target, since=utcnow() - timedelta(hours=1), now=clock)
    operations.run_job(database, job.id, now=clock)
    assert [d.event_id for d in deliveries_of(database) if d.status == DeliveryStatus.PENDING] == [recent]

    with session(database) as s:
        operations.set_subscription_state(s, target, enabled=False)
        with pytest.raises(operations.Conflict) as refused:
            operations.start_recover(s, target, since=utcnow() - timedelta(days=7))
    assert refused.value.reason == "subscription_disabled"


async def test_recover_back_fills_what_a_disabled_subscription_missed(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    """Events emitted while a subscription was disabled have no delivery to it at all. Recover
    with ``enable`` turns it back on and delivers each of them once (counted as back-filled),
    together with what failed before; events it does not match, or before the range, are left."""
    receiver = ClockedReceiver(jwks, clock)
    target = subscribe(database, endpoints.add("was-off", receiver))
    other = subscribe(database, endpoints.add("other", ClockedReceiver(jwks, clock)))
    start = utcnow()
    delivered = emit_one(database)
    await deliver_due(database, settings, client, clock)
    with session(database) as s:
        operations.set_subscription_state(s, target, enabled=False)
    missed = [emit_one(database) for _ in range(5)]
    await deliver_due(database, settings, client, clock)
    assert [d.event_id for d in deliveries_of(database, subscription_id=target)] == [delivered]
    too_old = missed.pop(0)
    set_created_at(database, too_old, start - timedelta(hours=2))

    with session(database) as s:
        with pytest.raises(operations.Conflict):
            operations.start_recover(s, target, since=start - timedelta(minutes=1))
        job = operations.start_recover(s, target, since=start - timedelta(minutes=1), enable=True, now=clock)
    assert (job.status, job.total, job.backfilled) == ("running", len(missed), 0)
    finished = operations.run_job(database, job.id, batch_size=2, now=clock)
    assert (finished.status, finished.processed, finished.backfilled) == ("succeeded", 4, 4)
    await settle(database, settings, client, clock)

    assert sorted(receiver.arrivals) == sorted([delivered, *missed]), "each missed event once"
    assert too_old not in receiver.arrivals
    assert len(deliveries_of(database, subscription_id=other)) == 6, "the other subscription: nothing new"
    with session(database) as s:
        again = operations.start_recover(s, target, since=start - timedelta(minutes=1), now=clock)
    assert (again.total, operations.run_job(database, again.id, now=clock).backfilled) == (0, 0)


def test_recover_back_fills_only_what_was_accepted_while_the_subscription_existed_and_was_off(
    database: Engine, endpoints: Endpoints
) -> None:
    """An event accepted before the subscription was created was never its to have, and one
    accepted while it was on has its delivery (or had, until retention): neither is back-filled,
    on a subscription never disabled nor on one that was, and the count says so."""
    before_it = emit_one(database)
    target = subscribe(database, endpoints.add("late", Answer(200)))
    while_on = emit_one(database)
    with database.begin() as connection:  # its delivery pruned, as retention does to old rows
        connection.execute(sa.delete(Delivery).where(col(Delivery.event_id) == while_on))

    with session(database) as s:
        never_off = operations.start_recover(s, target, since=utcnow() - timedelta(hours=2))
    assert (never_off.total, operations.run_job(database, never_off.id).backfilled) == (0, 0)
    assert deliveries_of(database, subscription_id=target) == []

    with session(database) as s:
        operations.set_subscription_state(s, target, enabled=False)
    while_off = emit_one(database)
    with session(database) as s:
        job = operations.start_recover(s, target, since=utcnow() - timedelta(hours=2), enable=True)
    after_on = emit_one(database)
    assert (job.total, operations.run_job(database, job.id).backfilled) == (1, 1)
    got = {d.event_id for d in deliveries_of(database, subscription_id=target)}
    assert got == {while_off, after_on}, (before_it, while_on)


def test_a_subscription_whose_disable_notice_was_pruned_is_off_from_the_oldest_moment_known(
    database: Engine, endpoints: Endpoints
) -> None:
    target = subscribe(database, endpoints.add("off", Answer(200)))
    with session(database) as s:
        operations.set_subscription_state(s, target, enabled=False)
    missed = emit_one(database)
    with database.begin() as connection:
        connection.execute(sa.delete(Notice).where(col(Notice.kind) == "subscription.disabled"))
    with session(database) as s:
        job = operations.start_recover(s, target, since=utcnow() - timedelta(hours=1), enable=True)
    assert operations.run_job(database, job.id).backfilled == 1
    assert [d.event_id for d in deliveries_of(database, subscription_id=target)] == [missed]


def test_a_job_resumes_from_its_cursor_and_never_sends_a_row_twice(
    database: Engine, endpoints: Endpoints
) -> None:
    target = subscribe(database, endpoints.add("sink", Answer(200)))
    events = [emit_one(database) for _ in range(7)]
    with database.begin() as connection:
        connection.execute(sa.update(Delivery).values(status=DeliveryStatus.DEAD.value, attempt_count=8))
    with session(database) as s:
        job = operations.start_recover(s, target, since=utcnow() - timedelta(hours=1))
    sent: list[Sequence[str]] = []
    assert operations.step_job(database, job.id, enqueue=sent.append, batch_size=3)
    assert operations.step_job(database, job.id, enqueue=sent.append, batch_size=3)
    # The runner dies here; another picks the job up (a redelivered task).
    with session(database) as s:
        midway = operations.get_job(s, job.id)
    assert (midway.status, midway.processed) == ("running", 6)
    final = operations.run_job(database, job.id, enqueue=sent.append, batch_size=3)
    assert (final.status, final.processed) == ("succeeded", 7)
    handed = [i for batch in sent for i in batch]
    assert len(handed) == len(set(handed)) == 7
    fresh = [d for d in deliveries_of(database) if d.status == DeliveryStatus.PENDING]
    assert sorted(d.id for d in fresh) == sorted(handed)
    assert sorted(d.event_id for d in fresh) == sorted(events)
    assert all(d.enqueued_at is not None for d in fresh), "handed to the broker: marked as sent"
    # A finished job does nothing more.
    assert not operations.step_job(database, job.id, enqueue=sent.append)


def stall_a_job(engine: Engine, target: str, events: int) -> str:
    """A recover job over ``events`` dead deliveries whose runner died after two batches of 3."""
    for _ in range(events):
        emit_one(engine)
    with engine.begin() as connection:
        connection.execute(sa.update(Delivery).values(status=DeliveryStatus.DEAD.value, attempt_count=8))
    with session(engine) as s:
        job = operations.start_recover(s, target, since=utcnow() - timedelta(hours=1))
    assert operations.step_job(engine, job.id, enqueue=lambda _ids: None, batch_size=3)
    assert operations.step_job(engine, job.id, enqueue=lambda _ids: None, batch_size=3)
    return job.id


def test_the_scheduler_sends_a_job_whose_runner_died_again(
    database: Engine, endpoints: Endpoints, make_settings: MakeSettings
) -> None:
    target = subscribe(database, endpoints.add("sink", Answer(200)))
    job_id = stall_a_job(database, target, 7)
    with Session(database) as s:
        stalled = s.get(Job, job_id)
        assert stalled is not None
        last_progress = stalled.updated_at
    settings = make_settings(broker_url="redis://127.0.0.1:1/0", job_stale_after_seconds=60.0)
    resent: list[str] = []

    def relay_at(seconds: float) -> int:
        moment = last_progress + timedelta(seconds=seconds)
        return relay_once(database, settings, lambda _ids: None, now=moment, enqueue_job=resent.append).jobs

    assert relay_at(59) == 0, "a job that moved within job_stale_after_seconds is left to its runner"
    assert relay_at(61) == 1
    assert resent == [job_id]
    assert relay_at(61) == 0, "taken once: a second scheduler at the same moment finds nothing"
    assert relay_at(120) == 0, "re-sent at 61 s: not stale again before 121 s"
    assert relay_at(122) == 1
    assert resent == [job_id, job_id]

    # A worker runs what it was sent: the job goes on after its last committed batch.
    sent: list[Sequence[str]] = []
    final = operations.run_job(database, job_id, enqueue=sent.append, batch_size=3)
    assert (final.status, final.processed) == ("succeeded", 7)
    assert len([i for batch in sent for i in batch]) == 1, "only the row after the cursor"
    assert relay_at(10_000) == 0, "a finished job is never sent again"


def test_a_job_whose_runner_keeps_dying_on_one_batch_is_failed_not_resent_forever(
    database: Engine, endpoints: Endpoints, make_settings: MakeSettings
) -> None:
    """A poison batch kills every worker that runs it: after MAX_JOB_RESENDS re-sends without a
    committed batch the scheduler marks the job failed instead of taking down another worker.
    A batch committed in between starts the count again."""
    target = subscribe(database, endpoints.add("sink", Answer(200)))
    job_id = stall_a_job(database, target, 7)
    settings = make_settings(broker_url="redis://127.0.0.1:1/0", job_stale_after_seconds=60.0)
    resent: list[str] = []
    moment = utcnow()

    def relay_later() -> int:
        nonlocal moment
        moment += timedelta(seconds=61)
        return relay_once(database, settings, lambda _ids: None, now=moment, enqueue_job=resent.append).jobs

    assert [relay_later() for _ in range(2)] == [1, 1]
    assert operations.step_job(database, job_id, batch_size=1, now=lambda: moment), "one batch: progress"
    assert [relay_later() for _ in range(operations.MAX_JOB_RESENDS)] == [1] * operations.MAX_JOB_RESENDS
    assert relay_later() == 0, "the runner died once more without progress: not sent again"
    assert resent == [job_id] * (2 + operations.MAX_JOB_RESENDS)
    with session(database) as s:
        job = operations.get_job(s, job_id)
    assert job.status == "failed"
    assert job.error == "its runner died 4 times without finishing a batch; not sent again"
    assert relay_later() == 0


def test_the_scheduler_loop_resends_stalled_jobs(
    tmp_path: Path, endpoints: Endpoints, make_settings: MakeSettings
) -> None:
    url = f"sqlite:///{tmp_path / 'usp.sqlite3'}"
    engine = make_engine(url)
    try:
        upgrade(engine)
        target = subscribe(engine, endpoints.add("sink", Answer(200)))
        job_id = stall_a_job(engine, target, 4)
        settings = make_settings(
            database_url=url,
            broker_url="redis://127.0.0.1:1/0",
            relay_interval_seconds=0.05,
            job_stale_after_seconds=0.2,
        )
        resent: list[str] = []
        stop = threading.Event()
        relay = threading.Thread(
            target=run_relay,
            args=(settings,),
            kwargs={"stop": stop, "enqueue": lambda _ids: None, "enqueue_job": resent.append},
        )
        relay.start()
        try:
            for _ in range(400):
                if resent:
                    break
                stop.wait(0.05)
        finally:
            stop.set()
            relay.join(10)
        assert not relay.is_alive()
        assert set(resent) == {job_id}
        final = operations.run_job(engine, job_id, enqueue=lambda _ids: None, batch_size=3)
        assert (final.status, final.processed) == ("succeeded", 4)
    finally:
        engine.dispose()


def test_a_job_without_an_enqueuer_leaves_its_deliveries_to_the_relay(
    database: Engine, endpoints: Endpoints
) -> None:
    target = subscribe(database, endpoints.add("sink", Answer(200)))
    emit_one(database)
    with database.begin() as connection:
        connection.execute(sa.update(Delivery).values(status=DeliveryStatus.DEAD.value))
    with session(database) as s:
        job = operations.start_recover(s, target, since=utcnow() - timedelta(hours=1))
    operations.run_job(database, job.id)
    (fresh,) = [d for d in deliveries_of(database) if d.status == DeliveryStatus.PENDING]
    assert fresh.enqueued_at is None, "unsent: the relay's next pass sends it"


# -- dead letter --------------------------------------------------------------------------------------


async def test_redrive_filtered_and_all(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    first = ClockedReceiver(jwks, clock)
    second = ClockedReceiver(jwks, clock)
    first.down = second.down = True
    first_id = subscribe(database, endpoints.add("first", first))
    subscribe(database, endpoints.add("second", second))
    confirmed = emit_one(database, event_body("booking.confirmed"))
    cancelled = emit_one(database, event_body("booking.cancelled"))
    await settle(database, settings, client, clock)
    first.down = second.down = False

    with session(database) as s:
        listed = page_through(lambda **kw: operations.dead_letter(s, DeadLetterFilter(), **kw), limit=3)
        assert len(listed) == 4
        assert {d.event_type for d in listed} == {"booking.confirmed", "booking.cancelled"}
        for item in listed:  # each item shows why it died
            assert [a.outcome for a in item.attempts] == ["retry", "retry", "retry", "dead"]
            assert item.attempts[-1].status_code == 503
        mine = operations.dead_letter(s, DeadLetterFilter(subscription_id=first_id)).items
        assert [d.subscription_id for d in mine] == [first_id, first_id]
        job = operations.start_redrive(
            s, DeadLetterFilter(subscription_id=first_id, event_type="booking.cancelled")
        )
    assert job.total == 1
    operations.run_job(database, job.id, now=clock)
    await settle(database, settings, client, clock)
    assert first.arrivals == [cancelled]
    assert second.arrivals == []
    with session(database) as s:
        (redriven,) = [d for d in deliveries_of(database) if d.status == DeliveryStatus.SUPERSEDED]
        assert (redriven.subscription_id, redriven.event_id) == (first_id, cancelled)
        successor = s.get(Delivery, redriven.superseded_by)
        assert successor is not None
        assert (successor.status, successor.event_id) == (DeliveryStatus.SUCCEEDED, cancelled)
        assert len(operations.dead_letter(s, DeadLetterFilter()).items) == 3, "it left the dead letter"

    with session(database) as s:
        everything = operations.start_redrive(s, DeadLetterFilter())
    assert everything.total == 3, "the redriven row is superseded: not taken again"
    operations.run_job(database, everything.id, now=clock)
    await settle(database, settings, client, clock)
    assert sorted(first.arrivals) == sorted([cancelled, confirmed])
    assert sorted(second.arrivals) == sorted([cancelled, confirmed])
    with session(database) as s:
        # The dead rows stay as history (superseded, each naming its successor); the dead letter is empty.
        assert operations.dead_letter(s, DeadLetterFilter()).items == []
        assert operations.start_redrive(s, DeadLetterFilter()).total == 0
    statuses = Counter(d.status for d in deliveries_of(database))
    assert statuses == {DeliveryStatus.SUPERSEDED: 4, DeliveryStatus.SUCCEEDED: 4}


def test_redrive_skips_disabled_subscriptions(database: Engine, endpoints: Endpoints) -> None:
    url = endpoints.add("sink", Answer(200))
    active = subscribe(database, url)
    disabled = subscribe(database, url)
    emit_one(database)
    with database.begin() as connection:
        connection.execute(sa.update(Delivery).values(status=DeliveryStatus.DEAD.value))
    with session(database) as s:
        operations.set_subscription_state(s, disabled, enabled=False)
        job = operations.start_redrive(s, DeadLetterFilter())
    operations.run_job(database, job.id)
    pending = [d.subscription_id for d in deliveries_of(database) if d.status == DeliveryStatus.PENDING]
    assert pending == [active]


# -- subscriptions ------------------------------------------------------------------------------------


async def test_subscriptions_list_with_health_and_enable_disable(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    good = ClockedReceiver(jwks, clock)
    good_id = subscribe(database, endpoints.add("good", good))
    bad_id = subscribe(database, endpoints.add("bad", Answer(500)))
    idle_id = subscribe(database, endpoints.add("idle", Answer(200)), types='["waitlist.*"]')
    for _ in range(3):
        emit_one(database)
    await deliver_due(database, settings, client, clock)

    with session(database) as s:
        listed = page_through(lambda **kw: operations.list_subscriptions(s, now=clock, **kw), limit=2)
    health = {h.id: h for h in listed}
    assert [h.id for h in listed] == [good_id, bad_id, idle_id]
    assert (health[good_id].recent_attempts, health[good_id].success_rate) == (3, 1.0)
    assert (health[bad_id].recent_attempts, health[bad_id].success_rate) == (3, 0.0)
    assert health[bad_id].pending == 3
    assert health[bad_id].consecutive_failures >= 1
    assert health[bad_id].last_success_at is None
    assert (health[idle_id].recent_attempts, health[idle_id].success_rate) == (0, None)

    with session(database) as s:
        off = operations.set_subscription_state(s, bad_id, enabled=False, now=clock)
        assert (off.state, off.disabled_reason) == ("disabled", operations.DISABLED_BY_OPERATOR)
        assert [h.id for h in operations.list_subscriptions(s, state=SubscriptionState.DISABLED).items] == [
            bad_id
        ]
        with database.begin() as connection:  # as if its breaker had opened before
            connection.execute(
                sa.update(Subscription)
                .where(col(Subscription.id) == bad_id)
                .values(breaker_state="open", breaker_until=clock() + timedelta(minutes=5))
            )
        s.expire_all()
        on = operations.set_subscription_state(s, bad_id, enabled=True, now=clock)
        assert (on.state, on.disabled_reason, on.consecutive_failures, on.failing_since) == (
            "active",
            None,
            0,
            None,
        )
        assert (on.breaker_state, on.breaker_until) == ("closed", None)
        kinds = s.exec(select(Notice.kind).where(Notice.subscription_id == bad_id)).all()
    assert list(kinds) == ["subscription.disabled", "subscription.enabled"]


def test_a_deleted_subscription_stays_deleted(database: Engine, endpoints: Endpoints) -> None:
    deleted = subscribe(database, endpoints.add("sink", Answer(200)))
    with session(database) as s:
        row = s.get(Subscription, deleted)
        assert row is not None
        row.state, row.disabled_reason = SubscriptionState.DISABLED, operations.DELETED
        s.add(row)
        s.commit()
        with pytest.raises(operations.Conflict) as refused:
            operations.set_subscription_state(s, deleted, enabled=True)
    assert refused.value.reason == "subscription_deleted"


def test_a_job_that_fails_is_marked_failed(database: Engine) -> None:
    with session(database) as s:
        job = Job(kind="no-such-kind", params=json.dumps({"max_delivery_id": "dlv_z"}))
        s.add(job)
        s.commit()
        job_id = job.id
    with pytest.raises(ValueError, match="unknown job kind"):
        operations.run_job(database, job_id)
    with session(database) as s:
        failed = operations.get_job(s, job_id)
    assert (failed.status, failed.error) == (JobStatus.FAILED.value, "ValueError")
    with session(database) as s:
        resumed = operations.resume_job(s, job_id)
    assert (resumed.status, resumed.error, resumed.finished_at) == ("running", None, None)


# -- with real processes ---------------------------------------------------------------------------


class Switch:
    """``app`` while up; ``503`` while ``down``."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.down = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.down:
            await respond(send, 503, b"down")
            return
        await self.app(scope, receive, send)


@pytest.mark.parametrize("pipeline", [("redis", "postgresql")], indirect=True, ids=["redis-postgresql"])
def test_recover_job_runs_in_a_real_worker_after_an_outage(
    pipeline: Pipeline,
    start_worker: StartWorker,
    start_relay: StartRelay,
    endpoints: Endpoints,
    hub: Hub,
) -> None:
    """Redis, PostgreSQL, a Celery worker and the scheduler as subprocesses. One receiver is down
    while events are emitted until every delivery to it is dead (the schedule is compressed to
    1 s steps, so the outage outlasts it as a 10-minute one outlasts the real schedule's first
    tries); the recover job goes through Redis to the worker (``usp.run_job``), which sends each
    missed event once more. The healthy subscription's deliveries are untouched."""
    pipeline.fields["breaker_threshold"] = 0  # about recovery, not the breaker's pause
    engine = pipeline.engine
    jwks = jwks_of(pipeline)
    down = UspReceiver(jwks)
    switch = Switch(down)
    healthy = UspReceiver(jwks)
    down_id = pipeline_subscribe(engine, endpoints.add("down", switch))
    healthy_id = pipeline_subscribe(engine, endpoints.add("healthy", healthy))
    worker = start_worker()
    relay = start_relay()
    worker.wait_ready()
    relay.wait_ready()
    celery = tasks.install_enqueuer(pipeline.settings)

    since = utcnow()
    switch.down = True
    missed = emit_events(engine, 5)
    wait_for_status(engine, DeliveryStatus.DEAD, 5, 60, worker.diagnose, relay.output)
    wait_for_status(engine, DeliveryStatus.SUCCEEDED, 5, 60, worker.diagnose)
    healthy_before = {d.id: d.attempt_count for d in deliveries_of(engine, subscription_id=healthy_id)}
    tries_during_outage = len(hub.seen(endpoints.path("down")))
    assert down.handled == []
    switch.down = False

    with session(engine) as s:
        job = operations.start_recover(s, down_id, since=since)
    assert job.total == 5
    tasks.enqueue_job(job.id, app=celery)
    deadline = time.monotonic() + 60
    while sorted(down.handled) != sorted(missed):
        if time.monotonic() > deadline:
            pytest.fail(f"not recovered: {down.handled}\n{worker.diagnose()}")
        time.sleep(0.05)

    # The job is marked done after its last delivery's answer came back, a moment after the
    # receiver handled it.
    while (status := _job_status(engine, job.id)) == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status == "succeeded"
    assert len(hub.seen(endpoints.path("down"))) == tries_during_outage + 5, "each missed event once more"
    after = {d.id: d.attempt_count for d in deliveries_of(engine, subscription_id=healthy_id)}
    assert after == healthy_before, "the healthy subscription: no new deliveries, no new tries"
    assert sorted(healthy.handled) == sorted(missed)
