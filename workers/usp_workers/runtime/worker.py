"""Starting a delivery worker: a Celery worker consuming the delivery queue.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_workers.runtime.worker``.
"""

from __future__ import annotations

import logging
import os

from kombu.utils.url import maybe_sanitize_url

from usp_workers.runtime.celery_app import QUEUE, make_celery
from usp_workers.runtime.logs import configure_logging
from usp_workers.settings import WorkerSettings

__all__ = ["DEFAULT_CONCURRENCY", "run_worker", "worker_argv"]

logger = logging.getLogger("usp_workers")

#: Batches one worker process runs at once (threads). Each thread only waits for its batch on
#: the shared loop, so this bounds concurrent batches, not CPU use. Well above
#: ``per_endpoint_concurrency`` (8): a hung endpoint can hold that many threads with tries in
#: flight, and the rest must stay free for every other subscription.
DEFAULT_CONCURRENCY = 32


def worker_argv(
    *, concurrency: int | None = None, pool: str = "threads", loglevel: str = "INFO", node: str | None = None
) -> list[str]:
    """The ``celery worker`` arguments :func:`run_worker` uses (also handy for subprocesses).

    Gossip and mingle are off: they exchange state between workers over broadcast messages this
    service does not use, and the embedded broker has no broadcast (fanout) exchanges. The node
    name (``usp-NODE@host``) must differ between the workers of one host: on RabbitMQ each
    node's control queue is exclusive, and a second worker of the same name cannot start. By
    default it is this process's id, right when the worker runs in this process; a caller that
    starts workers as subprocesses gives each its own ``node``.
    """
    return [
        "worker",
        f"--pool={pool}",
        f"--concurrency={concurrency or DEFAULT_CONCURRENCY}",
        f"--queues={QUEUE}",
        f"--loglevel={loglevel}",
        "--without-gossip",
        "--without-mingle",
        f"--hostname=usp-{node or os.getpid()}@%h",
    ]


def run_worker(
    settings: WorkerSettings, *, concurrency: int | None = None, pool: str = "threads", loglevel: str = "INFO"
) -> None:
    """Run a delivery worker in this process until SIGTERM or SIGINT.

    Celery handles both as a *warm* shutdown: it stops taking messages, lets running batches
    finish and record their results, then exits (a second SIGINT, or SIGQUIT, exits at once;
    deliveries held then come back when their leases expire).
    """
    configure_logging(settings, level=loglevel)  # the lines before Celery's (make_celery hooks those)
    logger.info(
        "worker starting: queue %s, %s pool, concurrency %d, broker %s, database %s",
        QUEUE,
        pool,
        concurrency or DEFAULT_CONCURRENCY,
        maybe_sanitize_url(settings.broker_url_resolved),
        maybe_sanitize_url(settings.database_url),
    )
    celery = make_celery(settings)
    celery.loader.import_default_modules()  # registers usp.deliver (the app's include list)
    celery.worker_main(worker_argv(concurrency=concurrency, pool=pool, loglevel=loglevel))
