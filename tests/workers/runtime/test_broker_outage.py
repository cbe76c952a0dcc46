"""Broker down: the scheduler's re-sends (and the API's hand-off, which shares the counter) log one
warning when the outage starts and one with the count when the broker answers again, never a
traceback per batch. Redis is made unreachable through a proxy."""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa

from tests.faults import tcp_proxy
from tests.workers.conftest import MakeSettings
from usp_workers.runtime import relay, tasks
from usp_workers.runtime.celery_app import make_celery


def test_a_broker_outage_is_two_log_lines_not_a_traceback_per_batch(
    make_settings: MakeSettings, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    parsed = sa.make_url(redis_url)
    with tcp_proxy(parsed.host or "127.0.0.1", parsed.port or 6379) as proxy:
        celery = make_celery(make_settings(broker_url=f"redis://127.0.0.1:{proxy.port}/15"))
        enqueue = tasks.enqueuer(celery)
        try:
            assert relay._send([["dlv_a"]], enqueue) == (1, 1, 0)
            proxy.cut()
            with caplog.at_level(logging.INFO, logger="usp_workers"):
                failed = [relay._send([["dlv_b"], ["dlv_c"]], enqueue) for _ in range(4)]
                proxy.restore()
                recovered = relay._send([["dlv_d"]], enqueue)
        finally:
            celery.close()
    assert failed == [(0, 0, 2)] * 4, "each pass stops at the first refused batch; the rest wait"
    assert recovered == (1, 1, 0)
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 2, [r.getMessage() for r in said]
    assert said[0].getMessage().startswith("broker unavailable (")
    assert said[1].getMessage().startswith("broker available again after ")
    assert "4 operations failed meanwhile" in said[1].getMessage()
    assert not [r for r in caplog.records if r.exc_info], "no traceback"
