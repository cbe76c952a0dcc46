"""Recover and redrive as jobs: started here, worked through in batches by the ``usp.run_job``
task, resumable, never redelivering a row twice.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session

from usp_core.clock import utcnow
from usp_core.db import session as open_session
from usp_core.ids import new_id
from usp_workers.engine.health import NOTICE_DISABLED, NOTICE_ENABLED
from usp_workers.engine.ordering import subject_of
from usp_workers.engine.outbox import Enqueue, event_matches, new_delivery_row, stored_filter
from usp_workers.operations.errors import Conflict, NotFound
from usp_workers.operations.query import (
    _check_range,
    _dead_letter_filters,
    _deliveries,
    _events,
    _in_range,
    _jobs,
    _notices,
    _subscription,
    _subscriptions,
)
from usp_workers.operations.replay import _supersede
from usp_workers.operations.subscriptions import set_subscription_state
from usp_workers.operations.views import Clock, DeadLetterFilter, JobKind, JobView, _iso, _job_view, _moment
from usp_workers.storage.models import DeliveryStatus, Job, JobStatus, Subscription, SubscriptionState

logger = logging.getLogger("usp_workers")

#: Deliveries a job handles per transaction.
JOB_BATCH = 500


def start_recover(
    session: Session,
    subscription_id: str,
    *,
    since: datetime,
    until: datetime | None = None,
    enable: bool = False,
    now: Clock = utcnow,
) -> JobView:
    """Record (and commit) a recover job for ``subscription_id``, for events accepted in
    ``[since, until)``: its failed and dead deliveries are delivered again, and the events that
    matched it while it was disabled (which have no delivery at all) are back-filled; run it
    with :func:`run_job` (the ``usp.run_job`` task). ``total`` counts both; ``backfilled``, as the
    job runs, the second.

    The subscription must be active (its new deliveries would otherwise go dead unsent):
    ``enable`` enables it first (:func:`set_subscription_state`), else a disabled one is a
    :class:`Conflict`.
    """
    _check_range(since, until)
    subscription = _subscription(session, subscription_id)
    if enable:
        set_subscription_state(session, subscription_id, enabled=True, now=now)
        session.refresh(subscription)
    if subscription.state != SubscriptionState.ACTIVE:
        raise Conflict(
            "subscription_disabled",
            f"subscription {subscription_id!r} is disabled: enable it before recovering its deliveries",
        )
    moment = now()
    params = {
        "subscription_id": subscription_id,
        "since": _iso(since),
        "until": _iso(until),
        "backfill_before": _iso(moment),
    }
    return _start(session, JobKind.RECOVER, params, moment)


def start_redrive(session: Session, filters: DeadLetterFilter, *, now: Clock = utcnow) -> JobView:
    """Record (and commit) a job re-delivering the dead letter (filtered) to active subscriptions."""
    _check_range(filters.since, filters.until)
    if filters.subscription_id is not None:
        _subscription(session, filters.subscription_id)
    return _start(session, JobKind.REDRIVE, filters.as_params(), now())


def get_job(session: Session, job_id: str) -> JobView:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound("job_not_found", f"no job {job_id!r}")
    session.refresh(job)
    return _job_view(job)


def resume_job(session: Session, job_id: str, *, now: Clock = utcnow) -> JobView:
    """Make a failed job runnable again (committed); a running or finished one is returned as is.
    Send it to a worker afterwards: it continues after the last batch that committed."""
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound("job_not_found", f"no job {job_id!r}")
    if job.status == JobStatus.FAILED:
        job.status = JobStatus.RUNNING
        job.error = None
        job.resends = 0  # resumed by hand: the scheduler's count of dead runners starts again
        job.finished_at = None
        job.updated_at = now()
        session.add(job)
        session.commit()
    return _job_view(job)


#: Re-sends of a job without progress after which the scheduler fails it instead.
MAX_JOB_RESENDS = 3


def reclaim_stale_jobs(engine: Engine, *, now: datetime, stale_after: float) -> list[str]:
    """The running jobs that made no progress in the ``stale_after`` seconds before ``now``,
    oldest first, each marked as re-sent (``updated_at = now``, ``resends + 1``): send them to
    the workers again.

    A running job's ``updated_at`` moves with every batch it commits, so one that stands still
    that long lost its runner (a killed worker, a message no broker will hand out again). The
    mark is one conditional ``UPDATE``: two schedulers never both take one job, and a job is
    taken again only after another ``stale_after`` without progress. A runner that was merely
    slow is harmless: :func:`step_job`'s conditional cursor lets only one of the two commit each
    batch.

    A job re-sent :data:`MAX_JOB_RESENDS` times without committing a batch in between is not sent
    again but marked failed: something in its next batch kills whichever worker runs it (a
    poison batch), and re-sending it forever would take a worker down every ``stale_after``.
    Its cursor stays where it stood.
    """
    cutoff = now - timedelta(seconds=stale_after)
    stale = sa.and_(_jobs.c.status == JobStatus.RUNNING.value, _jobs.c.updated_at < cutoff)
    with engine.begin() as connection:
        given_up = connection.execute(
            sa.update(_jobs)
            .where(stale, _jobs.c.resends >= MAX_JOB_RESENDS)
            .values(
                status=JobStatus.FAILED.value,
                error=f"its runner died {MAX_JOB_RESENDS + 1} times without finishing a batch; "
                "not sent again",
                updated_at=now,
                finished_at=now,
            )
            .returning(_jobs.c.id)
        ).scalars()
        for job_id in given_up:
            logger.error("job %s failed: its runner died %d times on one batch", job_id, MAX_JOB_RESENDS + 1)
        resent = connection.execute(
            sa.update(_jobs)
            .where(stale)
            .values(updated_at=now, resends=_jobs.c.resends + 1)
            .returning(_jobs.c.id)
        ).scalars()
        return sorted(resent)


def run_job(
    engine: Engine,
    job_id: str,
    *,
    enqueue: Enqueue | None = None,
    batch_size: int = JOB_BATCH,
    now: Clock = utcnow,
) -> JobView:
    """Work ``job_id`` through to the end, one batch per transaction; return its final state.

    ``enqueue`` hands each batch's deliveries to the broker after its commit; without one (or
    when it fails) they are left for the relay, which sends them at its next pass. A job that
    already finished is returned as is. An unexpected error marks the job failed (its cursor
    stays where the last batch ended, so it can be resumed) and is raised again.
    """
    try:
        while step_job(engine, job_id, enqueue=enqueue, batch_size=batch_size, now=now):
            pass
    except Exception as exc:
        _fail(engine, job_id, exc, now())
        raise
    with open_session(engine) as s:
        return get_job(s, job_id)


def step_job(
    engine: Engine,
    job_id: str,
    *,
    enqueue: Enqueue | None = None,
    batch_size: int = JOB_BATCH,
    now: Clock = utcnow,
) -> bool:
    """Handle the job's next batch; ``False`` when the job is finished (or was already).

    The batch and the job's new cursor commit together, and the cursor update is conditional on
    the cursor this batch started from: if two runners race on one job (a redelivered task), the
    second one's batch rolls back instead of sending the same deliveries twice. A recover job
    goes through the subscription's deliveries first, then back-fills the events it has none
    of (:func:`_backfill_batch`), its cursor then prefixed ``events:``.
    """
    moment = now()
    with open_session(engine) as s:
        job = s.get(Job, job_id)
        if job is None:
            raise NotFound("job_not_found", f"no job {job_id!r}")
        if job.status != JobStatus.RUNNING:
            return False
        params = json.loads(job.params)
        enqueued_at = moment if enqueue is not None else None
        limit = max(1, batch_size)
        if job.cursor is not None and job.cursor.startswith(_BACKFILL_CURSOR):
            step = _backfill_batch(s, job.cursor, params, limit=limit, moment=moment, enqueued_at=enqueued_at)
        else:
            step = _delivery_batch(s, job, params, limit=limit, moment=moment, enqueued_at=enqueued_at)
            if step is None and job.kind == JobKind.RECOVER and params.get("backfill_before"):
                step = _Step(handed=[], cursor=_BACKFILL_CURSOR, processed=0)
        if step is None:
            s.connection().execute(
                sa.update(_jobs)
                .where(_jobs.c.id == job_id, _jobs.c.status == JobStatus.RUNNING.value)
                .values(
                    status=JobStatus.SUCCEEDED.value,
                    total=job.processed,
                    updated_at=moment,
                    finished_at=moment,
                )
            )
            s.commit()
            return False
        advanced = (
            s.connection()
            .execute(
                sa.update(_jobs)
                .where(
                    _jobs.c.id == job_id,
                    _jobs.c.status == JobStatus.RUNNING.value,
                    _jobs.c.cursor.is_(None) if job.cursor is None else _jobs.c.cursor == job.cursor,
                )
                .values(
                    cursor=step.cursor,
                    processed=_jobs.c.processed + step.processed,
                    backfilled=_jobs.c.backfilled + step.backfilled,
                    updated_at=moment,
                    resends=0,
                )
            )
            .rowcount
        )
        if advanced != 1:
            s.rollback()
            logger.warning("job %s: another runner took this batch; stopping here", job_id)
            return False
        s.commit()
    if step.handed and enqueue is not None:
        try:
            enqueue(step.handed)
        except Exception:
            # Committed is safe: the relay re-sends them once requeue_after_seconds have passed.
            logger.exception("job %s: broker hand-off failed for %d deliveries", job_id, len(step.handed))
    return True


#: A recover job's cursor once it back-fills events (followed by the last event id handled).
_BACKFILL_CURSOR = "events:"


@dataclass(frozen=True, slots=True)
class _Step:
    """One job batch: the deliveries to hand to the broker, where the next batch starts, and
    how many rows it handled (``backfilled`` of them new deliveries for missed events)."""

    handed: list[str]
    cursor: str
    processed: int
    backfilled: int = 0


def _delivery_batch(
    s: Session,
    job: Job,
    params: dict[str, Any],
    *,
    limit: int,
    moment: datetime,
    enqueued_at: datetime | None,
) -> _Step | None:
    """Re-deliver the job's next deliveries: a dead one gets a new delivery in its place, a
    waiting one is brought forward. None when there are no more."""
    rows = _job_candidates(s, job.kind, params, after=job.cursor, limit=limit)
    if not rows:
        return None
    connection = s.connection()
    handed: list[str] = []
    fresh = [
        new_delivery_row(
            new_id("dlv"),
            row.event_id,
            row.subscription_id,
            moment,
            enqueued_at=enqueued_at,
            subject=(row.subject_key, row.subject_order),  # the dead one's place
        )
        for row in rows
        if row.status == DeliveryStatus.DEAD.value
    ]
    if fresh:
        connection.execute(sa.insert(_deliveries), fresh)
        _supersede(
            connection, [(row["id"], row["event_id"], row["subscription_id"]) for row in fresh], moment
        )
    waiting = [row.id for row in rows if row.status == DeliveryStatus.PENDING.value]
    if waiting:
        brought = connection.execute(
            sa.update(_deliveries)
            .where(_deliveries.c.id.in_(waiting), _deliveries.c.status == DeliveryStatus.PENDING.value)
            .values(next_attempt_at=moment, enqueued_at=enqueued_at, updated_at=moment)
            .returning(_deliveries.c.id)
        ).scalars()
        handed.extend(brought)
    handed.extend(str(row["id"]) for row in fresh)
    return _Step(handed=handed, cursor=rows[-1].id, processed=len(rows))


def _backfill_batch(
    s: Session,
    cursor: str,
    params: dict[str, Any],
    *,
    limit: int,
    moment: datetime,
    enqueued_at: datetime | None,
) -> _Step | None:
    """A delivery for each of the next events that the recovered subscription should have had
    and has none of: those that matched it while it was disabled (emit skips a disabled
    subscription). None when there are no more."""
    subscription = s.get(Subscription, params["subscription_id"])
    if subscription is None:
        return None
    after = cursor.removeprefix(_BACKFILL_CURSOR) or None
    statement = _missed_events(s, subscription, params).order_by(_events.c.id).limit(limit)
    if after is not None:
        statement = statement.where(_events.c.id > after)
    compiled = stored_filter(subscription.payload_filter)
    if compiled is not None:
        statement = statement.add_columns(_events.c.payload)
    rows = s.connection().execute(statement).all()
    if not rows:
        return None
    taken = rows if compiled is None else [row for row in rows if compiled.matches(json.loads(row.payload))]
    fresh = [
        new_delivery_row(
            new_id("dlv"),
            row.id,
            subscription.id,
            moment,
            enqueued_at=enqueued_at,
            subject=subject_of(subscription.ordering, row.subject_id, row.created_at, row.id),
        )
        for row in taken
    ]
    if fresh:
        s.connection().execute(sa.insert(_deliveries), fresh)
    return _Step(
        handed=[str(row["id"]) for row in fresh],
        cursor=_BACKFILL_CURSOR + rows[-1].id,
        processed=len(rows),
        backfilled=len(fresh),
    )


def _disabled_spans(
    s: Session, subscription: Subscription, before: datetime
) -> list[tuple[datetime, datetime]]:
    """The spans ``[from, to)`` before ``before`` in which ``subscription`` existed and was
    disabled, read off its ``subscription.disabled``/``subscription.enabled`` notices.

    Notices are pruned with the events they would explain: an enable whose disable is gone
    opens its span at the oldest moment still known (the subscription's creation at best).
    """
    kinds = (NOTICE_DISABLED, NOTICE_ENABLED)
    notices = s.connection().execute(
        sa.select(_notices.c.kind, _notices.c.created_at)
        .where(
            _notices.c.subscription_id == subscription.id,
            _notices.c.kind.in_(kinds),
            _notices.c.created_at < before,
        )
        .order_by(_notices.c.created_at, _notices.c.id)
    )
    windows: list[tuple[datetime, datetime]] = []
    off_since: datetime | None = None
    seen = False
    for kind, at in notices:
        if kind == NOTICE_DISABLED and off_since is None:
            off_since = at
        elif kind == NOTICE_ENABLED and (off_since is not None or not seen):
            windows.append((off_since or subscription.created_at, at))
            off_since = None
        seen = True
    if off_since is not None:
        windows.append((off_since, before))
    return [(start, end) for start, end in windows if start < end]


def _missed_events(s: Session, subscription: Subscription, params: dict[str, Any]) -> sa.Select[Any]:
    """The events of the job's range, accepted while ``subscription`` was disabled before the job
    started, that it matches (types, audience; its filter is applied to them afterwards) and has
    no delivery of."""
    since, until = _moment(params["since"]), _moment(params["until"])
    before = _moment(params["backfill_before"])
    assert before is not None
    ranged = _in_range(sa.select(_events.c.event_type).distinct(), _events.c.created_at, since, until)
    patterns = json.loads(subscription.event_types)
    types = [t for t in s.connection().execute(ranged).scalars() if event_matches(t, patterns)]
    delivered = sa.exists().where(
        _deliveries.c.event_id == _events.c.id, _deliveries.c.subscription_id == subscription.id
    )
    windows = [
        sa.and_(_events.c.created_at >= start, _events.c.created_at < end)
        for start, end in _disabled_spans(s, subscription, before)
    ]
    statement = sa.select(_events.c.id, _events.c.subject_id, _events.c.created_at).where(
        _events.c.event_type.in_(types), sa.or_(sa.false(), *windows), ~delivered
    )
    if subscription.platform_profile is not None:  # :func:`usp_workers.engine.outbox.reaches`, in SQL
        statement = statement.where(
            sa.or_(_events.c.audience.is_(None), _events.c.audience == subscription.platform_profile)
        )
    return _in_range(statement, _events.c.created_at, since, until)


def _start(session: Session, kind: str, params: dict[str, Any], moment: datetime) -> JobView:
    # The newest delivery now: the job stops there, so rows it creates are not swept up again.
    newest = session.connection().execute(sa.select(sa.func.max(_deliveries.c.id))).scalar()
    params = params | {"max_delivery_id": newest}
    total = 0
    if newest is not None:
        candidates = _candidates_query(kind, params).with_only_columns(sa.func.count()).order_by(None)
        total = int(session.connection().execute(candidates).scalar_one())
    if params.get("backfill_before"):
        subscription = _subscription(session, params["subscription_id"])
        missed = _missed_events(session, subscription, params).with_only_columns(sa.func.count())
        total += int(session.connection().execute(missed).scalar_one())
    job = Job(kind=kind, params=json.dumps(params), total=total, created_at=moment, updated_at=moment)
    if newest is None and total == 0:
        job.status = JobStatus.SUCCEEDED
        job.finished_at = moment
    session.add(job)
    session.commit()
    return _job_view(job)


def _job_candidates(
    session: Session, kind: str, params: dict[str, Any], *, after: str | None, limit: int
) -> list[sa.Row[Any]]:
    statement = _candidates_query(kind, params).order_by(_deliveries.c.id).limit(limit)
    if after is not None:
        statement = statement.where(_deliveries.c.id > after)
    if session.connection().dialect.name == "postgresql":
        # Rows a worker is claiming right now are skipped by it, not waited for by us.
        statement = statement.with_for_update(of=_deliveries, skip_locked=True)
    return list(session.connection().execute(statement).all())


def _candidates_query(kind: str, params: dict[str, Any]) -> sa.Select[Any]:
    """The deliveries a job re-delivers (see the module docstring), in any order."""
    newer = _deliveries.alias("newer")
    latest = ~sa.exists().where(
        newer.c.event_id == _deliveries.c.event_id,
        newer.c.subscription_id == _deliveries.c.subscription_id,
        newer.c.id > _deliveries.c.id,
    )
    statement = (
        sa.select(
            _deliveries.c.id,
            _deliveries.c.event_id,
            _deliveries.c.subscription_id,
            _deliveries.c.status,
            _deliveries.c.subject_key,
            _deliveries.c.subject_order,
        )
        .join(_events, _events.c.id == _deliveries.c.event_id)
        .where(latest)
    )
    if params.get("max_delivery_id") is not None:
        statement = statement.where(_deliveries.c.id <= params["max_delivery_id"])
    if kind == JobKind.RECOVER:
        statement = statement.where(
            _deliveries.c.subscription_id == params["subscription_id"],
            sa.or_(
                _deliveries.c.status == DeliveryStatus.DEAD.value,
                sa.and_(
                    _deliveries.c.status == DeliveryStatus.PENDING.value,
                    _deliveries.c.attempt_count > 0,
                ),
            ),
        )
        return _in_range(statement, _events.c.created_at, _moment(params["since"]), _moment(params["until"]))
    if kind == JobKind.REDRIVE:
        active = sa.select(_subscriptions.c.id).where(
            _subscriptions.c.state == SubscriptionState.ACTIVE.value
        )
        statement = statement.where(
            _deliveries.c.status == DeliveryStatus.DEAD.value,
            _deliveries.c.subscription_id.in_(active.scalar_subquery()),
        )
        filters = DeadLetterFilter(
            subscription_id=params.get("subscription_id"),
            event_type=params.get("event_type"),
            since=_moment(params.get("since")),
            until=_moment(params.get("until")),
        )
        return _dead_letter_filters(statement, filters)
    raise ValueError(f"unknown job kind {kind!r}")


def _fail(engine: Engine, job_id: str, exc: Exception, moment: datetime) -> None:
    """Mark the job failed with the error's class (its text may hold data; the log has it)."""
    try:
        with engine.begin() as connection:
            connection.execute(
                sa.update(_jobs)
                .where(_jobs.c.id == job_id, _jobs.c.status == JobStatus.RUNNING.value)
                .values(
                    status=JobStatus.FAILED.value,
                    error=type(exc).__name__,
                    updated_at=moment,
                    finished_at=moment,
                )
            )
    except sa.exc.SQLAlchemyError:
        logger.exception("job %s: could not record its failure", job_id)
