"""Endpoint health per subscription: failure streaks, auto-disable, the circuit breaker, 429
back-pressure, and the notices operators read.

The columns live on the subscription row and are written per batch, on transitions only (why:
docs/architecture.md, "Endpoint health").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum

import sqlalchemy as sa
from sqlmodel import Session, SQLModel

from usp_core.clock import UtcDateTime, utcnow
from usp_workers.settings import WorkerSettings
from usp_workers.storage.models import BreakerState, Notice, Subscription, SubscriptionState, SubscriptionView

__all__ = [
    "BACKPRESSURE_MAX",
    "NOTICE_BREAKER_CLOSED",
    "NOTICE_BREAKER_OPENED",
    "NOTICE_BREAKER_REOPENED",
    "NOTICE_DISABLED",
    "NOTICE_ENABLED",
    "Gate",
    "HealthPolicy",
    "Tally",
    "apply",
    "claim_probe",
    "disable",
    "disable_failing",
    "gate",
    "human_duration",
    "needs_write",
    "record_notice",
    "reset_health",
    "set_rate_limit",
]

#: The longest a ``Retry-After`` pauses a subscription's other deliveries.
BACKPRESSURE_MAX = 60.0

NOTICE_DISABLED = "subscription.disabled"
NOTICE_ENABLED = "subscription.enabled"  #: by an operator (nothing enables a subscription by itself)
NOTICE_BREAKER_OPENED = "subscription.breaker_opened"
NOTICE_BREAKER_REOPENED = "subscription.breaker_reopened"  #: its half-open probe failed
NOTICE_BREAKER_CLOSED = "subscription.breaker_closed"
#: A delivery of the subscription went dead (``detail``: its id); announced as ``delivery.dead``.
NOTICE_DELIVERY_DEAD = "delivery.dead"

_DETAIL_MAX = 512
_REASON_MAX = 256

_subscriptions: sa.Table = SQLModel.metadata.tables[Subscription.__tablename__]
_notices: sa.Table = SQLModel.metadata.tables[Notice.__tablename__]


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """The health settings the delivery engine applies (see the module doc)."""

    write_interval: float = 5.0
    disable_after: float = 432000.0
    breaker_threshold: int = 10
    cooldown: float = 30.0
    max_cooldown: float = 3600.0

    @classmethod
    def from_settings(cls, settings: WorkerSettings) -> HealthPolicy:
        return cls(
            write_interval=settings.health_write_interval_seconds,
            disable_after=settings.auto_disable_after_seconds,
            breaker_threshold=settings.breaker_threshold,
            cooldown=settings.breaker_cooldown_seconds,
            max_cooldown=settings.breaker_max_cooldown_seconds,
        )

    def cooldown_after(self, opens: int) -> float:
        """The pause after the breaker opened for the ``opens``-th time in a row (1 = first).

        >>> policy = HealthPolicy(cooldown=30, max_cooldown=100)
        >>> policy.cooldown_after(1), policy.cooldown_after(2), policy.cooldown_after(3)
        (30.0, 60.0, 100.0)
        """
        return float(min(self.max_cooldown, self.cooldown * 2 ** min(max(opens - 1, 0), 32)))


@dataclass(slots=True)
class Tally:
    """What one batch's tries did to one subscription, in the order they ended."""

    subscription_id: str
    successes: int = 0
    failures: int = 0
    trailing_failures: int = 0  #: failures after the batch's last success
    probe: bool = False  #: this batch held the subscription's half-open probe
    back_off_until: datetime | None = None  #: a 429/503 asked for a pause until then
    #: the row read at claim time showed a breaker not closed: a success must close it
    breaker_seen_open: bool = False

    def success(self) -> None:
        self.successes += 1
        self.trailing_failures = 0

    def failure(self) -> None:
        self.failures += 1
        self.trailing_failures += 1

    def back_off(self, until: datetime) -> None:
        if self.back_off_until is None or until > self.back_off_until:
            self.back_off_until = until


