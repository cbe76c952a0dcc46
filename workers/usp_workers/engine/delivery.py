"""The delivery engine: claim a batch of deliveries, try each once, record what happened.

:func:`deliver_batch` is the whole engine, async and free of Celery and FastAPI (a task, a test
or a benchmark calls it alike); :func:`deliver_batch_sync` is the same for Celery's threads. Its
steps and why: docs/architecture.md, "The delivery engine".
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cached_property, partial
from typing import Final

import anyio
import anyio.to_thread
import httpx
from opentelemetry.trace import SpanKind, StatusCode
from sqlalchemy.engine import Connection, Engine

from usp_core.clock import utcnow
from usp_core.keycache import current_signing_keys
from usp_core.ssrf import ResolvedTarget, Resolver, check_target
from usp_receiver import SigningKey, sign_message_headers
from usp_workers.engine import brokers, custom_headers, endpoint_auth, health, ratelimit, tracing
from usp_workers.engine.background import background_runtime
from usp_workers.engine.endpoint_auth import EndpointAuth
from usp_workers.engine.health import Gate, HealthPolicy, Tally
from usp_workers.engine.ordering import successors
from usp_workers.engine.outage import DATABASE_OUTAGE, database_unavailable
from usp_workers.engine.outbox import Enqueue
from usp_workers.engine.payloads import BodyCache, build_delivery_request, encode_body
from usp_workers.engine.schedule import RetrySchedule, subscription_schedule
from usp_workers.engine.store import (
    AttemptRow,
    Claimed,
    DeliveryUpdate,
    LoadedEvent,
    LoadedSubscription,
    claim_and_load,
    record,
)
from usp_workers.engine.transport import TryResult, endpoint_slot, refused_result, send_once
from usp_workers.engine.verdict import Verdict, judge
from usp_workers.engine.webhook_secrets import SecretsUnavailable, unseal
from usp_workers.settings import WorkerSettings
from usp_workers.storage.models import (
    AttemptOutcome,
    BreakerState,
    DeliveryStatus,
    SubscriptionState,
    Transport,
)

__all__ = [
    "RATE_WAIT",
    "RECORD_DELAY",
    "RECORD_MARGIN",
    "SLOT_WAIT",
    "BatchReport",
    "DeliveryResult",
    "deliver_batch",
    "deliver_batch_sync",
]

logger = logging.getLogger("usp_workers")

Clock = Callable[[], datetime]

#: How long a worker holds a batch's outcomes while the database does not answer.
HOLD_OUTCOMES_SECONDS = 600.0
#: Seconds kept in reserve at the end of a lease for recording the batch's results.
RECORD_MARGIN = 2.0
#: Seconds a delivery to a rate-limited subscription waits in the worker for its reserved start
#: (longer, it goes back to the schedule): two scheduler passes, so the next batch arrives while
#: this one still sends, and the subscription's rate never gaps at a pass.
RATE_WAIT = 2.0
#: Seconds an ended try's outcome may wait to share its record with others that end soon after.
RECORD_DELAY = 0.2
#: Seconds a batch waits for an endpoint slot another batch holds before deferring its
#: deliveries to that endpoint: long enough to smooth contention on a fast endpoint, short
#: enough that a hung endpoint never parks worker threads.
SLOT_WAIT = 1.0


@dataclass(frozen=True, slots=True)
class DeliveryResult:
    """What happened to one claimed delivery in this batch."""

    delivery_id: str
    outcome: AttemptOutcome
    status: DeliveryStatus  #: the state written (or that would have been, when not ``applied``)
    attempt_number: int | None  #: ``None``: no try was made (subscription disabled)
    status_code: int | None = None
    error_class: str | None = None
    next_attempt_at: datetime | None = None
    duration_ms: float | None = None
    #: False when our lease had expired and another worker had taken the delivery over: the
    #: attempt was recorded, the delivery's state was left to the newer owner.
    applied: bool = True


@dataclass(slots=True)
class BatchReport:
    """The outcome of one :func:`deliver_batch` call, for callers, tests and benchmarks."""

    requested: int
    claimed: int = 0
    results: list[DeliveryResult] = field(default_factory=list)
    #: deliveries of ordered subjects that this batch's outcomes let go, handed to the broker
    released: list[str] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        """Ids not claimed: already done, not yet due, or held by another worker."""
        return self.requested - self.claimed

    @property
    def counts(self) -> Counter[AttemptOutcome]:
        return Counter(result.outcome for result in self.results)

    @property
    def succeeded(self) -> int:
        return self.counts[AttemptOutcome.SUCCEEDED]

    @property
    def retrying(self) -> int:
        return self.counts[AttemptOutcome.RETRY]

    @property
    def dead(self) -> int:
        return self.counts[AttemptOutcome.DEAD]

    @property
    def disabled(self) -> int:
        return self.counts[AttemptOutcome.DISABLED]

    @property
    def deferred(self) -> int:
        """Deliveries not tried because their endpoint stayed busy (back to pending, due now)."""
        return sum(result.error_class == "endpoint_busy" for result in self.results)

    @property
    def paused(self) -> int:
        """Deliveries not tried because of their subscription's health: breaker open, a
        half-open probe elsewhere, back-pressure, or its rate limit (back to pending, due later)."""
        return sum(result.error_class in _PAUSE_REASONS for result in self.results)

    @property
    def stale(self) -> int:
        """Results whose state update lost to a newer owner (see :attr:`DeliveryResult.applied`)."""
        return sum(not result.applied for result in self.results)

    def result(self, delivery_id: str) -> DeliveryResult:
        """The result for ``delivery_id`` (``KeyError`` when it was not claimed)."""
        for result in self.results:
            if result.delivery_id == delivery_id:
                return result
        raise KeyError(delivery_id)


async def deliver_batch(
    engine: Engine,
    settings: WorkerSettings,
    delivery_ids: Sequence[str],
    *,
    client: httpx.AsyncClient,
    resolver: Resolver | None = None,
    now: Clock = utcnow,
    schedule: RetrySchedule | None = None,
    enqueue: Enqueue | None = None,
) -> BatchReport:
    """Try each due delivery among ``delivery_ids`` once, and record the results.

    ``client`` is the process's shared client (:func:`usp_workers.engine.transport.make_client`): built
    once and reused so connections are pooled. ``resolver`` replaces DNS for the SSRF check
    (tests); ``now`` is the clock; ``schedule`` defaults to the one ``settings`` configure;
    ``enqueue`` hands an ordered subject's next delivery to the broker once this batch settles
    the one before it (without it, the scheduler's next pass sends it).
    Raises :class:`~usp_core.keycache.NoSigningKey` (before claiming anything) when no key
    signs now; database errors propagate (claimed deliveries then come back when their lease
    expires).
    """
    opened = await anyio.to_thread.run_sync(
        partial(
            _open, engine, settings, delivery_ids, client=client, now=now, schedule=schedule, enqueue=enqueue
        )
    )
    if isinstance(opened, BatchReport):
        return opened
    async with anyio.create_task_group() as group:
        group.start_soon(partial(anyio.to_thread.run_sync, opened.record_as_they_end))
        try:
            await opened.run(opened.claimed, resolver)
        finally:
            opened.sent()
    return opened.report


def deliver_batch_sync(
    engine: Engine,
    settings: WorkerSettings,
    delivery_ids: Sequence[str],
    *,
    client: httpx.AsyncClient | None = None,
    resolver: Resolver | None = None,
    now: Clock = utcnow,
    schedule: RetrySchedule | None = None,
    enqueue: Enqueue | None = None,
) -> BatchReport:
    """:func:`deliver_batch` for synchronous callers (Celery worker threads, scripts).

    The database work (claim, record) runs on the calling thread; only the HTTP exchanges run on
    the process's one background event loop, with its one shared ``AsyncClient`` (unless
    ``client=`` is given), both created on first use and re-created in a forked child
    (:mod:`usp_workers.engine.background`). Why not ``anyio.run`` per call: a new loop per task costs a
    loop's setup, and a new ``httpx`` client costs ~38 ms and throws the connection pool away,
    which at hundreds of batches a second is most of the budget. Why the database work stays on
    this thread: each hand-over between threads waits for the GIL behind whatever else the
    process runs, and under load those waits, not the queries, were most of a small batch's
    latency (a claim that takes 2.5 ms alone took 9 ms, p99 44 ms, through the loop and a
    thread pool). Thread-safe: many threads may call this at once; their HTTP exchanges
    interleave on the shared loop.
    """
    runtime = background_runtime(settings)
    opened = _open(
        engine,
        settings,
        delivery_ids,
        client=client or runtime.client,
        now=now,
        schedule=schedule,
        enqueue=enqueue,
    )
    if isinstance(opened, BatchReport):
        return opened
    sending = runtime.submit(opened.run(opened.claimed, resolver))
    sending.add_done_callback(lambda _: opened.sent())
    opened.record_as_they_end()
    sending.result()  # the sending's own error, if any, once what it concluded is recorded
    return opened.report


def _open(
    engine: Engine,
    settings: WorkerSettings,
    delivery_ids: Sequence[str],
    *,
    client: httpx.AsyncClient,
    now: Clock,
    schedule: RetrySchedule | None,
    enqueue: Enqueue | None,
) -> _Batch | BatchReport:
    """Claim the due deliveries among ``delivery_ids`` (blocking): the batch to run, or the
    finished report when nothing was claimed."""
    ids = list(dict.fromkeys(delivery_ids))
    report = BatchReport(requested=len(ids))
    if not ids:
        return report
    if settings.lease_seconds < settings.total_timeout + RECORD_MARGIN:
        logger.warning(
            "lease_seconds (%s) < total_timeout (%s) + %s s: a try that waits for a busy endpoint "
            "is always deferred",
            settings.lease_seconds,
            settings.total_timeout,
            RECORD_MARGIN,
        )
    keys = current_signing_keys(engine, settings, now=now())
    claimed_at = now()
    lease_until = claimed_at + timedelta(seconds=settings.lease_seconds)
    claim_began = time.time_ns()
    claimed, events, subscriptions = claim_and_load(engine, ids, now=claimed_at, lease_until=lease_until)
    _trace_claim(claim_began, ids, claimed, events)
    report.claimed = len(claimed)
    if not claimed:
        return report
    return _Batch(
        engine=engine,
        settings=settings,
        client=client,
        keys=keys,
        now=now,
        lease_until=lease_until,
        schedule=schedule or RetrySchedule.from_settings(settings),
        events=events,
        subscriptions=subscriptions,
        claimed=claimed,
        report=report,
        enqueue=enqueue,
        ordered=frozenset(delivery.id for delivery in claimed if delivery.subject_key is not None),
    )


# --------------------------------------------------------------------------------------------


_PAUSE_REASONS = frozenset({"breaker_open", "probe_elsewhere", "backpressure", "rate_limited"})

_Item = tuple[Claimed, LoadedEvent, LoadedSubscription]


@dataclass
class _Batch:
    """The per-batch state: what to send with, and what happened (attempts, updates, results)."""

    engine: Engine
    settings: WorkerSettings
    client: httpx.AsyncClient
    keys: Sequence[SigningKey]
    now: Clock
    lease_until: datetime
    schedule: RetrySchedule
    events: dict[str, LoadedEvent]
    subscriptions: dict[str, LoadedSubscription]
    claimed: list[Claimed]
    report: BatchReport
    bodies: BodyCache = field(default_factory=dict)
    enqueue: Enqueue | None = None
    #: the claimed deliveries under subject ordering: settled, they hand their subject on
    ordered: frozenset[str] = frozenset()
    #: outcomes concluded and not yet recorded (guarded by ``concluded``)
    attempts: list[AttemptRow] = field(default_factory=list)
    updates: list[DeliveryUpdate] = field(default_factory=list)
    results: list[DeliveryResult] = field(default_factory=list)
    concluded: threading.Condition = field(default_factory=threading.Condition)
    done_sending: bool = False
    tallies: dict[str, Tally] = field(default_factory=dict)
    #: per rate-limited subscription: the bucket's next start, and how many were deferred to it
    rate_blocked: dict[str, tuple[datetime, int]] = field(default_factory=dict)

    @property
    def policy(self) -> HealthPolicy:
        return HealthPolicy.from_settings(self.settings)

    @cached_property
    def key_ids(self) -> str:
        """The kids every try of the batch is signed with, ``sig1`` first."""
        return ",".join(key.kid for key in self.keys)

    def sent(self) -> None:
        """Every try of the batch has ended (or the sending failed): the last record may run."""
        with self.concluded:
            self.done_sending = True
            self.concluded.notify_all()

    def record_as_they_end(self) -> None:
        """Record outcomes while the batch runs, each within :data:`RECORD_DELAY` of its try's
        end (blocking; returns once the last is recorded).

        Why not once at the end: a batch lasts as long as its slowest try, and a 3 ms success that
        shared a batch with a 15 s timeout would stay unrecorded for 15 s, to be sent again if
        the worker died in between. Why not one transaction per outcome: a fast batch ends
        within the delay and keeps its one record; outcomes that end together share one.
        """
        while True:
            with self.concluded:
                while not self.done_sending and not (self.updates or self.results):
                    self.concluded.wait()
                deadline = time.monotonic() + RECORD_DELAY
                while not self.done_sending and (remaining := deadline - time.monotonic()) > 0:
                    self.concluded.wait(remaining)
                last = self.done_sending
                attempts, updates, results = self.attempts, self.updates, self.results
                self.attempts, self.updates, self.results = [], [], []
            self._record(attempts, updates, results, last=last)
            if last:
                return

    def _record(
        self,
        attempts: list[AttemptRow],
        updates: list[DeliveryUpdate],
        results: list[DeliveryResult],
        *,
        last: bool,
    ) -> None:
        """Write these outcomes (the last write also the subscriptions' health) and, in the same
        transaction, release what they let go of an ordered subject; then hand that over.

        If the database does not answer, the outcomes are held here and written as soon as it
        does (retried every second at most, for up to :data:`HOLD_OUTCOMES_SECONDS`): dropping
        them would let the lease run out and the scheduler send again what the receiver already
        acknowledged. The record is fenced by our lease, and the scheduler reclaims no lease
        until :data:`usp_workers.runtime.relay.RECLAIM_HOLD_OFF_SECONDS` after the database is back,
        which gives this retry the time to land first.
        """
        recorded_at = self.now()
        health_tallies = self.health_writes(recorded_at) if last else []
        if not (updates or health_tallies):
            return
        released: list[str] = []

        def hand_over(connection: Connection, applied: set[str]) -> None:
            finished = self._settled_ordered(updates, applied)
            released[:] = successors(connection, finished, now=recorded_at, handed=self.enqueue is not None)

        held_since = time.monotonic()
        pause = 0.1
        while True:
            try:
                applied = record(
                    self.engine,
                    attempts=attempts,
                    updates=updates,
                    lease_until=self.lease_until,
                    now=recorded_at,
                    health_tallies=health_tallies,
                    policy=self.policy,
                    then=hand_over if self.ordered else None,
                )
                break
            except Exception as exc:
                if not database_unavailable(exc) or time.monotonic() - held_since > HOLD_OUTCOMES_SECONDS:
                    raise
                DATABASE_OUTAGE.failed(exc)
                time.sleep(pause)
                pause = min(2 * pause, 1.0)
        DATABASE_OUTAGE.succeeded()
        results = [_applied(result, result.delivery_id in applied) for result in results]
        self.report.results.extend(results)
        stale = sum(not result.applied for result in results)
        if stale:
            logger.warning("%d deliveries were taken over after their lease expired", stale)
        if released:
            self._hand_over(released)

    def _settled_ordered(self, updates: list[DeliveryUpdate], applied: set[str]) -> list[str]:
        """The ordered deliveries these updates settled: each lets its subject's next one go."""
        settled = (DeliveryStatus.SUCCEEDED, DeliveryStatus.DEAD)
        return [
            u.delivery_id
            for u in updates
            if u.status in settled and u.delivery_id in self.ordered and u.delivery_id in applied
        ]

    def _hand_over(self, released: list[str]) -> None:
        """Publish the subjects' next deliveries, released (and marked handed) with the outcomes
        that freed them (best effort: the scheduler re-sends what this misses once
        ``requeue_after_seconds`` have passed)."""
        if self.enqueue is not None:
            try:
                self.enqueue(released)
            except Exception:
                logger.exception("could not hand over the next deliveries of %d subjects", len(released))
        self.report.released.extend(released)

    def health_writes(self, now: datetime) -> list[Tally]:
        """The tallies that must touch their subscription's row (see :mod:`usp_workers.engine.health`)."""
        policy = self.policy
        writes = []
        for tally in self.tallies.values():
            seen = self.subscriptions.get(tally.subscription_id)
            tally.breaker_seen_open = seen is None or seen.breaker_state != BreakerState.CLOSED
            if health.needs_write(tally, seen, policy, now):
                writes.append(tally)
        return writes

    async def run(self, claimed: Iterable[Claimed], resolver: Resolver | None) -> None:
        sendable: list[_Item] = []
        for delivery in claimed:
            event = self.events.get(delivery.event_id)
            subscription = self.subscriptions.get(delivery.subscription_id)
            if event is None or subscription is None:
                self._give_up(delivery, "event or subscription missing")
            elif subscription.state != SubscriptionState.ACTIVE:
                self._give_up(delivery, "subscription disabled")
            else:
                sendable.append((delivery, event, subscription))
        sendable = await self._gate(sendable)
        targets = await _check_targets({sub.url for _, _, sub in sendable}, self.settings, resolver)
        groups: dict[int, list[tuple[Claimed, LoadedEvent, LoadedSubscription]]] = {}
        slots: dict[int, anyio.Semaphore] = {}
        async with anyio.create_task_group() as group:
            for item in sendable:
                target = targets[item[2].url]
                if isinstance(target, Exception):
                    self._conclude(item[0], item[1], item[2], refused_result(target, self.now()))
                    continue
                slot = endpoint_slot(target, self.settings.per_endpoint_concurrency)
                slots[id(slot)] = slot
                groups.setdefault(id(slot), []).append(item)
            for key, items in groups.items():
                group.start_soon(self._run_endpoint, slots[key], items, targets)

    async def _gate(self, items: list[_Item]) -> list[_Item]:
        """Pause the deliveries whose subscription's breaker is open or half-open with a probe
        elsewhere, or that is under back-pressure; claim the probe where a cool-down has ended
        (one delivery probes, the rest wait for its verdict). No query unless a probe is due."""
        now = self.now()
        gates = {sub.id: health.gate(sub, now) for sub in {item[2].id: item[2] for item in items}.values()}
        if all(g is Gate.SEND for g in gates.values()):
            return items
        probes = sorted(sub_id for sub_id, g in gates.items() if g is Gate.PROBE)
        won: set[str] = set()
        if probes:
            won = await anyio.to_thread.run_sync(partial(self._claim_probes, probes, now))
        passed: list[_Item] = []
        probing: set[str] = set()
        for item in items:
            delivery, _, subscription = item
            decision = gates[subscription.id]
            if decision is Gate.SEND:
                passed.append(item)
            elif decision is Gate.PAUSED:
                reason = {
                    BreakerState.OPEN: "breaker_open",
                    BreakerState.HALF_OPEN: "probe_elsewhere",
                }.get(BreakerState(subscription.breaker_state), "backpressure")
                self._defer(delivery, until=subscription.breaker_until or now, reason=reason)
            elif subscription.id in won and subscription.id not in probing:
                probing.add(subscription.id)
                self._tally(subscription.id).probe = True
                passed.append(item)
            else:  # the probe is someone else's, or another delivery of this batch's
                self._defer(delivery, until=self._probe_deadline(now), reason="probe_elsewhere")
        return passed

    def _probe_deadline(self, now: datetime) -> datetime:
        """When a half-open probe claimed at ``now`` counts as lost (another worker may probe):
        it has :data:`SLOT_WAIT` to start, ``total_timeout`` to end, :data:`RECORD_MARGIN` to be
        recorded; never past our lease. The subscription's other deliveries wait until then."""
        seconds = SLOT_WAIT + self.settings.total_timeout + RECORD_MARGIN
        return min(self.lease_until, now + timedelta(seconds=seconds))

    def _claim_probes(self, subscription_ids: Sequence[str], now: datetime) -> set[str]:
        won: set[str] = set()
        with self.engine.begin() as connection:
            for subscription_id in subscription_ids:
                if health.claim_probe(
                    connection, subscription_id, now=now, probe_until=self._probe_deadline(now)
                ):
                    won.add(subscription_id)
        return won

    async def _rate_limited(self, delivery: Claimed, subscription: LoadedSubscription) -> bool:
        """Reserve a start in a rate-limited subscription's bucket right before its request and
        wait for it when it is at most :data:`RATE_WAIT` away (and the try still fits the
        lease); False when the delivery may go now (no limit, or its start came). Further away,
        the delivery is deferred to the bucket's next start, and later ones of the batch an
        interval further each, so a backlog comes back spread at the rate, not all at once."""
        limit = subscription.rate_limit
        if not limit:
            return False
        blocked = self.rate_blocked.get(subscription.id)
        if blocked is None:
            wait = max(0.0, min(RATE_WAIT, self._lease_budget()))
            reservation = await anyio.to_thread.run_sync(
                partial(ratelimit.reserve, self.engine, subscription.id, limit, clock=self.now, max_wait=wait)
            )
            if reservation.granted:
                await anyio.sleep(max(0.0, (reservation.at - self.now()).total_seconds()))
                return False
            blocked = (reservation.at, 0)
        next_start, waiting = blocked
        self.rate_blocked[subscription.id] = (next_start, waiting + 1)
        self._defer(delivery, until=next_start + timedelta(seconds=waiting / limit), reason="rate_limited")
        return True

    def _tally(self, subscription_id: str) -> Tally:
        tally = self.tallies.get(subscription_id)
        if tally is None:
            tally = self.tallies[subscription_id] = Tally(subscription_id)
        return tally

    async def _run_endpoint(
        self,
        slot: anyio.Semaphore,
        items: list[_Item],
        targets: dict[str, ResolvedTarget | Exception],
    ) -> None:
        """Send this batch's deliveries to one endpoint with the endpoint slots free *now*.

        A batch never waits (beyond :data:`SLOT_WAIT`) for slots other batches hold: if the
        endpoint is saturated its deliveries are deferred and the worker thread is released at
        once, so a hung endpoint holds at most ``per_endpoint_concurrency`` tries per process
        and every other subscription keeps flowing. The slots it does get are reused for the
        rest of its deliveries, one after another, while a try still fits in the lease.
        """
        taken = 0
        while taken < len(items):
            try:
                slot.acquire_nowait()
            except anyio.WouldBlock:
                break
            taken += 1
        if taken == 0 and self._lease_budget() > 0:
            with anyio.move_on_after(min(SLOT_WAIT, self._lease_budget())):
                await slot.acquire()
                taken = 1
        if taken == 0:
            for delivery, _, _ in items:
                self._defer(delivery)
            return
        queue = list(reversed(items))

        async def sender() -> None:
            first = True  # a slot free on arrival is used at once, as a fresh batch would
            while queue:
                delivery, event, subscription = queue.pop()
                if not first and self._lease_budget() <= 0:
                    self._defer(delivery)
                    continue
                if await self._rate_limited(delivery, subscription):
                    continue
                first = False
                target = targets[subscription.url]
                assert isinstance(target, ResolvedTarget)
                result = await self._send(delivery, event, subscription, target)
                self._conclude(delivery, event, subscription, result)

        try:
            async with anyio.create_task_group() as group:
                for _ in range(taken):
                    group.start_soon(sender)
        finally:
            for _ in range(taken):
                slot.release()

    def _lease_budget(self) -> float:
        """Seconds left to *start* a try that still ends (``total_timeout``) and is recorded
        (:data:`RECORD_MARGIN`) within our lease; past that, another worker may take it over."""
        remaining = (self.lease_until - self.now()).total_seconds()
        return remaining - self.settings.total_timeout - RECORD_MARGIN

    async def _send(
        self, delivery: Claimed, event: LoadedEvent, subscription: LoadedSubscription, target: ResolvedTarget
    ) -> TryResult:
        try:
            standard = None
            custom = None
            auth = None
            try:
                if subscription.endpoint_auth is not None:
                    auth = endpoint_auth.load(
                        subscription.endpoint_auth, self.settings.secrets_key, subscription.id
                    )
                if subscription.webhook_secrets is not None:
                    sealed = unseal(subscription.webhook_secrets, self.settings.secrets_key, subscription.id)
                    standard = sealed.signing(self.now())
                if subscription.custom_headers is not None:
                    custom = custom_headers.load(
                        subscription.custom_headers, self.settings.secrets_key, subscription.id
                    )
            except SecretsUnavailable as exc:  # the worker's configuration, not a bug: no traceback
                logger.warning("delivery %s not sent: %s", delivery.id, exc)
                return TryResult(self.now(), 0.0, error_class="secrets_unavailable", error=str(exc))
            if brokers.is_broker_url(subscription.url):
                message = encode_body(event, Transport.REST)
                signed = sign_message_headers(
                    subscription.url, message, self.keys, created=int(self.now().timestamp())
                )
                extra = custom.as_dict() if custom is not None else {}
                return await brokers.publish(
                    target,
                    message,
                    extra | signed,
                    event.id,
                    timeout=self.settings.total_timeout,
                    now=self.now,
                )
            body, headers = build_delivery_request(
                event,
                subscription,
                self.keys,
                created=int(self.now().timestamp()),
                delivery_id=delivery.id,
                bodies=self.bodies,
                standard=standard,
                custom=custom,
            )
        except Exception as exc:
            logger.exception("could not build delivery %s", delivery.id)
            return refused_result(exc, self.now())
        if not tracing.enabled():
            return await self._send_authorized(target, body, headers, auth)
        attributes = {
            "http.request.method": "POST",
            "url.full": subscription.url,
            "server.address": target.host,
            "usp.event_id": event.id,
            "usp.delivery_id": delivery.id,
            "usp.attempt": delivery.attempt_count + 1,
        }
        with tracing.span(
            "usp.attempt", parent=event.traceparent, kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            # After signing: traceparent is not a covered component. Unsampled, the event's own.
            if span is not None:
                tracing.inject(headers)
            elif event.traceparent is not None:
                headers["traceparent"] = event.traceparent
            result = await self._send_authorized(target, body, headers, auth)
            if span is not None:
                if result.status_code is not None:
                    span.set_attribute("http.response.status_code", result.status_code)
                if result.error_class is not None or (result.status_code or 0) >= 400:
                    span.set_attribute("error.type", result.error_class or str(result.status_code))
                    span.set_status(StatusCode.ERROR)
            return result

    async def _send_authorized(
        self, target: ResolvedTarget, body: bytes, headers: dict[str, str], auth: EndpointAuth | None
    ) -> TryResult:
        """One try, proven to the endpoint's gateway as the subscription says: with an OAuth token
        (fetched again, and the request sent once more, when the endpoint answers 401: the cached
        token may have been revoked), or over the subscription's client certificate."""
        if isinstance(auth, endpoint_auth.MutualTLS):
            client = endpoint_auth.mtls_client(auth, self.settings)
            return await send_once(client, target, body, headers, self.settings, now=self.now)
        if auth is None:
            return await send_once(self.client, target, body, headers, self.settings, now=self.now)
        for fresh in (False, True):
            if fresh:
                endpoint_auth.TOKENS.forget(auth)
            try:
                token = await endpoint_auth.TOKENS.token(auth, self.client, self.settings)
            except endpoint_auth.TokenFailed as exc:
                return TryResult(self.now(), 0.0, error_class="oauth_token_failed", error=str(exc))
            result = await send_once(
                self.client,
                target,
                body,
                headers | {"Authorization": f"Bearer {token}"},
                self.settings,
                now=self.now,
            )
            if result.status_code != 401:
                break
        return result

    def _conclude(
        self, delivery: Claimed, event: LoadedEvent, subscription: LoadedSubscription, result: TryResult
    ) -> None:
        number = delivery.attempt_count + 1
        finished = self.now()
        schedule, remaining = self.schedule, None
        if subscription.retry_schedule is not None:
            schedule, max_age = subscription_schedule(subscription.retry_schedule, self.settings.retry_jitter)
            if max_age is not None and delivery.created_at is not None:
                remaining = max_age - (finished - delivery.created_at).total_seconds()
        verdict = judge(result, number, schedule, remaining=remaining)
        next_at = None if verdict.delay is None else finished + timedelta(seconds=verdict.delay)
        tally = self._tally(subscription.id)
        if verdict.outcome is AttemptOutcome.SUCCEEDED:
            tally.success()
        else:
            tally.failure()
        pause = backpressure(result)
        if pause is not None:
            tally.back_off(finished + timedelta(seconds=pause))
        _log_try(delivery, event, number, verdict, result)
        self._queue_outcome(
            DeliveryUpdate(
                delivery_id=delivery.id,
                status=verdict.status,
                tried=True,
                next_attempt_at=next_at,
                last_status_code=result.status_code,
                last_error=verdict.last_error,
                disable_subscription=_disable(verdict, subscription),
            ),
            DeliveryResult(
                delivery_id=delivery.id,
                outcome=verdict.outcome,
                status=verdict.status,
                attempt_number=number,
                status_code=result.status_code,
                error_class=verdict.error_class,
                next_attempt_at=next_at,
                duration_ms=result.duration_ms,
            ),
            AttemptRow(
                delivery_id=delivery.id,
                attempt_number=number,
                started_at=result.started_at,
                duration_ms=round(result.duration_ms, 3),
                status_code=result.status_code,
                response_excerpt=result.response_excerpt,
                error_class=verdict.error_class,
                outcome=verdict.outcome.value,
                key_ids=None if result.error_class in _NOT_SENT else self.key_ids,
            ),
        )

    def _defer(
        self, delivery: Claimed, *, until: datetime | None = None, reason: str = "endpoint_busy"
    ) -> None:
        """Not tried: the endpoint stayed busy past our time budget (due now), or the
        subscription's health paused it (due ``until``). Back to pending (the relay re-sends it
        when due); no Attempt, ``attempt_count`` unchanged."""
        due = until if until is not None else self.now()
        self._queue_outcome(
            DeliveryUpdate(
                delivery_id=delivery.id,
                status=DeliveryStatus.PENDING,
                tried=False,
                deferred=True,
                next_attempt_at=due,
            ),
            DeliveryResult(
                delivery_id=delivery.id,
                outcome=AttemptOutcome.RETRY,
                status=DeliveryStatus.PENDING,
                attempt_number=None,
                error_class=reason,
                next_attempt_at=due,
            ),
        )

    def _give_up(self, delivery: Claimed, reason: str) -> None:
        """Dead without a try: no Attempt row, ``attempt_count`` unchanged."""
        self._queue_outcome(
            DeliveryUpdate(
                delivery_id=delivery.id,
                status=DeliveryStatus.DEAD,
                tried=False,
                last_error=reason,
            ),
            DeliveryResult(
                delivery_id=delivery.id,
                outcome=AttemptOutcome.DEAD,
                status=DeliveryStatus.DEAD,
                attempt_number=None,
                error_class=reason.replace(" ", "_"),
            ),
        )

    def _queue_outcome(
        self, update: DeliveryUpdate, result: DeliveryResult, attempt: AttemptRow | None = None
    ) -> None:
        """Queue one delivery's outcome for :meth:`record_as_they_end`, waking it only for the
        first outcome of its next record (a wake-up per outcome, in thread switches, took worker
        CPU per delivery from 612 to 802 µs in bench/pipeline.py)."""
        with self.concluded:
            if attempt is not None:
                self.attempts.append(attempt)
            self.updates.append(update)
            self.results.append(result)
            if len(self.updates) == 1:
                self.concluded.notify_all()


async def _check_targets(
    urls: Iterable[str], settings: WorkerSettings, resolver: Resolver | None
) -> dict[str, ResolvedTarget | Exception]:
    """Each distinct URL checked once, concurrently: a batch often holds many deliveries to one
    endpoint, and one DNS answer serves them all."""
    checked: dict[str, ResolvedTarget | Exception] = {}

    async def check(url: str) -> None:
        try:
            if brokers.is_broker_url(url):
                checked[url] = await brokers.check_broker(url, settings, resolver=resolver)
            else:
                checked[url] = await check_target(url, settings, resolver=resolver)
        except Exception as exc:  # TargetRefused, or a resolver's bug: the try fails, not the batch
            checked[url] = exc

    async with anyio.create_task_group() as group:
        for url in urls:
            group.start_soon(check, url)
    return checked


def backpressure(result: TryResult) -> float | None:
    """Seconds a try asks the subscription's *other* deliveries to hold off: a 429 (its
    ``Retry-After``, else a second) or a 503 with ``Retry-After``, capped at
    :data:`usp_workers.engine.health.BACKPRESSURE_MAX`.

    >>> from datetime import UTC, datetime
    >>> backpressure(TryResult(datetime(2026, 1, 1, tzinfo=UTC), 1.0, status_code=429, retry_after=3600))
    60.0
    """
    if result.status_code == 429:
        return min(result.retry_after if result.retry_after is not None else 1.0, health.BACKPRESSURE_MAX)
    if result.status_code == 503 and result.retry_after is not None:
        return min(result.retry_after, health.BACKPRESSURE_MAX)
    return None


def _log_try(delivery: Claimed, event: LoadedEvent, number: int, verdict: Verdict, result: TryResult) -> None:
    """One line per try, with the ids an operator searches by (never a header or a body):
    successes at DEBUG (thousands a second), retries at INFO, dead letters at WARNING."""
    if verdict.outcome is AttemptOutcome.SUCCEEDED:
        level = logging.DEBUG
    elif verdict.outcome is AttemptOutcome.RETRY:
        level = logging.INFO
    else:
        level = logging.WARNING
    if not logger.isEnabledFor(level):
        return
    logger.log(
        level,
        "delivery %s try %d: %s (%s)",
        delivery.id,
        number,
        verdict.outcome.value,
        verdict.last_error or result.status_code,
        extra={
            "event_id": event.id,
            "delivery_id": delivery.id,
            "subscription_id": delivery.subscription_id,
            "correlation_id": event.correlation_id,
            "attempt_number": number,
            "outcome": verdict.outcome.value,
            "status_code": result.status_code,
        },
    )


def _disable(verdict: Verdict, subscription: LoadedSubscription) -> tuple[str, str] | None:
    if not verdict.disables_subscription:
        return None
    return subscription.id, f"410 Gone from {_redacted(subscription.url)}"


def _redacted(url: str) -> str:
    """The URL without query, fragment or credentials: those may hold secrets."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        return "the subscription URL"
    return str(parsed.copy_with(query=None, fragment=None, username=None, password=None))


def _applied(result: DeliveryResult, applied: bool) -> DeliveryResult:
    return result if applied else replace(result, applied=False)


#: Tries that never reached the wire: their attempts name no signing key.
_NOT_SENT: Final = frozenset(
    {"ssrf_refused", "dns_error", "internal_error", "secrets_unavailable", "oauth_token_failed"}
)


def _trace_claim(
    began: int, ids: Sequence[str], claimed: Sequence[Claimed], events: Mapping[str, LoadedEvent]
) -> None:
    """One span for the claim, in the trace of the first event claimed, linked to the others."""
    if not tracing.enabled():
        return
    parents = [e.traceparent for e in events.values() if e.traceparent is not None]
    attributes = {"usp.asked": len(ids), "usp.claimed": len(claimed)}
    span = tracing.start_span("usp.claim", parents=parents, start_time=began, attributes=attributes)
    if span is not None:
        span.end()
