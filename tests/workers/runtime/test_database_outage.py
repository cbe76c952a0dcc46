"""The database goes away while a worker's try is in flight (PostgreSQL behind a proxy): the
receiver's 2xx is not lost. The worker holds the outcome, writes it when the database answers
again, and the scheduler finds nothing to send again: the event arrives exactly once."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tests.faults import TcpProxy, tcp_proxy
from tests.postgres import fresh_schema
from tests.workers.conftest import MakeSettings
from tests.workers.endpoints import Receive, Scope, Send, respond
from tests.workers.support import Endpoints, add_subscription, attempts, delivery, emit_event
from usp_core import db
from usp_core.keys import ensure_signing_key
from usp_workers.engine.background import close_background_runtime
from usp_workers.engine.delivery import deliver_batch_sync
from usp_workers.runtime.relay import relay_once
from usp_workers.storage import migrate
from usp_workers.storage.models import DeliveryStatus


@pytest.fixture
def schema_url(postgres_url: str) -> Iterator[str]:
    """A PostgreSQL URL whose connections use a fresh schema of their own (dropped after)."""
    with fresh_schema(postgres_url) as url:
        try:
            yield url
        finally:
            close_background_runtime()


class CutsTheDatabaseThenAcknowledges:
    """A receiver that makes the database unreachable while it answers 200, and brings it back
    ``after`` seconds later."""

    def __init__(self, proxy: TcpProxy, after: float) -> None:
        self.proxy = proxy
        self.after = after
        self.arrivals = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.arrivals += 1
        self.proxy.cut()
        threading.Timer(self.after, self.proxy.restore).start()
        await respond(send, 200, b"ok")


def test_an_outcome_the_database_could_not_take_is_held_and_never_sent_twice(
    schema_url: str, make_settings: MakeSettings, endpoints: Endpoints, caplog: pytest.LogCaptureFixture
) -> None:
    settings = make_settings(database_url=schema_url, lease_seconds=30.0)
    direct = db.make_engine(schema_url)
    parsed = sa.make_url(schema_url)
    proxied: Engine | None = None
    try:
        migrate.upgrade(direct)
        with db.session(direct) as s:
            ensure_signing_key(s, settings)
            s.commit()
        with tcp_proxy(parsed.host or "127.0.0.1", parsed.port or 5432) as proxy:
            receiver = CutsTheDatabaseThenAcknowledges(proxy, after=2.0)
            add_subscription(direct, endpoints.add("cut", receiver))
            _, (delivery_id,) = emit_event(direct)
            proxied = db.make_engine(parsed.set(host="127.0.0.1", port=proxy.port).render_as_string(False))
            with caplog.at_level(logging.WARNING, logger="usp_workers"):
                report = deliver_batch_sync(proxied, settings, [delivery_id])
        assert report.succeeded == 1
        assert receiver.arrivals == 1
        recorded = delivery(direct, delivery_id)
        assert (recorded.status, recorded.attempt_count) == (DeliveryStatus.SUCCEEDED, 1)
        assert [a.outcome for a in attempts(direct, delivery_id)] == ["succeeded"]
        sent: list[Sequence[str]] = []
        after = relay_once(direct, settings, sent.append)
        assert (after.reclaimed, sent) == (0, []), "nothing left to send again"
        said = [
            r.getMessage() for r in caplog.records if r.name == "usp_workers" and r.levelno >= logging.WARNING
        ]
        assert [m.split(" (")[0].split(" after")[0] for m in said] == [
            "database unavailable",
            "database available again",
        ]
        assert not [r for r in caplog.records if r.exc_info], "no traceback"
    finally:
        direct.dispose()
        if proxied is not None:
            proxied.dispose()


def test_after_its_own_outage_the_scheduler_holds_off_reclaiming_leases(
    schema_url: str, make_settings: MakeSettings
) -> None:
    """A pass that could not reach the database reports it, so the loop skips reclaiming for
    RECLAIM_HOLD_OFF_SECONDS after the return; a pass told not to reclaim leaves expired leases."""
    from usp_workers.runtime import relay

    settings = make_settings(database_url=schema_url)
    engine = db.make_engine(schema_url)
    try:
        migrate.upgrade(engine)
        add_subscription(engine, "http://127.0.0.1:9/held")
        _, (delivery_id,) = emit_event(engine)
        with engine.begin() as connection:
            connection.execute(
                sa.text(
                    "UPDATE usp_deliveries SET status = 'in_flight', lease_until = now() - interval '1 m'"
                )
            )
        sent: list[Sequence[str]] = []
        assert relay_once(engine, settings, sent.append, reclaim=False).reclaimed == 0
        assert delivery(engine, delivery_id).status == DeliveryStatus.IN_FLIGHT
        assert relay_once(engine, settings, sent.append).reclaimed == 1
        assert relay.RECLAIM_HOLD_OFF_SECONDS > 1.0, "longer than a holding worker's retry interval"
        with tcp_proxy("127.0.0.1", 9) as nowhere:
            nowhere.cut()
            unreachable = db.make_engine(
                sa.make_url(schema_url).set(host="127.0.0.1", port=nowhere.port).render_as_string(False)
            )
            try:
                assert relay._pass(unreachable, settings, sent.append, lambda job: None, None) is False
            finally:
                unreachable.dispose()
        assert relay._pass(engine, settings, sent.append, lambda job: None, None) is True
    finally:
        engine.dispose()
