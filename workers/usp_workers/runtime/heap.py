"""Keep the cyclic garbage collector's full passes short in long-running service processes: freeze
the start-up heap once the process is ready (measured: docs/architecture.md, "Retention,
metrics, the heap").
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
