"""Starting a delivery worker: a Celery worker consuming the delivery queue.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_workers.runtime.worker``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery.utils.nodenames import default_nodename, host_format
from kombu.utils.url import maybe_sanitize_url

from usp_workers.runtime.celery_app import QUEUE, make_celery
from usp_workers.runtime.logs import configure_logging
from usp_workers.settings import WorkerSettings

__all__ = ["DEFAULT_CONCURRENCY", "run_worker", "worker_argv", "worker_options"]

logger = logging.getLogger("usp_workers")

#: Batches one worker process runs at once (threads). Each thread only waits for its batch on
#: the shared loop, so this bounds concurrent batches, not CPU use. Well above
#: ``per_endpoint_concurrency`` (8): a hung endpoint can hold that many threads with tries in
#: flight, and the rest must stay free for every other subscription.
DEFAULT_CONCURRENCY = 32


def worker_options(
    *, concurrency: int | None = None, pool: str = "threads", loglevel: str = "INFO", node: str | None = None
) -> dict[str, Any]:
    """The worker's options, as keyword arguments of ``Celery.Worker`` (:func:`worker_argv` is
    the same options as ``celery worker`` arguments).

    Gossip and mingle are off: they exchange state between workers over broadcast messages this
    service does not use, and the embedded broker has no broadcast (fanout) exchanges. The node
    name (``usp-NODE@host``) must differ between the workers of one host: on RabbitMQ each
    node's control queue is exclusive, and a second worker of the same name cannot start. By
    default it is this process's id, right when the worker runs in this process; a caller that
    starts workers as subprocesses gives each its own ``node``.
    """
    return {
        "pool_cls": pool,
        "concurrency": concurrency or DEFAULT_CONCURRENCY,
        "queues": [QUEUE],
        "loglevel": loglevel,
        "without_gossip": True,
        "without_mingle": True,
        "hostname": f"usp-{node or os.getpid()}@%h",
    }


def worker_argv(
    *, concurrency: int | None = None, pool: str = "threads", loglevel: str = "INFO", node: str | None = None
) -> list[str]:
    """:func:`worker_options` as ``celery -A usp_workers.runtime.celery_app worker`` arguments."""
    options = worker_options(concurrency=concurrency, pool=pool, loglevel=loglevel, node=node)
    return [
        "worker",
        f"--pool={options['pool_cls']}",
        f"--concurrency={options['concurrency']}",
        f"--queues={','.join(options['queues'])}",
        f"--loglevel={options['loglevel']}",
        "--without-gossip",
        "--without-mingle",
        f"--hostname={options['hostname']}",
    ]


def run_worker(
    settings: WorkerSettings, *, concurrency: int | None = None, pool: str = "threads", loglevel: str = "INFO"
) -> None:
    """Run a delivery worker in this process until SIGTERM or SIGINT.

    Celery handles both as a *warm* shutdown: it stops taking messages, lets running batches
    finish and record their results, then exits (a second SIGINT, or SIGQUIT, exits at once;
    deliveries held then come back when their leases expire).

    The worker is built with ``Celery.Worker``, as ``celery worker`` builds it, without going
    through Celery's command line, which imports every ``celery`` subcommand (``celery shell``'s
    prompt_toolkit among them). CPU to "ready", 2 cores: 1.95 → 1.4 s where nothing is compiled
    ahead and PYTHONDONTWRITEBYTECODE is set, 0.92 → 0.89 s with the imports compiled.
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
    options = worker_options(concurrency=concurrency, pool=pool, loglevel=loglevel)
    options["hostname"] = host_format(default_nodename(options["hostname"]))  # as the command line does
    worker = celery.Worker(**options)
    worker.start()
    if worker.exitcode:
        raise SystemExit(worker.exitcode)
