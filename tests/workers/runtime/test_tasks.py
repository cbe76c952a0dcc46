"""The hand-off to the broker: batching, the outbox enqueuer, and a broker that is down.

The embedded broker (a SQLite file in the test's folder) stands in for any broker here: what is
checked is what gets published, read back from its message table.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import select

from tests.workers.conftest import MakeSettings
from tests.workers.support import (
    Pipeline,
    add_subscription,
    booking_event,
    consuming,
    delivery,
    emit_event,
)
from usp_core.db import session
from usp_dispatcher.cli.config import Settings
from usp_workers.engine import outbox
from usp_workers.runtime import tasks
from usp_workers.runtime.celery_app import DELIVER_TASK, QUEUE, make_celery
from usp_workers.runtime.embedded_broker import EMBEDDED_DRAIN_SLICE, celery_broker, make_broker_engine
from usp_workers.storage.models import Delivery, EventRecord


@pytest.fixture(autouse=True)
def _no_enqueuer_left() -> Iterator[None]:
    yield
    tasks.uninstall_enqueuer()


def published(broker_url: str) -> list[dict[str, Any]]:
    """The messages in an embedded broker, oldest first: their headers and decoded arguments."""
    engine = make_broker_engine(broker_url)
    try:
        with engine.connect() as connection:
            payloads = connection.execute(sa.text("SELECT payload FROM kombu_message ORDER BY id")).scalars()
            messages = [json.loads(p) for p in payloads]
    finally:
        engine.dispose()
    for message in messages:
        message["args"] = json.loads(base64.b64decode(message["body"]))[0]
    return messages


def test_ids_are_sent_in_batches_of_batch_size(make_settings: MakeSettings, tmp_path: Path) -> None:
    broker = f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}"
    celery = make_celery(make_settings(broker_url=broker, batch_size=50))
    ids = [f"dlv_{n:03}" for n in range(120)]
    try:
        assert tasks.enqueue_deliveries(ids, app=celery) == 3
    finally:
        celery.close()

    messages = published(broker)
    assert [m["headers"]["task"] for m in messages] == [DELIVER_TASK] * 3
    assert [m["properties"]["delivery_info"]["routing_key"] for m in messages] == [QUEUE] * 3
    assert [m["args"] for m in messages] == [[ids[:50]], [ids[50:100]], [ids[100:]]]
    assert all(m["content-type"] == "application/json" for m in messages)


def test_emit_hands_committed_deliveries_to_the_broker(
    database: Engine, make_settings: MakeSettings, tmp_path: Path
) -> None:
    broker = f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}"
    for name in ("a", "b"):
        add_subscription(database, f"https://{name}.example/hooks")
    tasks.install_enqueuer(make_settings(broker_url=broker))

    _, delivery_ids = emit_event(database)
    assert tasks.flush_enqueuer()

    [message] = published(broker)
    assert sorted(message["args"][0]) == sorted(delivery_ids)


def test_on_the_embedded_broker_commits_are_published_at_once_never_held(
    database: Engine, make_settings: MakeSettings, tmp_path: Path
) -> None:
    """No worker takes anything, so messages wait (a backlog by the hand-off's measure); still,
    with a minute's interval, every commit is in the broker without a flush."""
    broker = f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}"
    add_subscription(database, "https://a.example/hooks")
    tasks.install_enqueuer(make_settings(broker_url=broker, handoff_interval_seconds=60.0))
    sent = [delivery_id for _ in range(3) for delivery_id in emit_event(database)[1]]
    deadline = time.monotonic() + 10
    got: list[str] = []
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
        with contextlib.suppress(sa.exc.OperationalError):  # before the first publish: no table
            got = [delivery_id for m in published(broker) for delivery_id in m["args"][0]]
    # (Commits made while a publish is under way go together in the next one.)
    assert got == sent, "every commit published within seconds, none held for the interval"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # nothing listens there once the socket is closed


