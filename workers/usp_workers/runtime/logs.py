"""Structured logs: one JSON object per line, for the API, the worker and the scheduler.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_workers.runtime.logs``.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any

from usp_core.settings import CommonSettings

__all__ = [
    "CONTEXT_FIELDS",
    "JsonFormatter",
    "RedactingFilter",
    "configure_logging",
    "hook_celery_logging",
    "redact",
]

#: ``extra`` fields copied onto each JSON line when a record has them.
CONTEXT_FIELDS = (
    "event_id",
    "delivery_id",
    "subscription_id",
    "correlation_id",
    "attempt_number",
    "outcome",
    "status_code",
)

_MASK = "[redacted]"
_PATTERNS = (
    # RFC 9421 Signature dictionary members: label=:base64:
    (re.compile(r"([A-Za-z0-9_-]+=):[A-Za-z0-9+/=]{16,}:"), r"\1:" + _MASK + ":"),
    # Authorization: Bearer <token>
    (re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+"), r"\1" + _MASK),
    # JWK private members ("d", and RSA's "p", "q", "dp", "dq", "qi")
    (re.compile(r'("(?:d|p|q|dp|dq|qi)"\s*:\s*")[^"]+(")'), r"\1" + _MASK + r"\2"),
)
#: Loggers that servers configure with their own handlers (not the root's): re-formatted too.
_SERVER_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "celery", "celery.task")
#: Kept to warnings, as the worker's text set-up does (``usp_workers.runtime.celery_app``): httpx logs
#: each request's URL (which may carry a token), Celery two lines per task.
_QUIET = ("httpx", "httpcore", "celery.app.trace", "celery.worker.strategy")


def redact(text: str) -> str:
    """``text`` with anything shaped like a signature, bearer token or private key masked.

    >>> redact('Signature: sig1=:c2lnbmF0dXJlLWJ5dGVzLWhlcmU=:, Authorization: Bearer s3cr3t-t0ken')
    'Signature: sig1=:[redacted]:, Authorization: Bearer [redacted]'
    """
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


class JsonFormatter(logging.Formatter):
    """A record as one JSON line: ``ts``, ``level``, ``logger``, ``message``, the
    :data:`CONTEXT_FIELDS` it carries, and ``exception`` when there is one; redacted."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = redact(self.formatException(record.exc_info))
        elif record.exc_text:
            line["exception"] = redact(record.exc_text)
        return json.dumps(line, default=str, ensure_ascii=False)


class RedactingFilter(logging.Filter):
    """Masks secrets in text log lines (the message is rendered once, then redacted)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def configure_logging(settings: CommonSettings, *, level: int | str = logging.INFO) -> None:
    """Set up this process's logging for ``settings.log_format``.

    ``json``: the root logger gets one stderr handler with :class:`JsonFormatter` (replacing
    any), and the handlers servers install on their own loggers (uvicorn, Celery) get the
    formatter too, so every line of the process is JSON. ``text``: INFO lines on stderr when
    nobody configured logging yet, with secrets masked. Idempotent.
    """
    root = logging.getLogger()
    if settings.log_format == "json":
        formatter = JsonFormatter()
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(formatter)
        for old in list(root.handlers):
            root.removeHandler(old)
        root.addHandler(stream)
        root.setLevel(level)
        for name in _SERVER_LOGGERS:
            for server_handler in logging.getLogger(name).handlers:
                server_handler.setFormatter(formatter)
        for name in _QUIET:
            logging.getLogger(name).setLevel(logging.WARNING)
        return
    if not root.handlers:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        for handler in root.handlers:
            handler.addFilter(RedactingFilter())


def hook_celery_logging(settings: CommonSettings) -> None:
    """With JSON logs, keep Celery from replacing the root logger's handlers with its own text
    ones: a receiver on ``setup_logging`` makes Celery skip its set-up and configure ours."""
    if settings.log_format != "json":
        return
    from celery.signals import setup_logging

    def configure(loglevel: int | str | None = None, **_: Any) -> None:
        configure_logging(settings, level=loglevel or logging.INFO)

    setup_logging.connect(configure, weak=False)
