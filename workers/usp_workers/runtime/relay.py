"""The scheduler: one loop that turns the database's schedule into broker messages.

Each pass reclaims expired leases, enqueues due deliveries, re-sends stalled jobs, prunes the
embedded broker and runs retention (why the schedule is in the database: docs/architecture.md,
"Celery carries wake-ups").
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from types import FrameType
from typing import Any

import sqlalchemy as sa
from kombu.utils.url import maybe_sanitize_url
from sqlalchemy.engine import Engine
from sqlmodel import SQLModel

from usp_core.clock import utcnow
from usp_core.db import make_engine, session
from usp_workers.engine import health
from usp_workers.engine.health import HealthPolicy
from usp_workers.engine.ordering import unblocked
from usp_workers.engine.outage import BROKER_OUTAGE, DATABASE_OUTAGE, database_unavailable
from usp_workers.engine.outbox import Enqueue
from usp_workers.operations import announce_notices, lapse_leases, reclaim_stale_jobs
from usp_workers.runtime.embedded_broker import make_broker_engine, prune_consumed
from usp_workers.runtime.logs import configure_logging
from usp_workers.settings import SchedulerSettings
from usp_workers.storage.models import Delivery, DeliveryStatus, Subscription
from usp_workers.storage.retention import RetentionReport, RetentionSchedule, prune_once

__all__ = [
    "MAX_ROUNDS",
    "RELAY_LIMIT",
    "EnqueueJob",
    "RelayReport",
    "endpoint_batch_size",
    "hold_blocked",
    "mark_due",
    "plan_batches",
    "reclaim_expired_leases",
    "relay_once",
    "release_held",
    "run_relay",
]

logger = logging.getLogger("usp_workers")

#: Deliveries marked per round; a full round is followed by another, up to :data:`MAX_ROUNDS`.
RELAY_LIMIT = 5000
#: Rounds per pass: a huge backlog is worked off over several passes, so lease reclaiming and
#: pruning keep their rhythm.
MAX_ROUNDS = 20
#: Seconds after the database answers again before expired leases are reclaimed: a worker that
#: held its outcomes through the outage writes them within a second or two of its return
#: (the batch's close in :mod:`usp_workers.engine.delivery`), and a reclaim first would send them again.
RECLAIM_HOLD_OFF_SECONDS = 15.0

#: Sends one recover/redrive job to the workers (:func:`usp_workers.runtime.tasks.enqueue_job`, bound).
EnqueueJob = Callable[[str], None]

_deliveries: sa.Table = SQLModel.metadata.tables[Delivery.__tablename__]
_subscriptions: sa.Table = SQLModel.metadata.tables[Subscription.__tablename__]


@dataclass(frozen=True, slots=True)
class RelayReport:
    """What one :func:`relay_once` pass did."""

    reclaimed: int = 0  #: expired leases turned back into pending deliveries
    enqueued: int = 0  #: deliveries sent to the broker
    batches: int = 0  #: tasks sent
    failed: int = 0  #: deliveries marked but not sent (broker error); re-sent after requeue_after
    pruned: int = 0  #: consumed embedded-broker messages deleted
    jobs: int = 0  #: stalled recover/redrive jobs sent to the workers again
    disabled: int = 0  #: subscriptions disabled after failing continuously behind an open breaker
    held: int = 0  #: ordered deliveries found behind an earlier one of their subject, now held
    released: int = 0  #: held deliveries the sweep found free (their subject's head settled)
    lapsed: int = 0  #: leased subscriptions (listeners') deleted, their lease not renewed

    @property
    def busy(self) -> bool:
        """Whether the pass did anything worth a log line."""
        return any(
            (
                self.reclaimed,
                self.enqueued,
                self.failed,
                self.pruned,
                self.jobs,
                self.disabled,
                self.held,
                self.released,
                self.lapsed,
            )
        )


def relay_once(
    engine: Engine,
    settings: SchedulerSettings,
    enqueue: Enqueue,
    *,
    now: datetime | None = None,
    limit: int = RELAY_LIMIT,
    broker_engine: Engine | None = None,
    enqueue_job: EnqueueJob | None = None,
    reclaim: bool = True,
    sweep: bool = True,
) -> RelayReport:
    """One scheduler pass at ``now``: reclaim expired leases (unless ``reclaim`` is false),
    release held deliveries whose subject is free (unless ``sweep`` is false), hold the due ones
    that are not, enqueue due deliveries, re-send stalled jobs (only with ``enqueue_job``),
    disable the subscriptions failing for too long behind an open breaker, delete those whose
    lease lapsed, prune.

    ``enqueue`` sends one batch (:func:`usp_workers.runtime.tasks.enqueue_deliveries` bound to an app).
    When it raises, the pass stops sending: the rest of the marked deliveries are re-sent
    ``requeue_after_seconds`` later, which also paces retries against a broker that is down.
    A job ``enqueue_job`` fails to send is taken again ``job_stale_after_seconds`` later.
    ``broker_engine`` is the embedded broker's database (made on demand when it is in use).
    """
    moment = now if now is not None else utcnow()
    reclaimed = reclaim_expired_leases(engine, now=moment) if reclaim else 0
    released = release_held(engine) if sweep else 0
    held = hold_blocked(engine, settings, now=moment)
    enqueued = batches = failed = 0
    for _ in range(MAX_ROUNDS):
        rows = mark_due(engine, settings, now=moment, limit=limit)
        sent, sent_batches, unsent = _send(plan_batches(rows, settings), enqueue)
        enqueued += sent
        batches += sent_batches
        if unsent:
            failed += unsent
            break
        if len(rows) < limit:
            break
    jobs = 0
    if enqueue_job is not None:
        jobs = _resend_jobs(engine, settings, enqueue_job, moment)
    with engine.begin() as connection:
        disabled = health.disable_failing(connection, HealthPolicy.from_settings(settings), now=moment)
        lapsed = lapse_leases(connection, now=moment)
    with session(engine) as s:  # after the disables above, so this pass announces them too
        announce_notices(s)
    pruned = 0
    if settings.uses_embedded_broker:
        pruned = _prune(broker_engine, settings, moment)
    return RelayReport(
        reclaimed=reclaimed,
        enqueued=enqueued,
        batches=batches,
        failed=failed,
        pruned=pruned,
        jobs=jobs,
        disabled=len(disabled),
        held=held,
        released=released,
        lapsed=len(lapsed),
    )


def reclaim_expired_leases(engine: Engine, *, now: datetime) -> int:
    """Turn ``in_flight`` deliveries whose lease expired before ``now`` back into due ``pending``
    ones (``enqueued_at`` null, so this pass sends them); return how many."""
    statement = (
        sa.update(_deliveries)
        .where(
            _deliveries.c.status == DeliveryStatus.IN_FLIGHT.value,
            _deliveries.c.lease_until < now,
        )
        .values(status=DeliveryStatus.PENDING.value, lease_until=None, enqueued_at=None, updated_at=now)
    )
    with engine.begin() as connection:
        return connection.execute(statement).rowcount


def hold_blocked(
    engine: Engine, settings: SchedulerSettings, *, now: datetime, limit: int = RELAY_LIMIT * MAX_ROUNDS
) -> int:
    """Hold up to ``limit`` ordered deliveries that :func:`mark_due` would send but for an earlier
    one of their subject (:func:`usp_workers.engine.ordering.unblocked` is false): out of
    ``ix_usp_deliveries_sendable``, they are no longer tested on every pass. The earlier one's
    end releases its successor (:func:`usp_workers.engine.ordering.successors`);
    :func:`release_held` catches what other paths free. Returns how many were held.

    A delivery handed to the broker less than ``requeue_after_seconds`` ago is left alone: in a
    flowing subject it is released before then, and holding it would be a write for nothing."""
    blocked = (
        sa.select(_deliveries.c.id)
        .where(_due(settings, now), _deliveries.c.subject_key.is_not(None), ~unblocked(_deliveries))
        .limit(limit)
        .with_for_update(skip_locked=True)  # PostgreSQL; SQLite renders nothing (it locks the file)
    )
    with engine.begin() as connection:
        statement = _locked(connection, sa.update(_deliveries).values(held=True), blocked, _sendable(now))
        return connection.execute(statement).rowcount


def release_held(engine: Engine) -> int:
    """Release the held deliveries no earlier one of their subject holds back any more: a safety
    net for the paths that settle a subject's head without releasing its successor (a head
    pruned by retention, a subscription's ``on_dead`` changed, a race with :func:`hold_blocked`).
    It tests every held delivery, so the scheduler runs it once per ``requeue_after_seconds``,
    not every pass."""
    statement = (
        sa.update(_deliveries)
        .where(
            _deliveries.c.status == DeliveryStatus.PENDING.value, _deliveries.c.held, unblocked(_deliveries)
        )
        .values(held=False)
    )
    with engine.begin() as connection:
        return connection.execute(statement).rowcount


def _sendable(now: datetime) -> sa.ColumnElement[bool]:
    """Pending, not held, due by ``now``: the range of ``ix_usp_deliveries_sendable``."""
    return sa.and_(
        _deliveries.c.status == DeliveryStatus.PENDING.value,
        ~_deliveries.c.held,
        _deliveries.c.next_attempt_at <= now,
    )


def _locked(
    connection: sa.Connection, statement: sa.Update, candidates: sa.Select[Any], still: sa.ColumnElement[bool]
) -> sa.Update:
    """``statement`` limited to the rows ``candidates`` selects and locks, where ``still`` holds.

    On PostgreSQL through a CTE: a CTE that locks rows is computed once; as an IN subquery
    PostgreSQL may run it again for every due row (a nested loop it picks on stale statistics: a
    fresh or fast-growing table): measured at 17 s a pass with 2,000 ordered deliveries due."""
    if connection.dialect.name == "postgresql":
        locked = candidates.cte("candidates")
        return statement.where(_deliveries.c.id == locked.c.id, still)
    return statement.where(_deliveries.c.id.in_(candidates.scalar_subquery()), still)


def _due(settings: SchedulerSettings, now: datetime) -> sa.ColumnElement[bool]:
    """Sendable, and never handed to the broker or handed ``requeue_after_seconds`` ago."""
    cutoff = now - timedelta(seconds=settings.requeue_after_seconds)
    return sa.and_(
        _sendable(now), sa.or_(_deliveries.c.enqueued_at.is_(None), _deliveries.c.enqueued_at < cutoff)
    )


def mark_due(
    engine: Engine, settings: SchedulerSettings, *, now: datetime, limit: int = RELAY_LIMIT
) -> list[tuple[str, str]]:
    """Mark up to ``limit`` due, unsent deliveries as sent at ``now``; return their
    ``(delivery id, subscription id)``, oldest due first.

    One conditional statement: a row another relay marked a moment ago no longer matches, and on
    PostgreSQL rows another relay is marking right now are skipped (``SKIP LOCKED``) rather than
    waited for; SQLite runs one writer at a time. So concurrent relays return disjoint sets.

    Deliveries of a subscription paused until after ``now`` (:func:`usp_workers.engine.health.gate`:
    ``breaker_until`` ahead, whatever the breaker's state) are skipped: sent, they would be
    claimed only to be put back to ``pending`` until ``breaker_until``, a wasted task and two
    writes each, every pass. They are sent once it passes (the half-open probe among them). The
    test is a ``NOT EXISTS`` on the subscription's primary key per due row, so the scan stays
    the due index's and the subscriptions table is only probed, never scanned. Deliveries held
    back behind an earlier one of their subject (:func:`usp_workers.engine.ordering.unblocked`) are
    skipped likewise: the one that settles it hands them over. Those :func:`hold_blocked` held
    are not even looked at.
    """
    due = _due(settings, now)
    paused = sa.exists().where(
        _subscriptions.c.id == _deliveries.c.subscription_id,
        _subscriptions.c.breaker_until > now,
    )
    candidates = (
        sa.select(_deliveries.c.id)
        .where(due, ~paused, unblocked(_deliveries))
        .order_by(_deliveries.c.next_attempt_at)
        .limit(limit)
        .with_for_update(skip_locked=True)  # PostgreSQL; SQLite renders nothing (it locks the file)
    )
    with engine.begin() as connection:
        statement = _locked(connection, sa.update(_deliveries).values(enqueued_at=now), candidates, due)
        returning = (_deliveries.c.id, _deliveries.c.subscription_id, _deliveries.c.next_attempt_at)
        rows = connection.execute(statement.returning(*returning)).all()
    return [(row.id, row.subscription_id) for row in sorted(rows, key=lambda r: (r.next_attempt_at, r.id))]


def endpoint_batch_size(settings: SchedulerSettings) -> int:
    """The most deliveries to *one* subscription that go in one batch.

    A batch records its results when its last try ends, and its lease runs out
    ``lease_seconds`` after the claim. An endpoint that times out takes
    ``ceil(n / per_endpoint_concurrency) * total_timeout`` for ``n`` tries, so ``n`` is kept to
    the waves that fit in the lease, less one wave of margin: a dead endpoint's batch then ends
    (all tries failed and rescheduled) before the relay would reclaim it and send it again.
    """
    waves = max(1, int(settings.lease_seconds // settings.total_timeout) - 1)
    return max(1, min(settings.batch_size, settings.per_endpoint_concurrency * waves))


def plan_batches(rows: Iterable[tuple[str, str]], settings: SchedulerSettings) -> list[list[str]]:
    """Split ``(delivery id, subscription id)`` rows into task batches, grouped by subscription.

    A batch is as slow as its slowest try, and its other deliveries are recorded only then. So a
    subscription with more due deliveries than one wave of its endpoint
    (``per_endpoint_concurrency``) gets batches of its own (:func:`endpoint_batch_size` each):
    when that endpoint is slow or dead, it holds only its own deliveries. Subscriptions with a
    few deliveries each (the usual case: one event to many subscribers) share batches up to
    ``batch_size``, since all their tries run in one wave; this keeps tasks few (Celery's cost
    is per task).

    >>> from usp_workers.settings import SchedulerSettings
    >>> s = SchedulerSettings(batch_size=4, per_endpoint_concurrency=1, lease_seconds=45, total_timeout=15)
    >>> plan_batches([("d1", "a"), ("d2", "a"), ("d3", "b"), ("d4", "c"), ("d5", "a")], s)
    [['d1', 'd2'], ['d5'], ['d3', 'd4']]
    """
    by_subscription: dict[str, list[str]] = {}
    for delivery_id, subscription_id in rows:
        by_subscription.setdefault(subscription_id, []).append(delivery_id)
    own_size = endpoint_batch_size(settings)
    batches: list[list[str]] = []
    shared: list[str] = []
    for ids in by_subscription.values():
        if len(ids) > settings.per_endpoint_concurrency:
            batches.extend(_chunks(ids, own_size))
        else:
            shared.extend(ids)
    batches.extend(_chunks(shared, settings.batch_size))
    return batches


def run_relay(
    settings: SchedulerSettings,
    *,
    stop: threading.Event | None = None,
    enqueue: Enqueue | None = None,
    enqueue_job: EnqueueJob | None = None,
) -> None:
    """Run :func:`relay_once` every ``relay_interval_seconds`` until ``stop`` is set (or, without
    one, until SIGTERM or SIGINT). ``enqueue`` and ``enqueue_job`` default to the Celery app of
    ``settings``."""
    from usp_workers.runtime import tasks  # Celery only where the loop really runs
    from usp_workers.runtime.celery_app import make_celery

    _default_logging(settings)
    engine = make_engine(settings)
    celery = None
    if enqueue is None or enqueue_job is None:
        celery = make_celery(settings)  # connects on first send only
        if enqueue is None:
            enqueue = tasks.enqueuer(celery)
        if enqueue_job is None:
            enqueue_job = partial(tasks.enqueue_job, app=celery)
    broker_engine = (
        make_broker_engine(settings.broker_url_resolved) if settings.uses_embedded_broker else None
    )
    stopping = stop if stop is not None else threading.Event()
    retention = RetentionSchedule()
    reclaim_after = sweep_after = 0.0
    logger.info(
        "scheduler started: database %s, broker %s, a pass every %.1f s",
        _safe_url(settings.database_url),
        _safe_url(settings.broker_url_resolved),
        settings.relay_interval_seconds,
    )
    try:
        with _stop_on_signals(stopping, install=stop is None):
            while not stopping.is_set():
                started = time.monotonic()
                sweep = started >= sweep_after
                if sweep:
                    sweep_after = started + settings.requeue_after_seconds
                if not _pass(
                    engine,
                    settings,
                    enqueue,
                    enqueue_job,
                    broker_engine,
                    reclaim=started >= reclaim_after,
                    sweep=sweep,
                ):
                    # Workers hold outcomes they could not write: after the database is back,
                    # give them the time to write before their leases are taken back.
                    reclaim_after = time.monotonic() + RECLAIM_HOLD_OFF_SECONDS
                _retain(engine, settings, retention)
                stopping.wait(max(0.0, settings.relay_interval_seconds - (time.monotonic() - started)))
    finally:
        engine.dispose()
        if broker_engine is not None:
            broker_engine.dispose()
        if celery is not None:
            celery.close()
        logger.info("scheduler stopped")


def _pass(
    engine: Engine,
    settings: SchedulerSettings,
    enqueue: Enqueue,
    enqueue_job: EnqueueJob,
    broker_engine: Engine | None,
    *,
    reclaim: bool = True,
    sweep: bool = True,
) -> bool:
    """One pass, logged; ``False`` when the database did not answer."""
    try:
        report = relay_once(
            engine,
            settings,
            enqueue,
            broker_engine=broker_engine,
            enqueue_job=enqueue_job,
            reclaim=reclaim,
            sweep=sweep,
        )
    except sa.exc.SQLAlchemyError as exc:
        # The database is down or busy: try again next pass (nothing is lost).
        if not database_unavailable(exc):
            logger.exception("scheduler pass failed; retrying in %.1f s", settings.relay_interval_seconds)
            return True
        DATABASE_OUTAGE.failed(exc)
        return False
    DATABASE_OUTAGE.succeeded()
    if report.busy:
        logger.info(
            "scheduler: %d enqueued in %d batches, %d expired leases reclaimed, %d not sent "
            "(broker error; re-sent in %.0f s), %d consumed broker messages pruned, %d stalled jobs re-sent, "
            "%d failing subscriptions disabled, %d ordered deliveries held behind their subject, "
            "%d held deliveries released, %d leased subscriptions lapsed",
            report.enqueued,
            report.batches,
            report.reclaimed,
            report.failed,
            settings.requeue_after_seconds,
            report.pruned,
            report.jobs,
            report.disabled,
            report.held,
            report.released,
            report.lapsed,
        )
    return True


def _retain(engine: Engine, settings: SchedulerSettings, schedule: RetentionSchedule) -> None:
    now = utcnow()
    if settings.retention_days <= 0 or not schedule.due(now):
        return
    try:
        report = prune_once(engine, settings, now=now)
    except sa.exc.SQLAlchemyError:
        # Busy or down: retention can wait for a later pass (nothing depends on it being on time).
        logger.exception("retention pass failed; retrying later")
        schedule.done(RetentionReport(), now)  # next interval, not next pass: it is struggling
        return
    schedule.done(report, now)
    if report.busy:
        logger.info(
            "retention: %d events (%d deliveries), %d attempts, %d notices older than %g days pruned%s",
            report.events,
            report.deliveries,
            report.attempts,
            report.notices,
            settings.retention_days,
            "; more next pass" if report.more else "",
        )


def _resend_jobs(engine: Engine, settings: SchedulerSettings, enqueue_job: EnqueueJob, now: datetime) -> int:
    """Send the stalled jobs again; stop at the first broker error (those not sent are taken
    again ``job_stale_after_seconds`` later). Returns how many were sent."""
    sent = 0
    for job_id in reclaim_stale_jobs(engine, now=now, stale_after=settings.job_stale_after_seconds):
        try:
            enqueue_job(job_id)
        except Exception as exc:
            BROKER_OUTAGE.failed(exc)  # the job is taken again job_stale_after_seconds later
            return sent
        BROKER_OUTAGE.succeeded()
        logger.info(
            "job %s made no progress for %.0f s: sent to the workers again",
            job_id,
            settings.job_stale_after_seconds,
        )
        sent += 1
    return sent


def _send(batches: Sequence[list[str]], enqueue: Enqueue) -> tuple[int, int, int]:
    """Send each batch; stop at the first failure. Returns (sent, batches sent, not sent)."""
    sent = 0
    for index, batch in enumerate(batches):
        try:
            enqueue(batch)
        except Exception as exc:
            BROKER_OUTAGE.failed(exc)  # the rest wait for the next re-send
            return sent, index, sum(len(b) for b in batches[index:])
        BROKER_OUTAGE.succeeded()
        sent += len(batch)
    return sent, len(batches), 0


_broker_engines: dict[str, Engine] = {}


def _prune(broker_engine: Engine | None, settings: SchedulerSettings, now: datetime) -> int:
    if broker_engine is None:
        url = settings.broker_url_resolved
        broker_engine = _broker_engines.get(url)
        if broker_engine is None:
            broker_engine = _broker_engines[url] = make_broker_engine(url)
    try:
        return prune_consumed(broker_engine, now=now)
    except sa.exc.OperationalError as exc:
        # Busy past the timeout, most likely: pruning can wait for the next pass.
        logger.warning("could not prune the embedded broker this pass: %s", exc.orig)
        return 0


@contextmanager
def _stop_on_signals(stop: threading.Event, *, install: bool) -> Iterator[None]:
    """Set ``stop`` on SIGTERM/SIGINT while inside (main thread only; handlers restored after)."""
    if not install or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, _frame: FrameType | None) -> None:
        logger.info("scheduler stopping (%s)", signal.Signals(signum).name)
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _default_logging(settings: SchedulerSettings) -> None:
    """INFO lines on stderr when nobody configured logging (the CLI, a bare script); one JSON
    object per line with ``USP_LOG_FORMAT=json`` (:mod:`usp_workers.runtime.logs`)."""
    if settings.log_format == "json":
        configure_logging(settings)
    elif not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _safe_url(url: str) -> str:
    """``url`` with any password masked, for logs."""
    return str(maybe_sanitize_url(url))


def _chunks(ids: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(ids), size):
        yield list(ids[start : start + size])