class Gate(Enum):
    """What a claimed delivery's subscription allows right now (:func:`gate`)."""

    SEND = "send"  #: send it
    PAUSED = "paused"  #: breaker open or back-pressure: defer it to ``breaker_until``
    PROBE = "probe"  #: the breaker's cool-down is over: one delivery may probe (claim it first)


def gate(subscription: SubscriptionView, now: datetime) -> Gate:
    """Decide from the subscription row read at claim time (no query)."""
    until = subscription.breaker_until
    if subscription.breaker_state == BreakerState.CLOSED:
        return Gate.PAUSED if until is not None and until > now else Gate.SEND
    if until is not None and until > now:
        return Gate.PAUSED  # open and cooling down, or half-open with a probe in flight
    return Gate.PROBE


def claim_probe(
    connection: sa.Connection, subscription_id: str, *, now: datetime, probe_until: datetime
) -> bool:
    """Take the subscription's half-open probe if its cool-down (or a dead prober's deadline)
    has passed; True for exactly one caller. ``probe_until``: when the probe counts as lost."""
    statement = (
        sa.update(_subscriptions)
        .where(
            _subscriptions.c.id == subscription_id,
            _subscriptions.c.breaker_state.in_([BreakerState.OPEN.value, BreakerState.HALF_OPEN.value]),
            sa.or_(_subscriptions.c.breaker_until.is_(None), _subscriptions.c.breaker_until <= now),
        )
        .values(breaker_state=BreakerState.HALF_OPEN.value, breaker_until=probe_until)
        .returning(_subscriptions.c.id)
    )
    return connection.execute(statement).first() is not None


def needs_write(tally: Tally, seen: SubscriptionView | None, policy: HealthPolicy, now: datetime) -> bool:
    """Whether ``tally`` must touch the row: any failure, probe or back-off; a success only when
    the row read at claim time shows failures, a breaker not closed, or a stale
    ``last_success_at``."""
    if tally.failures or tally.probe or tally.back_off_until is not None:
        return True
    if not tally.successes:
        return False
    if seen is None:
        return True
    if seen.consecutive_failures or seen.failing_since is not None:
        return True
    if seen.breaker_state != BreakerState.CLOSED:
        return True
    last = seen.last_success_at
    return last is None or (now - last).total_seconds() >= policy.write_interval


def apply(
    connection: sa.Connection, tallies: Iterable[Tally], policy: HealthPolicy, *, now: datetime
) -> None:
    """Write each tally to its subscription row, in id order (so concurrent batches lock rows in
    one order and cannot deadlock), with the transitions it causes and their notices."""
    for tally in sorted(tallies, key=lambda t: t.subscription_id):
        if tally.successes:
            _record_success(connection, tally, policy, now)
        elif tally.failures:
            _record_failures(connection, tally, policy, now)
        if tally.back_off_until is not None:
            _back_off(connection, tally.subscription_id, tally.back_off_until)


def disable(connection: sa.Connection, subscription_id: str, reason: str, *, now: datetime) -> bool:
    """Disable an active subscription and record a ``subscription.disabled`` notice; False when
    it was not active (another worker, or an operator, got there first: no second notice)."""
    statement = (
        sa.update(_subscriptions)
        .where(
            _subscriptions.c.id == subscription_id,
            _subscriptions.c.state == SubscriptionState.ACTIVE.value,
        )
        .values(state=SubscriptionState.DISABLED.value, disabled_reason=reason[:_REASON_MAX], updated_at=now)
        .returning(_subscriptions.c.id)
    )
    if connection.execute(statement).first() is None:
        return False
    record_notice(connection, subscription_id, NOTICE_DISABLED, reason, now=now)
    return True


