"""``LiveHub`` on a real database, with plain senders in place of MCP sessions: what it sends
(signed, in order, by profile, subscription and audience) and how it sheds sessions that fail."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tests.dispatcher.mcp.support import OTHER_PROFILE, PROFILE
from tests.dispatcher.mcp_live.support import emit, wait_until
from tests.dispatcher.support import event
from usp_core import db, keys
from usp_dispatcher import access
from usp_dispatcher.cli.config import Settings
from usp_dispatcher.mcp.live import RECENT, LiveHub, _Tail
from usp_receiver import JWKS, verify_notification_params
from usp_workers.engine import outbox
from usp_workers.storage.models import Subscription, SubscriptionState

pytestmark = pytest.mark.anyio

#: A profile with no subscription until a test adds one.
THIRD = "https://third.example/.well-known/usp/profile.json"


@pytest.fixture
def prepared(keyed: Engine) -> Engine:
    """The test database migrated and keyed, with subscriptions for two profiles."""
    with db.session(keyed) as session:
        session.add(
            Subscription(url="http://127.0.0.1:9/a", platform_profile=PROFILE, event_types='["booking.*"]')
        )
        session.add(Subscription(url="http://127.0.0.1:9/b", platform_profile=OTHER_PROFILE))
        session.add(
            Subscription(
                url="http://127.0.0.1:9/c",
                platform_profile=PROFILE,
                event_types='["waitlist.*"]',
                state=SubscriptionState.DISABLED,
            )
        )
        session.commit()
    return keyed


class Inbox:
    """A session's sender that keeps what it was sent."""

    def __init__(self) -> None:
        self.params: list[dict[str, Any]] = []

    async def __call__(self, params: dict[str, Any]) -> None:
        self.params.append(params)

    @property
    def event_ids(self) -> list[str]:
        return [params["event_id"] for params in self.params]


@asynccontextmanager
async def running(
    hub: LiveHub, engine: Engine, settings: Settings, *, poll_interval: float = 0.2
) -> AsyncIterator[None]:
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(partial(hub.run, engine, settings, poll_interval=poll_interval))
        yield
        task_group.cancel_scope.cancel()


async def test_each_session_gets_its_profiles_matching_events_signed_and_in_order(
    prepared: Engine, settings: Settings
) -> None:
    hub = LiveHub()
    acme, other = Inbox(), Inbox()
    async with running(hub, prepared, settings):
        hub.attach("acme", PROFILE, acme)
        hub.attach("other", OTHER_PROFILE, other)
        mine = [emit(prepared, "booking.created", audience=PROFILE) for _ in range(3)]
        theirs = emit(prepared, "booking.created", audience=OTHER_PROFILE)
        business_only = emit(prepared, "booking.confirmed", audience="")
        public_catalog = emit(prepared, "catalog.service.updated", audience=None)
        waitlist = emit(prepared, "waitlist.joined", audience=PROFILE)  # acme's waitlist.* is disabled
        fence = emit(prepared, "booking.cancelled", audience=PROFILE)
        await wait_until(lambda: fence in acme.event_ids and public_catalog in other.event_ids)

    assert acme.event_ids == [*mine, fence]
    assert other.event_ids == [theirs, public_catalog]
    assert business_only not in acme.event_ids + other.event_ids
    assert waitlist not in acme.event_ids
    with db.session(prepared) as session:
        published = JWKS.from_dict(keys.published_jwks(session, settings))
    for params in acme.params + other.params:
        verified = verify_notification_params(params, published)
        assert verified.params["event_id"] == params["event_id"]


