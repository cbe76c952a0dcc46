"""Per-subject ordering in the engine (SQLite and PostgreSQL): a subject's deliveries go one at a
time in emission order, a failing one holds back only its own subject, and a dead one blocks
(visibly) or is skipped, as the subscription chose. Retries are driven by a moved clock.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from tests.workers.conftest import MakeSettings
from tests.workers.endpoints import Receive, Scope, Send, read_body, respond
from tests.workers.support import Clock, Endpoints, attempts, delivery
from usp_core.clock import utcnow
from usp_core.db import session
from usp_dispatcher.cli.config import Settings
from usp_receiver import JWKS
from usp_schemas import BOOKING_CONFIRMED_EXAMPLE, new_event_id
from usp_workers import operations
from usp_workers.engine import ordering
from usp_workers.engine.delivery import deliver_batch
from usp_workers.engine.outbox import emit
from usp_workers.runtime.relay import hold_blocked, mark_due, release_held
from usp_workers.storage.models import Delivery, DeliveryStatus, OnDead, Ordering, Subscription

pytestmark = pytest.mark.anyio


@dataclass
class ByEvent:
    """Answers 500 to the events in ``failing``, 204 to the rest; ``arrived`` in arrival order."""

    failing: set[str] = field(default_factory=set)
    arrived: list[str] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        event_id = json.loads(await read_body(receive))["event_id"]
        self.arrived.append(event_id)
        await respond(send, 500 if event_id in self.failing else 204)


def ordered_subscription(engine: Engine, url: str, on_dead: OnDead = OnDead.BLOCK) -> str:
    with Session(engine) as s:
        row = Subscription(url=url, ordering=Ordering.SUBJECT, on_dead=on_dead)
        s.add(row)
        s.commit()
        return row.id


def emit_for(engine: Engine, booking_id: str, clock: Clock) -> tuple[str, str]:
    """Emit a booking.confirmed event about ``booking_id``; its id and its one delivery's."""
    event = json.loads(BOOKING_CONFIRMED_EXAMPLE)
    event["event_id"] = new_event_id()
    event["booking_id"] = event["data"]["id"] = booking_id
    with session(engine) as s:
        record = emit(s, event)
        s.commit()
        [delivery_id] = s.exec(select(Delivery.id).where(Delivery.event_id == record.id)).all()
    return record.id, delivery_id


def pending_ids(engine: Engine) -> list[str]:
    with Session(engine) as s:
        return list(
            s.exec(
                select(Delivery.id)
                .where(col(Delivery.status) == DeliveryStatus.PENDING)
                .order_by(col(Delivery.id))
            ).all()
        )


