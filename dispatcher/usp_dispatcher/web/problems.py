"""RFC 9457 problem responses for every error this service answers, and the handlers that make them.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.web.problems``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from usp_dispatcher.errors import (
    Conflict,
    HTTPProblem,
    NonceStoreUnavailable,
    NotFound,
    Refusal,
    Refused,
    TooSoon,
)
from usp_receiver import problem_outcome
from usp_workers import Outage, database_unavailable, describe_outage

__all__ = [
    "PROBLEM_MEDIA_TYPE",
    "CatchAllProblems",
    "install_problem_handlers",
    "problem_response",
    "validation_summary",
]

logger = logging.getLogger("usp_dispatcher")

PROBLEM_MEDIA_TYPE = "application/problem+json"

_STATUS_OF: dict[type[Refusal], int] = {NotFound: 404, Conflict: 409, Refused: 422, TooSoon: 429}
_TITLE_OF: dict[type[Refusal], str] = {
    NotFound: "Not found",
    Conflict: "Conflict",
    Refused: "Request refused",
    TooSoon: "Too many requests",
}
# Starlette's own HTTP errors (unknown route, wrong method ...): a reason per status.
_HTTP_REASONS = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def problem_response(
    status: int,
    reason: str,
    title: str,
    detail: str,
    *,
    headers: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> JSONResponse:
    """A problem answer: ``type``, ``title``, ``status``, ``detail`` and ``reason`` always present.

    >>> problem_response(404, "subscription_not_found", "Not found", "no such subscription").status_code
    404
    """
    outcome = problem_outcome(status, reason, title, detail or title, dict(headers or {}))
    body = dict(extra or {}) | outcome.body
    return JSONResponse(body, status_code=status, headers=outcome.headers, media_type=PROBLEM_MEDIA_TYPE)


def validation_summary(errors: Sequence[Mapping[str, Any]], *, limit: int = 5) -> str:
    """``loc: msg`` for the first few errors, never the offending input (it may hold PII or secrets)."""
    parts = [f"{'.'.join(map(str, e.get('loc', ()))) or '<root>'}: {e.get('msg', 'invalid')}" for e in errors]
    more = f" (+{len(parts) - limit} more)" if len(parts) > limit else ""
    return "; ".join(parts[:limit]) + more


def install_problem_handlers(app: FastAPI) -> None:
    """Make every error ``app`` can answer an RFC 9457 problem."""
    app.add_exception_handler(HTTPProblem, _on_http_problem)  # type: ignore[arg-type]
    app.add_exception_handler(Refusal, _on_refusal)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _on_request_validation)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)  # type: ignore[arg-type]
    app.add_middleware(CatchAllProblems)


async def _on_http_problem(_request: Request, exc: HTTPProblem) -> JSONResponse:
    return problem_response(
        exc.status, exc.reason, exc.title, exc.detail, headers=exc.headers, extra=exc.extra
    )


async def _on_refusal(_request: Request, exc: Refusal) -> JSONResponse:
    kind = _kind_of(exc)
    headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, TooSoon) else None
    return problem_response(
        _STATUS_OF[kind], exc.reason, _TITLE_OF[kind], exc.detail, headers=headers, extra=exc.extra
    )


def status_of(exc: Refusal) -> int:
    """The HTTP status a service refusal answers with (what the problem handler sends), for a
    surface that renders it itself (the console's pages)."""
    return _STATUS_OF[_kind_of(exc)]


def _kind_of(exc: Refusal) -> type[Refusal]:
    return next((k for k in _STATUS_OF if isinstance(exc, k)), Refused)


async def _on_request_validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
    return problem_response(422, "invalid_request", "Invalid request", validation_summary(exc.errors()))


async def _on_http_exception(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
    reason = _HTTP_REASONS.get(exc.status_code, "http_error")
    title = reason.replace("_", " ").capitalize()
    detail = exc.detail if isinstance(exc.detail, str) else title
    return problem_response(exc.status_code, reason, title, detail, headers=exc.headers)


class CatchAllProblems:
    """ASGI middleware: an unreachable database becomes a 503 problem with ``Retry-After`` (logged
    once per outage, see :class:`usp_workers.engine.outage.Outage`); any other unhandled exception a bare 500
    problem, the log getting the rest."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except ClientDisconnect:
            # The client went away while its body was read: nothing to answer, nothing broken.
            logger.info("client disconnected during %s %s", scope.get("method"), scope.get("path"))
        except Exception as exc:
            if started:
                logger.exception("unhandled error answering %s %s", scope.get("method"), scope.get("path"))
                raise  # too late for a clean answer; let the server drop the connection
            await _answer_failure(exc, scope, receive, send)
        else:
            if scope.get("method") in _WRITES:
                OUTAGE.succeeded()


async def _answer_failure(exc: Exception, scope: Scope, receive: Receive, send: Send) -> None:
    if database_unavailable(exc):
        # Producers back off and retry; nothing was accepted (the transaction never committed).
        OUTAGE.failed(exc)
        response = problem_response(
            503,
            "database_unavailable",
            "Service unavailable",
            "The database does not answer; nothing was accepted. Retry after the delay given.",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    elif isinstance(exc, NonceStoreUnavailable):
        # Fail closed: a nonce that cannot be checked might be a replay.
        logger.warning("answering 503: %s", describe_outage(exc))
        response = problem_response(
            503,
            "replay_store_unavailable",
            "Service unavailable",
            "The store of signature nonces does not answer, so the request's nonce cannot be checked; "
            "nothing was done. Retry after the delay given, with a fresh signature.",
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    else:
        # Path only: the query string could carry something secret; headers never logged.
        logger.exception("unhandled error answering %s %s", scope.get("method"), scope.get("path"))
        response = problem_response(
            500,
            "internal_error",
            "Internal server error",
            "The server failed to handle this request; the failure has been logged.",
        )
    await response(scope, receive, send)


#: One per process: every app in it shares the database's fate.
OUTAGE = Outage("database", logger, "answering 503 with Retry-After until it answers")
#: Seconds a producer is asked to wait before retrying while the database is down.
RETRY_AFTER_SECONDS = 5
_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