@pytest.mark.parametrize("poll_interval", [0.2, 3600], ids=["polled", "woken"])
async def test_a_profile_without_an_active_subscription_hears_nothing_on_its_sessions(
    prepared: Engine, settings: Settings, poll_interval: float
) -> None:
    """A session pushes what its profile subscribed to, nothing more (README: a session does not
    subscribe by itself): a third profile's session hears none of its own bookings until it
    subscribes, then hears the next ones. With polling practically off ("woken"), at once: the
    subscription's commit makes the hub forget the patterns it had read."""
    hub = LiveHub()
    inbox, acme = Inbox(), Inbox()
    async with running(hub, prepared, settings, poll_interval=poll_interval):
        hub.attach("third", THIRD, inbox)
        hub.attach("acme", PROFILE, acme)
        unheard = emit(prepared, "booking.created", audience=THIRD)
        fence = emit(prepared, "booking.created", audience=PROFILE)
        await wait_until(lambda: fence in acme.event_ids)
        assert inbox.event_ids == []
        with db.session(prepared) as session:
            session.add(Subscription(url="http://127.0.0.1:9/t", platform_profile=THIRD))
            session.commit()
        heard = emit(prepared, "booking.created", audience=THIRD)
        await wait_until(lambda: heard in inbox.event_ids)
    assert inbox.event_ids == [heard]
    assert unheard not in inbox.event_ids


