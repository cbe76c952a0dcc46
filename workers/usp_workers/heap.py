"""Keep the cyclic garbage collector's full passes short in long-running service processes.

A full (generation 2) collection scans every tracked object of the process while holding the
GIL, so every thread stops for it: in the API, the hand-off thread that publishes committed
deliveries (:mod:`usp_workers.handoff`) and every request; in a worker, every batch. Nearly all
of those objects are the ones start-up made (modules, classes, functions, the app, its routes,
Celery's and SQLAlchemy's registries) and they live as long as the process, so scanning them
finds nothing. Python runs a full pass whenever the objects promoted since the last one exceed a
quarter of the long-lived total, which steady traffic reaches every few seconds.

Measured with ``bench/pipeline.py`` (Redis + PostgreSQL, 2 cores), in the process that commits
the events and hands them off, as the API does: full passes over ~155,000 objects took 60-190 ms
each, two or three of them in the paced phase, and each one held back every delivery waiting in
the hand-off for as long (the runs' worst seconds: p99 65-100 ms against ~40 in the others).
After :func:`freeze_startup_heap` (called there just before the measured phases) the full
passes scan only what was made since, 4,000-9,000 objects, and took 3-17 ms.

The cost: an object frozen here that later becomes part of an unreachable cycle is never
collected. Start-up objects stay for the life of the process anyway, which is why this freezes
once per process, when it is ready, and not again: a later freeze would also pin what the
process made since (a finished request's objects, a test's fixtures), which need not live as
long.
"""

from __future__ import annotations

import gc
import logging
import os

__all__ = ["freeze_startup_heap"]

logger = logging.getLogger("usp_workers")

_frozen_in: int | None = None  #: the process id that froze (a forked child has not yet)


def freeze_startup_heap() -> bool:
    """Collect once, then move every object alive now into the permanent generation, so that
    later full collections skip it. Call it when the process has started up. Only the first
    call in a process does anything; returns whether this one did."""
    global _frozen_in
    if _frozen_in == os.getpid():
        return False
    _frozen_in = os.getpid()
    gc.collect()
    gc.freeze()
    logger.debug("froze %d start-up objects out of the garbage collector's scans", gc.get_freeze_count())
    return True
