"""The delivery engine against a real server and real databases (SQLite and PostgreSQL).

Every successful REST delivery is verified by the receiver library itself (``WebhookApp``), and
JSON-RPC ones by a verifier plus a notification check, so "succeeded" here means "a platform
would have accepted it". Retries are driven by moving a clock forward past ``next_attempt_at``
and calling ``deliver_batch`` again, as the relay would.
"""

from __future__ import annotations

import json
from datetime import timedelta

import anyio
import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy.engine import Engine

from tests.workers.conftest import MakeSettings
from tests.workers.endpoints import (
    Answer,
    Blocking,
    ConcurrencyProbe,
    Hang,
    Hub,
    Huge,
    JsonRpcReceiver,
    Sequenced,
    Trickle,
    UspReceiver,
    failing_first,
)
from tests.workers.support import (
    Clock,
    Endpoints,
    add_subscription,
    attempts,
    delivery,
    emit_event,
    subscription,
)
from usp_core.db import session
from usp_core.keycache import NoSigningKey
from usp_core.keys import published_jwks, rotate
from usp_core.ssrf import Resolver
from usp_dispatcher.cli.config import Settings
from usp_receiver import JWKS, Verifier
from usp_schemas import WEBHOOK_METHOD
from usp_workers.engine.delivery import RECORD_MARGIN, BatchReport, deliver_batch
from usp_workers.engine.webhook_secrets import STANDARD, WebhookSecrets, seal
from usp_workers.storage.models import (
    AttemptOutcome,
    DeliveryStatus,
    EventRecord,
    Subscription,
    SubscriptionState,
    Transport,
)

pytestmark = pytest.mark.anyio


async def deliver(
    engine: Engine,
    settings: Settings,
    ids: list[str],
    client: httpx.AsyncClient,
    clock: Clock,
    resolver: Resolver | None = None,
) -> BatchReport:
    return await deliver_batch(engine, settings, ids, client=client, now=clock, resolver=resolver)


async def deliver_until_settled(
    engine: Engine, settings: Settings, ids: list[str], client: httpx.AsyncClient, clock: Clock
) -> list[BatchReport]:
    """Call deliver_batch, move the clock past the next due time, repeat until nothing is pending."""
    reports = []
    for _ in range(20):
        report = await deliver(engine, settings, ids, client, clock)
        reports.append(report)
        pending = [delivery(engine, i) for i in ids if delivery(engine, i).status == DeliveryStatus.PENDING]
        if not pending:
            return reports
        clock.advance_to(max(row.next_attempt_at for row in pending))
    raise AssertionError("deliveries never settled")


# -- success ---------------------------------------------------------------------------------------


