"""Is this process able to work: the database and the broker answer.

The API serves it at ``/readyz``; ``usp-webhooks ready`` runs it for the worker's and the
scheduler's container health checks. Each check has a short timeout, so a probe never hangs
on an unreachable host, and a failure says which dependency failed and how, without the URL
(it may hold a password).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from kombu.connection import Connection
from sqlalchemy.engine import Engine

from usp_core.settings import CommonSettings
from usp_workers.engine.outage import describe
from usp_workers.runtime.celery_app import transport_options
from usp_workers.runtime.embedded_broker import celery_broker

__all__ = ["CHECK_TIMEOUT_SECONDS", "Check", "check_broker", "check_database", "readiness"]

#: How long one check may take before it counts as failed.
CHECK_TIMEOUT_SECONDS = 3.0


@dataclass(frozen=True, slots=True)
class Check:
    """One dependency: ``error`` (its exception class and first line) when it failed."""

    name: str
    ok: bool
    error: str | None = None


def check_database(engine: Engine) -> Check:
    try:
        with engine.connect() as connection:
            connection.execute(sa.text("SELECT 1"))
    except Exception as exc:  # any failure is the answer, not a crash of the probe
        return Check("database", False, describe(exc))
    return Check("database", True)


def check_broker(settings: CommonSettings) -> Check:
    url, transport = celery_broker(settings.broker_url_resolved)
    try:
        with Connection(  # type: ignore[no-untyped-call]
            url,
            transport=transport,
            connect_timeout=CHECK_TIMEOUT_SECONDS,
            transport_options=transport_options(settings),
        ) as connection:
            connection.ensure_connection(max_retries=0, timeout=CHECK_TIMEOUT_SECONDS)
    except Exception as exc:  # as above
        return Check("broker", False, describe(exc))
    return Check("broker", True)


def readiness(engine: Engine, settings: CommonSettings) -> list[Check]:
    """Both checks, database first."""
    return [check_database(engine), check_broker(settings)]
