"""One warning when a dependency (the broker, the database) stops answering, one when it is back.

A process that hands off a batch every few milliseconds would otherwise log a traceback per
batch for as long as the outage lasts; the operator needs to know that it started, what the error
was, and when it ended with how many operations failed in between.
"""

from __future__ import annotations

import logging
import re
import threading
import time

import sqlalchemy as sa

__all__ = ["BROKER_OUTAGE", "DATABASE_OUTAGE", "Outage", "database_unavailable", "describe"]

_CREDENTIALS = re.compile(r"://[^/@\s]*@")


class Outage:
    """Thread-safe; ``failed`` on each failure, ``succeeded`` after each success."""

    def __init__(self, what: str, logger: logging.Logger, consequence: str) -> None:
        self._what = what
        self._logger = logger
        self._consequence = consequence
        self._lock = threading.Lock()
        self._since: float | None = None
        self._failures = 0

    def reset(self) -> None:
        """Forget an outage without a line (tests start each from a clean state)."""
        with self._lock:
            self._since, self._failures = None, 0

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            self._failures += 1
            if self._since is not None:
                return
            self._since = time.monotonic()
        self._logger.warning("%s unavailable (%s): %s", self._what, describe(exc), self._consequence)

    def succeeded(self) -> None:
        with self._lock:  # uncontended almost always: cheap next to the operation it follows
            since, failures = self._since, self._failures
            self._since, self._failures = None, 0
        if since is None:  # no outage (or another thread closed it first)
            return
        self._logger.warning(
            "%s available again after %.0f s; %d operations failed meanwhile",
            self._what,
            time.monotonic() - since,
            failures,
        )


#: One per process: the API's hand-off and the scheduler's re-sends share the broker's fate.
BROKER_OUTAGE = Outage(
    "broker",
    logging.getLogger("usp_workers"),
    "committed deliveries wait in the database; the scheduler sends them when it answers",
)

#: The worker's and the scheduler's: outcomes held, passes skipped while the database is down.
DATABASE_OUTAGE = Outage(
    "database",
    logging.getLogger("usp_workers"),
    "outcomes are held in the worker and written when it answers; the scheduler waits",
)


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` means the database cannot be reached now (not a bug in a query)."""
    if isinstance(exc, sa.exc.DBAPIError):
        return exc.connection_invalidated or isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError)
    return isinstance(exc, sa.exc.TimeoutError)  # the pool had no connection to give


def describe(exc: BaseException) -> str:
    """``Type: first line of the message`` (at most 200 characters), any ``user:password@`` of a
    URL in it masked: what a log line or a health answer may say of a dependency's failure."""
    first = (str(exc).strip().splitlines() or [""])[0]
    text = _CREDENTIALS.sub("://***@", first)[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
