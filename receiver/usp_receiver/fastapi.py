"""Receive USP webhooks in a FastAPI app: one router, one POST route.

The route takes the raw :class:`~fastapi.Request` and declares no body model on purpose: the
signature is over the exact bytes sent, so they are verified before anything parses them, and a
model would let FastAPI parse (and answer 422 for) unverified input first. The OpenAPI operation
still describes the body and every answer the sender can get.

Not imported by ``usp_receiver`` itself; import it explicitly::

    from usp_receiver.fastapi import webhook_router
"""

from __future__ import annotations

from typing import Any

try:
    from fastapi import APIRouter, Request
    from fastapi.responses import JSONResponse, Response
    from starlette.requests import ClientDisconnect
except ImportError as exc:  # pragma: no cover - exercised only without the extra installed
    raise ImportError("usp_receiver.fastapi needs FastAPI: install usp-receiver[fastapi]") from exc

from usp_receiver._receive import PROBLEM_TYPE_BASE, Outcome, WebhookReceiver
from usp_receiver._tracing import traced
from usp_receiver._url import check_public_url, request_url
from usp_receiver.asgi import DEFAULT_MAX_BODY_BYTES, declared_length, payload_too_large, read_limited

__all__ = ["webhook_router"]


def webhook_router(
    receiver: WebhookReceiver,
    *,
    path: str = "/webhooks/usp",
    public_url: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> APIRouter:
    """An :class:`~fastapi.APIRouter` with one ``POST path`` route that hands deliveries to
    ``receiver``. Pass ``public_url`` when the app sits behind a proxy (see :mod:`usp_receiver.asgi`).

    >>> from fastapi import FastAPI
    >>> from usp_receiver import JWKS, Verifier, WebhookReceiver
    >>> receiver = WebhookReceiver(Verifier(JWKS([])), lambda hook: None)
    >>> app = FastAPI()
    >>> app.include_router(webhook_router(receiver, public_url="https://platform.example/webhooks/usp"))
    """
    if max_body_bytes < 0:
        raise ValueError("max_body_bytes must not be negative")
    base = None if public_url is None else check_public_url(public_url)

    async def receive_usp_webhook(request: Request) -> Response:
        declared = declared_length(request.scope["headers"])
        if declared is not None and declared > max_body_bytes:
            return _response(payload_too_large(max_body_bytes))
        try:
            body = await read_limited(request.stream(), max_body_bytes)
        except ClientDisconnect:
            return Response(status_code=400)  # nobody reads it; the sender retries
        if body is None:
            return _response(payload_too_large(max_body_bytes))
        url = request_url(request.scope, base)
        headers = request.scope["headers"]
        return _response(await traced(lambda: receiver.receive(request.method, url, headers, body), headers))

    router = APIRouter()
    router.add_api_route(
        path,
        receive_usp_webhook,
        methods=["POST"],
        summary="Receive a signed USP webhook",
        description=_DESCRIPTION,
        response_class=JSONResponse,
        response_model=None,
        responses=_RESPONSES,
        openapi_extra={"requestBody": _REQUEST_BODY},
        operation_id="receive_usp_webhook",
    )
    return router


def _response(outcome: Outcome) -> JSONResponse:
    return JSONResponse(
        outcome.body, status_code=outcome.status, headers=outcome.headers, media_type=outcome.media_type
    )


_DESCRIPTION = (
    "Called by the business to deliver one USP event. The request must carry an RFC 9421 "
    "signature (`Signature-Input`, `Signature`) by a key from the business's JWKS and an RFC 9530 "
    "`Content-Digest` of the body. Any 2xx means: do not send this event again (accepted, or "
    "already processed). 409, 5xx: send it again later. 400, 401, 413: the delivery is refused."
)

_REQUEST_BODY: dict[str, Any] = {
    "required": True,
    "description": (
        "A USP event envelope (`event`, `event_id`, `timestamp`, `version`, `data`...). Verified "
        "over its exact bytes before it is parsed."
    ),
    "content": {"application/json": {"schema": {"type": "object"}}},
}

_PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 9457 problem details; `reason` is a stable machine-readable code.",
    "required": ["type", "title", "status", "reason"],
    "properties": {
        "type": {"type": "string", "example": PROBLEM_TYPE_BASE + "bad_signature"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "reason": {"type": "string", "example": "bad_signature"},
        "detail": {"type": "string"},
    },
}


def _problem(description: str, reasons: list[str]) -> dict[str, Any]:
    schema = _PROBLEM_SCHEMA | {
        "properties": _PROBLEM_SCHEMA["properties"] | {"reason": {"type": "string", "enum": reasons}}
    }
    return {"description": description, "content": {"application/problem+json": {"schema": schema}}}


_RETRY_AFTER = {
    "Retry-After": {"description": "Seconds to wait before sending again", "schema": {"type": "integer"}}
}

_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Accepted, or a duplicate of an event already processed: do not send it again",
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["status", "event_id"],
                    "properties": {
                        "status": {"type": "string", "enum": ["accepted", "duplicate"]},
                        "event_id": {"type": "string"},
                    },
                }
            }
        },
    },
    400: _problem("Signed, but not a valid USP event", ["invalid_event"]),
    401: _problem(
        "The signature, digest or replay window does not hold",
        [
            "missing_signature",
            "malformed_signature",
            "unknown_key",
            "bad_signature",
            "digest_mismatch",
            "missing_component",
            "stale",
            "expired",
            "future",
            "tag_mismatch",
        ],
    ),
    409: _problem("The same event is being processed right now: send it again later", ["in_progress"])
    | {"headers": _RETRY_AFTER},
    413: _problem("The body is larger than this receiver accepts", ["payload_too_large"]),
    500: _problem("The handler failed; the event was not recorded, send it again", ["handler_failed"]),
    503: _problem(
        "Signing keys or the deduplication store are unavailable: send it again later",
        ["key_fetch_failed", "dedupe_unavailable"],
    )
    | {"headers": _RETRY_AFTER},
}