def record_notice(
    connection: sa.Connection, subscription_id: str, kind: str, detail: str, *, now: datetime
) -> None:
    """Insert a :class:`~usp_workers.storage.models.Notice` (never with secrets in ``detail``)."""
    connection.execute(
        sa.insert(_notices).values(
            subscription_id=subscription_id, kind=kind, detail=detail[:_DETAIL_MAX], created_at=now
        )
    )


def set_rate_limit(
    session: Session, subscription_id: str, rate_limit: int | None, *, now: datetime | None = None
) -> Subscription | None:
    """Set (or, with ``None``, lift) a subscription's limit of deliveries started per second,
    enforced across the fleet (:mod:`usp_workers.engine.ratelimit`); the caller commits. None when the
    subscription does not exist. Raises ``ValueError`` for a limit below 1."""
    if rate_limit is not None and rate_limit < 1:
        raise ValueError("rate_limit must be at least 1 delivery per second (or None for no limit)")
    subscription = session.get(Subscription, subscription_id)
    if subscription is None:
        return None
    subscription.rate_limit = rate_limit
    subscription.updated_at = now or utcnow()
    session.add(subscription)
    return subscription


def reset_health(
    session: Session, subscription_id: str, *, now: datetime | None = None
) -> Subscription | None:
    """Forget a subscription's failure streak and close its breaker (an operator re-enabling
    it: otherwise its old ``failing_since`` would disable it again at the next dead delivery);
    the caller commits. None when the subscription does not exist."""
    subscription = session.get(Subscription, subscription_id)
    if subscription is None:
        return None
    subscription.consecutive_failures = 0
    subscription.failing_since = None
    subscription.breaker_state = BreakerState.CLOSED
    subscription.breaker_until = None
    subscription.breaker_opens = 0
    subscription.updated_at = now or utcnow()
    session.add(subscription)
    return subscription


# --------------------------------------------------------------------------------------------


def _record_success(connection: sa.Connection, tally: Tally, policy: HealthPolicy, now: datetime) -> None:
    c = _subscriptions.c
    trailing = tally.trailing_failures
    values: dict[str, object] = {
        "consecutive_failures": trailing,
        "failing_since": now if trailing else None,
        "last_success_at": now,
    }
    if trailing:
        values["last_failure_at"] = now
    where = [c.id == tally.subscription_id]
    if not trailing:
        # A refresh only: skipped in SQL when another worker refreshed it a moment ago.
        where.append(
            sa.or_(
                c.consecutive_failures != 0,
                c.failing_since.is_not(None),
                c.last_success_at.is_(None),
                c.last_success_at <= now - timedelta(seconds=policy.write_interval),
            )
        )
    connection.execute(sa.update(_subscriptions).where(*where).values(values))
    if not (tally.probe or tally.breaker_seen_open):
        return
    closed = connection.execute(
        sa.update(_subscriptions)
        .where(
            c.id == tally.subscription_id,
            c.breaker_state != BreakerState.CLOSED.value,
            # A success from a batch that started before the breaker opened closes it too: the
            # endpoint answers.
        )
        .values(breaker_state=BreakerState.CLOSED.value, breaker_until=None, breaker_opens=0, updated_at=now)
        .returning(c.id)
    ).first()
    if closed is not None:
        record_notice(
            connection, tally.subscription_id, NOTICE_BREAKER_CLOSED, "a delivery succeeded", now=now
        )