async def test_a_rest_delivery_is_verified_by_the_receiver_and_recorded_with_one_attempt(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    hub: Hub,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    receiver = UspReceiver(jwks)
    add_subscription(database, endpoints.add("rest", receiver))
    event_id, ids = emit_event(database)

    report = await deliver(database, settings, ids, client, clock)

    assert (report.requested, report.claimed, report.succeeded) == (1, 1, 1)
    assert receiver.handled == [event_id]
    [seen] = hub.seen(endpoints.path("rest"))
    with session(database) as s:
        event = s.get(EventRecord, event_id)
        assert event is not None
    assert seen.body == event.payload.encode()  # the stored envelope, byte for byte
    assert seen.headers["content-type"] == "application/json"
    assert seen.headers["user-agent"] == "usp-webhooks/0.1"
    assert seen.headers["usp-event-id"] == event_id
    assert seen.headers["usp-delivery-id"] == ids[0]
    row = delivery(database, ids[0])
    assert row.status == DeliveryStatus.SUCCEEDED
    assert row.attempt_count == 1
    assert row.last_status_code == 200
    assert row.completed_at is not None
    assert row.lease_until is None
    assert row.enqueued_at is None
    assert row.last_error is None
    [attempt] = attempts(database, ids[0])
    assert attempt.attempt_number == 1
    assert attempt.outcome == AttemptOutcome.SUCCEEDED
    assert attempt.status_code == 200
    assert attempt.error_class is None
    assert attempt.duration_ms > 0
    assert attempt.response_excerpt is not None
    assert '"accepted"' in attempt.response_excerpt


async def test_a_jsonrpc_delivery_is_a_signed_notification_without_id(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    hub: Hub,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    receiver = JsonRpcReceiver(jwks)
    add_subscription(database, endpoints.add("rpc", receiver), Transport.JSONRPC)
    event_id, ids = emit_event(database)

    report = await deliver(database, settings, ids, client, clock)

    assert report.succeeded == 1, receiver.refused
    assert receiver.handled == [event_id]
    assert receiver.refused == []
    [seen] = hub.seen(endpoints.path("rpc"))
    message = json.loads(seen.body)
    assert message["method"] == WEBHOOK_METHOD
    assert "id" not in message
    with session(database) as s:
        event = s.get(EventRecord, event_id)
        assert event is not None
    assert message["params"] == json.loads(event.payload)
    assert delivery(database, ids[0]).status == DeliveryStatus.SUCCEEDED


async def test_one_event_to_several_subscriptions_in_one_batch(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    rest, rpc = UspReceiver(jwks), JsonRpcReceiver(jwks)
    add_subscription(database, endpoints.add("rest", rest))
    add_subscription(database, endpoints.add("rpc", rpc), Transport.JSONRPC)
    event_ids, delivery_ids = [], []
    for _ in range(5):
        event_id, ids = emit_event(database)
        event_ids.append(event_id)
        delivery_ids += ids

    report = await deliver(database, settings, delivery_ids, client, clock)

    assert (report.claimed, report.succeeded) == (10, 10)
    assert sorted(rest.handled) == sorted(event_ids)
    assert sorted(rpc.handled) == sorted(event_ids)


# -- retries and the dead letter ----------------------------------------------------------------


async def test_failing_twice_then_succeeding_is_retried_on_schedule(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    hub: Hub,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    receiver = UspReceiver(jwks)
    add_subscription(database, endpoints.add("flaky", failing_first(2, receiver)))
    event_id, ids = emit_event(database)
    clock.freeze()

    first = await deliver(database, settings, ids, client, clock)
    assert first.retrying == 1
    row = delivery(database, ids[0])
    assert row.status == DeliveryStatus.PENDING
    assert row.attempt_count == 1
    assert row.last_status_code == 500
    assert row.last_error == "HTTP 500"
    assert row.lease_until is None
    assert row.enqueued_at is None
    assert row.next_attempt_at == clock() + timedelta(seconds=0.05)

    not_yet = await deliver(database, settings, ids, client, clock)
    assert (not_yet.claimed, not_yet.skipped) == (0, 1)  # not due: skipped, no request
    assert len(hub.seen(endpoints.path("flaky"))) == 1

    clock.advance(0.05)
    second = await deliver(database, settings, ids, client, clock)
    assert second.retrying == 1
    assert delivery(database, ids[0]).next_attempt_at == clock() + timedelta(seconds=0.1)

    clock.advance(0.1)
    third = await deliver(database, settings, ids, client, clock)
    assert third.succeeded == 1

    assert receiver.handled == [event_id]
    row = delivery(database, ids[0])
    assert (row.status, row.attempt_count, row.last_status_code) == (DeliveryStatus.SUCCEEDED, 3, 200)
    assert row.last_error is None
    tries = attempts(database, ids[0])
    assert [a.attempt_number for a in tries] == [1, 2, 3]
    assert [a.outcome for a in tries] == [
        AttemptOutcome.RETRY,
        AttemptOutcome.RETRY,
        AttemptOutcome.SUCCEEDED,
    ]
    assert [a.status_code for a in tries] == [500, 500, 200]
    assert [a.error_class for a in tries] == ["http_status", "http_status", None]
    assert tries[0].response_excerpt == "try again"


async def test_always_failing_goes_dead_after_the_whole_schedule(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    hub: Hub,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    add_subscription(database, endpoints.add("down", Answer(500, body=b"down")))
    _, ids = emit_event(database)

    reports = await deliver_until_settled(database, settings, ids, client, clock)

    tries = len(settings.retry_schedule) + 1
    assert len(reports) == tries
    assert len(hub.seen(endpoints.path("down"))) == tries
    row = delivery(database, ids[0])
    assert row.status == DeliveryStatus.DEAD
    assert row.attempt_count == tries
    assert row.completed_at is not None
    assert row.last_error == f"gave up after {tries} tries; last: HTTP 500"
    recorded = attempts(database, ids[0])
    assert [a.attempt_number for a in recorded] == list(range(1, tries + 1))
    assert [a.outcome for a in recorded] == [AttemptOutcome.RETRY] * (tries - 1) + [AttemptOutcome.DEAD]
    assert all(a.status_code == 500 for a in recorded)
    clock.advance(3600)
    assert (await deliver(database, settings, ids, client, clock)).claimed == 0  # dead stays dead


async def test_a_jittered_schedule_stays_within_its_bounds(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    settings = make_settings(retry_schedule=(100,), retry_jitter=0.2)
    add_subscription(database, endpoints.add("down", Answer(503)))
    ids = [i for _ in range(10) for i in emit_event(database)[1]]
    clock.freeze()

    await deliver(database, settings, ids, client, clock)

    waits = {(delivery(database, i).next_attempt_at - clock()).total_seconds() for i in ids}
    assert all(80 <= wait <= 120 for wait in waits), waits
    assert len(waits) > 1  # actually jittered


# -- status codes with special meaning -------------------------------------------------------------


async def test_410_disables_the_subscription_and_its_other_deliveries_die_without_a_request(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    hub: Hub,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    url = endpoints.add("gone", Answer(410, body=b"unsubscribed"))
    sub = add_subscription(database, url + "?token=s3cret")
    _, first = emit_event(database)
    _, later = emit_event(database)  # queued before the 410 arrives

    report = await deliver(database, settings, first, client, clock)

    assert report.disabled == 1
    gone = subscription(database, sub.id)
    assert gone.state == SubscriptionState.DISABLED
    assert gone.disabled_reason == f"410 Gone from {url}"  # no query: it may hold a secret
    row = delivery(database, first[0])
    assert (row.status, row.attempt_count, row.last_status_code) == (DeliveryStatus.DEAD, 1, 410)
    [attempt] = attempts(database, first[0])
    assert (attempt.outcome, attempt.error_class) == (AttemptOutcome.DISABLED, "gone")

    report = await deliver(database, settings, later, client, clock)

    assert (report.claimed, report.dead) == (1, 1)
    assert len(hub.seen(endpoints.path("gone"))) == 1  # no request for the later delivery
    row = delivery(database, later[0])
    assert (row.status, row.attempt_count, row.last_error) == (
        DeliveryStatus.DEAD,
        0,
        "subscription disabled",
    )
    assert attempts(database, later[0]) == []


@pytest.mark.parametrize(
    ("status", "retry_after", "expected"),
    [
        (429, "15", 15.0),  # within 1x..2x of the scheduled 10 s: honoured
        (503, "15", 15.0),
        (429, "3600", 20.0),  # clamped to 2x
        (429, "1", 10.0),  # clamped to 1x
        (429, None, 10.0),  # absent: the schedule
        (429, "whenever", 10.0),  # unreadable: the schedule
    ],
)
async def test_retry_after_is_honoured_within_the_clamp(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
    status: int,
    retry_after: str | None,
    expected: float,
) -> None:
    settings = make_settings(retry_schedule=(10.0,))
    headers = [] if retry_after is None else [("Retry-After", retry_after)]
    add_subscription(database, endpoints.add("busy", Answer(status, headers)))
    _, ids = emit_event(database)
    now = clock.freeze()

    report = await deliver(database, settings, ids, client, clock)

    assert report.retrying == 1
    row = delivery(database, ids[0])
    assert row.status == DeliveryStatus.PENDING
    assert row.last_status_code == status
    assert row.next_attempt_at == now + timedelta(seconds=expected)


async def test_a_redirect_is_a_failure_and_is_never_followed(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    hub: Hub,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    target = endpoints.add("target", UspReceiver(jwks))
    add_subscription(database, endpoints.add("moved", Answer(302, [("Location", target)])))
    _, ids = emit_event(database)

    report = await deliver(database, settings, ids, client, clock)

    assert report.retrying == 1
    assert hub.seen(endpoints.path("target")) == []
    [attempt] = attempts(database, ids[0])
    assert (attempt.status_code, attempt.error_class) == (302, "redirect")
    assert delivery(database, ids[0]).last_error == "HTTP 302: redirects are not followed"


# -- transport failures ------------------------------------------------------------------------------


@pytest.mark.parametrize("app", [Hang(3.0), Trickle(chunks=30, interval=0.1)], ids=["hang", "trickle"])
async def test_a_slow_endpoint_times_out_within_the_total_timeout(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
    app: Hang | Trickle,
) -> None:
    # The trickle answers a byte every 0.1 s: no single read waits long, only the total is long.
    settings = make_settings(total_timeout=0.5)
    add_subscription(database, endpoints.add("slow", app))
    _, ids = emit_event(database)

    with anyio.fail_after(2.5):
        report = await deliver(database, settings, ids, client, clock)

    assert report.retrying == 1
    [attempt] = attempts(database, ids[0])
    assert attempt.error_class == "timeout"
    assert attempt.status_code is None
    assert 400 <= attempt.duration_ms < 1500
    row = delivery(database, ids[0])
    assert row.status == DeliveryStatus.PENDING
    assert row.last_status_code is None
    assert row.last_error is not None
    assert "Timeout" in row.last_error


async def test_a_refused_connection_says_so(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    add_subscription(database, "http://127.0.0.1:9/hooks")  # discard port: nobody listens
    _, ids = emit_event(database)

    report = await deliver(database, settings, ids, client, clock)

    assert report.retrying == 1
    [attempt] = attempts(database, ids[0])
    assert (attempt.error_class, attempt.status_code) == ("connection_refused", None)


async def test_a_huge_response_is_cut_to_an_excerpt(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    huge = Huge(size=64 * 1024 * 1024)
    add_subscription(database, endpoints.add("huge", huge))
    _, ids = emit_event(database)

    report = await deliver(database, settings, ids, client, clock)

    assert report.succeeded == 1
    [attempt] = attempts(database, ids[0])
    assert attempt.response_excerpt == "x" * 1024
    assert await anyio.to_thread.run_sync(huge.hung_up.wait, 5)
    assert huge.sent < huge.size  # we hung up instead of reading 64 MiB


# -- signatures ------------------------------------------------------------------------------------


async def test_every_try_is_signed_afresh(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    hub: Hub,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    receiver = UspReceiver(jwks)
    url = endpoints.add("flaky", failing_first(2, receiver))
    add_subscription(database, url)
    event_id, ids = emit_event(database)

    for _ in range(3):
        await deliver(database, settings, ids, client, clock)
        clock.advance(2)  # whole seconds apart: ``created`` has one-second resolution

    seen = hub.seen(endpoints.path("flaky"))
    assert len(seen) == 3
    assert receiver.handled == [event_id]
    verifier = Verifier(jwks)
    created = [verifier.verify("POST", url, s.headers, s.body, now=_created(s.headers)).created for s in seen]
    assert len(set(created)) == 3, created  # each try signed at its own moment, each valid


def _created(headers: dict[str, str]) -> float:
    return float(headers["signature-input"].split(";created=")[1].split(";")[0])


async def test_during_rotation_both_keys_sign_and_either_alone_is_enough(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    hub: Hub,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    [old] = list(jwks)
    with session(database) as s:
        rotate(s, settings, now=clock())  # publish lead 0: the new key signs at once
        s.commit()
        both = JWKS.from_dict(published_jwks(s, settings))
    [new] = [key for key in both if key.kid != old.kid]
    old_only, new_only = UspReceiver(JWKS([old])), UspReceiver(JWKS([new]))
    add_subscription(database, endpoints.add("old", old_only))
    add_subscription(database, endpoints.add("new", new_only))
    event_id, ids = emit_event(database)

    report = await deliver(database, settings, ids, client, clock)

    assert report.succeeded == 2
    assert old_only.handled == [event_id]
    assert new_only.handled == [event_id]
    [seen] = hub.seen(endpoints.path("old"))
    labels = seen.headers["signature-input"]
    assert labels.startswith("sig1=")
    assert ", sig2=" in labels
    assert f'keyid="{new.kid}"' in labels.split(", sig2=")[0]  # sig1 is the new key
    assert f'keyid="{old.kid}"' in labels.split(", sig2=")[1]


# -- SSRF ------------------------------------------------------------------------------------------


async def test_a_private_target_is_refused_at_delivery_and_never_contacted(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    hub: Hub,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    settings = make_settings(allow_private_targets=False)
    add_subscription(database, endpoints.add("internal", UspReceiver(jwks)))
    _, ids = emit_event(database)

    report = await deliver(database, settings, ids, client, clock)

    assert report.retrying == 1  # DNS may change back: the schedule decides, then the dead letter
    assert hub.seen(endpoints.path("internal")) == []
    [attempt] = attempts(database, ids[0])
    assert (attempt.error_class, attempt.status_code, attempt.outcome) == (
        "ssrf_refused",
        None,
        AttemptOutcome.RETRY,
    )
    row = delivery(database, ids[0])
    assert row.attempt_count == 1
    assert row.last_error is not None
    assert "loopback" in row.last_error


async def test_a_name_is_resolved_checked_and_pinned_with_the_signed_authority(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    hub: Hub,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    asked: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"]

    receiver = UspReceiver(jwks)
    path = endpoints.add("named", receiver).removeprefix(endpoints.base)
    add_subscription(database, f"http://hooks.platform.test:{hub.port}{path}")
    event_ids, ids = [], []
    for _ in range(3):
        event_id, delivery_ids = emit_event(database)
        event_ids.append(event_id)
        ids += delivery_ids

    report = await deliver(database, settings, ids, client, clock, resolver=resolver)

    assert report.succeeded == 3
    assert sorted(receiver.handled) == sorted(event_ids)  # verified @authority = the name
    assert asked == ["hooks.platform.test"]  # one lookup per batch and URL
    assert {s.headers["host"] for s in hub.seen(path)} == {f"hooks.platform.test:{hub.port}"}


async def test_a_name_that_does_not_resolve_is_a_dns_error(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    async def nxdomain(host: str, port: int) -> list[str]:
        raise OSError("Name or service not known")

    add_subscription(database, "http://nowhere.invalid/hooks")
    _, ids = emit_event(database)

    report = await deliver(database, settings, ids, client, clock, resolver=nxdomain)

    assert report.retrying == 1
    [attempt] = attempts(database, ids[0])
    assert attempt.error_class == "dns_error"


# -- concurrency and ownership -------------------------------------------------------------------------


async def test_two_workers_handed_the_same_ids_deliver_each_once(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    hub: Hub,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    add_subscription(database, endpoints.add("a", UspReceiver(jwks)))
    add_subscription(database, endpoints.add("b", UspReceiver(jwks)))
    ids = [i for _ in range(20) for i in emit_event(database)[1]]
    reports: list[BatchReport] = []

    async def worker(order: list[str]) -> None:
        reports.append(await deliver(database, settings, order, client, clock))

    async with anyio.create_task_group() as group:
        for order in (ids, ids[::-1], ids[10:] + ids[:10]):
            group.start_soon(worker, order)

    assert sum(r.claimed for r in reports) == len(ids)
    assert sum(r.succeeded for r in reports) == len(ids)
    requests = hub.seen(endpoints.path("a")) + hub.seen(endpoints.path("b"))
    assert len(requests) == len(ids)  # not one request twice (the receiver's dedupe would hide it)
    for delivery_id in ids:
        assert len(attempts(database, delivery_id)) == 1
        assert delivery(database, delivery_id).status == DeliveryStatus.SUCCEEDED


async def test_a_worker_whose_lease_expired_cannot_overwrite_the_new_owners_state(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    # Worker A's try hangs past its lease; worker B takes the delivery over and its try hangs
    # too. A's try then fails while B still holds the delivery: A must not touch B's claim.
    receiver = UspReceiver(jwks)
    stuck_a, stuck_b = Blocking(status=500), Blocking(then=receiver)
    add_subscription(database, endpoints.add("slow", Sequenced([stuck_a, stuck_b])))
    event_id, ids = emit_event(database)
    late = Clock()  # worker B's clock is past worker A's lease
    late.offset = timedelta(seconds=settings.lease_seconds + 1)
    reports: dict[str, BatchReport] = {}
    a_done = anyio.Event()

    async def worker(name: str, clock: Clock) -> None:
        reports[name] = await deliver(database, settings, ids, client, clock)
        if name == "a":
            a_done.set()

    async with anyio.create_task_group() as group:
        group.start_soon(worker, "a", clock)
        assert await anyio.to_thread.run_sync(stuck_a.entered.wait, 5)
        group.start_soon(worker, "b", late)  # takes the expired lease over
        assert await anyio.to_thread.run_sync(stuck_b.entered.wait, 5)
        b_lease = delivery(database, ids[0]).lease_until
        stuck_a.release.set()
        with anyio.fail_after(5):
            await a_done.wait()
        row = delivery(database, ids[0])
        assert (row.status, row.lease_until, row.attempt_count) == (DeliveryStatus.IN_FLIGHT, b_lease, 0)
        stuck_b.release.set()

    stale, owner = reports["a"], reports["b"]
    assert (stale.claimed, stale.retrying, stale.stale) == (1, 1, 1)
    assert stale.results[0].applied is False
    assert (owner.succeeded, owner.stale) == (1, 0)
    assert receiver.handled == [event_id]
    row = delivery(database, ids[0])
    assert (row.status, row.last_status_code, row.attempt_count) == (DeliveryStatus.SUCCEEDED, 200, 1)
    outcomes = sorted(a.outcome for a in attempts(database, ids[0]))
    assert outcomes == [AttemptOutcome.RETRY, AttemptOutcome.SUCCEEDED]  # both tries recorded


async def test_concurrent_tries_per_endpoint_are_bounded(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    settings = make_settings(per_endpoint_concurrency=3)
    slow, fast = ConcurrencyProbe(hold=0.2), ConcurrencyProbe(hold=0.0)
    add_subscription(database, endpoints.add("slow", slow))
    add_subscription(database, endpoints.add("fast", fast))
    ids = [i for _ in range(12) for i in emit_event(database)[1]]

    report = await deliver(database, settings, ids, client, clock)

    assert report.succeeded == 24
    assert slow.peak == 3  # bounded, and actually concurrent


async def test_a_try_that_could_outlive_the_lease_is_deferred_untried(
    database: Engine,
    make_settings: MakeSettings,
    jwks: JWKS,
    endpoints: Endpoints,
    hub: Hub,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    # One slot; each try holds it 0.7 s; 1.2 s of the lease may be spent waiting for the slot.
    # The first two tries start in time (at 0 and ~0.7 s); the others would start at >= 1.4 s.
    settings = make_settings(
        per_endpoint_concurrency=1, total_timeout=1.0, lease_seconds=1.0 + RECORD_MARGIN + 1.2
    )
    probe = ConcurrencyProbe(hold=0.7)
    add_subscription(database, endpoints.add("busy", probe))
    ids = [emit_event(database)[1][0] for _ in range(4)]
    before = {i: delivery(database, i).last_error for i in ids}

    report = await deliver(database, settings, ids, client, clock)

    assert (report.succeeded, report.deferred) == (2, 2)
    assert len(hub.seen(endpoints.path("busy"))) == 2
    deferred = [r.delivery_id for r in report.results if r.error_class == "endpoint_busy"]
    for delivery_id in deferred:
        row = delivery(database, delivery_id)
        assert (row.status, row.attempt_count, row.lease_until) == (DeliveryStatus.PENDING, 0, None)
        assert row.next_attempt_at <= clock()  # due again at once
        assert row.last_error == before[delivery_id]
        assert attempts(database, delivery_id) == []
    again = await deliver(database, settings, deferred, client, clock)
    assert again.claimed == 2


async def test_unknown_and_already_settled_ids_are_skipped(
    database: Engine,
    settings: Settings,
    jwks: JWKS,
    endpoints: Endpoints,
    hub: Hub,
    client: httpx.AsyncClient,
    clock: Clock,
) -> None:
    add_subscription(database, endpoints.add("ok", UspReceiver(jwks)))
    _, ids = emit_event(database)
    await deliver(database, settings, ids, client, clock)

    report = await deliver(database, settings, [*ids, "dlv_unknown", *ids], client, clock)

    assert (report.requested, report.claimed, report.skipped, report.results) == (2, 0, 2, [])
    assert len(hub.seen(endpoints.path("ok"))) == 1


async def test_no_live_signing_key_fails_before_claiming(
    database: Engine, settings: Settings, endpoints: Endpoints, client: httpx.AsyncClient, clock: Clock
) -> None:
    add_subscription(database, endpoints.add("ok", Answer(200)))
    _, ids = emit_event(database)

    with pytest.raises(NoSigningKey):
        await deliver(database, settings, ids, client, clock)

    assert delivery(database, ids[0]).status == DeliveryStatus.PENDING


async def test_a_worker_that_cannot_open_a_standard_webhooks_secret_says_so_and_sends_nothing(
    database: Engine,
    jwks: JWKS,
    make_settings: MakeSettings,
    endpoints: Endpoints,
    client: httpx.AsyncClient,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its USP_SECRETS_KEY unset (or not the API's): the try is not sent (a delivery without the
    headers the platform verifies would be refused), the attempt says why, the log has one
    warning and no traceback; with the key, the same delivery goes out signed both ways."""
    url = endpoints.add("sealed", Answer(200))
    row = add_subscription(database, url)
    key = SecretStr("worker-secrets-key")
    with session(database) as s:
        stored = s.get(Subscription, row.id)
        assert stored is not None
        stored.webhook_secrets = seal(WebhookSecrets.new((STANDARD,)), key, stored.id)
        s.add(stored)
        s.commit()
    _, ids = emit_event(database)

    await deliver(database, make_settings(), ids, client, clock)
    [attempt] = attempts(database, ids[0])
    assert (attempt.error_class, attempt.key_ids) == ("secrets_unavailable", None)
    assert endpoints.hub.seen(endpoints.path("sealed")) == []
    assert "USP_SECRETS_KEY" in caplog.text
    assert not [r for r in caplog.records if r.exc_info]

    clock.advance(3600)
    await deliver(database, make_settings(secrets_key=key), ids, client, clock)
    (sent,) = endpoints.hub.seen(endpoints.path("sealed"))
    assert sent.headers["webhook-signature"].startswith("v1,")
    moment = clock().timestamp()
    assert Verifier(jwks).verify("POST", url, sent.headers, sent.body, now=moment), "RFC 9421 as always"
