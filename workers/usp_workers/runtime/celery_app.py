"""The Celery application: one queue of delivery batches, configured for at-least-once.

``celery -A usp_workers.runtime.celery_app worker`` finds :data:`app`, built from the environment;
code with its own settings calls :func:`make_celery`. Messages carry wake-ups, the database
carries state (docs/architecture.md, "Celery carries wake-ups").
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import warnings
from typing import Any

from celery import Celery
from celery.exceptions import SecurityWarning
from celery.signals import after_setup_logger, celeryd_init, worker_init, worker_process_init, worker_ready
from kombu.entity import Queue

from usp_core.settings import CommonSettings
from usp_workers.engine import tracing
from usp_workers.runtime.embedded_broker import celery_broker
from usp_workers.runtime.heap import freeze_startup_heap
from usp_workers.runtime.logs import hook_celery_logging
from usp_workers.settings import WorkerSettings

__all__ = [
    "DELIVER_TASK",
    "PREFETCH_MULTIPLIER",
    "QUEUE",
    "app",
    "make_celery",
    "prepare_broker",
    "settings_of",
    "transport_options",
]

logger = logging.getLogger("usp_workers")

#: The one queue every delivery batch goes through.
QUEUE = "usp.deliveries"
#: The task's name on the wire (``usp_workers.runtime.tasks.deliver``).
DELIVER_TASK = "usp.deliver"

#: Messages a worker reserves per execution slot. Each message is already a batch of up to
#: ``batch_size`` deliveries, so 1 loses no throughput, and anything higher only hurts:
#: a worker whose threads are all busy with a slow endpoint would hoard batches another worker
#: could start now; reserved batches age in the buffer (their ``enqueued_at`` stamp passes
#: ``requeue_after_seconds`` and the relay sends them again, which is harmless but wasted);
#: and a worker that is killed takes more unacknowledged messages down with it.
PREFETCH_MULTIPLIER = 1

_SETTINGS_ATTRIBUTE = "usp_settings"


def make_celery(settings: CommonSettings) -> Celery:
    """A Celery app for ``settings``: broker ``settings.broker_url_resolved``, JSON only, no
    results, late acknowledgement, one queue (:data:`QUEUE`). Connects lazily (on first send)."""
    broker_url, transport = celery_broker(settings.broker_url_resolved)
    celery = Celery("usp_workers", include=["usp_workers.runtime.tasks"], set_as_current=False)
    celery.conf.update(
        broker_url=broker_url,
        broker_transport=transport,
        broker_transport_options=transport_options(settings),
        broker_connection_retry_on_startup=True,
        # Messages are lists of ids: JSON, and nothing else is accepted (no pickle from the wire).
        task_serializer="json",
        accept_content=["json"],
        # Results would be a second write per batch that nobody reads: the database has them.
        result_backend=None,
        task_ignore_result=True,
        task_store_errors_even_if_ignored=False,
        # At least once (see the module docstring).
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=PREFETCH_MULTIPLIER,
        # On a lost broker connection, let running batches finish and record their results:
        # cancelling them would leave their deliveries in flight until their leases expire.
        # (Setting it also silences Celery's pending-deprecation warning about the default.)
        worker_cancel_long_running_tasks_on_connection_loss=False,
        task_default_queue=QUEUE,
        task_queues=(Queue(QUEUE, routing_key=QUEUE),),  # type: ignore[no-untyped-call]
        task_routes={DELIVER_TASK: {"queue": QUEUE, "routing_key": QUEUE}},
        task_create_missing_queues=False,
        worker_disable_rate_limits=True,  # no rate limits are used; skip their bookkeeping
        worker_send_task_events=False,
        task_send_sent_event=False,
        enable_utc=True,
        timezone="UTC",
    )
    setattr(celery, _SETTINGS_ATTRIBUTE, settings)
    _log_json_if_asked(settings)
    return celery


def settings_of(celery: Celery) -> WorkerSettings:
    """The worker settings ``celery`` was made with (``WorkerSettings()`` from the environment
    for an app that :func:`make_celery` did not make with them)."""
    settings = getattr(celery, _SETTINGS_ATTRIBUTE, None)
    if isinstance(settings, WorkerSettings):
        return settings
    settings = WorkerSettings()
    setattr(celery, _SETTINGS_ATTRIBUTE, settings)
    return settings


def prepare_broker(celery: Celery) -> None:
    """Connect and declare :data:`QUEUE`. For the embedded broker this creates its tables once,
    up front, instead of in several processes racing at their first message."""
    with celery.connection_for_write() as connection:
        connection.ensure_connection(max_retries=3)
        celery.amqp.queues[QUEUE](connection.default_channel).declare()


def transport_options(settings: CommonSettings) -> dict[str, Any]:
    """Transport options for the configured broker. They are per transport: kombu's SQL transport
    passes every unknown option to ``create_engine``, which refuses what it does not know."""
    url = settings.broker_url_resolved
    if url.startswith(("redis://", "rediss://", "redis+socket://")):
        # No acknowledgement emulation: the database's lease and the relay bring back what a dead
        # worker held (docs/architecture.md, "Celery carries wake-ups").
        return {"ack_emulation": False}
    return {}


_json_hook_lock = threading.Lock()
_json_hooked = False


def _log_json_if_asked(settings: CommonSettings) -> None:
    """With JSON logs, make Celery's logging set-up ours, once per process.

    Celery skips its own set-up when anything receives ``setup_logging``, so the receiver is
    connected only for JSON (text keeps Celery's handlers and :func:`_quiet_per_request_logs`).
    Connecting is all that happens here: the receiver runs only where a worker starts, never in
    the API or the scheduler, which also make apps. The first JSON app of a process decides.
    """
    global _json_hooked
    if settings.log_format != "json":
        return
    with _json_hook_lock:
        if not _json_hooked:
            hook_celery_logging(settings)
            _json_hooked = True


def _quiet_per_request_logs(**_: Any) -> None:
    """Keep the worker's log to one line per batch (``usp_workers.runtime.tasks``) plus problems.

    httpx logs every request at INFO with its URL, and webhook URLs may carry secrets (a token in
    the query); Celery logs two INFO lines per task ("received", "succeeded"), which at hundreds
    of batches a second drown everything else. Their warnings and errors still show.
    """
    for name in ("httpx", "httpcore", "celery.app.trace", "celery.worker.strategy"):
        logging.getLogger(name).setLevel(logging.WARNING)


after_setup_logger.connect(_quiet_per_request_logs, weak=False)

#: The collector thresholds of worker processes (Python's defaults: 700, 10, 10).
#:
#: Why: a worker allocates thousands of short-lived objects per batch (ORM rows, requests,
#: signature bases), so with the defaults the cyclic collector runs many times a second and,
#: holding the GIL, stops every batch in the process while it scans; a gen-2 pass over a heap
#: grown by a burst takes tens of milliseconds. Measured with ``bench/pipeline.py`` (Redis +
#: PostgreSQL, 2 cores): enqueue→2xx p99 at half load 17-78 ms over seven runs with these
#: thresholds (six under 50 ms), against 35-186 ms with the defaults (one under 50 ms), and ~10 %
#: less worker CPU per delivery. Almost
#: all of a batch's garbage is freed by reference counting anyway; the collector only has cycles
#: left to find, and finding them less often costs a little memory, not correctness.
WORKER_GC_THRESHOLDS: tuple[int, int, int] = (20_000, 50, 100)


#: Seconds a thread of a worker process may hold the GIL while another waits for it (Python's
#: default: 0.005).
#:
#: Why: every delivery crosses threads (the consumer hands the message to a pool thread, which
#: claims, hands the requests to the event loop's thread, and records), and each wake-up (a
#: socket ready, a result back) waits for the GIL behind whichever thread is computing, up to
#: the whole interval, several times per delivery. Measured with ``bench/pipeline.py`` (Redis +
#: PostgreSQL, 2 cores), three interleaved pairs: enqueue→2xx p99 at half load 56.5-63.0 ms with
#: 1 ms against 76.0-91.7 ms with the default, at the same throughput and worker CPU.
WORKER_SWITCH_INTERVAL = 0.001


def _tune_interpreter(**_: Any) -> None:
    gc.set_threshold(*WORKER_GC_THRESHOLDS)
    sys.setswitchinterval(WORKER_SWITCH_INTERVAL)


def _freeze_startup_heap(**_: Any) -> None:
    freeze_startup_heap()


def _trace(**_: Any) -> None:
    tracing.configure("usp-webhooks-worker")  # only with OTEL_EXPORTER_OTLP_ENDPOINT set


def _explain_root(conf: Any, **_: Any) -> None:
    """Say once, in one line, what Celery's superuser ``SecurityWarning`` (a screenful on every
    start as root, as in a container without a ``USER``) means here, and silence it.

    Root is dangerous to a Celery worker because a pickled message runs code as root; this app
    accepts JSON only, so a message cannot (Celery itself refuses to start as root with pickle
    accepted, and that refusal is left alone). The image runs as user 10001 all the same.
    """
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or "pickle" in conf.accept_content:
        return
    warnings.filterwarnings("ignore", category=SecurityWarning)
    logging.getLogger("usp_workers").warning(
        "running as root: safe from Celery's pickle risk (this worker accepts only JSON messages), "
        "but a container should run it as a user (the project's image runs as uid 10001)"
    )


# Fired before Celery checks privileges, by `usp-webhooks worker` and `celery worker` alike.
celeryd_init.connect(_explain_root, weak=False)
# Only where a worker starts (its main process, and each child of a prefork pool): the API and
# the scheduler import this module too and keep Python's defaults.
worker_init.connect(_tune_interpreter, weak=False)
worker_process_init.connect(_tune_interpreter, weak=False)
# Once the worker is up (with the threads pool, the process that runs the batches; with
# prefork, each child once initialised): see usp_workers.runtime.heap.
worker_ready.connect(_freeze_startup_heap, weak=False)
worker_process_init.connect(_freeze_startup_heap, weak=False)
worker_init.connect(_trace, weak=False)  # prefork children inherit it (the SDK restarts its thread)

#: The app ``celery -A usp_workers.runtime.celery_app worker`` runs, configured from the environment.
app: Celery = make_celery(WorkerSettings())
