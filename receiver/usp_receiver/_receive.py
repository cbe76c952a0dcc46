"""Receiving one webhook, independent of the web framework: verify, parse, dedupe, handle.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_receiver._receive``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, assert_never

import anyio.to_thread
from pydantic import ValidationError

from usp_receiver._errors import KeyFetchError, ReceiverError, VerificationError
from usp_receiver._message import HeadersInput
from usp_receiver._verify import Verified, Verifier
from usp_receiver.dedupe import DedupeStore, MemoryDedupe, Processed, process_once
from usp_receiver.standard_webhooks import StandardVerified, StandardWebhooksVerifier
from usp_schemas import EventValidationError, ProbeEvent, WebhookEvent, parse_event

__all__ = [
    "PROBLEM_TYPE_BASE",
    "Handler",
    "Outcome",
    "ReceivedWebhook",
    "WebhookReceiver",
    "problem_outcome",
]

logger = logging.getLogger("usp_receiver")

#: Problem ``type`` URIs are this prefix plus the reason code (RFC 9457 §3.1.1).
PROBLEM_TYPE_BASE = "urn:usp-webhooks:problem:"
_RETRY_IN_PROGRESS_SECONDS = 5


@dataclass(frozen=True, slots=True)
class ReceivedWebhook:
    """What a handler gets: the validated event, who signed it, the exact bytes received."""

    event: WebhookEvent
    verified: Verified | StandardVerified
    body: bytes = field(repr=False)


Handler = Callable[[ReceivedWebhook], Awaitable[None] | None]


@dataclass(frozen=True, slots=True)
class Outcome:
    """The answer to send: ``status``, a JSON ``body`` and extra ``headers``."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    reason: str | None = None
    event_id: str | None = None

    @property
    def media_type(self) -> str:
        return "application/problem+json" if self.status >= 400 else "application/json"


class WebhookReceiver:
    """Verify, deduplicate and hand USP webhooks to ``handler``; framework-neutral.

    ``handler`` may be sync (run in a worker thread) or async. Raise from it to refuse the event:
    the sender gets a 500 and retries, and the retry is processed (never swallowed as a duplicate).

    >>> from usp_receiver import JWKS, Verifier
    >>> seen = []
    >>> receiver = WebhookReceiver(Verifier(JWKS([])), lambda hook: seen.append(hook.event.event_id))
    """

    def __init__(
        self,
        verifier: Verifier | StandardWebhooksVerifier,
        handler: Handler,
        *,
        dedupe: DedupeStore | None = None,
    ) -> None:
        self.verifier = verifier
        self.handler = handler
        self.dedupe: DedupeStore = dedupe if dedupe is not None else MemoryDedupe()

    async def receive(self, method: str, url: str, headers: HeadersInput, body: bytes) -> Outcome:
        """Process one delivery and say what to answer. Never raises for bad input."""
        try:
            verified = await self.verifier.averify(method, url, headers, body)
        except VerificationError as exc:
            logger.info("webhook refused: %s", exc.reason)
            return _problem(401, exc, "Signature verification failed")
        except KeyFetchError as exc:
            logger.warning("webhook deferred: signing keys unavailable (%s)", exc.detail)
            return _problem(503, exc, "Signing keys unavailable", retry_after=30)
        try:
            event = parse_event(body)
        except EventValidationError as exc:
            probe = _probe(body)
            if probe is not None:  # verified, and acted on by nobody: `usp-webhooks probe` asks
                return Outcome(200, {"status": "probe", "event_id": probe.event_id}, event_id=probe.event_id)
            logger.info("webhook refused: not a USP event (%s)", exc)
            return problem_outcome(400, "invalid_event", "Not a valid USP event", str(exc))
        return await self._deliver(ReceivedWebhook(event, verified, body))

    async def _deliver(self, hook: ReceivedWebhook) -> Outcome:
        event_id = hook.event.event_id
        processed = await process_once(self.dedupe, event_id, lambda: run_handler(self.handler, hook))
        match processed:
            case Processed.ACCEPTED:
                return Outcome(200, {"status": "accepted", "event_id": event_id}, event_id=event_id)
            case Processed.DUPLICATE:
                return Outcome(
                    200, {"status": "duplicate", "event_id": event_id}, reason="duplicate", event_id=event_id
                )
            case Processed.IN_PROGRESS:
                return problem_outcome(
                    409,
                    "in_progress",
                    "Event is being processed",
                    "retry later",
                    {"Retry-After": str(_RETRY_IN_PROGRESS_SECONDS)},
                    event_id,
                )
            case Processed.FAILED:
                # The handler's own text may hold PII or secrets: it is logged, never sent back.
                return problem_outcome(500, "handler_failed", "Webhook handler failed", event_id=event_id)
            case Processed.UNAVAILABLE:
                return problem_outcome(
                    503,
                    "dedupe_unavailable",
                    "Deduplication store unavailable",
                    headers={"Retry-After": "30"},
                    event_id=event_id,
                )
            case _:
                assert_never(processed)


async def run_handler(handler: Handler, hook: ReceivedWebhook) -> None:
    """Run ``handler``: await it when async, in a worker thread when sync (it may block)."""
    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(type(handler).__call__):
        result = handler(hook)
    else:
        result = await anyio.to_thread.run_sync(handler, hook)
    if inspect.isawaitable(result):
        await result


def problem_outcome(
    status: int,
    reason: str,
    title: str,
    detail: str = "",
    headers: dict[str, str] | None = None,
    event_id: str | None = None,
) -> Outcome:
    """An RFC 9457 problem answer: ``type`` is :data:`PROBLEM_TYPE_BASE` + ``reason``, and
    ``reason`` is repeated as a member (the stable code senders switch on).

    >>> outcome = problem_outcome(413, "payload_too_large", "Payload too large")
    >>> outcome.status, outcome.media_type, outcome.body["type"]
    (413, 'application/problem+json', 'urn:usp-webhooks:problem:payload_too_large')
    """
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE_BASE + reason,
        "title": title,
        "status": status,
        "reason": reason,
    }
    if detail:
        body["detail"] = detail
    return Outcome(status, body, dict(headers or {}), reason, event_id)


def _problem(status: int, exc: ReceiverError, title: str, *, retry_after: int | None = None) -> Outcome:
    headers = {"Retry-After": str(retry_after)} if retry_after else {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Signature realm="usp-webhooks"'
    return problem_outcome(status, exc.reason, title, exc.detail, headers)


def _probe(body: bytes) -> ProbeEvent | None:
    """``body`` as a probe event (:mod:`usp_schemas`' ``probe.test``), else ``None``."""
    try:
        return ProbeEvent.model_validate_json(body)
    except ValidationError:
        return None
