"""Coalesce the deliveries of many small commits into few, fuller broker messages.

An API commits a few events per request, and each commit used to publish its own
``usp.deliver`` task of a few deliveries. A task's cost is mostly fixed (Celery's publish,
reserve and acknowledge; the claim and record transactions; the hand-over to the event loop:
~5 ms of CPU in all, against ~0.45 ms per delivery), so at a steady few hundred deliveries a
second the fleet spent most of its CPU on task overhead, and the queueing that followed was the
latency tail. Measured with ``bench/pipeline.py`` (Redis + PostgreSQL, 2 cores, ~850 events/s):
transactions of 8 events every 10 ms, one task each, kept 1.85 cores busy (p99 100-160 ms);
the same rate in tasks of ~25 kept 1.31 busy (p99 27 ms).

:class:`HandOff` is Nagle's algorithm for that hand-off: a commit's deliveries go to the broker
at once when the previous hand-off is at least ``interval`` old (an idle or lightly loaded
service adds no delay), otherwise they wait, with every commit made meanwhile, until ``interval``
after it; full batches of ``batch_size`` never wait. So no delivery waits longer than
``interval``, and under load one message carries every commit of an ``interval``.

The default interval (``handoff_interval_seconds``, 30 ms) is measured, not guessed: in eight
pairs of bench runs (20 ms, then 30 ms, minutes apart), 30 ms had the lower p99 at half load in
the seven made while the machine was busy (47-95 ms against 59-249 ms), at about the same p50
(the shorter queue pays for the wait); on a quiet machine 20 ms did a little better (p99 35-40
ms against 47). Re-measured once claim and record had become one statement each: 10 ms halves
p50 on Redis (16-25 ms against 30-47), but p99 was lower in only about half of the interleaved pairs
(5 of 9), the workers spend 20-60% more CPU per delivery at half load, and on the embedded
broker (a SQLite write per message) p99 doubled. Measured again on a faster machine, with the
start-up heap frozen (:mod:`usp_workers.heap`), two pairs each: at half load 20 ms had p99 30.5
ms against 41-42, but at 85% load 319-330 ms against 129-174; sending at once whenever 16
deliveries wait did the same, measured there before the freeze (23-26 ms against 39-46 at half
load, 55-334 against 69-119 at 85%). Shorter waits buy the quiet case's latency with the busy
case's CPU, so 30 ms stays. Adapting to the load needs a signal of the workers' backlog, which
the committing process does not have: with one prefetched message per worker thread the
broker's queue stays empty until every thread is busy.

Nothing is lost by waiting in memory: every delivery was committed already marked
``enqueued_at``, so if this process dies before the hand-off the relay re-sends it after
``requeue_after_seconds`` (the same path as a crash between commit and publish). Publishing
runs on the hand-off's own thread, so a request never waits for the broker, and a broker that
is down costs the committing request nothing (the failure is logged; the relay re-sends).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

from .outage import BROKER_OUTAGE

__all__ = ["HandOff"]

logger = logging.getLogger("usp_workers")

Publish = Callable[[Sequence[str]], None]
#: How many delivery messages wait in the broker, not yet taken by a worker.
Backlog = Callable[[], int]


class HandOff:
    """An :data:`~usp_workers.outbox.Enqueue` that publishes through ``publish`` on a thread of
    its own, at most one partial batch per ``interval`` seconds (see the module docstring).

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
                self._look_at_backlog()
            finally:
                with self._lock:
                    self._publishing = False
                    self._lock.notify_all()

    def _look_at_backlog(self) -> None:
        if self.backlog is None:
            return
        try:
            busy = self.backlog() > 0
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