def test_a_broker_that_is_down_never_fails_the_emitting_transaction(
    database: Engine, make_settings: MakeSettings, caplog: pytest.LogCaptureFixture
) -> None:
    add_subscription(database, "https://a.example/hooks")
    tasks.install_enqueuer(make_settings(broker_url=f"redis://127.0.0.1:{_closed_port()}/0"))

    with caplog.at_level(logging.WARNING, logger="usp_workers"):
        _, [delivery_id] = emit_event(database)
        started = time.monotonic()
        assert tasks.flush_enqueuer(), "the hand-off gives up"
        elapsed = time.monotonic() - started

    assert elapsed < 10, "the hand-off gives up quickly (the relay re-sends later)"
    [failure] = [r for r in caplog.records if r.getMessage().startswith("broker unavailable (")]
    assert failure.threadName == "usp-handoff", "the committing thread never waits for the broker"
    row: Delivery = delivery(database, delivery_id)
    assert row.enqueued_at is not None, "marked as handed off: the relay re-sends it after requeue_after"


def test_uninstalled_enqueuer_leaves_deliveries_to_the_relay(
    database: Engine, make_settings: MakeSettings, tmp_path: Path
) -> None:
    broker = f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}"
    add_subscription(database, "https://a.example/hooks")
    tasks.install_enqueuer(make_settings(broker_url=broker))
    tasks.uninstall_enqueuer()

    emit_event(database)

    assert not (tmp_path / "broker.sqlite3").exists(), "nothing was published"


def test_embedded_broker_is_kombus_sql_transport_without_its_url_prefix() -> None:
    url, transport = celery_broker("sqla+sqlite:////data/usp-broker.sqlite3")
    settings = Settings(_env_file=None, broker_url="sqla+sqlite:////data/usp-broker.sqlite3")
    celery = make_celery(settings)
    assert (celery.conf.broker_url, celery.conf.broker_transport) == (url, transport)
    assert celery.conf.broker_transport_options == {}, "kombu passes SQL transport options to create_engine"
    assert celery.conf.task_acks_late
    assert celery.conf.task_reject_on_worker_lost
    assert celery.conf.worker_prefetch_multiplier == 1
    assert celery.conf.task_ignore_result


def test_an_embedded_broker_wait_ends_after_its_slice_and_still_delivers(
    make_settings: MakeSettings, tmp_path: Path
) -> None:
    """Celery's loop for polling transports waits up to 2 s per call and looks at its shutdown
    flag only between calls: each wait is cut to the slice, so a stopping worker is not held."""
    broker = f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}"
    celery = make_celery(make_settings(broker_url=broker))
    try:
        with consuming(celery) as (connection, got):
            started = time.monotonic()
            with pytest.raises(socket.timeout):
                connection.drain_events(timeout=60)
            waited = time.monotonic() - started
            tasks.enqueue_deliveries(["dlv_1"], app=celery)
            deadline = time.monotonic() + 30
            while not got and time.monotonic() < deadline:
                with contextlib.suppress(socket.timeout):
                    connection.drain_events(timeout=60)
    finally:
        celery.close()

    assert EMBEDDED_DRAIN_SLICE <= 1
    assert waited < 10  # not the 60 s asked for
    assert [body[0] for body in got] == [[["dlv_1"]]]  # args: (ids,)