async def test_a_subscription_committed_while_the_hub_reads_is_not_forgotten(
    prepared: Engine, settings: Settings
) -> None:
    """A subscription committed between the hub's read of the subscriptions and the end of that
    poll: the patterns the poll read are already stale, and must not be the ones the next commit
    is judged by (polling practically off: only a wake-up can bring the event in)."""
    hub = LiveHub()
    inbox = Inbox()
    subscribed: list[str] = []

    def subscribe_meanwhile(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "usp_subscriptions.platform_profile IN" in statement and not subscribed:
            subscribed.append(statement)  # the hub has read the subscriptions: now one is added
            with db.session(prepared) as session:
                session.add(Subscription(url="http://127.0.0.1:9/t", platform_profile=THIRD))
                session.commit()
            subscribed.append("committed")

    # Listening until the hub has stopped: SQLAlchemy's dispatch must not see its listeners
    # change while the hub's thread runs a statement.
    sa.event.listen(prepared, "after_cursor_execute", subscribe_meanwhile)
    try:
        async with running(hub, prepared, settings, poll_interval=3600):
            hub.attach("third", THIRD, inbox)
            unheard = emit(prepared, "booking.created", audience=THIRD)
            await wait_until(lambda: "committed" in subscribed)
            await anyio.sleep(0.1)  # the poll ends, and the one the subscription's commit asked for
            heard = emit(prepared, "booking.created", audience=THIRD)
            await wait_until(lambda: heard in inbox.event_ids)
    finally:
        sa.event.remove(prepared, "after_cursor_execute", subscribe_meanwhile)
    assert inbox.event_ids == [heard]
    assert unheard not in inbox.event_ids


async def test_a_commit_in_this_process_wakes_the_hub(prepared: Engine, settings: Settings) -> None:
    """With polling practically off, only the commit hook can bring the event in."""
    hub = LiveHub()
    acme = Inbox()
    async with running(hub, prepared, settings, poll_interval=3600):
        hub.attach("acme", PROFILE, acme)
        first = emit(prepared, "booking.created", audience=PROFILE)  # the attach's own poll may see it
        await wait_until(lambda: first in acme.event_ids)
        second = emit(prepared, "booking.created", audience=PROFILE)  # only the wake-up can
        await wait_until(lambda: second in acme.event_ids)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_commit_in_another_process_wakes_the_hub_on_postgresql(
    prepared: Engine, settings: Settings
) -> None:
    """With polling practically off, only the outbox's NOTIFY can bring in an event another
    process (another API process, a worker) committed."""
    hub = LiveHub()
    acme = Inbox()
    url = prepared.url.render_as_string(hide_password=False)
    code = (
        "from tests.dispatcher.mcp_live.support import emit\n"
        "from usp_core import db\n"
        f"print(emit(db.make_engine({url!r}), 'booking.created', audience={PROFILE!r}))"
    )
    async with running(hub, prepared, settings, poll_interval=3600):
        hub.attach("acme", PROFILE, acme)
        first = emit(prepared, "booking.created", audience=PROFILE)  # the attach's own poll may see it
        await wait_until(lambda: first in acme.event_ids)
        done = await anyio.run_process([sys.executable, "-c", code], cwd=Path(__file__).parents[3])
        elsewhere = done.stdout.decode().strip()
        await wait_until(lambda: elsewhere in acme.event_ids)


async def test_a_commit_no_attached_session_wants_costs_the_hub_no_read(
    prepared: Engine, settings: Settings
) -> None:
    """The hub reads the events table after this process's commits only when one may hold an
    event for an attached profile, by the patterns its last read found: other profiles' events
    and types nobody subscribed to cost it nothing (their periodic poll still reads them)."""
    hub = LiveHub()
    acme = Inbox()
    reads, counting = 0, False

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        nonlocal reads
        # the hub's read of the recent events
        reads += counting and "WHERE usp_events.created_at >=" in statement

    sa.event.listen(prepared, "before_cursor_execute", count)  # until the hub stops, as above
    try:
        async with running(hub, prepared, settings, poll_interval=3600):
            hub.attach("acme", PROFILE, acme)
            first = emit(prepared, "booking.created", audience=PROFILE)
            await wait_until(lambda: first in acme.event_ids)  # the hub has read acme's patterns
            counting = True
            for event_type, audience in [
                ("booking.created", OTHER_PROFILE),  # another profile's
                ("waitlist.joined", PROFILE),  # acme's waitlist.* subscription is disabled
                ("booking.confirmed", ""),  # the business's own
            ]:
                emit(prepared, event_type, audience=audience)
                await anyio.sleep(0.1)  # the loop runs: a wake-up would poll now
            assert reads == 0
            fence = emit(prepared, "booking.cancelled", audience=PROFILE)
            await wait_until(lambda: fence in acme.event_ids)
            counting = False
    finally:
        sa.event.remove(prepared, "before_cursor_execute", count)
    assert acme.event_ids == [first, fence]
    assert reads == 1


async def test_events_from_before_a_session_attached_are_not_sent(
    prepared: Engine, settings: Settings
) -> None:
    hub = LiveHub()
    acme = Inbox()
    async with running(hub, prepared, settings):
        before = emit(prepared, "booking.created", audience=PROFILE)
        hub.attach("acme", PROFILE, acme)
        after = emit(prepared, "booking.created", audience=PROFILE)
        await wait_until(lambda: after in acme.event_ids)
    assert before not in acme.event_ids
    assert acme.event_ids == [after]


@pytest.mark.parametrize(("held", "then"), [(0.0, 0.0), (RECENT + 0.3, 0.5)], ids=["next-poll", "next-sweep"])
async def test_an_event_committed_after_a_later_one_is_still_sent(
    prepared: Engine, settings: Settings, held: float, then: float
) -> None:
    """Event ids are taken when the event is written, not when it commits: a long transaction's
    event is older than one committed before it, and must not be skipped. Most polls reread
    only the last RECENT seconds behind the newest event (held briefly: the next poll finds it);
    one every SWEEP_INTERVAL rereads the whole lookback (held longer: that sweep finds it)."""
    hub = LiveHub()
    acme = Inbox()
    async with running(hub, prepared, settings):
        hub.attach("acme", PROFILE, acme)
        slow_body = event("booking.created")
        with db.session(prepared) as slow:
            outbox.emit(slow, slow_body, audience=PROFILE)
            await anyio.sleep(held)
            quick = emit(prepared, "booking.created", audience=PROFILE)
            await wait_until(lambda: quick in acme.event_ids)
            await anyio.sleep(then)  # polls go on (the first with an event seen is a sweep)
            slow.commit()
        await wait_until(lambda: slow_body["event_id"] in acme.event_ids)
    assert acme.event_ids == [quick, slow_body["event_id"]]
    assert slow_body["event_id"] < quick


async def test_a_failing_or_stalled_session_is_detached_and_the_others_still_hear(
    prepared: Engine, settings: Settings
) -> None:
    hub = LiveHub(queue_size=2)
    healthy = Inbox()
    never = anyio.Event()

    async def failing(params: dict[str, Any]) -> None:
        raise ConnectionResetError("the session's stream is gone")

    async def stalled(params: dict[str, Any]) -> None:
        await never.wait()

    async with running(hub, prepared, settings):
        hub.attach("healthy", PROFILE, healthy)
        hub.attach("failing", PROFILE, failing)
        hub.attach("stalled", PROFILE, stalled)
        sent = []
        for _ in range(6):  # one at a time: the healthy session keeps up, the stalled one cannot
            sent.append(emit(prepared, "booking.confirmed", audience=PROFILE))
            await wait_until(lambda: sent[-1] in healthy.event_ids)
        await wait_until(lambda: hub.session_keys == {"healthy"})
        # A detached session attaches again on its next privileged call.
        hub.attach("failing", PROFILE, healthy)
        assert hub.session_keys == {"healthy", "failing"}
    assert healthy.event_ids == sent
    assert hub.session_keys == frozenset()  # a stopped hub forgets its sessions


async def test_a_dead_session_reported_by_the_transport_is_swept(
    prepared: Engine, settings: Settings
) -> None:
    alive = {"one": True, "two": True}
    hub = LiveHub(is_alive=lambda key: alive[key])
    one, two = Inbox(), Inbox()
    async with running(hub, prepared, settings):
        hub.attach("one", PROFILE, one)
        hub.attach("two", PROFILE, two)
        alive["one"] = False
        await wait_until(lambda: hub.session_keys == {"two"})
        after = emit(prepared, "booking.created", audience=PROFILE)
        await wait_until(lambda: after in two.event_ids)
    assert one.event_ids == []


def test_attach_is_idempotent_and_a_session_may_speak_for_several_profiles() -> None:
    hub = LiveHub()
    first, second = Inbox(), Inbox()
    hub.attach("s", PROFILE, first)
    hub.attach("s", PROFILE, second)
    hub.attach("s", OTHER_PROFILE, second)
    assert hub.session_keys == {"s"}
    hub.detach("s")
    hub.detach("unknown")
    assert hub.session_keys == frozenset()


def test_the_tail_forgets_what_fell_below_the_floor_and_counts_a_reread_once() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    at = {name: start + timedelta(seconds=n) for n, name in enumerate("abcd", 1)}
    tail = _Tail(timedelta(seconds=5))
    tail.advance(start, [("b", at["b"]), ("a", at["a"]), ("c", at["c"])])  # committed out of order
    tail.advance(start, [("c", at["c"]), ("d", at["d"])])  # a sweep rereads c
    assert tail.newest == at["d"]
    assert len(tail.expiry) == len(tail.seen) == 4
    tail.advance(at["c"], [])
    assert tail.seen == {"c": at["c"], "d": at["d"]}
    assert sorted(tail.expiry) == [(at["c"], "c"), (at["d"], "d")]
    # Most polls read from RECENT behind the newest; a sweep from the lookback behind it (here:
    # from the attach, which is later); either way nothing below that is still looked for.
    assert tail.floors(start, moment=100.0) == (start, start)
    assert tail.floors(start, moment=100.1) == (at["d"] - timedelta(seconds=RECENT), start)
    assert tail.floors(start, moment=101.0) == (start, start)


async def test_a_revoked_principal_is_dropped_at_the_next_read_that_has_events_for_it(
    prepared: Engine, settings: Settings
) -> None:
    """The hub checks who opened each attachment once per read (not once per notification): a
    revoked key's attachment gets nothing more and is told it was dropped; another's goes on."""
    with db.session(prepared) as session:
        access.issue_api_key(session, "acme")
        access.issue_api_key(session, "globex")
    hub = LiveHub()
    acme, globex, dropped = Inbox(), Inbox(), []
    async with running(hub, prepared, settings):
        hub.attach("acme", PROFILE, acme, principal="key:acme", on_drop=lambda: dropped.append("acme"))
        hub.attach("globex", OTHER_PROFILE, globex, principal="key:globex")
        first = emit(prepared, "booking.created", audience=PROFILE)
        await wait_until(lambda: first in acme.event_ids)
        with db.session(prepared) as session:
            (row,) = [key for key in access.list_api_keys(session) if key.principal == "acme"]
            assert access.revoke_api_key(session, row.id)
        after = emit(prepared, "booking.confirmed", audience=PROFILE)
        theirs = emit(prepared, "booking.confirmed", audience=OTHER_PROFILE)
        await wait_until(lambda: dropped == ["acme"] and theirs in globex.event_ids)
        assert hub.session_keys == frozenset({"globex"})
    assert acme.event_ids == [first]
    assert after not in acme.event_ids
