"""One typed settings object per process kind, read from ``USP_*`` environment variables (and a
``.env`` file): what every process reads, and what the API, a worker and the scheduler add.

With no settings at all the whole service runs on one machine: SQLite in the working folder and
an embedded broker that is itself a SQLite file, so the README's first command needs no Redis.
Production sets ``USP_DATABASE_URL`` to PostgreSQL and ``USP_BROKER_URL`` to Redis (or RabbitMQ).
"""

from __future__ import annotations

import ipaddress
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = [
    "DEFAULT_RETRY_SCHEDULE",
    "ApiSettings",
    "CommonSettings",
    "SchedulerSettings",
    "Settings",
    "WorkerSettings",
]

#: Seconds to wait after each failed try (SPEC-NOTES): 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h.
DEFAULT_RETRY_SCHEDULE: tuple[float, ...] = (5, 300, 1800, 7200, 18000, 36000, 36000)


def _split_commas(value: object) -> object:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


#: A list setting spelled as comma-separated words in the environment.
_COMMAS = BeforeValidator(_split_commas)


class CommonSettings(BaseSettings):
    """What every process reads: where the data, the broker and the signing keys are, which
    targets may be called, and how work is cut into tasks. Each field is ``USP_<NAME>``.

    >>> CommonSettings(database_url="sqlite:///demo.sqlite3").broker_url_resolved.startswith("sqla+sqlite")
    True
    """

    model_config = SettingsConfigDict(env_prefix="USP_", env_file=".env", extra="ignore")

    database_url: str = Field(
        default="sqlite:///usp-webhooks.sqlite3",
        description="SQLAlchemy URL of the database: SQLite (default, a file in the working folder) "
        "or PostgreSQL (postgresql+psycopg://user@host/db).",
    )
    broker_url: str | None = Field(
        default=None,
        description="Celery broker: redis://host:6379/0 or amqp://... Unset: the embedded broker, a "
        "SQLite file beside the database (kombu's SQLAlchemy transport).",
    )
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="`text`, or `json`: one JSON object per line with `event_id`, `delivery_id`, "
        "`subscription_id`, `correlation_id` (api, worker, scheduler)",
    )
    key_store_path: Path | None = Field(
        default=None,
        description="folder for signing keys; unset: keys live in the database's signing-key table",
    )
    secrets_key: SecretStr | None = Field(
        default=None,
        description="encrypts subscriptions' Standard Webhooks secrets at rest (AES-256-GCM under a key "
        "derived from it; e.g. `openssl rand -hex 32`); unset: subscriptions may not ask for Standard "
        "Webhooks signatures (`up` makes one in `usp-webhooks-secrets.key`)",
    )
    key_publish_lead_seconds: float = Field(
        default=300.0,
        ge=0,
        description="a rotated-in key is published this long before it signs (JWKS cache age)",
    )
    key_overlap_seconds: float = Field(
        default=86400.0,
        ge=0,
        description="after a new key starts signing, the old one also signs for this long",
    )
    connect_timeout: float = Field(default=5.0, gt=0, description="seconds to connect to a webhook target")
    total_timeout: float = Field(default=15.0, gt=0, description="seconds for a whole delivery attempt")
    allow_private_targets: bool = Field(
        default=False,
        description="let subscriptions target loopback and private addresses (development only); cloud"
        " metadata and link-local targets stay refused",
    )
    private_target_allowlist: Annotated[tuple[str, ...], NoDecode, _COMMAS] = Field(
        default=(),
        description="CIDRs that are allowed even though they are not global, comma-separated",
    )
    batch_size: int = Field(default=50, ge=1, le=1000, description="deliveries per worker task")
    handoff_interval_seconds: float = Field(
        default=0.03,
        ge=0,
        description="while messages wait in the broker that no worker has taken (the workers are behind), a "
        "commit's deliveries wait up to this long to go with the commits made meanwhile (fuller "
        "tasks cost less CPU; a full batch never waits); otherwise they go at once; a process "
        "that dies meanwhile loses nothing (the relay re-sends after "
        "`USP_REQUEUE_AFTER_SECONDS`); 0: every commit publishes on the committing thread. On the embedded "
        "broker commits are not coalesced (any value > 0 publishes at once, off the committing thread)",
    )
    lease_seconds: float = Field(
        default=60.0, gt=0, description="an in-flight delivery whose worker vanished is retried after this"
    )
    per_endpoint_concurrency: int = Field(
        default=8, ge=1, description="concurrent requests to one endpoint per worker"
    )

    @field_validator("private_target_allowlist")
    @classmethod
    def _valid_networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for network in value:
            ipaddress.ip_network(network, strict=False)
        return value

    @cached_property
    def broker_url_resolved(self) -> str:
        """The broker URL Celery gets: the configured one, or the embedded SQLite broker."""
        if self.broker_url:
            return self.broker_url
        return "sqla+sqlite:///" + str(_embedded_broker_path(self.database_url))

    @property
    def uses_embedded_broker(self) -> bool:
        return self.broker_url_resolved.startswith("sqla+")


