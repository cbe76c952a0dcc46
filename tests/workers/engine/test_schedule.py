"""The retry schedule, its jitter and Retry-After clamp; and the verdict on each kind of try."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest

from usp_dispatcher.cli.config import Settings
from usp_workers.engine.schedule import (
    RetrySchedule,
    ScheduleError,
    check_schedule,
    parse_retry_after,
    subscription_schedule,
)
from usp_workers.engine.transport import TryResult
from usp_workers.engine.verdict import judge
from usp_workers.settings import DEFAULT_RETRY_SCHEDULE
from usp_workers.storage.models import AttemptOutcome, DeliveryStatus

NOW = datetime(2026, 8, 20, 12, 0, tzinfo=UTC)


def test_the_default_schedule_gives_eight_tries_then_dead() -> None:
    schedule = RetrySchedule.from_settings(Settings(_env_file=None, retry_jitter=0))
    waits = [schedule.delay_after(n) for n in range(1, 9)]
    assert waits == [*map(float, DEFAULT_RETRY_SCHEDULE), None]
    assert schedule.max_tries == 8


def test_jitter_spreads_waits_uniformly_within_the_fraction() -> None:
    schedule = RetrySchedule((100,), jitter=0.2, rng=random.Random(7))
    waits = [schedule.delay_after(1) for _ in range(2000)]
    assert all(w is not None and 80 <= w <= 120 for w in waits)
    values = [w for w in waits if w is not None]
    assert min(values) < 82
    assert max(values) > 118
    assert 98 < sum(values) / len(values) < 102  # centred


@pytest.mark.parametrize(
    ("retry_after", "expected"),
    [(15, 15.0), (10, 10.0), (20, 20.0), (3600, 20.0), (1, 10.0), (0, 10.0)],
)
def test_retry_after_is_clamped_between_one_and_two_scheduled_waits(
    retry_after: float, expected: float
) -> None:
    assert RetrySchedule((10,), jitter=0).delay_after(1, retry_after) == expected


def test_the_clamp_applies_to_the_jittered_wait() -> None:
    rng = random.Random(3)
    jittered = RetrySchedule((10,), jitter=0.2, rng=random.Random(3)).delay_after(1)
    assert jittered is not None
    assert RetrySchedule((10,), jitter=0.2, rng=rng).delay_after(1, 1000) == pytest.approx(2 * jittered)


def test_an_exhausted_schedule_ignores_retry_after() -> None:
    assert RetrySchedule((10,), jitter=0).delay_after(2, retry_after=5) is None


@pytest.mark.parametrize("bad", [{"delays": (-1,), "jitter": 0}, {"delays": (1,), "jitter": 1.0}])
def test_nonsense_schedules_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must"):
        RetrySchedule(**bad)  # type: ignore[arg-type]


def test_attempt_numbers_count_from_one() -> None:
    with pytest.raises(ValueError, match="from 1"):
        RetrySchedule((1,), jitter=0).delay_after(0)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("120", 120.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        ("Thu, 20 Aug 2026 12:01:30 GMT", 90.0),
        ("Thursday, 20-Aug-26 12:01:30 GMT", 90.0),  # obsolete RFC 850 form
        ("Thu, 20 Aug 2026 11:00:00 GMT", 0.0),  # in the past: now
        (None, None),
        ("", None),
        ("-5", None),
        ("1.5", None),
        ("soon", None),
    ],
)
def test_parse_retry_after_reads_seconds_and_http_dates(value: str | None, expected: float | None) -> None:
    assert parse_retry_after(value, NOW) == expected


# -- verdicts --------------------------------------------------------------------------------------

SCHEDULE = RetrySchedule((5, 50), jitter=0)


def _try(
    status: int | None = None, error_class: str | None = None, retry_after: float | None = None
) -> TryResult:
    return TryResult(
        NOW, 12.0, status_code=status, error_class=error_class, error="boom", retry_after=retry_after
    )


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_any_2xx_succeeds(status: int) -> None:
    verdict = judge(_try(status), 1, SCHEDULE)
    assert (verdict.outcome, verdict.status, verdict.error_class) == (
        AttemptOutcome.SUCCEEDED,
        DeliveryStatus.SUCCEEDED,
        None,
    )


def test_410_disables_even_on_the_last_try() -> None:
    verdict = judge(_try(410), 3, SCHEDULE)
    assert verdict.outcome is AttemptOutcome.DISABLED
    assert verdict.status is DeliveryStatus.DEAD
    assert verdict.disables_subscription


@pytest.mark.parametrize(
    ("result", "error_class"),
    [
        (_try(301), "redirect"),
        (_try(302), "redirect"),
        (_try(307), "redirect"),
        (_try(400), "http_status"),
        (_try(404), "http_status"),
        (_try(500), "http_status"),
        (_try(error_class="timeout"), "timeout"),
        (_try(error_class="connect_error"), "connect_error"),
        (_try(error_class="ssrf_refused"), "ssrf_refused"),
    ],
)
def test_everything_else_is_retried_then_dead(result: TryResult, error_class: str) -> None:
    first = judge(result, 1, SCHEDULE)
    assert (first.outcome, first.status, first.delay, first.error_class) == (
        AttemptOutcome.RETRY,
        DeliveryStatus.PENDING,
        5.0,
        error_class,
    )
    last = judge(result, 3, SCHEDULE)
    assert (last.outcome, last.status, last.delay) == (AttemptOutcome.DEAD, DeliveryStatus.DEAD, None)
    assert last.last_error is not None
    assert last.last_error.startswith("gave up after 3 tries")


def test_retry_after_of_a_429_reaches_the_schedule() -> None:
    assert judge(_try(429, retry_after=8), 1, SCHEDULE).delay == 8.0


def test_a_retry_that_would_pass_the_maximum_age_is_not_scheduled() -> None:
    result = TryResult(datetime.now(UTC), 12.0, status_code=500)
    schedule = RetrySchedule((600.0,), jitter=0.0)
    assert judge(result, 1, schedule, remaining=700).delay == 600
    dead = judge(result, 1, schedule, remaining=500)
    assert dead.status is DeliveryStatus.DEAD
    assert "the next would pass the subscription's maximum age" in (dead.last_error or "")


def test_a_subscription_s_own_schedule_is_checked_and_read_back() -> None:
    stored = check_schedule([10, 60.5], 3600)
    schedule, max_age = subscription_schedule(stored, 0.0)
    assert (schedule.delays, schedule.max_tries, max_age) == ((10.0, 60.5), 3, 3600.0)
    cases: list[tuple[list[Any], float | None, str]] = [
        ([], None, "delays"),
        ([1] * 26, None, "delays"),
        ([True], None, "delays[0]"),
        ([-1], None, "delays[0]"),
        ([8 * 86400], None, "delays[0]"),
        ([10], 59, "max_age_seconds"),
        ([10], 31 * 86400, "max_age_seconds"),
    ]
    for delays, age, where in cases:
        with pytest.raises(ScheduleError) as refused:
            check_schedule(delays, age)
        assert refused.value.where == where
