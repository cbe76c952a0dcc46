"""The delivery engine's front door: what the service (``usp_dispatcher``) may call. The outbox
(:func:`emit`), the tables a subscription lives in, a subscription's options and their checks,
the processes (worker, relay, Celery) and the task hand-off, metrics and tracing;
the operator verbs are :mod:`usp_workers.operations`. Names load on first use, so importing one
does not start Celery.

Why it works this way: docs/architecture.md, "Four packages, one direction".
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from usp_workers.engine import custom_headers, tracing
    from usp_workers.engine.brokers import check_broker, is_broker_url
    from usp_workers.engine.custom_headers import CustomHeaders, HeaderError, check_headers
    from usp_workers.engine.custom_headers import masked as masked_headers
    from usp_workers.engine.custom_headers import store as store_headers
    from usp_workers.engine.endpoint_auth import AuthError, EndpointAuth, OAuth2ClientCredentials, check_auth
    from usp_workers.engine.endpoint_auth import masked as masked_auth
    from usp_workers.engine.endpoint_auth import store as store_auth
    from usp_workers.engine.filters import FilterError, compile_filter
    from usp_workers.engine.outage import DATABASE_OUTAGE, Outage, database_unavailable
    from usp_workers.engine.outage import describe as describe_outage
    from usp_workers.engine.outbox import (
        EVENTS_CHANNEL,
        EVENTS_CHANNEL_SQL,
        emit,
        event_matches,
        reaches,
        unflushed_deliveries,
    )
    from usp_workers.engine.schedule import ScheduleError, check_schedule
    from usp_workers.engine.transport import FAILURES, make_client
    from usp_workers.engine.webhook_secrets import (
        RFC9421,
        SCHEMES,
        SecretsUnavailable,
        WebhookSecrets,
        seal,
        unseal,
    )
    from usp_workers.operations import activity
    from usp_workers.operations import probe as endpoint_probe
    from usp_workers.runtime import metrics, tasks
    from usp_workers.runtime.celery_app import make_celery, prepare_broker
    from usp_workers.runtime.heap import freeze_startup_heap
    from usp_workers.runtime.logs import configure_logging
    from usp_workers.runtime.readiness import readiness
    from usp_workers.runtime.relay import run_relay
    from usp_workers.runtime.tasks import handing_off
    from usp_workers.runtime.worker import run_worker
    from usp_workers.settings import SchedulerSettings, WorkerSettings
    from usp_workers.storage.migrate import upgrade
    from usp_workers.storage.models import (
        Delivery,
        DeliveryStatus,
        EventRecord,
        OnDead,
        Ordering,
        ProbeRun,
        Subscription,
        SubscriptionState,
        Transport,
    )

__all__ = [
    "DATABASE_OUTAGE",
    "EVENTS_CHANNEL",
    "EVENTS_CHANNEL_SQL",
    "FAILURES",
    "RFC9421",
    "SCHEMES",
    "AuthError",
    "CustomHeaders",
    "Delivery",
    "DeliveryStatus",
    "EndpointAuth",
    "EventRecord",
    "FilterError",
    "HeaderError",
    "OAuth2ClientCredentials",
    "OnDead",
    "Ordering",
    "Outage",
    "ProbeRun",
    "ScheduleError",
    "SchedulerSettings",
    "SecretsUnavailable",
    "Subscription",
    "SubscriptionState",
    "Transport",
    "WebhookSecrets",
    "WorkerSettings",
    "activity",
    "check_auth",
    "check_broker",
    "check_headers",
    "check_schedule",
    "compile_filter",
    "configure_logging",
    "custom_headers",
    "database_unavailable",
    "describe_outage",
    "emit",
    "endpoint_probe",
    "event_matches",
    "freeze_startup_heap",
    "handing_off",
    "is_broker_url",
    "make_celery",
    "make_client",
    "masked_auth",
    "masked_headers",
    "metrics",
    "prepare_broker",
    "reaches",
    "readiness",
    "run_relay",
    "run_worker",
    "seal",
    "store_auth",
    "store_headers",
    "tasks",
    "tracing",
    "unflushed_deliveries",
    "unseal",
    "upgrade",
]

#: Each exported name: the module it lives in, and its name there (``None``: the module itself).
_EXPORTS: dict[str, tuple[str, str | None]] = {
    # settings and schema
    "SchedulerSettings": ("usp_workers.settings", "SchedulerSettings"),
    "WorkerSettings": ("usp_workers.settings", "WorkerSettings"),
    "upgrade": ("usp_workers.storage.migrate", "upgrade"),
    # tables
    **{
        name: ("usp_workers.storage.models", name)
        for name in (
            "Delivery",
            "DeliveryStatus",
            "EventRecord",
            "OnDead",
            "Ordering",
            "ProbeRun",
            "Subscription",
            "SubscriptionState",
            "Transport",
        )
    },
    # the outbox
    **{
        name: ("usp_workers.engine.outbox", name)
        for name in (
            "EVENTS_CHANNEL",
            "EVENTS_CHANNEL_SQL",
            "emit",
            "event_matches",
            "reaches",
            "unflushed_deliveries",
        )
    },
    # a subscription's options and their checks
    "check_broker": ("usp_workers.engine.brokers", "check_broker"),
    "is_broker_url": ("usp_workers.engine.brokers", "is_broker_url"),
    "custom_headers": ("usp_workers.engine.custom_headers", None),
    **{
        name: ("usp_workers.engine.custom_headers", name)
        for name in ("CustomHeaders", "HeaderError", "check_headers")
    },
    "masked_headers": ("usp_workers.engine.custom_headers", "masked"),
    "store_headers": ("usp_workers.engine.custom_headers", "store"),
    **{
        name: ("usp_workers.engine.endpoint_auth", name)
        for name in ("AuthError", "EndpointAuth", "OAuth2ClientCredentials", "check_auth")
    },
    "masked_auth": ("usp_workers.engine.endpoint_auth", "masked"),
    "store_auth": ("usp_workers.engine.endpoint_auth", "store"),
    "FilterError": ("usp_workers.engine.filters", "FilterError"),
    "compile_filter": ("usp_workers.engine.filters", "compile_filter"),
    "ScheduleError": ("usp_workers.engine.schedule", "ScheduleError"),
    "check_schedule": ("usp_workers.engine.schedule", "check_schedule"),
    **{
        name: ("usp_workers.engine.webhook_secrets", name)
        for name in ("RFC9421", "SCHEMES", "SecretsUnavailable", "WebhookSecrets", "seal", "unseal")
    },
    # outbound requests, outages
    "FAILURES": ("usp_workers.engine.transport", "FAILURES"),
    "make_client": ("usp_workers.engine.transport", "make_client"),
    "DATABASE_OUTAGE": ("usp_workers.engine.outage", "DATABASE_OUTAGE"),
    "Outage": ("usp_workers.engine.outage", "Outage"),
    "database_unavailable": ("usp_workers.engine.outage", "database_unavailable"),
    "describe_outage": ("usp_workers.engine.outage", "describe"),
    # operator views the verbs do not cover
    "activity": ("usp_workers.operations.activity", None),
    "endpoint_probe": ("usp_workers.operations.probe", None),
    # processes, the task hand-off, metrics, tracing
    "make_celery": ("usp_workers.runtime.celery_app", "make_celery"),
    "prepare_broker": ("usp_workers.runtime.celery_app", "prepare_broker"),
    "freeze_startup_heap": ("usp_workers.runtime.heap", "freeze_startup_heap"),
    "configure_logging": ("usp_workers.runtime.logs", "configure_logging"),
    "readiness": ("usp_workers.runtime.readiness", "readiness"),
    "run_relay": ("usp_workers.runtime.relay", "run_relay"),
    "run_worker": ("usp_workers.runtime.worker", "run_worker"),
    "tasks": ("usp_workers.runtime.tasks", None),
    "handing_off": ("usp_workers.runtime.tasks", "handing_off"),
    "metrics": ("usp_workers.runtime.metrics", None),
    "tracing": ("usp_workers.engine.tracing", None),
}


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'usp_workers' has no attribute {name!r}") from None
    loaded = import_module(module)
    value = loaded if attribute is None else getattr(loaded, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
