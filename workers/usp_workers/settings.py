"""What a worker and the scheduler read beside :class:`usp_core.settings.CommonSettings`."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic_settings import NoDecode

from usp_core.settings import COMMAS, CommonSettings

__all__ = ["DEFAULT_RETRY_SCHEDULE", "SchedulerSettings", "WorkerSettings"]

#: Seconds to wait after each failed try (SPEC-NOTES): 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h.
DEFAULT_RETRY_SCHEDULE: tuple[float, ...] = (5, 300, 1800, 7200, 18000, 36000, 36000)


class WorkerSettings(CommonSettings):
    """A worker's: how deliveries are retried and when a failing subscription is paused."""

    retry_schedule: Annotated[tuple[float, ...], NoDecode, COMMAS] = Field(
        default=DEFAULT_RETRY_SCHEDULE,
        description="seconds to wait after each failed try, comma-separated; then the delivery is dead",
    )
    retry_jitter: float = Field(default=0.2, ge=0, lt=1, description="± fraction applied to each wait")
    health_write_interval_seconds: float = Field(
        default=5.0,
        ge=0,
        description="a healthy subscription's `last_success_at` is written at most this often (its row is not"
        " updated on every delivery)",
    )
    auto_disable_after_seconds: float = Field(
        default=432000.0,
        gt=0,
        description="a subscription whose deliveries failed continuously this long (5 days, counted from the "
        "first failure after its last success) is disabled",
    )
    breaker_threshold: int = Field(
        default=10,
        ge=0,
        description="consecutive failed tries that open a subscription's circuit breaker (0: no breaker)",
    )
    breaker_cooldown_seconds: float = Field(
        default=30.0,
        gt=0,
        description="an open breaker pauses deliveries this long before one probe; doubled after each "
        "failed probe",
    )
    breaker_max_cooldown_seconds: float = Field(
        default=3600.0, gt=0, description="the longest pause an open breaker grows to"
    )


class SchedulerSettings(WorkerSettings):
    """The scheduler's: how often it looks for due, lost and stale work, and what it prunes. It
    reads the workers' settings too: it disables subscriptions by their health policy."""

    relay_interval_seconds: float = Field(
        default=1.0, gt=0, description="how often the scheduler looks for due work"
    )
    requeue_after_seconds: float = Field(
        default=30.0,
        gt=0,
        description="a due delivery handed to the broker but not picked up is re-sent after this",
    )
    job_stale_after_seconds: float = Field(
        default=120.0,
        gt=0,
        description="a running recover/redrive job that made no progress for this long (its worker died) "
        "is sent to the workers again by the scheduler",
    )
    retention_days: float = Field(
        default=30.0,
        ge=0,
        description="events (with their deliveries) and attempts older than this are pruned by the "
        "scheduler; 0 keeps everything",
    )