def test_an_embedded_consumer_fetches_oldest_first_and_marks_what_it_took_as_kombu_does(
    make_settings: MakeSettings, tmp_path: Path
) -> None:
    """The fetch is ours (two Core statements), the table kombu's: what it took is hidden, its
    version bumped and its timestamp set to the fetch (pruning reads it); the rest stays."""
    broker = f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}"
    celery = make_celery(make_settings(broker_url=broker))
    try:
        for n in range(3):
            tasks.enqueue_deliveries([f"dlv_{n}"], app=celery)
        before = dt.datetime.now()
        with consuming(celery) as (connection, got):
            while len(got) < 2:
                connection.drain_events(timeout=5)
    finally:
        celery.close()
    assert [body[0][0] for body in got] == [["dlv_0"], ["dlv_1"]]
    engine = make_broker_engine(broker)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                sa.text("SELECT visible, version, timestamp FROM kombu_message ORDER BY id")
            ).all()
    finally:
        engine.dispose()
    assert [(bool(r.visible), r.version) for r in rows] == [(False, 2), (False, 2), (True, 1)]
    assert all(dt.datetime.fromisoformat(str(r.timestamp)) >= before for r in rows[:2])


@pytest.mark.parametrize("pipeline", [("redis", "sqlite")], ids=["redis"], indirect=True)
def test_redis_keeps_one_copy_of_a_message_and_gets_back_what_a_closing_consumer_held(
    pipeline: Pipeline,
) -> None:
    """No acknowledgement emulation on Redis (the database's lease brings back what a dead worker
    held): a message a worker took is in its memory only, not copied to kombu's ``unacked`` keys;
    a consumer that closes without acknowledging it (a stopping worker) puts it back."""
    celery = make_celery(pipeline.settings)
    client = redis.Redis.from_url(pipeline.settings.broker_url_resolved)
    try:
        tasks.enqueue_deliveries(["dlv_1", "dlv_2"], app=celery)
        with celery.connection_for_read() as connection:
            channel = connection.channel()
            message = celery.amqp.queues[QUEUE](channel).get(no_ack=False)
            assert message is not None
            assert message.payload[0] == [["dlv_1", "dlv_2"]]
            assert tasks.waiting_messages(celery) == 0
            assert client.exists("unacked", "unacked_index") == 0, "kombu kept a copy in Redis"
            channel.close()
        assert tasks.waiting_messages(celery) == 1, "the unacknowledged message went back"
    finally:
        client.close()
        celery.close()


def test_a_rolled_back_emit_writes_nothing_and_hands_off_nothing(database: Engine) -> None:
    """The outbox's hooks live on the Session class: a rollback must drop what the undone
    transaction queued, so the session's next commit hands off only its own deliveries."""
    add_subscription(database, "https://a.example/hooks")
    handed: list[list[str]] = []
    outbox.set_enqueuer(lambda ids: handed.append(list(ids)))
    try:
        with session(database) as s:
            dropped = outbox.emit(s, booking_event()).id
            s.flush()  # its delivery row is written in the transaction, then undone
            s.rollback()
            kept = outbox.emit(s, booking_event()).id
            s.commit()
    finally:
        outbox.set_enqueuer(None)

    with session(database) as s:
        kept_ids = list(s.exec(select(Delivery.id).where(Delivery.event_id == kept)).all())
        dropped_ids = list(s.exec(select(Delivery.id).where(Delivery.event_id == dropped)).all())
        assert s.get(EventRecord, dropped) is None
    assert len(kept_ids) == 1
    assert dropped_ids == []
    assert handed == [kept_ids]


@pytest.mark.parametrize(
    "pipeline",
    [("redis", "sqlite"), ("embedded", "sqlite"), ("amqp", "sqlite")],
    ids=["redis", "embedded", "rabbitmq"],
    indirect=True,
)
def test_waiting_messages_counts_what_no_worker_took(pipeline: Pipeline) -> None:
    """The hand-off's load signal, on every broker: an empty (or never declared) queue is 0."""
    celery = make_celery(pipeline.settings)
    assert tasks.waiting_messages(celery) == 0
    tasks.enqueue_deliveries([f"dlv_{n}" for n in range(3)], app=celery)
    deadline = time.monotonic() + 10  # RabbitMQ's count follows its queue a moment later
    while tasks.waiting_messages(celery) != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tasks.waiting_messages(celery) == 1  # one message of three ids (batch_size is 50)
