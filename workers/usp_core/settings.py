"""What every process reads (the API, a worker, the scheduler, the command line), from ``USP_*``
environment variables and a ``.env`` file; each process kind's settings add to these.

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

__all__ = ["COMMAS", "CommonSettings"]


def _split_commas(value: object) -> object:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


#: A list setting spelled as comma-separated words in the environment.
COMMAS = BeforeValidator(_split_commas)


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
    private_target_allowlist: Annotated[tuple[str, ...], NoDecode, COMMAS] = Field(
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


def _embedded_broker_path(database_url: str) -> Path:
    """The embedded broker's SQLite file: beside a SQLite database, else in the working folder."""
    if database_url.startswith("sqlite:///") and database_url != "sqlite:///:memory:":
        db_path = Path(database_url.removeprefix("sqlite:///"))
        return db_path.with_name(db_path.stem + "-broker.sqlite3")
    return Path("usp-webhooks-broker.sqlite3")
