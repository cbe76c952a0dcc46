"""The Celery task that delivers a batch, and the hand-off that sends batches to it.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_workers.runtime.tasks``.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

from celery import Celery, shared_task
from celery.signals import worker_process_shutdown, worker_shutdown
from sqlalchemy.engine import Engine

from usp_core.db import make_engine
from usp_core.settings import CommonSettings
from usp_workers import operations
from usp_workers.engine import delivery, outbox
from usp_workers.engine.handoff import HandOff
from usp_workers.runtime.celery_app import DELIVER_TASK, QUEUE, make_celery, settings_of
from usp_workers.runtime.celery_app import app as default_app

__all__ = [
    "PUBLISH_RETRY_POLICY",
    "RUN_JOB_TASK",
    "deliver",
    "dispose_engines",
    "engine_for",
    "enqueue_deliveries",
    "enqueue_job",
    "enqueuer",
    "flush_enqueuer",
    "handing_off",
    "install_enqueuer",
    "run_job",
    "uninstall_enqueuer",
]

logger = logging.getLogger("usp_workers")

#: How hard one publish tries before it gives up. Short on purpose: the hand-off after emit runs
#: in the API's request, and a broker that is down must not hold requests for long. Nothing is
#: lost by giving up: the deliveries are committed, and the relay re-sends them once
#: ``requeue_after_seconds`` have passed.
PUBLISH_RETRY_POLICY: dict[str, float] = {
    "max_retries": 2,
    "interval_start": 0.0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}


def _deliver(task: Any, delivery_ids: list[str]) -> dict[str, int]:
    """``usp.deliver``: try the due deliveries among ``delivery_ids`` once each.

    Ids that are not pending-and-due (delivered already, scheduled later, held by another
    worker) are skipped by the engine's conditional claim, so a message that arrives twice (a
    relay re-send, a broker redelivery) costs one query, never a second delivery. Errors
    propagate: Celery logs them and acknowledges the message, and the deliveries come back
    through the relay (unclaimed ones after ``requeue_after_seconds``, claimed ones when their
    lease expires), so a retry here would only duplicate that.
    """
    settings = settings_of(task.app)
    started = time.perf_counter()
    report = delivery.deliver_batch_sync(
        engine_for(settings), settings, delivery_ids, enqueue=enqueuer(task.app)
    )
    elapsed_ms = (time.perf_counter() - started) * 1000
    summary = {
        "requested": report.requested,
        "claimed": report.claimed,
        "succeeded": report.succeeded,
        "retrying": report.retrying,
        "dead": report.dead,
        "disabled": report.disabled,
    }
    logger.info(
        "batch of %d: %d claimed, %d delivered, %d to retry, %d dead, %d disabled in %.0f ms",
        report.requested,
        report.claimed,
        report.succeeded,
        report.retrying,
        report.dead,
        report.disabled,
        elapsed_ms,
    )
    return summary


#: The task. ``acks_late``/``reject_on_worker_lost`` are also the app's defaults; they are
#: repeated here so an app configured elsewhere cannot weaken them for this task.
deliver = shared_task(
    name=DELIVER_TASK,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)(_deliver)


#: An admin job (recover, redrive: :mod:`usp_workers.operations`) on the delivery queue.
RUN_JOB_TASK = "usp.run_job"


def _run_job(task: Any, job_id: str) -> dict[str, Any]:
    """``usp.run_job``: work an admin job through in batches, handing each batch's deliveries to
    the broker. Run again (a redelivered message, a resume), it continues from its cursor."""
    settings = settings_of(task.app)
    job = operations.run_job(engine_for(settings), job_id, enqueue=enqueuer(task.app))
    logger.info("job %s (%s): %s, %d deliveries handled", job.id, job.kind, job.status, job.processed)
    return {"status": job.status, "processed": job.processed}


run_job = shared_task(
    name=RUN_JOB_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True
)(_run_job)


def enqueue_job(job_id: str, *, app: Celery | None = None) -> None:
    """Send ``usp.run_job`` for ``job_id`` (raises what the broker raises)."""
    target = app if app is not None else (_installed or default_app)
    target.send_task(
        RUN_JOB_TASK,
        args=[job_id],
        queue=QUEUE,
        routing_key=QUEUE,
        retry=True,
        retry_policy=PUBLISH_RETRY_POLICY,
    )


def send_job(job_id: str) -> bool:
    """:func:`enqueue_job`, answering whether the broker took it; a refusal is logged and the
    job stays recorded, for its resume (the admin API and the console say so)."""
    try:
        enqueue_job(job_id)
    except Exception:
        logger.exception("could not send job %s to the workers", job_id)
        return False
    return True


# ------------------------------------------------------------------------------- the engine


_engine_lock = threading.Lock()
_engines: dict[tuple[int, str], Engine] = {}


def engine_for(settings: CommonSettings) -> Engine:
    """This process's database engine for ``settings.database_url``, created on first use.

    Keyed by process id: a forked child (Celery's prefork pool) must not use connections it
    inherited (they are the parent's sockets), so it builds its own on first use.
    """
    key = (os.getpid(), settings.database_url)
    engine = _engines.get(key)
    if engine is not None:
        return engine
    with _engine_lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = make_engine(settings)
        return engine


def dispose_engines() -> None:
    """Close this process's engines (worker shutdown, tests)."""
    with _engine_lock:
        mine = [key for key in _engines if key[0] == os.getpid()]
        for key in mine:
            _engines.pop(key).dispose()


def _forget_engines_after_fork() -> None:
    global _engine_lock
    _engine_lock = threading.Lock()  # another thread may have held it at the fork


def _on_worker_shutdown(**_: Any) -> None:
    dispose_engines()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_engines_after_fork)
worker_shutdown.connect(_on_worker_shutdown, weak=False)
worker_process_shutdown.connect(_on_worker_shutdown, weak=False)


# ------------------------------------------------------------------------------- the hand-off


_installed: Celery | None = None
_handoff: HandOff | None = None


def enqueue_deliveries(
    delivery_ids: Sequence[str], *, app: Celery | None = None, retry_policy: dict[str, float] | None = None
) -> int:
    """Send ``delivery_ids`` to the workers in batches of ``batch_size``; return the number of
    tasks sent. ``app`` defaults to the installed enqueuer's app, else one from the environment.

    Raises what the broker raises once :data:`PUBLISH_RETRY_POLICY` is spent; batches sent
    before the failure stay sent (a later re-send of them is harmless).
    """
    target = app if app is not None else (_installed or default_app)
    size = settings_of(target).batch_size
    sent = 0
    for batch in _chunks(delivery_ids, size):
        target.send_task(
            DELIVER_TASK,
            args=[batch],
            queue=QUEUE,
            routing_key=QUEUE,
            retry=True,
            retry_policy=retry_policy if retry_policy is not None else PUBLISH_RETRY_POLICY,
        )
        sent += 1
    return sent


def install_enqueuer(settings: CommonSettings) -> Celery:
    """Make :func:`usp_workers.engine.outbox.emit` in this process hand its committed deliveries to the
    broker of ``settings``; return the app used. A failed hand-off never reaches emit's caller:
    it is logged, and the relay re-sends the deliveries later.

    With ``handoff_interval_seconds`` > 0 (the default) the hand-off is a :class:`HandOff`:
    published on its own thread, commits coalesced under load (not on the embedded broker). Call
    :func:`flush_enqueuer` to wait until what was committed so far is published."""
    global _installed, _handoff
    celery = make_celery(settings)
    publish = enqueuer(celery)
    handoff: HandOff | None = None
    if settings.uses_embedded_broker and settings.handoff_interval_seconds > 0:
        # At once, still off the committing thread: a worker fetches from this broker in a write
        # transaction of its own, so a message just published often still waits when the hand-off
        # looks, and coalescing cost latency for nothing. bench/pipeline.py --only embedded at half
        # the burst rate, three runs each: p50 15-19 ms at once against 27-34 ms coalescing, the
        # same deliveries/s (2,306-2,364 against 2,150-2,298) and worker CPU (415-419 against
        # 428-458 µs a delivery).
        handoff = HandOff(publish, interval=0.0, batch_size=settings.batch_size)
    elif settings.handoff_interval_seconds > 0:
        handoff = HandOff(
            publish,
            interval=settings.handoff_interval_seconds,
            batch_size=settings.batch_size,
            backlog=partial(waiting_messages, celery),
        )
    outbox.set_enqueuer(handoff or publish)
    if handoff is not None and not _flush_at_exit:
        _register_flush_at_exit()
    previous = (_installed, _handoff)
    _installed, _handoff = celery, handoff
    _close(*previous)
    return celery


@contextmanager
def handing_off(settings: CommonSettings) -> Iterator[Celery]:
    """:func:`install_enqueuer` for the block, then :func:`uninstall_enqueuer` (which publishes
    what is still held): every process that emits (the API, the scheduler, MCP over stdio, an
    operator's command) hands its commits to the broker at once instead of leaving them to the
    relay's re-send."""
    celery = install_enqueuer(settings)
    try:
        yield celery
    finally:
        uninstall_enqueuer()


def flush_enqueuer(timeout: float | None = 10.0) -> bool:
    """Publish what the installed hand-off holds now and wait for it; False on timeout."""
    handoff = _handoff
    return handoff.flush(timeout) if handoff is not None else True


def uninstall_enqueuer() -> None:
    """Publish what the hand-off holds, then stop handing off after commit (the relay alone
    will find new deliveries)."""
    global _installed, _handoff
    outbox.set_enqueuer(None)
    previous = (_installed, _handoff)
    _installed, _handoff = None, None
    _close(*previous)


_flush_at_exit = False


def _register_flush_at_exit() -> None:
    """Publish what the hand-off holds when the interpreter exits (its thread is a daemon, so
    nothing else would; what an exit still loses, the relay re-sends)."""
    global _flush_at_exit
    _flush_at_exit = True
    atexit.register(flush_enqueuer, 5.0)


def _close(celery: Celery | None, handoff: HandOff | None) -> None:
    if handoff is not None:
        handoff.close()
    if celery is not None:
        celery.close()


def waiting_messages(celery: Celery) -> int:
    """Delivery messages in the broker that no worker has taken yet (on Redis and the embedded
    broker an empty queue does not exist, and a passive declare of it fails: none wait)."""
    with celery.pool.acquire(block=True) as connection:
        try:
            declared = connection.default_channel.queue_declare(queue=QUEUE, passive=True)
        except connection.channel_errors:
            return 0
        return int(declared.message_count)


def enqueuer(celery: Celery) -> outbox.Enqueue:
    """An :data:`~usp_workers.engine.outbox.Enqueue` sending through ``celery`` (the relay's and the
    outbox's hand-off)."""
    return partial(_hand_off, celery)


def _hand_off(celery: Celery, delivery_ids: Sequence[str]) -> None:
    enqueue_deliveries(delivery_ids, app=celery)


def _chunks(ids: Sequence[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(ids), size):
        yield list(ids[start : start + size])
