"""The embedded broker's doorbell: a put wakes an idle consumer of the same broker at once."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from tests.workers.conftest import MakeSettings
from tests.workers.support import consuming
from usp_workers.runtime import embedded_broker, tasks
from usp_workers.runtime.celery_app import make_celery
from usp_workers.runtime.doorbell import Doorbell, doorbell_folder


def test_a_ring_wakes_every_consumer_of_the_broker_and_only_its(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two spellings of one SQLite file share a doorbell; another file's consumer sleeps on."""
    monkeypatch.chdir(tmp_path)
    mine, spelled_otherwise, other = (
        Doorbell(f"sqlite:///{tmp_path / 'broker.sqlite3'}"),
        Doorbell("sqlite:///broker.sqlite3"),
        Doorbell(f"sqlite:///{tmp_path / 'other.sqlite3'}"),
    )
    producer = Doorbell(f"sqlite:///{tmp_path / 'broker.sqlite3'}")
    try:
        for bell in (mine, spelled_otherwise, other):
            assert bell.listen() is not None
        assert mine.folder == spelled_otherwise.folder != other.folder
        assert len(str(mine.folder)) < 60, "socket paths must stay short"
        producer.ring()
        assert mine.wait(0), "a ring before the wait counts"
        assert spelled_otherwise.wait(0)
        assert not mine.wait(0), "and is used up"
        assert not other.wait(0)
        woken: list[bool] = []
        waiter = threading.Thread(target=lambda: woken.append(mine.wait(30)))
        waiter.start()
        time.sleep(0.05)
        producer.ring()
        waiter.join(10)
        assert woken == [True]
    finally:
        for bell in (mine, spelled_otherwise, other, producer):
            bell.close()
    assert not any(mine.folder.iterdir()), "a closed consumer removes its socket"


def test_a_killed_consumers_socket_is_cleared_by_the_next_ring(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'broker.sqlite3'}"
    folder = doorbell_folder(url)
    folder.mkdir(mode=0o700, exist_ok=True)
    dead = folder / "999999-dead"
    orphan = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    orphan.bind(str(dead))
    orphan.close()  # the file stays, as a SIGKILLed consumer leaves it
    producer = Doorbell(url)
    try:
        producer.ring()
        assert not dead.exists()
    finally:
        producer.close()


def test_a_doorbell_in_someone_elses_folder_is_not_used(tmp_path: Path) -> None:
    """A folder others may write to is not trusted: the consumer polls instead."""
    url = f"sqlite:///{tmp_path / 'broker.sqlite3'}"
    folder = doorbell_folder(url)
    folder.mkdir(mode=0o700, exist_ok=True)
    folder.chmod(0o777)
    bell = Doorbell(url)
    try:
        assert bell.listen() is None
        assert bell.wait(0.01) is False
    finally:
        bell.close()
        folder.chmod(0o700)


def test_an_idle_embedded_consumer_is_woken_by_a_put_not_by_its_poll(
    make_settings: MakeSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the poll and the wait slice set to a minute, only the doorbell can deliver a message
    published while the consumer waits."""
    monkeypatch.setattr(embedded_broker, "EMBEDDED_DRAIN_SLICE", 60.0)
    monkeypatch.setattr(embedded_broker.EmbeddedTransport, "polling_interval", 60.0)
    broker = f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}"
    consumer_app, producer_app = (make_celery(make_settings(broker_url=broker)) for _ in range(2))
    try:
        with consuming(consumer_app) as (connection, got):
            publisher = threading.Timer(0.3, tasks.enqueue_deliveries, (["dlv_1"],), {"app": producer_app})
            publisher.start()
            started = time.monotonic()
            connection.drain_events(timeout=60)
            waited = time.monotonic() - started
            publisher.join()
    finally:
        consumer_app.close()
        producer_app.close()
    assert [body[0] for body in got] == [[["dlv_1"]]]
    assert waited < 30, "woken by the put, not after the minute's poll"
