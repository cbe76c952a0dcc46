"""Retention: old events (with their deliveries) and old attempts go, in batches; recent rows and
any event with unfinished work stay."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, SQLModel, col, func, select

from tests.workers.conftest import MakeSettings
from tests.workers.support import add_subscription, emit_event
from usp_core.clock import utcnow
from usp_core.db import make_engine
from usp_workers.runtime.relay import run_relay
from usp_workers.storage.migrate import upgrade
from usp_workers.storage.models import Attempt, Delivery, DeliveryStatus, EventRecord, Notice, Transport
from usp_workers.storage.retention import prune_once

_events = SQLModel.metadata.tables[EventRecord.__tablename__]
_deliveries = SQLModel.metadata.tables[Delivery.__tablename__]
_attempts = SQLModel.metadata.tables[Attempt.__tablename__]


def age(engine: Engine, event_id: str, days: float, status: DeliveryStatus, *, attempts: int = 2) -> None:
    """Make ``event_id`` ``days`` old, its deliveries ``status``, each with ``attempts`` attempts
    that old."""
    then = utcnow() - timedelta(days=days)
    with engine.begin() as connection:
        connection.execute(sa.update(_events).where(_events.c.id == event_id).values(created_at=then))
        ids = list(
            connection.execute(
                sa.select(_deliveries.c.id).where(_deliveries.c.event_id == event_id)
            ).scalars()
        )
        connection.execute(
            sa.update(_deliveries)
            .where(_deliveries.c.event_id == event_id)
            .values(status=status.value, created_at=then)
        )
        for delivery_id in ids:
            for number in range(1, attempts + 1):
                connection.execute(
                    sa.insert(_attempts).values(
                        delivery_id=delivery_id,
                        attempt_number=number,
                        started_at=then,
                        duration_ms=12.5,
                        status_code=500,
                        error_class="http_status",
                        outcome="retry",
                    )
                )


def count(engine: Engine, model: type[SQLModel], **where: str) -> int:
    with Session(engine) as s:
        statement = select(func.count()).select_from(model)
        for name, value in where.items():
            statement = statement.where(col(getattr(model, name)) == value)
        return int(s.exec(statement).one())


def test_old_rows_go_in_batches_recent_and_unfinished_ones_stay(
    database: Engine, make_settings: MakeSettings
) -> None:
    settings = make_settings(retention_days=30.0)
    add_subscription(database, "http://127.0.0.1:9/a")
    add_subscription(database, "http://127.0.0.1:9/b", Transport.JSONRPC)
    old_done = [emit_event(database)[0] for _ in range(5)]
    for event_id in old_done:
        age(database, event_id, 31, DeliveryStatus.SUCCEEDED)
    old_dead = emit_event(database)[0]
    age(database, old_dead, 45, DeliveryStatus.DEAD)
    old_pending = emit_event(database)[0]
    age(database, old_pending, 40, DeliveryStatus.PENDING)
    old_in_flight = emit_event(database)[0]
    age(database, old_in_flight, 40, DeliveryStatus.IN_FLIGHT)
    recent = emit_event(database)[0]
    age(database, recent, 29, DeliveryStatus.SUCCEEDED)
    with Session(database) as s:
        s.add(
            Notice(
                subscription_id="sub_x",
                kind="subscription.disabled",
                created_at=utcnow() - timedelta(days=31),
            )
        )
        s.add(Notice(subscription_id="sub_x", kind="subscription.disabled"))
        s.commit()

    # A pass with a small budget stops with work left and says so. The budget counts rows:
    # each event here has two deliveries, so a batch of 3 rows takes one event (two would be
    # four rows), and a batch of 1 row still takes one (an event is never split).
    first = prune_once(database, settings, batch=3, max_batches=1)
    assert (first.events, first.deliveries, first.more) == (1, 2, True)
    second = prune_once(database, settings, batch=1, max_batches=1)
    assert (second.events, second.deliveries, second.more) == (1, 2, True)

    rest = prune_once(database, settings, batch=4, max_batches=50)
    assert not rest.more
    assert first.events + second.events + rest.events == 6  # five succeeded, one dead
    assert first.deliveries + second.deliveries + rest.deliveries == 12
    for event_id in [*old_done, old_dead]:
        assert count(database, EventRecord, id=event_id) == 0
        assert count(database, Delivery, event_id=event_id) == 0
    for event_id in (old_pending, old_in_flight, recent):
        assert count(database, EventRecord, id=event_id) == 1
        assert count(database, Delivery, event_id=event_id) == 2
    # Old attempts go even when their delivery stays (its history keeps its recent tries);
    # the recent event's attempts (29 days) stay.
    assert count(database, Attempt) == 4
    with Session(database) as s:
        kept = s.exec(
            select(Delivery.event_id).join(Attempt, col(Attempt.delivery_id) == col(Delivery.id))
        ).all()
    assert set(kept) == {recent}
    assert count(database, Notice) == 1

    assert prune_once(database, settings) == type(rest)()  # nothing left to do


def test_zero_keeps_everything(database: Engine, make_settings: MakeSettings) -> None:
    add_subscription(database, "http://127.0.0.1:9/a")
    event_id = emit_event(database)[0]
    age(database, event_id, 400, DeliveryStatus.SUCCEEDED)
    report = prune_once(database, make_settings(retention_days=0))
    assert not report.busy
    assert count(database, EventRecord, id=event_id) == 1


def test_the_scheduler_runs_retention(tmp_path: Path, make_settings: MakeSettings) -> None:
    url = f"sqlite:///{tmp_path / 'usp.sqlite3'}"
    engine = make_engine(url)
    try:
        upgrade(engine)
        add_subscription(engine, "http://127.0.0.1:9/a")
        old = emit_event(engine)[0]
        age(engine, old, 31, DeliveryStatus.SUCCEEDED)
        fresh = emit_event(engine)[0]
        age(engine, fresh, 1, DeliveryStatus.SUCCEEDED)
        settings = make_settings(
            database_url=url,
            broker_url="redis://127.0.0.1:1/0",
            relay_interval_seconds=0.05,
            retention_days=30,
        )
        stop = threading.Event()
        relay = threading.Thread(
            target=run_relay, args=(settings,), kwargs={"stop": stop, "enqueue": lambda _ids: None}
        )
        relay.start()
        try:
            for _ in range(200):
                if count(engine, EventRecord, id=old) == 0:
                    break
                stop.wait(0.05)
        finally:
            stop.set()
            relay.join(10)
        assert count(engine, EventRecord, id=old) == 0
        assert count(engine, EventRecord, id=fresh) == 1
    finally:
        engine.dispose()


def test_a_dead_delivery_being_redriven_neither_waits_nor_deadlocks_retention(
    database: Engine, make_settings: MakeSettings
) -> None:
    """A recover/redrive batch locks an old event's dead delivery, then inserts its new delivery
    (whose foreign key needs the event row). Retention must skip that event, not lock it and wait
    for the delivery: that order deadlocks on PostgreSQL and one side is aborted (a failed job).
    SQLite runs one writer at a time, so there retention simply runs after the batch."""
    settings = make_settings(retention_days=30.0)
    subscription = add_subscription(database, "http://127.0.0.1:9/a")
    event_id, (dead_id,) = emit_event(database)
    age(database, event_id, 45, DeliveryStatus.DEAD)
    errors: list[BaseException] = []

    def prune() -> None:
        try:
            prune_once(database, settings)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    pruner = threading.Thread(target=prune)
    concurrent = database.dialect.name == "postgresql"
    with database.connect() as job:
        if concurrent:
            job.execute(sa.select(_deliveries.c.id).where(_deliveries.c.id == dead_id).with_for_update())
            pruner.start()
            pruner.join(timeout=10)  # with the defect it waits for our lock: we go on regardless
        now = utcnow()
        job.execute(
            sa.insert(_deliveries).values(
                id="dlv_redriven",
                event_id=event_id,
                subscription_id=subscription.id,
                status=DeliveryStatus.PENDING.value,
                attempt_count=0,
                next_attempt_at=now,
                created_at=now,
                updated_at=now,
            )
        )
        job.commit()
    if not concurrent:
        pruner.start()
    pruner.join()
    assert errors == []
    assert count(database, EventRecord, id=event_id) == 1
    assert count(database, Delivery, event_id=event_id) == 2
