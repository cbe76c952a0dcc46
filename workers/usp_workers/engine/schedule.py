"""When to try a failed delivery again: the retry schedule, its jitter, and ``Retry-After``.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_workers.engine.schedule``.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from usp_workers.settings import WorkerSettings

__all__ = [
    "MAX_DELAY",
    "MAX_DELAYS",
    "MAX_MAX_AGE",
    "MIN_MAX_AGE",
    "RetrySchedule",
    "ScheduleError",
    "check_schedule",
    "parse_retry_after",
    "subscription_schedule",
]

#: A subscription's own schedule stays within these: at most 25 waits of at most 7 days each,
#: and a maximum age (from the delivery's creation) from one minute to the 30 days events are kept.
MAX_DELAYS = 25
MAX_DELAY = 7 * 86_400.0
MIN_MAX_AGE = 60.0
MAX_MAX_AGE = 30 * 86_400.0


class RetrySchedule:
    """The waits between tries, with ±``jitter`` (a fraction) applied uniformly.

    >>> schedule = RetrySchedule((5, 300), jitter=0.0)
    >>> schedule.delay_after(1), schedule.delay_after(2), schedule.delay_after(3)
    (5.0, 300.0, None)
    >>> schedule.delay_after(1, retry_after=60)  # clamped to 2x the scheduled wait
    10.0
    """

    def __init__(self, delays: Sequence[float], jitter: float, rng: random.Random | None = None) -> None:
        if any(delay < 0 for delay in delays):
            raise ValueError("retry delays must not be negative")
        if not 0 <= jitter < 1:
            raise ValueError("jitter must be a fraction in [0, 1)")
        self.delays: tuple[float, ...] = tuple(float(delay) for delay in delays)
        self.jitter = float(jitter)
        # Not cryptographic: jitter only spreads load.
        self._rng = rng if rng is not None else random.Random()  # noqa: S311

    @classmethod
    def from_settings(cls, settings: WorkerSettings, rng: random.Random | None = None) -> RetrySchedule:
        """The schedule ``settings`` configure (``retry_schedule``, ``retry_jitter``)."""
        return cls(settings.retry_schedule, settings.retry_jitter, rng)

    @property
    def max_tries(self) -> int:
        """How many tries a delivery gets in all: the first plus one per wait."""
        return len(self.delays) + 1

    def delay_after(self, attempt_number: int, retry_after: float | None = None) -> float | None:
        """Seconds until the next try after try ``attempt_number`` (1 = the first) failed, or
        ``None`` when the schedule is used up and the delivery goes dead.

        ``retry_after`` (what a 429/503 asked for) replaces the jittered wait, clamped to
        between 1x and 2x of it.
        """
        if attempt_number < 1:
            raise ValueError("attempt_number counts from 1")
        if attempt_number > len(self.delays):
            return None
        scheduled = self.delays[attempt_number - 1]
        if self.jitter:
            scheduled *= 1 + self._rng.uniform(-self.jitter, self.jitter)
        if retry_after is None:
            return scheduled
        return min(max(retry_after, scheduled), 2 * scheduled)


class ScheduleError(ValueError):
    """A subscription's schedule that cannot be saved; ``where`` names the part at fault."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}")
        self.where = where
        self.problem = problem


def check_schedule(delays: Sequence[float], max_age_seconds: float | None) -> str:
    """A subscription's own schedule checked, as stored (canonical JSON); :class:`ScheduleError`
    names what is out of bounds.

    >>> check_schedule([10, 60, 600], 3600)
    '{"delays":[10.0,60.0,600.0],"max_age_seconds":3600.0}'
    """
    if not 1 <= len(delays) <= MAX_DELAYS:
        raise ScheduleError("delays", f"give 1 to {MAX_DELAYS} waits, in seconds")
    for index, delay in enumerate(delays):
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 < delay <= MAX_DELAY:
            raise ScheduleError(
                f"delays[{index}]", f"must be more than 0 and at most {MAX_DELAY:.0f} seconds"
            )
    if max_age_seconds is not None and (
        isinstance(max_age_seconds, bool) or not MIN_MAX_AGE <= max_age_seconds <= MAX_MAX_AGE
    ):
        raise ScheduleError(
            "max_age_seconds", f"must be from {MIN_MAX_AGE:.0f} to {MAX_MAX_AGE:.0f} seconds (30 days)"
        )
    age = None if max_age_seconds is None else float(max_age_seconds)
    return json.dumps({"delays": [float(d) for d in delays], "max_age_seconds": age}, separators=(",", ":"))


@functools.lru_cache(maxsize=1024)
def subscription_schedule(stored: str, jitter: float) -> tuple[RetrySchedule, float | None]:
    """A stored schedule as the worker uses it: its waits (with the service's jitter) and its
    maximum age in seconds (``None``: only the waits bound it)."""
    document = json.loads(stored)
    return RetrySchedule(document["delays"], jitter), document.get("max_age_seconds")


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """A ``Retry-After`` header as seconds from ``now``: delta-seconds or an HTTP-date (RFC 9110
    §10.2.3). ``None`` when absent or unreadable; a date in the past gives 0.

    >>> parse_retry_after("120", datetime(2026, 1, 1, tzinfo=UTC))
    120.0
    >>> parse_retry_after("Thu, 01 Jan 2026 00:01:00 GMT", datetime(2026, 1, 1, tzinfo=UTC))
    60.0
    >>> parse_retry_after("soon", datetime(2026, 1, 1, tzinfo=UTC)) is None
    True
    """
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        moment = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:  # "-0000" dates parse naive; HTTP-dates are GMT
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (moment - now).total_seconds())