class WorkerSettings(CommonSettings):
    """A worker's: how deliveries are retried and when a failing subscription is paused."""

    retry_schedule: Annotated[tuple[float, ...], NoDecode, _COMMAS] = Field(
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


class ApiSettings(CommonSettings):
    """The API's (REST, MCP, console): who may call it and how it presents itself."""

    admin_token: SecretStr | None = Field(
        default=None, description="bearer token for admin endpoints; unset: admin endpoints refuse everyone"
    )
    public_base_url: str = Field(
        default="http://127.0.0.1:8000", description="the URL this service is reached at (for discovery)"
    )
    seed_demo_catalog: bool = Field(
        default=True,
        description="on first start (an empty catalog), add the demo services so there is something to book",
    )
    metrics_public: bool = Field(
        default=False,
        description="serve `GET /metrics` without the admin token (only on a private network)",
    )
    metrics_window_seconds: float = Field(
        default=300.0,
        gt=0,
        description="the attempt latency histogram on `/metrics` covers the attempts of this many last "
        "seconds",
    )
    require_authentication: bool = Field(
        default=True,
        description="privileged MCP tools refuse callers that did not authenticate (false: anonymous "
        "platforms may book, bound to their `_meta.usp.profile` only)",
    )
    auth_mechanisms: Annotated[
        tuple[Literal["bearer", "http_message_signatures", "booking_scoped_credential"], ...],
        NoDecode,
        _COMMAS,
    ] = Field(
        default=("bearer", "http_message_signatures", "booking_scoped_credential"),
        description="authentication mechanisms offered to platforms, comma-separated (published in "
        "`/.well-known/usp`); the admin token is always accepted",
    )
    agent_signature_components: Annotated[tuple[str, ...], NoDecode, _COMMAS] = Field(
        default=("@authority",),
        description="what an agent's Web Bot Auth signature must cover, comma-separated, besides "
        "`signature-agent` (when sent) and `content-digest` (when sent): the draft's minimum; add "
        "`@method,@path` to ask more",
    )
    booking_credential_ttl_seconds: int = Field(
        default=2_592_000, gt=0, description="lifetime of an issued `booking_scoped_credential` (30 days)"
    )
    mcp_session_idle_seconds: float = Field(
        default=300.0,
        gt=0,
        description="an MCP session with no request in flight for this long is closed and its memory "
        "freed (an open notification stream counts as a request); its client opens a new one",
    )


class Settings(ApiSettings, SchedulerSettings):
    """Every setting: for ``usp-webhooks up``, which runs the API, a worker and the scheduler in
    one process tree, and for the command line.

    >>> Settings(retry_schedule="5,60", auth_mechanisms="bearer").retry_schedule
    (5.0, 60.0)
    """


def _embedded_broker_path(database_url: str) -> Path:
    """The embedded broker's SQLite file: beside a SQLite database, else in the working folder."""
    if database_url.startswith("sqlite:///") and database_url != "sqlite:///:memory:":
        db_path = Path(database_url.removeprefix("sqlite:///"))
        return db_path.with_name(db_path.stem + "-broker.sqlite3")
    return Path("usp-webhooks-broker.sqlite3")
