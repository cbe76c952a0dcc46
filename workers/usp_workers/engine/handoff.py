"""Hand committed deliveries to the broker: at once while the workers keep up, coalesced while
they do not (the measurement behind it: docs/architecture.md, "The outbox and the hand-off").
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from usp_workers.engine.outage import BROKER_OUTAGE

__all__ = ["HandOff"]

logger = logging.getLogger("usp_workers")

Publish = Callable[[Sequence[str]], None]
#: How many delivery messages wait in the broker, not yet taken by a worker.
Backlog = Callable[[], int]


class HandOff:
    """An :data:`~usp_workers.engine.outbox.Enqueue` that publishes through ``publish`` on a thread of
    its own: at once while ``backlog()`` was 0 at the last look, else at most one partial batch
    per ``interval`` seconds (no ``backlog``: always the latter).

    >>> sent = []
    >>> handoff = HandOff(sent.append, interval=0.02, batch_size=50)
    >>> handoff(["dlv_1"]); handoff(["dlv_2"])
    >>> handoff.close()
    >>> sorted(id for batch in sent for id in batch)
    ['dlv_1', 'dlv_2']
    """

    def __init__(
        self, publish: Publish, *, interval: float, batch_size: int, backlog: Backlog | None = None
    ) -> None:
        self.publish = publish
        self.interval = interval
        self.batch_size = batch_size
        self.backlog = backlog
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Condition()
        self._pending: list[str] = []
        self._publishing = False
        self._closed = False
        self._flushing = 0  #: flushes waiting: send without waiting for the interval
        self._last_sent = float("-inf")
        #: The broker held messages no worker had taken at the last look: the workers are all
        #: busy, so commits wait for each other. Without a ``backlog`` to look at: always.
        self._busy = self.backlog is None
        self._thread: threading.Thread | None = None

    def __call__(self, delivery_ids: Sequence[str]) -> None:
        """Queue committed ``delivery_ids`` for the broker (never blocks on the broker)."""
        if os.getpid() != self._pid:
            self._reset()  # a forked child: the parent's queue and thread are the parent's
        with self._lock:
            if self._closed:
                raise RuntimeError("this hand-off is closed")
            self._pending.extend(delivery_ids)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="usp-handoff", daemon=True)
                self._thread.start()
            self._lock.notify()

    def flush(self, timeout: float | None = None) -> bool:
        """Publish what is queued now, without waiting for ``interval``; wait until it has been
        published (or failed). False if ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._flushing += 1
            self._lock.notify_all()
            try:
                while self._pending or self._publishing:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._lock.wait(remaining)
            finally:
                self._flushing -= 1
        return True

    def close(self, timeout: float | None = 10.0) -> None:
        """Publish what is queued, then stop the thread. Later calls raise ``RuntimeError``."""
        if os.getpid() != self._pid:
            return
        self.flush(timeout)
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
            self._lock.notify_all()
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._lock:
                batch = self._next_batch()
                if batch is None:
                    return
                self._publishing = True
            try:
                self.publish(batch)
            except Exception as exc:
                # Committed and marked: the relay re-sends them once requeue_after_seconds pass.
                BROKER_OUTAGE.failed(exc)
            else:
                BROKER_OUTAGE.succeeded()
                self._look_at_backlog(published=-(-len(batch) // self.batch_size))
            finally:
                with self._lock:
                    self._publishing = False
                    self._lock.notify_all()

    def _look_at_backlog(self, published: int) -> None:
        """Busy if more than the ``published`` messages just sent wait: the look comes right after
        the publish, and what it sent is seldom taken yet (on the embedded broker, never), so
        counting it coalesced every commit at any rate."""
        if self.backlog is None:
            return
        try:
            busy = self.backlog() > published
        except Exception:
            logger.debug("could not read the broker's backlog; coalescing meanwhile", exc_info=True)
            busy = True
        with self._lock:
            self._busy = busy

    def _next_batch(self) -> list[str] | None:
        """Wait (holding the lock) until something may be sent; take it. ``None``: closed."""
        while True:
            if self._pending:
                now = time.monotonic()
                due = self._last_sent + self.interval
                full = len(self._pending) - len(self._pending) % self.batch_size
                if now >= due or not self._busy or self._closed or self._flushing > 0:
                    taken, self._pending = self._pending, []
                elif full:
                    taken, self._pending = self._pending[:full], self._pending[full:]
                else:
                    self._lock.wait(due - now)
                    continue
                self._last_sent = now
                return taken
            if self._closed:
                return None
            self._lock.wait()
