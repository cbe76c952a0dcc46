"""What the pipeline promises under load and under failure, shown with real processes.

Redis broker (database 11, held under the suite's lock) and PostgreSQL, real Celery worker
subprocesses and a real scheduler subprocess, receivers on real uvicorn servers that verify every
signature (the receiver library for REST; ``usp_receiver.Verifier`` plus the library's dedupe for
JSON-RPC). "Lost" means a delivery that never succeeded; "processed twice" means a receiver's
handler ran twice for one event. The sender is at-least-once, so a crash may make it POST an event
again; the receiver's dedupe then answers without running the handler. So every test asserts
exactly one handler run per (subscription, event), and reports how many POSTs were repeats.

1. Fan-out: 1,000 events to two REST and one JSON-RPC subscription, two workers.
2. A worker SIGKILLed in the middle of 2,000 deliveries, then restarted.
3. The broker's Redis database flushed mid-run: the relay re-sends what it lost.
4. A process killed between its commit and the hand-off to the broker.
5. A slow endpoint does not stall deliveries to another.
6. Retries, the dead letter, 410 Gone and Retry-After through the whole pipeline.

Settings are shortened so each runs in seconds (lease, requeue-after, schedule, timeouts); every
wait has a timeout, and every child process is killed at the end (its process group).
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, func, select

from tests.workers.endpoints import (
    Answer,
    Hub,
    JsonRpcReceiver,
    Sequenced,
    Unresponsive,
    UspReceiver,
    failing_first,
)
from tests.workers.support import (
    Endpoints,
    Pipeline,
    ServiceProcess,
    StartRelay,
    StartWorker,
    emit_events,
    in_flight_under_lease,
    jwks_of,
    status_counts,
    subscribe,
    wait_all_succeeded,
    wait_for_status,
)
from usp_workers.runtime import tasks
from usp_workers.storage.models import (
    Attempt,
    AttemptOutcome,
    Delivery,
    DeliveryStatus,
    Subscription,
    SubscriptionState,
    Transport,
)

#: The production shape: Redis broker, PostgreSQL database.
redis_postgresql = pytest.mark.parametrize(
    "pipeline", [("redis", "postgresql")], indirect=True, ids=["redis-postgresql"]
)
#: The production shape on either broker the README names: Redis, RabbitMQ.
each_broker = pytest.mark.parametrize(
    "pipeline",
    [("redis", "postgresql"), ("amqp", "postgresql")],
    indirect=True,
    ids=["redis-postgresql", "rabbitmq-postgresql"],
)

Diagnose = Callable[[], str]


# -- helpers --------------------------------------------------------------------------------------------


def start_fleet(
    start_worker: StartWorker, start_relay: StartRelay, workers: int = 2, *, relay: bool = True
) -> list[Diagnose]:
    """Start ``workers`` worker processes (and the scheduler), wait until all are ready; return
    their diagnostics for failure messages."""
    children: list[ServiceProcess] = [start_worker(f"worker-{n}") for n in range(1, workers + 1)]
    if relay:
        children.append(start_relay())
    for child in children:
        child.wait_ready()
    return [child.diagnose for child in children]


def assert_each_handled_once(handled: Iterable[str], event_ids: Sequence[str], who: str) -> None:
    """The handler ran exactly once per event: none missing, none twice, nothing else."""
    counts = Counter(handled)
    missing = set(event_ids) - set(counts)
    assert not missing, f"{who}: {len(missing)} of {len(event_ids)} events never handled"
    twice = {event_id: n for event_id, n in counts.items() if n > 1}
    assert not twice, f"{who}: {len(twice)} events handled more than once"
    assert len(counts) == len(event_ids), f"{who}: handled events nobody emitted"


def posts(hub: Hub, path: str) -> int:
    """Requests that reached ``path`` (every try, whatever its answer)."""
    return len(hub.seen(path))


def dead_deliveries(engine: Engine) -> list[Delivery]:
    """The dead letter, as an operator lists it."""
    with Session(engine) as s:
        rows = s.exec(select(Delivery).where(Delivery.status == DeliveryStatus.DEAD)).all()
        for row in rows:
            s.expunge(row)
        return list(rows)


def attempts_of(engine: Engine, subscription_id: str) -> list[Attempt]:
    """Every attempt at deliveries to ``subscription_id``, in order."""
    with Session(engine) as s:
        rows = s.exec(
            select(Attempt)
            .join(Delivery, col(Delivery.id) == col(Attempt.delivery_id))
            .where(Delivery.subscription_id == subscription_id)
            .order_by(col(Attempt.started_at))
        ).all()
        for row in rows:
            s.expunge(row)
        return list(rows)


def attempt_count(engine: Engine) -> int:
    with Session(engine) as s:
        return int(s.exec(select(func.count()).select_from(Attempt)).one())


def report(capsys: pytest.CaptureFixture[str], line: str) -> None:
    """Print a result line even when pytest captures output (``-s`` not needed)."""
    with capsys.disabled():
        print(f"\n[resilience] {line}")


# -- 1. fan-out -----------------------------------------------------------------------------------------


@redis_postgresql
def test_1000_events_to_three_subscriptions_are_each_handled_once(
    pipeline: Pipeline,
    start_worker: StartWorker,
    start_relay: StartRelay,
    endpoints: Endpoints,
    hub: Hub,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every event reaches every subscription, verified, and no handler runs twice: two REST
    receivers (the receiver library's ASGI app) and one JSON-RPC receiver, fed by two workers."""
    # The three receivers share one server, i.e. one endpoint for the per-endpoint bound.
    pipeline.fields["per_endpoint_concurrency"] = 64
    jwks = jwks_of(pipeline)
    rest = {"rest-a": UspReceiver(jwks), "rest-b": UspReceiver(jwks)}
    rpc = JsonRpcReceiver(jwks)
    for name, receiver in rest.items():
        subscribe(pipeline.engine, endpoints.add(name, receiver))
    subscribe(pipeline.engine, endpoints.add("rpc", rpc), Transport.JSONRPC)
    logs = start_fleet(start_worker, start_relay)
    tasks.install_enqueuer(pipeline.settings)

    started = time.monotonic()
    event_ids = emit_events(pipeline.engine, 1000, per_transaction=10)
    finished = wait_all_succeeded(pipeline.engine, 3000, 150, *logs)

    for name, receiver in rest.items():
        assert_each_handled_once(receiver.handled, event_ids, name)
    assert rpc.refused == []
    assert_each_handled_once(rpc.handled, event_ids, "rpc")
    assert status_counts(pipeline.engine) == {DeliveryStatus.SUCCEEDED.value: 3000}
    sent = sum(posts(hub, endpoints.path(name)) for name in (*rest, "rpc"))
    assert sent == attempt_count(pipeline.engine) == 3000, "nothing failed, so nothing was sent twice"
    batches = [log().count("batch of") for log in logs[:2]]
    assert all(batches), f"both workers delivered: {batches} batches"
    report(
        capsys,
        f"fan-out: 3000 deliveries in {finished - started:.1f} s "
        f"({3000 / (finished - started):.0f}/s), batches per worker {batches}, "
        f"{sent - 3000} duplicate POSTs",
    )


