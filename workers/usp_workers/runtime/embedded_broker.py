"""The embedded broker: kombu's SQLAlchemy transport on a SQLite file, made fit for several processes.

What it fixes in kombu's transport (polling, locking, growth) and what it cannot do:
docs/architecture.md, "The embedded broker".
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
from functools import cached_property
from queue import Empty
from time import monotonic
from typing import Any

import sqlalchemy as sa
from kombu.transport import sqlalchemy as kombu_sqla
from sqlalchemy.engine import Engine

from usp_core.db import sqlite_pragmas
from usp_workers.runtime.doorbell import Doorbell

__all__ = [
    "EMBEDDED_DRAIN_SLICE",
    "EMBEDDED_POLLING_INTERVAL",
    "TRANSPORT_PATH",
    "EmbeddedTransport",
    "celery_broker",
    "make_broker_engine",
    "prune_consumed",
]

logger = logging.getLogger("usp_workers")

#: Seconds an idle consumer waits for its doorbell before it polls the embedded broker anyway.
#:
#: Every message put rings the doorbell of every consumer of the file on this machine
#: (:mod:`usp_workers.runtime.doorbell`), so an idle consumer fetches it at once; the poll only
#: catches what no ring announced (a producer on another machine sharing a SQL broker). Each poll
#: is a SQLite write transaction, so a long interval also keeps an idle worker's CPU and the
#: file's write lock free. With a 0.05 s poll and no doorbell, ``bench/pipeline.py --only
#: embedded`` gave enqueue→2xx p50 58-60 ms: most messages waited on the poll.
EMBEDDED_POLLING_INTERVAL = 0.25
#: Seconds one ``drain_events`` call may wait for a message (see
#: :meth:`EmbeddedTransport.drain_events`).
EMBEDDED_DRAIN_SLICE = 0.25
#: How Celery finds :class:`EmbeddedTransport` (the ``broker_transport`` setting).
TRANSPORT_PATH = "usp_workers.runtime.embedded_broker:EmbeddedTransport"
_PREFIXES = ("sqla+", "sqlalchemy+")
_MESSAGE_TABLE = "kombu_message"


class _EmbeddedChannel(kombu_sqla.Channel):
    """kombu's channel, with an engine tuned for several processes on one SQLite file, that rings
    the file's doorbell for every message it puts (after its commit), and fetches in two Core
    statements on a queue id it looked up once.

    Why the fetch: kombu's ``_get`` looks the queue's row up and loads the message through the ORM
    on every call; at a steady ~1,200 deliveries/s that was 38% of a worker's CPU (a 15 s py-spy
    of ``bench/pipeline.py --only embedded``'s paced phase). The statements are the same: the
    oldest visible message of the queue, locked (``BEGIN IMMEDIATE`` on SQLite, ``FOR UPDATE``
    elsewhere), then hidden, its version bumped and its timestamp set to the fetch, as kombu's
    ORM update does (pruning reads that timestamp).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self._queue_ids: dict[str, int] = {}

    def _put(self, queue: Any, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        super()._put(queue, payload, **kwargs)  # type: ignore[no-untyped-call]
        self.connection.doorbell.ring()

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        queue_id = self._queue_ids.get(queue)
        if queue_id is None:
            queue_id = self._queue_ids[queue] = self._get_or_create(queue).id  # type: ignore[no-untyped-call]
        session = self.session
        oldest, hide = _fetch_statements(self.message_cls.__table__)
        if session.bind.name == "sqlite":
            session.execute(sa.text("BEGIN IMMEDIATE TRANSACTION"))
        try:
            row = session.execute(oldest, {"queue_id": queue_id}).first()
            if row is None:
                raise Empty()
            session.execute(hide, {"message_id": row.id, "fetched_at": dt.datetime.now()})
            return json.loads(row.payload)
        finally:
            session.commit()

    def _purge(self, queue: Any) -> Any:
        self._queue_ids.pop(queue, None)
        return super()._purge(queue)  # type: ignore[no-untyped-call]

    def _engine_from_config(self) -> Engine:
        options = self.connection.client.transport_options
        # kombu hands every unknown option to create_engine; polling_interval is ours, not its.
        options.pop("polling_interval", None)
        engine: Engine = super()._engine_from_config()  # type: ignore[no-untyped-call]
        if engine.dialect.name == "sqlite":
            sa.event.listen(engine, "connect", _sqlite_pragmas)
        return engine


class EmbeddedTransport(kombu_sqla.Transport):
    """kombu's SQLAlchemy transport, polling every :data:`EMBEDDED_POLLING_INTERVAL` seconds, and
    waiting at most :data:`EMBEDDED_DRAIN_SLICE` seconds per ``drain_events`` call."""

    Channel = _EmbeddedChannel
    polling_interval = EMBEDDED_POLLING_INTERVAL

    @cached_property
    def doorbell(self) -> Doorbell:
        assert self.client is not None
        return Doorbell(self.client.hostname or "")

    def drain_events(self, connection: Any, timeout: Any = None, **kwargs: Any) -> None:
        """kombu's loop (fetch; when empty, wait and fetch again), waiting on the doorbell
        instead of sleeping a fixed interval.

        Why the slice: Celery's loop for polling transports asks for up to 2 s per call and
        looks at its shutdown flag only between calls, so a worker told to stop (SIGTERM,
        Ctrl-C on ``usp-webhooks up``) went on polling for up to 2 s first. A shorter wait
        only means the loop comes round more often when idle."""
        if timeout is not None:
            timeout = min(timeout, EMBEDDED_DRAIN_SLICE)
        started = monotonic()
        doorbell, cycle = self.doorbell, self.cycle
        assert cycle is not None
        doorbell.listen()
        while True:
            try:
                cycle.get(self._deliver, timeout=timeout)  # type: ignore[no-untyped-call]
                return
            except Empty:
                left = None if timeout is None else timeout - (monotonic() - started)
                if left is not None and left <= 0:
                    raise TimeoutError() from None
                doorbell.wait(self.polling_interval if left is None else min(left, self.polling_interval))

    def close_connection(self, connection: Any) -> None:
        super().close_connection(connection)  # type: ignore[no-untyped-call]
        if "doorbell" in self.__dict__:
            self.doorbell.close()


@functools.cache
def _fetch_statements(table: sa.Table) -> tuple[sa.Select[Any], sa.Update]:
    """The oldest visible message of a queue (locked), and hiding one: built once per table."""
    c = table.c
    oldest = (
        sa.select(c.id, c.payload)
        .where(c.queue_id == sa.bindparam("queue_id"), c.visible != sa.false())
        .order_by(c.timestamp, c.id)
        .limit(1)
        .with_for_update()
    )
    hide = (
        sa.update(table)
        .where(c.id == sa.bindparam("message_id"))
        .values(visible=False, timestamp=sa.bindparam("fetched_at"), version=c.version + 1)
    )
    return oldest, hide


def is_sql_broker(url: str) -> bool:
    """Whether ``url`` names kombu's SQLAlchemy transport (``sqla+…`` or ``sqlalchemy+…``)."""
    return url.startswith(_PREFIXES)


def celery_broker(url: str) -> tuple[str, str | None]:
    """The ``(broker_url, broker_transport)`` Celery gets for ``url``: a SQL broker URL loses its
    prefix and names :class:`EmbeddedTransport`; any other URL is passed through unchanged.

    >>> celery_broker("sqla+sqlite:///b.sqlite3")
    ('sqlite:///b.sqlite3', 'usp_workers.runtime.embedded_broker:EmbeddedTransport')
    >>> celery_broker("redis://127.0.0.1:6379/0")
    ('redis://127.0.0.1:6379/0', None)
    """
    for prefix in _PREFIXES:
        if url.startswith(prefix):
            return url.removeprefix(prefix), TRANSPORT_PATH
    return url, None


def make_broker_engine(url: str) -> Engine:
    """An engine on a SQL broker's database (for pruning), with the transport's SQLite tuning."""
    target, _ = celery_broker(url)
    if target.startswith("sqlite"):
        engine = sa.create_engine(target, connect_args={"check_same_thread": False, "timeout": 30})
        sa.event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return sa.create_engine(target, pool_pre_ping=True, pool_size=2)


_metadata = sa.MetaData()
#: The columns of kombu's message table that pruning needs (kombu declares the full table).
_messages = sa.Table(
    _MESSAGE_TABLE,
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("visible", sa.Boolean),
    # kombu stamps it with naive local time (datetime.now) when a consumer fetches the row.
    sa.Column("timestamp", sa.DateTime),
)


def prune_consumed(
    engine: Engine,
    *,
    older_than: dt.timedelta = dt.timedelta(minutes=1),
    now: dt.datetime | None = None,
    chunk: int = 500,
    max_chunks: int = 40,
) -> int:
    """Delete messages consumers fetched more than ``older_than`` ago; return how many.

    Deleting them loses nothing: kombu never shows a fetched row again (it restores unacked
    messages by publishing new rows). The minute of grace keeps rows of the moment for anyone
    inspecting the file. Deletes go in transactions of ``chunk`` rows, because each holds the
    file's write lock, which every consumer's next poll needs; at most ``max_chunks`` per call,
    so one pass stays short and the next pass continues.
    """
    if not sa.inspect(engine).has_table(_MESSAGE_TABLE):
        return 0  # no consumer or producer has opened the broker yet
    moment = now if now is not None else dt.datetime.now(dt.UTC)
    # kombu's timestamps are naive local time: compare in the same terms.
    cutoff = (moment - older_than).astimezone().replace(tzinfo=None)
    consumed = (
        sa.select(_messages.c.id)
        .where(_messages.c.visible == sa.false(), _messages.c.timestamp < cutoff)
        .limit(chunk)
    )
    total = 0
    for _ in range(max_chunks):
        with engine.begin() as connection:
            deleted = connection.execute(
                sa.delete(_messages).where(_messages.c.id.in_(consumed.scalar_subquery()))
            )
        total += deleted.rowcount
        if deleted.rowcount < chunk:
            break
    return total


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    sqlite_pragmas(dbapi_connection, foreign_keys=False)