def _record_failures(connection: sa.Connection, tally: Tally, policy: HealthPolicy, now: datetime) -> None:
    c = _subscriptions.c
    row = connection.execute(
        sa.update(_subscriptions)
        .where(c.id == tally.subscription_id)
        .values(
            consecutive_failures=c.consecutive_failures + tally.failures,
            failing_since=sa.func.coalesce(c.failing_since, sa.literal(now, UtcDateTime())),
            last_failure_at=now,
        )
        .returning(c.consecutive_failures, c.failing_since, c.breaker_state, c.breaker_opens, c.state)
    ).first()
    if row is None:
        return
    failing_since: datetime | None = _aware(row.failing_since)
    if tally.probe and row.breaker_state == BreakerState.HALF_OPEN.value:
        opens = row.breaker_opens + 1
        cooldown = policy.cooldown_after(opens)
        reopened = connection.execute(
            sa.update(_subscriptions)
            .where(c.id == tally.subscription_id, c.breaker_state == BreakerState.HALF_OPEN.value)
            .values(
                breaker_state=BreakerState.OPEN.value,
                breaker_until=now + timedelta(seconds=cooldown),
                breaker_opens=opens,
                updated_at=now,
            )
            .returning(c.id)
        ).first()
        if reopened is not None:
            record_notice(
                connection,
                tally.subscription_id,
                NOTICE_BREAKER_REOPENED,
                f"the probe failed; deliveries paused {human_duration(cooldown)}",
                now=now,
            )
    elif (
        policy.breaker_threshold
        and row.breaker_state == BreakerState.CLOSED.value
        and row.consecutive_failures >= policy.breaker_threshold
    ):
        cooldown = policy.cooldown_after(1)
        opened = connection.execute(
            sa.update(_subscriptions)
            .where(c.id == tally.subscription_id, c.breaker_state == BreakerState.CLOSED.value)
            .values(
                breaker_state=BreakerState.OPEN.value,
                breaker_until=now + timedelta(seconds=cooldown),
                breaker_opens=1,
                updated_at=now,
            )
            .returning(c.id)
        ).first()
        if opened is not None:
            record_notice(
                connection,
                tally.subscription_id,
                NOTICE_BREAKER_OPENED,
                f"{row.consecutive_failures} consecutive failed tries; deliveries paused"
                f" {human_duration(cooldown)}",
                now=now,
            )
    if (
        row.state == SubscriptionState.ACTIVE.value
        and failing_since is not None
        and (now - failing_since).total_seconds() >= policy.disable_after
    ):
        disable(connection, tally.subscription_id, _failing_reason(now - failing_since), now=now)


def disable_failing(connection: sa.Connection, policy: HealthPolicy, *, now: datetime) -> list[str]:
    """Disable the active subscriptions whose breaker has kept their deliveries paused past
    ``policy.disable_after`` of continuous failure (their next probe may be an hour away: the
    clock must not wait for it); one notice each. Returns their ids."""
    c = _subscriptions.c
    rows = connection.execute(
        sa.select(c.id, c.failing_since).where(
            c.state == SubscriptionState.ACTIVE.value,
            c.breaker_state != BreakerState.CLOSED.value,
            c.failing_since <= now - timedelta(seconds=policy.disable_after),
        )
    ).all()
    disabled = []
    for subscription_id, failing_since in rows:
        since = _aware(failing_since)
        assert since is not None
        if disable(connection, subscription_id, _failing_reason(now - since), now=now):
            disabled.append(subscription_id)
    return disabled


def human_duration(seconds: float) -> str:
    """A duration as an operator reads it, in its largest sensible unit.

    >>> human_duration(20.4), human_duration(150), human_duration(7200), human_duration(5 * 86400)
    ('20 s', '2.5 min', '2 h', '5 days')
    """
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f}".removesuffix(".0") + f" {unit}"
    return f"{seconds:.0f} s"


def _failing_reason(failing_for: timedelta) -> str:
    return f"deliveries failed continuously for {human_duration(failing_for.total_seconds())}"


def _back_off(connection: sa.Connection, subscription_id: str, until: datetime) -> None:
    c = _subscriptions.c
    connection.execute(
        sa.update(_subscriptions)
        .where(
            c.id == subscription_id,
            c.breaker_state == BreakerState.CLOSED.value,
            sa.or_(c.breaker_until.is_(None), c.breaker_until < until),
        )
        .values(breaker_until=until)
    )


def _aware(value: datetime | None) -> datetime | None:
    """RETURNING bypasses the column type on some drivers' paths: make sure it is aware UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)