# -- 2. a worker killed mid-run --------------------------------------------------------------------------


@each_broker
def test_a_worker_killed_mid_run_loses_nothing(
    pipeline: Pipeline,
    start_worker: StartWorker,
    start_relay: StartRelay,
    endpoints: Endpoints,
    hub: Hub,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SIGKILL one of two workers while 2,000 deliveries are in progress, then start it again:
    every delivery succeeds, every event is handled once per subscription. What the killed
    worker held (claimed deliveries, prefetched and unacknowledged messages) comes back through
    the lease (4 s here) and the relay's re-send (5 s); a try it had sent before dying may be
    POSTed again, and the receiver's dedupe absorbs it."""
    pipeline.fields |= {
        # A batch may start tries for 1 s of its lease (the rest is one try and its record,
        # RECORD_MARGIN 2 s): with no time to wait for a slot, every batch that found the
        # endpoint busy would be deferred at once and sent again, ~9 claims per delivery.
        "lease_seconds": FIRST_LEASE,
        "total_timeout": 1.0,
        "connect_timeout": 1.0,
        "requeue_after_seconds": 5.0,
        # A try that times out under load is retried, never dead: "lost" would be a false alarm.
        "retry_schedule": (0.5,) * 10,
        # Nor paused: ten such timeouts in a row (a loaded CI machine) would open the breaker
        # for its 30 s cooldown, and the run would wait it out with every delivery deferred.
        "breaker_threshold": 0,
        "per_endpoint_concurrency": 16,
        "batch_size": 20,
    }
    jwks = jwks_of(pipeline)
    # Each request takes 50 ms, so a worker holds the deliveries it claimed (in flight, under
    # its lease) for a while: the kill below finds some, and they must come back by the lease.
    receivers = {"a": UspReceiver(jwks, delay=0.05), "b": UspReceiver(jwks, delay=0.05)}
    for name, receiver in receivers.items():
        subscribe(pipeline.engine, endpoints.add(name, receiver))
    # The second worker's lease is a little longer, so the first's claims can be told apart in
    # the database (``lease_until - updated_at``): the kill must hit a worker holding some.
    first = start_worker("worker-1")
    second = start_worker("worker-2", env={"USP_LEASE_SECONDS": str(SECOND_LEASE)})
    relay = start_relay()
    for child in (first, second, relay):
        child.wait_ready()
    tasks.install_enqueuer(pipeline.settings)

    emitted: list[str] = []
    failures: list[BaseException] = []

    def emit_all() -> None:
        try:
            emitted.extend(emit_events(pipeline.engine, 1000, per_transaction=20))
        except BaseException as exc:
            failures.append(exc)

    emitter = threading.Thread(target=emit_all)
    emitter.start()
    wait_for_status(pipeline.engine, DeliveryStatus.SUCCEEDED, 500, 60, first.diagnose, second.diagnose)
    # Kill while many deliveries are in flight (a worker holds up to 32 batches of 20), stopped
    # while it is looked at, so that what it was seen holding it still holds when it dies: the
    # relay must reclaim them below.
    in_flight = first.kill_holding(lambda: held_by_first(pipeline.engine), 20, timeout=30)
    at_kill = status_counts(pipeline.engine)
    done_at_kill = at_kill.get(DeliveryStatus.SUCCEEDED.value, 0)
    restarted = start_worker("worker-1-restarted")
    emitter.join(60)
    assert not emitter.is_alive(), "emitting took over a minute"
    assert not failures, failures
    assert len(emitted) == 1000
    restarted.wait_ready()
    wait_all_succeeded(pipeline.engine, 2000, 120, second.diagnose, restarted.diagnose, relay.output)

    for name, receiver in receivers.items():
        assert_each_handled_once(receiver.handled, emitted, name)
    assert dead_deliveries(pipeline.engine) == []
    sent = sum(posts(hub, endpoints.path(name)) for name in receivers)
    reclaimed = _reclaimed(relay.output())
    assert reclaimed > 0, f"what the killed worker held comes back by its lease ({in_flight} in flight)"
    report(
        capsys,
        f"worker SIGKILLed at {done_at_kill}/2000 succeeded ({in_flight} in flight under its lease): "
        f"{reclaimed} expired leases reclaimed, {sent - 2000} duplicate POSTs "
        f"({attempt_count(pipeline.engine)} attempts recorded), 0 lost, 0 handled twice",
    )


#: The killed worker's lease, and the other's: a little longer, to tell their claims apart.
FIRST_LEASE = 4.0
SECOND_LEASE = 4.25


def held_by_first(engine: Engine) -> int:
    return in_flight_under_lease(engine, FIRST_LEASE)


def _reclaimed(relay_log: str) -> int:
    """The expired leases the relay reports having reclaimed ("…, N expired leases reclaimed")."""
    total = 0
    for line in relay_log.splitlines():
        before, found, _ = line.partition(" expired leases reclaimed")
        if found:
            total += int(before.rsplit(" ", 1)[-1])
    return total


# -- 3. the broker's data wiped ---------------------------------------------------------------------------


@each_broker
def test_a_flushed_broker_loses_nothing(
    pipeline: Pipeline,
    start_worker: StartWorker,
    start_relay: StartRelay,
    endpoints: Endpoints,
    hub: Hub,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The broker's Redis database is flushed while 400 events' messages wait in it: the
    database still holds every delivery as pending, and the relay re-sends the lost ones once
    ``requeue_after_seconds`` (2 s) have passed. Events emitted after the flush go through the
    same, still-connected hand-off.

    ``FLUSHDB`` of the broker's database, not ``FLUSHALL``: see :meth:`Pipeline.flush_broker`.
    For the broker, which keeps everything in that one database, the two are the same event."""
    pipeline.fields |= {"requeue_after_seconds": 2.0, "batch_size": 10, "per_endpoint_concurrency": 64}
    receiver = UspReceiver(jwks_of(pipeline))
    subscribe(pipeline.engine, endpoints.add("usp", receiver))
    tasks.install_enqueuer(pipeline.settings)
    before = emit_events(pipeline.engine, 400, per_transaction=10)  # 40 messages wait in Redis
    assert tasks.flush_enqueuer()
    assert pipeline.queued() == 40

    # The scheduler runs; the workers start only after the flush. With workers already
    # consuming, a fast fleet drains all 40 messages before any flush can hit them (seen on a
    # quiet machine), and the test would prove nothing.
    logs = start_fleet(start_worker, start_relay, workers=0)
    lost = pipeline.flush_broker()
    flushed_at = time.monotonic()
    assert lost > 0, "messages were waiting in the broker when it was flushed"
    logs += start_fleet(start_worker, start_relay, relay=False)
    after = emit_events(pipeline.engine, 200, per_transaction=10)
    finished = wait_all_succeeded(pipeline.engine, 600, 90, *logs)

    assert_each_handled_once(receiver.handled, before + after, "usp")
    sent = posts(hub, endpoints.path("usp"))
    report(
        capsys,
        f"broker flushed with {lost} messages waiting: all 600 delivered "
        f"{finished - flushed_at:.1f} s after the flush, {sent - 600} duplicate POSTs, 0 lost",
    )


# -- 4. a crash between commit and hand-off --------------------------------------------------------------


def run_until_killed(
    pipeline: Pipeline, tmp_path: Path, source: str, count: int
) -> tuple[str, list[Delivery]]:
    """Run the emitter script ``source`` with ``count`` until it SIGKILLs itself; its output and
    the deliveries it left in the database."""
    script = tmp_path / "emitter.py"
    script.write_text(source)
    emitter = ServiceProcess(pipeline, "emitter", [sys.executable, str(script), str(count)])
    try:
        code = emitter.wait(60)
    finally:
        emitter.stop()
    assert code == -9, emitter.output()
    with Session(pipeline.engine) as s:
        return emitter.output(), list(s.exec(select(Delivery)).all())


#: Emits ``argv[1]`` events in one transaction with an enqueuer that SIGKILLs its own process:
#: the commit has happened, the hand-off never does.
CRASH_AFTER_COMMIT = """
import json, os, signal, sys
from usp_schemas import BOOKING_CONFIRMED_EXAMPLE, new_event_id
from usp_workers.engine import outbox
from usp_core.db import make_engine, session
from usp_dispatcher.cli.config import Settings

def crash(delivery_ids):
    print(f"committed {len(delivery_ids)} deliveries; dying before the hand-off", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

outbox.set_enqueuer(crash)
engine = make_engine(Settings())
with session(engine) as s:
    for _ in range(int(sys.argv[1])):
        outbox.emit(s, json.loads(BOOKING_CONFIRMED_EXAMPLE) | {"event_id": new_event_id()})
    s.commit()
print("survived the commit", flush=True)
"""


@redis_postgresql
def test_a_crash_between_commit_and_hand_off_loses_nothing(
    pipeline: Pipeline,
    start_worker: StartWorker,
    start_relay: StartRelay,
    endpoints: Endpoints,
    hub: Hub,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A process commits 100 events and is killed before it hands a single delivery to the
    broker: the broker never hears of them, the workers idle; the relay finds them pending, still
    unsent ``requeue_after_seconds`` (2 s) after the commit, and sends them."""
    pipeline.fields["requeue_after_seconds"] = 2.0
    receiver = UspReceiver(jwks_of(pipeline))
    subscribe(pipeline.engine, endpoints.add("usp", receiver))
    logs = start_fleet(start_worker, start_relay, workers=1, relay=False)

    output, rows = run_until_killed(pipeline, tmp_path, CRASH_AFTER_COMMIT, 100)
    assert "committed 100 deliveries; dying before the hand-off" in output
    assert "survived" not in output
    event_ids = sorted({d.event_id for d in rows})
    assert len(rows) == 100
    assert {d.status for d in rows} == {DeliveryStatus.PENDING}
    assert all(d.enqueued_at is not None for d in rows), "written as handed off, before the hand-off"
    assert pipeline.queued() == 0, "nothing reached the broker"

    relay = start_relay()
    relay.wait_ready()
    started = time.monotonic()
    wait_all_succeeded(pipeline.engine, 100, 60, *logs, relay.output)
    elapsed = time.monotonic() - started

    assert_each_handled_once(receiver.handled, event_ids, "usp")
    sent = posts(hub, endpoints.path("usp"))
    assert sent == 100
    report(capsys, f"crash after commit: 100 events delivered by the relay {elapsed:.1f} s after it started")


#: Hands two events to the broker through the API's hand-off, one commit each (no worker takes
#: them: after the second, a message waits that the last publish did not send, a backlog), then
#: commits ``argv[1]`` more within the hand-off's interval (so it holds them, to coalesce) and
#: SIGKILLs itself.
KILLED_WHILE_HANDOFF_HOLDS = """
import json, os, signal, sys
from usp_schemas import BOOKING_CONFIRMED_EXAMPLE, new_event_id
from usp_workers.engine import outbox
from usp_workers.runtime import tasks
from usp_core.db import make_engine, session
from usp_dispatcher.cli.config import Settings

settings = Settings()
tasks.install_enqueuer(settings)
engine = make_engine(settings)
for count in (1, 1, int(sys.argv[1])):
    with session(engine) as s:
        for _ in range(count):
            outbox.emit(s, json.loads(BOOKING_CONFIRMED_EXAMPLE) | {"event_id": new_event_id()})
        s.commit()
    if count == 1:
        assert tasks.flush_enqueuer(10), "the first commits are published"
print("committed; dying while the hand-off holds them", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@redis_postgresql
def test_a_process_killed_while_its_hand_off_holds_deliveries_loses_nothing(
    pipeline: Pipeline,
    start_worker: StartWorker,
    start_relay: StartRelay,
    endpoints: Endpoints,
    hub: Hub,
    tmp_path: Path,
) -> None:
    """The API's hand-off keeps commits in memory for up to ``handoff_interval_seconds`` to
    publish them together. A process killed then takes them down with it: the broker got the
    first two commits' deliveries only; the relay sends the 40 others once they are
    ``requeue_after_seconds`` old."""
    pipeline.fields["requeue_after_seconds"] = 2.0
    pipeline.fields["handoff_interval_seconds"] = 60.0
    receiver = UspReceiver(jwks_of(pipeline))
    subscribe(pipeline.engine, endpoints.add("usp", receiver))

    output, rows = run_until_killed(pipeline, tmp_path, KILLED_WHILE_HANDOFF_HOLDS, 40)
    assert "dying while the hand-off holds them" in output
    event_ids = sorted({d.event_id for d in rows})
    assert len(rows) == 42
    assert pipeline.queued() == 2, "only the first two commits reached the broker"

    logs = start_fleet(start_worker, start_relay, workers=1, relay=True)
    wait_all_succeeded(pipeline.engine, 42, 60, *logs)

    assert_each_handled_once(receiver.handled, event_ids, "usp")
    assert posts(hub, endpoints.path("usp")) == 42


# -- 5. a slow endpoint ---------------------------------------------------------------------------------


@redis_postgresql
def test_a_slow_endpoint_does_not_stall_deliveries_to_others(
    pipeline: Pipeline,
    start_worker: StartWorker,
    start_relay: StartRelay,
    endpoints: Endpoints,
    serve_hub: Callable[[], Hub],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Subscription A's endpoint (a server of its own, so its own per-endpoint bound) never
    answers within the 2 s total timeout; subscription B gets the same 60 events, emitted one per
    transaction, about 20 a second, as the API would. Each reaches B well before A's try of the
    same event times out: B never waits for A.

    A warm-up event (to B alone, before A subscribes) takes each worker's first-batch costs
    (keys, client, connections) out of the measurement."""
    total_timeout = 2.0
    pipeline.fields |= {"total_timeout": total_timeout, "connect_timeout": 1.0}
    fast = UspReceiver(jwks_of(pipeline))
    subscribe(pipeline.engine, endpoints.add("fast", fast))
    logs = start_fleet(start_worker, start_relay)
    tasks.install_enqueuer(pipeline.settings)
    warm_up = emit_events(pipeline.engine, 2, per_transaction=1)
    _wait_until(lambda: len(fast.handled) == 2, 30, logs)
    slow_hub = serve_hub()
    slow_hub.routes["/slow"] = Unresponsive(30.0)
    subscribe(pipeline.engine, f"http://127.0.0.1:{slow_hub.port}/slow")

    emitted_at: dict[str, float] = {}
    for _ in range(60):
        [event_id] = emit_events(pipeline.engine, 1)
        emitted_at[event_id] = time.monotonic()
        time.sleep(0.03)
    _wait_until(lambda: len(fast.handled) == 62, 60, logs)

    latencies = sorted(fast.handled_at[e] - emitted_at[e] for e in emitted_at)
    p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
    slow_tries = len(slow_hub.seen("/slow"))
    report(
        capsys,
        f"slow endpoint: B's latency p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, "
        f"max {latencies[-1] * 1000:.0f} ms; A (timing out after {total_timeout:.0f} s) got "
        f"{slow_tries} tries by then",
    )
    assert slow_tries > 0, "A's endpoint was tried (and hung)"
    assert latencies[-1] < total_timeout, (
        f"B waited for A's timeouts: {sum(t >= total_timeout for t in latencies)} of 60 events "
        f"reached B {total_timeout:.0f} s or more after they were emitted (max {latencies[-1]:.1f} s)"
    )
    assert_each_handled_once(fast.handled, warm_up + list(emitted_at), "fast")


def _wait_until(condition: Callable[[], bool], timeout: float, logs: Sequence[Diagnose]) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not done within {timeout} s:\n" + "\n".join(log() for log in logs))
        time.sleep(0.05)


# -- 6. failures through the whole pipeline --------------------------------------------------------------


@redis_postgresql
def test_retries_dead_letter_gone_and_retry_after_through_the_pipeline(
    pipeline: Pipeline,
    start_worker: StartWorker,
    start_relay: StartRelay,
    endpoints: Endpoints,
    hub: Hub,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One event to four receivers, on a compressed schedule (1 s, 1 s, 1 s; no jitter):

    * ``flaky`` fails twice, then accepts: three tries, about a second apart, succeeded;
    * ``broken`` always fails: four tries, then the delivery is dead and listed in the dead letter;
    * ``gone`` answers 410: the delivery is dead after one try, the subscription disabled, and
      the next event makes no delivery for it;
    * ``throttled`` fails once, then answers 503 with ``Retry-After: 2``, then accepts: the
      third try comes 2 s after the second, not 1 s. (Its second try, not its first: the first
      retry of the run also waits for the scheduler's first connection to the broker, which
      would make any first gap look long.)
    """
    jwks = jwks_of(pipeline)
    flaky, throttled_receiver = UspReceiver(jwks), UspReceiver(jwks)
    subscriptions = {
        "flaky": subscribe(pipeline.engine, endpoints.add("flaky", failing_first(2, flaky))),
        "broken": subscribe(pipeline.engine, endpoints.add("broken", Answer(500, body=b"down"))),
        "gone": subscribe(pipeline.engine, endpoints.add("gone", Answer(410))),
        "throttled": subscribe(
            pipeline.engine,
            endpoints.add(
                "throttled",
                Sequenced([Answer(500), Answer(503, headers=[("Retry-After", "2")]), throttled_receiver]),
            ),
        ),
    }
    logs = start_fleet(start_worker, start_relay)
    tasks.install_enqueuer(pipeline.settings)

    [event_id] = emit_events(pipeline.engine, 1)
    wait_for_status(pipeline.engine, DeliveryStatus.SUCCEEDED, 2, 30, *logs)
    wait_for_status(pipeline.engine, DeliveryStatus.DEAD, 2, 30, *logs)

    assert flaky.handled == [event_id]
    assert throttled_receiver.handled == [event_id]
    tries = {name: attempts_of(pipeline.engine, sub) for name, sub in subscriptions.items()}
    gaps = {name: _gaps(rows) for name, rows in tries.items()}

    assert [a.status_code for a in tries["flaky"]] == [500, 500, 200]
    assert all(1.0 <= gap < 10.0 for gap in gaps["flaky"]), gaps

    assert [a.status_code for a in tries["broken"]] == [500] * 4
    assert tries["broken"][-1].outcome == AttemptOutcome.DEAD
    [dead_broken, dead_gone] = sorted(
        dead_deliveries(pipeline.engine), key=lambda d: d.subscription_id != subscriptions["broken"]
    )
    assert dead_broken.subscription_id == subscriptions["broken"]
    assert dead_broken.attempt_count == 4
    assert dead_broken.last_error is not None
    assert "gave up after 4 tries" in dead_broken.last_error

    assert dead_gone.subscription_id == subscriptions["gone"]
    assert [(a.status_code, a.outcome) for a in tries["gone"]] == [(410, AttemptOutcome.DISABLED)]
    with Session(pipeline.engine) as s:
        gone = s.get(Subscription, subscriptions["gone"])
        assert gone is not None
        assert gone.state == SubscriptionState.DISABLED

    assert [a.status_code for a in tries["throttled"]] == [500, 503, 200]
    assert gaps["throttled"][1] >= 2.0, f"Retry-After: 2 obeyed (the schedule alone says 1 s): {gaps}"

    [second_event] = emit_events(pipeline.engine, 1)
    with Session(pipeline.engine) as s:
        targets = s.exec(select(Delivery.subscription_id).where(Delivery.event_id == second_event)).all()
    assert sorted(targets) == sorted(subscriptions[n] for n in ("flaky", "broken", "throttled"))
    assert posts(hub, endpoints.path("gone")) == 1
    rounded = {name: [round(gap, 2) for gap in values] for name, values in gaps.items()}
    report(capsys, f"failures: seconds between tries {rounded}")


def _gaps(rows: Sequence[Attempt]) -> list[float]:
    """Seconds between the starts of consecutive tries."""
    starts = [row.started_at for row in rows]
    return [(b - a) / timedelta(seconds=1) for a, b in itertools.pairwise(starts)]
