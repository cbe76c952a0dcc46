"""The scheduler's domain housekeeping: lapsed offers expire (seat passed on), old idempotency
keys are forgotten, in a thread the ``scheduler`` command runs beside the relay."""

from __future__ import annotations

import logging
import re
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from tests.dispatcher.conftest import MakeSettings
from tests.dispatcher.scheduling.support import (
    ALICE,
    BOB,
    Catalog,
    build_catalog,
    count,
    event_types,
    ok,
    run,
    slot_counts,
)
from tests.faults import tcp_proxy
from tests.postgres import fresh_schema
from usp_core import db
from usp_core.clock import utcnow
from usp_dispatcher import cli, database
from usp_dispatcher.scheduling import cancel_booking, create_booking, get_waitlist_entry, join_waitlist
from usp_dispatcher.scheduling.housekeeping import (
    IDEMPOTENCY_RETENTION,
    housekeeping_once,
    housekeeping_thread,
)
from usp_dispatcher.scheduling.tables import IdempotencyRecord
from usp_schemas import TimeWindow, WaitlistEntry


@pytest.fixture
def catalog(engine: Engine) -> Catalog:
    database.upgrade(engine)
    return build_catalog(engine)


def lapsed_offer(catalog: Catalog) -> WaitlistEntry:
    """Bob was offered the first slot an hour ago (its offer lapsed 45 minutes ago)."""
    an_hour_ago = utcnow() - timedelta(hours=1)
    window = TimeWindow(start=an_hour_ago, end=an_hour_ago + timedelta(days=3650))
    booking = ok(
        run(catalog.engine, create_booking, catalog.cut, catalog.cut_slots[0], ALICE, now=an_hour_ago)
    )
    entry = ok(run(catalog.engine, join_waitlist, catalog.cut, window, BOB, now=an_hour_ago))
    ok(run(catalog.engine, cancel_booking, booking.id, now=an_hour_ago))
    assert ok(run(catalog.engine, get_waitlist_entry, entry.id)).state == "offered"
    return entry


def remember_key(engine: Engine, key: str, age: timedelta) -> None:
    with db.session(engine) as session:
        session.add(
            IdempotencyRecord(
                principal="p",
                key=key,
                request_hash="0" * 64,
                status_code=200,
                response="{}",
                created_at=utcnow() - age,
            )
        )
        session.commit()


def test_one_pass_expires_offers_and_forgets_old_keys(catalog: Catalog) -> None:
    entry = lapsed_offer(catalog)
    remember_key(catalog.engine, "old", IDEMPOTENCY_RETENTION + timedelta(minutes=1))
    remember_key(catalog.engine, "fresh", IDEMPOTENCY_RETENTION - timedelta(minutes=1))

    report = housekeeping_once(catalog.engine)

    assert (report.expired_waitlist_entries, report.forgotten_idempotency_keys) == (1, 1)
    assert ok(run(catalog.engine, get_waitlist_entry, entry.id)).state == "expired"
    assert slot_counts(catalog.engine, catalog.cut_slots[0]) == (0, 0)  # back on sale
    assert event_types(catalog.engine)[-2:] == ["waitlist.expired", "catalog.availability.changed"]
    assert count(catalog.engine, IdempotencyRecord) == 1
    assert housekeeping_once(catalog.engine).expired_waitlist_entries == 0


def test_thread_runs_until_the_block_ends(catalog: Catalog, make_settings: MakeSettings) -> None:
    entry = lapsed_offer(catalog)
    with housekeeping_thread(make_settings(relay_interval_seconds=0.05)) as thread:
        deadline = time.monotonic() + 20
        while ok(run(catalog.engine, get_waitlist_entry, entry.id)).state != "expired":
            assert time.monotonic() < deadline, "the offer never expired"
            time.sleep(0.05)
    assert not thread.is_alive()


def test_scheduler_command_runs_housekeeping_beside_the_relay(
    catalog: Catalog, make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    import usp_workers

    seen: list[Any] = []

    def fake_relay(settings: Any, **_kwargs: Any) -> None:
        seen.append(settings)
        seen.extend(t.name for t in threading.enumerate())

    monkeypatch.setattr(usp_workers, "run_relay", fake_relay)  # the command takes it from the door
    settings = make_settings()
    env = {"USP_DATABASE_URL": settings.database_url, "USP_BROKER_URL": settings.broker_url_resolved}
    result = CliRunner().invoke(cli.app, ["scheduler"], env=env)
    assert result.exit_code == 0, result.output
    assert seen[0].database_url == settings.database_url
    assert "usp-housekeeping" in seen[1:]
    assert "usp-housekeeping" not in {t.name for t in threading.enumerate()}


def test_an_outage_is_one_warning_when_it_starts_and_one_when_it_ends(
    postgres_url: str, make_settings: MakeSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL unreachable for ~20 passes: the thread says so once, without a traceback, and
    once more when a pass succeeds again (it logged a traceback per pass)."""
    with fresh_schema(postgres_url) as schema_url:
        direct = db.make_engine(schema_url)
        parsed = sa.make_url(schema_url)
        try:
            database.upgrade(direct)
            with tcp_proxy(parsed.host or "127.0.0.1", parsed.port or 5432) as proxy:
                proxied = parsed.set(host="127.0.0.1", port=proxy.port).render_as_string(False)
                settings = make_settings(database_url=proxied, relay_interval_seconds=0.05)
                proxy.cut()
                with (
                    caplog.at_level(logging.INFO),
                    housekeeping_thread(settings),
                ):
                    wait_for(lambda: failures(caplog) >= 1, "the outage noticed")
                    time.sleep(20 * settings.relay_interval_seconds)
                    proxy.restore()
                    wait_for(lambda: "database available again" in caplog.text, "the end of the outage")
        finally:
            direct.dispose()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [m.split(" (")[0].split(" after")[0] for m in said] == [
        "database unavailable",
        "database available again",
    ], said
    assert re.search(r"; (\d+) operations failed meanwhile", said[1]), said[1]
    assert int(re.findall(r"(\d+) operations failed", said[1])[0]) >= 2, "several passes failed"
    assert not [r for r in caplog.records if r.exc_info], "no traceback"


def failures(caplog: pytest.LogCaptureFixture) -> int:
    return sum("database unavailable" in r.getMessage() for r in caplog.records)


def wait_for(condition: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)
