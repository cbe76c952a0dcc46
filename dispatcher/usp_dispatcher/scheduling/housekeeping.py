"""The scheduling domain's periodic work, run by ``usp-webhooks scheduler`` beside the relay.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.scheduling.housekeeping``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from usp_core import db
from usp_core.clock import utcnow
from usp_dispatcher.scheduling import expire_offers, forget_idempotency_keys
from usp_workers import DATABASE_OUTAGE, SchedulerSettings, database_unavailable

__all__ = ["IDEMPOTENCY_RETENTION", "HousekeepingReport", "housekeeping_once", "housekeeping_thread"]

logger = logging.getLogger("usp_dispatcher")

#: How long an idempotency key is remembered.
IDEMPOTENCY_RETENTION = timedelta(hours=24)


@dataclass(frozen=True, slots=True)
class HousekeepingReport:
    expired_waitlist_entries: int
    forgotten_idempotency_keys: int


def housekeeping_once(engine: Engine, *, now: datetime | None = None) -> HousekeepingReport:
    """One pass of both steps, each in its own transaction."""
    now = now or utcnow()
    with db.session(engine) as session:
        expired = expire_offers(session, now=now)
        session.commit()
    with db.session(engine) as session:
        forgotten = forget_idempotency_keys(session, before=now - IDEMPOTENCY_RETENTION)
        session.commit()
    return HousekeepingReport(expired, forgotten)


@contextmanager
def housekeeping_thread(settings: SchedulerSettings) -> Iterator[threading.Thread]:
    """Run :func:`housekeeping_once` every ``relay_interval_seconds`` in a thread until the
    ``with`` block ends (the relay owns the main thread and its signal handlers)."""
    stop = threading.Event()
    thread = threading.Thread(target=_loop, args=(settings, stop), name="usp-housekeeping", daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        stop.set()
        thread.join(timeout=30)


def _loop(settings: SchedulerSettings, stop: threading.Event) -> None:
    engine = db.make_engine(settings)
    try:
        while not stop.is_set():
            try:
                report = housekeeping_once(engine)
            except sa.exc.SQLAlchemyError as exc:
                # Nothing is lost: the next pass tries again. An outage is one warning when it
                # starts and one when it ends, shared with the relay beside it; anything else is
                # a bug, and its traceback is what the operator needs.
                if database_unavailable(exc):
                    DATABASE_OUTAGE.failed(exc)
                else:
                    logger.exception(
                        "housekeeping pass failed; retrying in %.1f s", settings.relay_interval_seconds
                    )
            else:
                DATABASE_OUTAGE.succeeded()
                if report.expired_waitlist_entries or report.forgotten_idempotency_keys:
                    logger.info(
                        "housekeeping: %d waitlist entries expired, %d idempotency keys forgotten",
                        report.expired_waitlist_entries,
                        report.forgotten_idempotency_keys,
                    )
            stop.wait(settings.relay_interval_seconds)
    finally:
        engine.dispose()
