"""Endpoint health: failure streaks, auto-disable after days of continuous failure (on a moved
clock), 410's notice, and the rule that a healthy subscription's row is not written per success.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from tests.workers.conftest import MakeSettings
from tests.workers.endpoints import Answer
from tests.workers.support import Clock, Endpoints, add_subscription, delivery, emit_event, subscription
from usp_core.db import session
from usp_dispatcher.cli.config import Settings
from usp_receiver import JWKS
from usp_workers.engine.delivery import deliver_batch
from usp_workers.engine.health import (
    NOTICE_BREAKER_OPENED,
    NOTICE_DELIVERY_DEAD,
    NOTICE_DISABLED,
    reset_health,
)
from usp_workers.runtime.relay import relay_once
from usp_workers.storage.models import BreakerState, DeliveryStatus, Notice, SubscriptionState

pytestmark = pytest.mark.anyio

DAY = 86400.0


def notices(engine: Engine, subscription_id: str, *, dead: bool = False) -> list[Notice]:
    """The subscription's health notices (with ``dead``: its dead deliveries' notices instead)."""
    kind = col(Notice.kind) == NOTICE_DELIVERY_DEAD if dead else col(Notice.kind) != NOTICE_DELIVERY_DEAD
    with Session(engine) as s:
        rows = list(
            s.exec(
                select(Notice).where(Notice.subscription_id == subscription_id, kind).order_by(col(Notice.id))
            )
        )
        for row in rows:
            s.expunge(row)
        return rows


async def settle(
    engine: Engine, settings: Settings, ids: list[str], client: httpx.AsyncClient, clock: Clock
) -> None:
    """Deliver until nothing is pending, moving the clock to each retry."""
    for _ in range(20):
        await deliver_batch(engine, settings, ids, client=client, now=clock)
        pending = [delivery(engine, i) for i in ids if delivery(engine, i).status == DeliveryStatus.PENDING]
        if not pending:
            return
        clock.advance_to(max(row.next_attempt_at for row in pending))
    raise AssertionError("deliveries never settled")


@contextmanager
def subscription_writes(engine: Engine) -> Iterator[list[str]]:
    """Every UPDATE statement on the subscriptions table the engine sends while inside."""
    seen: list[str] = []

    def listen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE USP_SUBSCRIPTIONS"):
            seen.append(statement)

    sa.event.listen(engine, "before_cursor_execute", listen)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", listen)


async def test_auto_disable_after_the_failure_period_at_the_next_failed_try(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    settings = make_settings(breaker_threshold=0, auto_disable_after_seconds=5 * DAY)
    sub = add_subscription(database, endpoints.add("down", Answer(500)))

    # A delivery exhausts its schedule on day 0: dead, but the subscription stays: five days of
    # failure have not passed.
    _, first = emit_event(database)
    await settle(database, settings, first, client, clock)
    assert delivery(database, first[0]).status == DeliveryStatus.DEAD
    row = subscription(database, sub.id)
    assert row.state == SubscriptionState.ACTIVE
    assert row.consecutive_failures == 4  # the first try and three retries
    assert row.failing_since is not None
    assert row.last_failure_at is not None
    failing_since = row.failing_since

    # Four days later, still failing, another delivery dies: still under the period.
    clock.advance(4 * DAY)
    _, second = emit_event(database)
    await settle(database, settings, second, client, clock)
    assert subscription(database, sub.id).state == SubscriptionState.ACTIVE
    assert subscription(database, sub.id).failing_since == failing_since

    # Past five days of continuous failure, the next failed try disables it, once: its own
    # schedule need not be exhausted.
    clock.advance(1.01 * DAY)
    _, third = emit_event(database)
    await deliver_batch(database, settings, third, client=client, now=clock)
    row = subscription(database, sub.id)
    assert row.state == SubscriptionState.DISABLED
    assert row.disabled_reason == "deliveries failed continuously for 5 days"
    [notice] = notices(database, sub.id)
    assert notice.kind == NOTICE_DISABLED
    assert notice.detail == row.disabled_reason

    # Re-enabling through reset_health forgets the streak.
    with session(database) as s:
        reset_health(s, sub.id)
        s.commit()
    row = subscription(database, sub.id)
    assert (row.consecutive_failures, row.failing_since) == (0, None)


async def test_a_success_ends_the_failure_streak(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    settings = make_settings(breaker_threshold=0, auto_disable_after_seconds=5 * DAY)
    switch = {"status": 500}

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await Answer(switch["status"])(scope, receive, send)

    sub = add_subscription(database, endpoints.add("flaky", app))
    _, ids = emit_event(database)
    await deliver_batch(database, settings, ids, client=client, now=clock)
    assert subscription(database, sub.id).failing_since is not None

    # Six days pass; one success, then failures again: the period starts over, so the next
    # failures do not disable.
    clock.advance(6 * DAY)
    switch["status"] = 200
    await settle(database, settings, ids, client, clock)
    row = subscription(database, sub.id)
    assert (row.consecutive_failures, row.failing_since) == (0, None)
    assert row.last_success_at is not None
    switch["status"] = 500
    _, more = emit_event(database)
    await settle(database, settings, more, client, clock)
    assert delivery(database, more[0]).status == DeliveryStatus.DEAD
    assert subscription(database, sub.id).state == SubscriptionState.ACTIVE


async def test_410_disables_at_once_with_a_notice(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    sub = add_subscription(database, endpoints.add("gone", Answer(410)))
    _, ids = emit_event(database)
    await deliver_batch(database, settings, ids, client=client, now=clock)
    assert subscription(database, sub.id).state == SubscriptionState.DISABLED
    [dead] = notices(database, sub.id, dead=True)
    assert dead.detail == ids[0], "its dead delivery is noted too, for the delivery.dead event"
    [notice] = notices(database, sub.id)
    assert notice.kind == NOTICE_DISABLED
    assert "410" in notice.detail


async def test_a_healthy_subscription_row_is_not_written_on_every_success(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    settings = make_settings(health_write_interval_seconds=5.0)
    sub = add_subscription(database, endpoints.add("ok", Answer(204)))

    with subscription_writes(database) as writes:
        await deliver_batch(database, settings, emit_event(database)[1], client=client, now=clock)
    assert len(writes) == 1  # the first success is news: last_success_at
    first_success = subscription(database, sub.id).last_success_at
    assert first_success is not None

    clock.advance(1)
    with subscription_writes(database) as writes:
        for _ in range(3):
            await deliver_batch(database, settings, emit_event(database)[1], client=client, now=clock)
    assert writes == []  # within the interval: no write at all
    assert subscription(database, sub.id).last_success_at == first_success

    clock.advance(5)
    with subscription_writes(database) as writes:
        await deliver_batch(database, settings, emit_event(database)[1], client=client, now=clock)
    assert len(writes) == 1
    refreshed = subscription(database, sub.id).last_success_at
    assert refreshed is not None
    assert refreshed - first_success >= timedelta(seconds=6)


async def test_an_open_breaker_does_not_hold_back_the_disable_clock(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    """Set to disable after 20 s of failure, with a breaker whose next probe is ten minutes
    away: the scheduler's pass disables it 20 s after the last success, not at that probe."""
    settings = make_settings(
        breaker_threshold=2, breaker_cooldown_seconds=600.0, auto_disable_after_seconds=20.0
    )
    sub = add_subscription(database, endpoints.add("down", Answer(500)))
    ids = [emit_event(database)[1][0] for _ in range(2)]
    clock.freeze()  # the reason names whole seconds: real time passing must not add one
    await deliver_batch(database, settings, ids, client=client, now=clock)
    assert subscription(database, sub.id).breaker_state == BreakerState.OPEN

    clock.advance(19)
    assert relay_once(database, settings, lambda _ids: None, now=clock()).disabled == 0
    assert subscription(database, sub.id).state == SubscriptionState.ACTIVE

    clock.advance(1)
    assert relay_once(database, settings, lambda _ids: None, now=clock()).disabled == 1
    row = subscription(database, sub.id)
    assert row.state == SubscriptionState.DISABLED
    assert row.disabled_reason == "deliveries failed continuously for 20 s"
    assert [n.kind for n in notices(database, sub.id)] == [NOTICE_BREAKER_OPENED, NOTICE_DISABLED]
    # One notice, however many passes follow.
    assert relay_once(database, settings, lambda _ids: None, now=clock()).disabled == 0
    assert len(notices(database, sub.id)) == 2