async def test_a_subjects_events_go_one_at_a_time_and_a_failure_holds_back_only_its_subject(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    settings = make_settings(retry_schedule=(5.0,) * 5)
    endpoint = ByEvent()
    ordered_subscription(database, endpoints.add("ordered", endpoint))
    a = [emit_for(database, "bkg_a", clock) for _ in range(3)]
    b = [emit_for(database, "bkg_b", clock) for _ in range(2)]
    endpoint.failing.add(a[0][0])

    # Handed every delivery at once, the engine claims only each subject's first.
    report = await deliver_batch(database, settings, pending_ids(database), client=client, now=clock)
    assert report.claimed == 2
    assert endpoint.arrived == [a[0][0], b[0][0]] or endpoint.arrived == [b[0][0], a[0][0]]
    # b's first settled, so b's second is let go (no broker here: left for the scheduler's pass);
    # a's first failed and waits for its retry, and a's later events wait behind it.
    assert report.released == [b[1][1]]
    assert [row for row, _ in mark_due(database, settings, now=clock())] == [b[1][1]]

    report = await deliver_batch(database, settings, pending_ids(database), client=client, now=clock)
    assert report.claimed == 1
    assert endpoint.arrived[-1] == b[1][0]

    # The retry comes due and succeeds: a's second goes next, then its third.
    endpoint.failing.clear()
    clock.advance(5.1)
    for expected in a:
        report = await deliver_batch(database, settings, pending_ids(database), client=client, now=clock)
        assert report.claimed == 1
        assert endpoint.arrived[-1] == expected[0]
    assert pending_ids(database) == []
    assert [e for e in endpoint.arrived if e in {x for x, _ in a}] == [a[0][0], a[0][0], a[1][0], a[2][0]]


async def test_unordered_subscriptions_are_not_held_back(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    endpoint = ByEvent()
    with Session(database) as s:
        s.add(Subscription(url=endpoints.add("unordered", endpoint)))
        s.commit()
    events = [emit_for(database, "bkg_a", clock) for _ in range(4)]
    endpoint.failing.add(events[0][0])
    report = await deliver_batch(database, settings, pending_ids(database), client=client, now=clock)
    assert report.claimed == 4
    assert sorted(endpoint.arrived) == sorted(e for e, _ in events)
    with Session(database) as s:
        assert s.exec(select(Delivery.subject_key)).all() == [None] * 4


async def test_a_dead_delivery_blocks_its_subject_visibly_until_redriven(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    settings = make_settings(retry_schedule=(1.0,))
    endpoint = ByEvent()
    sub = ordered_subscription(database, endpoints.add("blocking", endpoint))
    poison, *held = [emit_for(database, "bkg_poison", clock) for _ in range(3)]
    other = emit_for(database, "bkg_other", clock)
    endpoint.failing.add(poison[0])

    await deliver_batch(database, settings, pending_ids(database), client=client, now=clock)
    clock.advance(1.1)
    report = await deliver_batch(database, settings, pending_ids(database), client=client, now=clock)
    assert report.dead == 1
    assert report.released == []  # dead under "block": nothing behind it may go
    assert delivery(database, other[1]).status == DeliveryStatus.SUCCEEDED  # other subjects flowed
    report = await deliver_batch(database, settings, pending_ids(database), client=client, now=clock)
    assert report.claimed == 0

    # Visible: the admin view names the subject, its dead delivery and what waits; so does the gauge.
    with database.connect() as connection:
        [blocked] = ordering.blocked_subjects(connection, sub)
        assert ordering.blocked_counts(connection) == {sub: 1}
    assert (blocked.subject, blocked.delivery_id, blocked.event_id, blocked.waiting) == (
        "bkg_poison",
        poison[1],
        poison[0],
        2,
    )
    with Session(database) as s:
        health = operations.subscription_health(s, sub)
    assert health.blocked_subjects == 1

    # Redriven, the new delivery takes the dead one's place, and the rest follow in order.
    endpoint.failing.clear()
    with Session(database) as s:
        operations.replay_event(s, poison[0], subscription_id=sub, now=clock)
    for expected in [poison, *held]:
        report = await deliver_batch(database, settings, pending_ids(database), client=client, now=clock)
        assert report.claimed == 1
        assert endpoint.arrived[-1] == expected[0]
    with database.connect() as connection:
        assert ordering.blocked_subjects(connection, sub) == []
        assert ordering.blocked_counts(connection) == {}


async def test_under_skip_a_dead_delivery_lets_its_subject_go_on(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    settings = make_settings(retry_schedule=())
    endpoint = ByEvent()
    sub = ordered_subscription(database, endpoints.add("skipping", endpoint), on_dead=OnDead.SKIP)
    poison, after = (emit_for(database, "bkg_1", clock) for _ in range(2))
    endpoint.failing.add(poison[0])

    report = await deliver_batch(database, settings, pending_ids(database), client=client, now=clock)
    assert report.dead == 1
    assert report.released == [after[1]]
    report = await deliver_batch(database, settings, pending_ids(database), client=client, now=clock)
    assert report.succeeded == 1
    assert endpoint.arrived == [poison[0], after[0]]
    with database.connect() as connection:
        assert ordering.blocked_subjects(connection, sub) == []


def test_successors_are_each_finished_subjects_head_when_it_is_pending_and_due(
    database: Engine, endpoints: Endpoints, clock: Clock
) -> None:
    """What a settled ordered delivery lets go: per subject, its earliest unsettled delivery,
    only if that one is pending and due; one head per subject, whatever else is pending behind it."""
    ordered_subscription(database, endpoints.add("heads", ByEvent()))
    a = [emit_for(database, "bkg_a", clock)[1] for _ in range(3)]
    b = [emit_for(database, "bkg_b", clock)[1] for _ in range(2)]
    c = [emit_for(database, "bkg_c", clock)[1] for _ in range(2)]
    now = clock()
    with session(database) as s:
        for done in (a[0], b[0], c[0]):
            s.get_one(Delivery, done).status = DeliveryStatus.SUCCEEDED
        s.get_one(Delivery, b[1]).next_attempt_at = now + timedelta(seconds=30)  # its retry is not due
        s.get_one(Delivery, c[1]).status = DeliveryStatus.IN_FLIGHT  # already taken
        s.commit()

    def handed_at() -> dict[str, object]:
        with Session(database) as s:
            return {d.id: d.enqueued_at for d in s.exec(select(Delivery)).all()}

    before = handed_at()
    with database.begin() as connection:
        assert ordering.successors(connection, [a[0], b[0], c[0]], now=now, handed=True) == [a[1]]
    assert handed_at() == before | {a[1]: now}  # the one released is marked handed, nothing else
    with database.begin() as connection:  # not handed: left (unmarked) for the scheduler's next pass
        assert ordering.successors(connection, [a[0]], now=now, handed=False) == [a[1]]
        assert ordering.successors(connection, [], now=now, handed=True) == []
    with Session(database) as s:
        assert s.get_one(Delivery, a[1]).enqueued_at is None


def held_ids(engine: Engine) -> set[str]:
    with Session(engine) as s:
        return set(s.exec(select(Delivery.id).where(col(Delivery.held))).all())


def settle(engine: Engine, delivery_id: str, status: DeliveryStatus = DeliveryStatus.SUCCEEDED) -> None:
    """Settle a delivery the way no engine path does (retention, an operator's SQL): nothing is
    released behind it."""
    with session(engine) as s:
        s.get_one(Delivery, delivery_id).status = status
        s.commit()


def test_the_relay_holds_what_waits_behind_its_subject_and_the_heads_end_releases_the_next(
    database: Engine, make_settings: MakeSettings, endpoints: Endpoints, clock: Clock
) -> None:
    """A due delivery behind an earlier one of its subject is held once, and then left out of
    every pass (a pass's cost no longer grows with what waits); its subject's head settling
    releases the next one; the sweep frees what was settled by any other path."""
    settings = make_settings()
    ordered_subscription(database, endpoints.add("held", ByEvent()))
    a = [emit_for(database, "bkg_a", clock)[1] for _ in range(3)]
    c = [emit_for(database, "bkg_c", clock)[1] for _ in range(2)]
    _, b = emit_for(database, "bkg_b", clock)
    settle(database, a[0], DeliveryStatus.IN_FLIGHT)  # taken by a worker: a's others wait
    settle(database, c[0], DeliveryStatus.IN_FLIGHT)
    # Handed to the broker at emit a moment ago: not yet the relay's, so not held (a flowing
    # subject releases them before the relay would send them again).
    assert hold_blocked(database, settings, now=clock()) == 0
    clock.advance(settings.requeue_after_seconds + 1)
    now = clock()

    assert hold_blocked(database, settings, now=now) == 3
    assert held_ids(database) == {a[1], a[2], c[1]}
    assert [row for row, _ in mark_due(database, settings, now=now)] == [b]
    assert hold_blocked(database, settings, now=now) == 0  # held once, not tested again

    settle(database, a[0])
    with database.begin() as connection:
        assert ordering.successors(connection, [a[0]], now=now, handed=True) == [a[1]]
    assert held_ids(database) == {a[2], c[1]}

    # a[1] settled where nothing releases a[2] (say, an operator's UPDATE): the pass does not see
    # it, the sweep does, and leaves c[1], still behind c[0], held.
    settle(database, a[1])
    assert mark_due(database, settings, now=clock()) == []
    assert release_held(database) == 1
    assert held_ids(database) == {c[1]}
    assert [row for row, _ in mark_due(database, settings, now=clock())] == [a[2]]


async def test_a_held_delivery_a_worker_claims_is_the_relays_again_when_it_comes_back(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    """A held delivery whose subject's head settled can still be claimed from a message sent
    before it was held; if it fails, its retry must come due in the relay's scan, not wait for
    the sweep."""
    settings = make_settings(retry_schedule=(5.0,) * 5)
    endpoint = ByEvent()
    ordered_subscription(database, endpoints.add("claimed", endpoint))
    first, second = (emit_for(database, "bkg_a", clock) for _ in range(2))
    settle(database, first[1], DeliveryStatus.IN_FLIGHT)
    clock.advance(settings.requeue_after_seconds + 1)
    assert hold_blocked(database, settings, now=clock()) == 1
    settle(database, first[1])
    endpoint.failing.add(second[0])

    report = await deliver_batch(database, settings, [second[1]], client=client, now=clock)
    assert report.claimed == 1
    assert held_ids(database) == set()
    clock.advance(5.1)
    assert [row for row, _ in mark_due(database, settings, now=clock())] == [second[1]]


async def test_a_subjects_next_delivery_is_released_with_its_heads_outcome_in_one_transaction(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    """The database drops the connection as the worker releases the subject's next delivery: the
    head's outcome and the release are one transaction, retried together, so the next delivery
    is handed over at once, not left held until the scheduler's sweep; the head's try is
    recorded once."""
    settings = make_settings()
    endpoint = ByEvent()
    ordered_subscription(database, endpoints.add("ordered", endpoint))
    first, second = (emit_for(database, "bkg_a", clock) for _ in range(2))
    settle(database, first[1], DeliveryStatus.IN_FLIGHT)
    clock.advance(settings.requeue_after_seconds + 1)
    assert hold_blocked(database, settings, now=clock()) == 1  # second waits, held
    settle(database, first[1], DeliveryStatus.PENDING)
    failures: list[str] = []

    def drop_the_release(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().startswith("UPDATE usp_deliveries") and " later" in statement and not failures:
            failures.append(statement)
            raise sa.exc.OperationalError(statement, {}, ConnectionResetError("server closed the connection"))

    handed: list[Sequence[str]] = []
    sa.event.listen(database, "before_cursor_execute", drop_the_release)
    try:
        report = await deliver_batch(
            database, settings, [first[1]], client=client, now=clock, enqueue=handed.append
        )
    finally:
        sa.event.remove(database, "before_cursor_execute", drop_the_release)
    assert len(failures) == 1
    assert report.released == [second[1]]
    assert handed == [[second[1]]]
    assert held_ids(database) == set()
    assert delivery(database, first[1]).status == DeliveryStatus.SUCCEEDED
    assert len(attempts(database, first[1])) == 1


def test_an_events_place_sorts_by_time_then_id() -> None:
    moment = utcnow()
    places = [ordering.place(moment, "evt_b"), ordering.place(moment, "evt_a")]
    assert sorted(places) == [ordering.place(moment, "evt_a"), ordering.place(moment, "evt_b")]
    assert ordering.subject_of(Ordering.NONE, "bkg_1", moment, "evt_a") == (None, None)
    assert ordering.subject_of(Ordering.SUBJECT, None, moment, "evt_a") == (None, None)
    assert ordering.subject_of("subject", "bkg_1", moment, "evt_a") == ("bkg_1", places[1])
