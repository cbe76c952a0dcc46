"""What a try means for its delivery: done, retry later, dead, or the subscription is gone.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_workers.engine.verdict``.
"""

from __future__ import annotations

from dataclasses import dataclass

from usp_workers.engine.schedule import RetrySchedule
from usp_workers.engine.transport import TryResult
from usp_workers.storage.models import AttemptOutcome, DeliveryStatus

__all__ = ["Verdict", "judge"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The delivery's next state after a try."""

    outcome: AttemptOutcome
    status: DeliveryStatus
    error_class: str | None
    last_error: str | None
    delay: float | None = None  #: seconds until the next try (``RETRY`` only)

    @property
    def disables_subscription(self) -> bool:
        return self.outcome is AttemptOutcome.DISABLED


def judge(
    result: TryResult, attempt_number: int, schedule: RetrySchedule, *, remaining: float | None = None
) -> Verdict:
    """The verdict on try ``attempt_number`` (1 = the first) of a delivery; ``remaining``: the
    seconds left of the subscription's maximum age, which a next try must not pass.

    >>> from datetime import UTC, datetime
    >>> schedule = RetrySchedule((5,), jitter=0)
    >>> at = datetime(2026, 1, 1, tzinfo=UTC)
    >>> judge(TryResult(at, 3.0, status_code=500), 1, schedule).delay
    5.0
    >>> judge(TryResult(at, 3.0, status_code=500), 2, schedule).status
    <DeliveryStatus.DEAD: 'dead'>
    """
    code = result.status_code
    if code is not None and 200 <= code < 300:
        return Verdict(AttemptOutcome.SUCCEEDED, DeliveryStatus.SUCCEEDED, None, None)
    if code == 410:
        return Verdict(
            AttemptOutcome.DISABLED, DeliveryStatus.DEAD, "gone", "HTTP 410 Gone: subscription disabled"
        )
    if code is None:
        error_class = result.error_class or "internal_error"
        last_error = result.error or error_class
    elif 300 <= code < 400:
        error_class, last_error = "redirect", f"HTTP {code}: redirects are not followed"
    else:
        error_class, last_error = "http_status", f"HTTP {code}"
    delay = schedule.delay_after(attempt_number, result.retry_after)
    if delay is None:
        return Verdict(
            AttemptOutcome.DEAD,
            DeliveryStatus.DEAD,
            error_class,
            f"gave up after {attempt_number} tries; last: {last_error}",
        )
    if remaining is not None and delay > remaining:
        return Verdict(
            AttemptOutcome.DEAD,
            DeliveryStatus.DEAD,
            error_class,
            f"gave up after {attempt_number} tries: the next would pass the subscription's maximum age;"
            f" last: {last_error}",
        )
    return Verdict(AttemptOutcome.RETRY, DeliveryStatus.PENDING, error_class, last_error, delay)
