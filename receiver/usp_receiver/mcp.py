"""Receive signed ``usp_webhook`` notifications on a live MCP session (official ``mcp`` SDK, 2.3+).

A business pushes USP events to a platform that holds an MCP session open to it as JSON-RPC
notifications (``method: "usp_webhook"``, no ``id``), each carrying an in-band JWS in
``params._meta.usp.signature``. :class:`NotificationBinding` verifies that signature, validates the
params as a USP event envelope (exactly what the REST receiver accepts), deduplicates on
``event_id`` and runs your handler once per event with a :class:`ReceivedNotification`.

How it plugs in, and why this way: ``ClientSession`` in mcp 2.3 never hands a notification whose
method the negotiated protocol version does not define to ``message_handler``; it is dropped with a
debug log before any user callback (``ClientSession._on_notify``). The SDK's supported hook for
vendor notifications is a *notification binding* (``mcp.client.NotificationBinding``), passed
either to ``ClientSession(notification_bindings=[...])`` or, through a ``ClientExtension``, to
``Client(extensions=[...])``. This module builds both from one object, so no monkeypatching is
involved and your own ``message_handler`` keeps seeing every core notification untouched.

Two SDK properties worth knowing: bound notifications are handled one at a time, in dispatch
order, from a bounded queue (256) that drops the *oldest* entry when full; and a notification has
no response, so a rejected or dropped event is not retried by the sender over this session. Keep
the handler short (hand off to a job queue) and let the REST delivery path or an admin replay
cover anything lost.

This module is not imported by ``usp_receiver`` itself; import it explicitly::

    from usp_receiver.mcp import NotificationBinding, ReceivedNotification

    async def on_event(notification: ReceivedNotification) -> None:
        await jobs.enqueue(notification.event)  # a parsed usp_schemas event: .event, .event_id...

    binding = NotificationBinding(keys=jwks, dedupe=MemoryDedupe(), handler=on_event)
"""

from __future__ import annotations

import enum
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, assert_never

try:
    import mcp_types as types
    from mcp.client import ClientExtension, ClientSession
    from mcp.client import NotificationBinding as _SDKNotificationBinding
    from pydantic import RootModel
except ImportError as exc:  # pragma: no cover - exercised only without the extra installed
    raise ImportError("usp_receiver.mcp needs the official MCP SDK: install usp-receiver[mcp]") from exc

from usp_receiver._errors import InvalidEvent, ReceiverError
from usp_receiver._jws import VerifiedNotification, averify_notification_params
from usp_receiver._keys import KeyResolver
from usp_receiver.dedupe import DedupeStore, Processed, process_once
from usp_schemas import EventValidationError, WebhookEvent, parse_event

__all__ = [
    "CURSOR_META_KEY",
    "EXTENSION_IDENTIFIER",
    "LISTEN_FILTER_KEY",
    "USP_WEBHOOK_METHOD",
    "BindingStats",
    "NotificationBinding",
    "NotificationHandler",
    "NotificationOutcome",
    "ReceivedNotification",
    "RejectionHook",
    "USPWebhookExtension",
    "listen",
]

logger = logging.getLogger(__name__)

#: The JSON-RPC method of USP webhook notifications.
USP_WEBHOOK_METHOD: Final = "usp_webhook"
#: The client extension identifier (SEP-2133 grammar) advertised by :class:`USPWebhookExtension`.
EXTENSION_IDENTIFIER: Final = "dev.usp-protocol/webhooks"
#: The ``subscriptions/listen`` filter key (MCP 2026-07-28, an extension key MCP's filter carries)
#: a platform sets to hear its webhooks on the stream; the business publishes the filter in
#: ``/.well-known/usp`` (``bindings.mcp.listen_filter``).
LISTEN_FILTER_KEY: Final = "io.usp/webhooks"
#: In the listen request's ``_meta``: the last ``event_id`` received, to hear first what came after.
CURSOR_META_KEY: Final = "io.usp/after"


@dataclass(frozen=True, slots=True)
class ReceivedNotification:
    """What a handler gets: the validated event, who signed it, and the signed params.

    ``params`` are the verified params with the signature removed (``verified.params``): the
    notification's counterpart of :attr:`usp_receiver.ReceivedWebhook.body`, for anything the
    parsed ``event`` does not model (``_meta``, fields a newer sender added).
    """

    event: WebhookEvent
    verified: VerifiedNotification
    params: dict[str, Any] = field(repr=False)


NotificationHandler = Callable[[ReceivedNotification], Awaitable[None]]
RejectionHook = Callable[[Any, ReceiverError], Awaitable[None] | None]


class NotificationOutcome(enum.Enum):
    """What :meth:`NotificationBinding.handle` did with one notification."""

    ACCEPTED = "accepted"  #: verified, new, handler ran and the id is committed
    DUPLICATE = "duplicate"  #: already processed: handler not run
    IN_PROGRESS = "in_progress"  #: another worker holds the id right now: handler not run
    REJECTED = "rejected"  #: signature invalid, or params not a USP event: handler not run
    FAILED = "failed"  #: handler (or the dedupe store) raised: claim released, a re-send runs again


@dataclass
class BindingStats:
    """Counters per :class:`NotificationOutcome`, for metrics and tests. Mutated only on the event
    loop."""

    accepted: int = 0
    duplicates: int = 0
    in_progress: int = 0
    rejected: int = 0
    failed: int = 0

    @property
    def total(self) -> int:
        """Notifications handled so far, whatever their outcome."""
        return self.accepted + self.duplicates + self.in_progress + self.rejected + self.failed


class _RawParams(RootModel[Any]):
    """The SDK validates bound params with a pydantic model; this one keeps them untouched, so the
    JWS is checked over exactly what arrived (and non-object params reach us to be counted)."""

    root: Any


class NotificationBinding:
    """Verify, deduplicate and dispatch ``usp_webhook`` notifications from an MCP server.

    ``keys`` resolves the business's signing keys (e.g. its JWKS), ``dedupe`` remembers processed
    ``event_id`` values, ``handler`` (async) receives a :class:`ReceivedNotification` once per
    event. Params that are validly signed but not a USP event are rejected like the REST receiver
    rejects them (``invalid_event``). ``on_rejected(params, error)`` (sync or async) observes
    rejections; ``error.reason`` is the stable code (``bad_signature``, ``stale``,
    ``invalid_event``...).

    >>> from mcp import Client
    >>> from usp_receiver.dedupe import MemoryDedupe
    >>> async def on_event(notification: ReceivedNotification) -> None:
    ...     print(notification.event.event, notification.event.event_id)
    >>> binding = NotificationBinding(keys=jwks, dedupe=MemoryDedupe(), handler=on_event)  # doctest: +SKIP
    >>> async with Client(server, extensions=[binding.extension]) as client:  # doctest: +SKIP
    ...     ...

    or, with a bare session: ``ClientSession(read, write, notification_bindings=[binding.sdk_binding])``.
    """

    def __init__(
        self,
        keys: KeyResolver,
        dedupe: DedupeStore,
        handler: NotificationHandler,
        *,
        on_rejected: RejectionHook | None = None,
        max_age: float = 300,
        max_future: float = 60,
        method: str = USP_WEBHOOK_METHOD,
    ) -> None:
        self._keys = keys
        self._dedupe = dedupe
        self._handler = handler
        self._on_rejected = on_rejected
        self._max_age = max_age
        self._max_future = max_future
        self.method = method
        self.stats = BindingStats()
        self._sdk_binding = _SDKNotificationBinding(
            method=method, params_type=_RawParams, handler=self._on_sdk
        )

    @property
    def sdk_binding(self) -> _SDKNotificationBinding[Any]:
        """The SDK binding, for ``ClientSession(notification_bindings=[binding.sdk_binding])``."""
        return self._sdk_binding

    @property
    def extension(self) -> USPWebhookExtension:
        """A client extension carrying this binding, for ``Client(extensions=[binding.extension])``."""
        return USPWebhookExtension(self)

    async def _on_sdk(self, params: _RawParams) -> None:
        await self.handle(params.root)

    async def handle(self, params: Any) -> NotificationOutcome:
        """Process one notification's ``params`` and report the outcome; never raises an
        ``Exception`` (there is nobody to answer: failures are logged and counted).

        Called by the SDK for you; call it directly to feed notifications from elsewhere.
        """
        try:
            verified = await averify_notification_params(
                params, self._keys, max_age=self._max_age, max_future=self._max_future
            )
            try:
                event = parse_event(verified.params)
            except EventValidationError as exc:
                # The message names fields and checks, never the offending values (PII).
                raise InvalidEvent(str(exc)) from None
        except ReceiverError as error:
            await self._reject(params, error)
            return NotificationOutcome.REJECTED
        except Exception:
            # A resolver that breaks its contract; still nothing to answer, so log and count.
            logger.exception("usp_webhook notification could not be verified")
            self.stats.failed += 1
            return NotificationOutcome.FAILED

        notification = ReceivedNotification(event, verified, verified.params)
        processed = await process_once(self._dedupe, event.event_id, lambda: self._handler(notification))
        match processed:
            case Processed.ACCEPTED:
                self.stats.accepted += 1
                return NotificationOutcome.ACCEPTED
            case Processed.DUPLICATE:
                self.stats.duplicates += 1
                return NotificationOutcome.DUPLICATE
            case Processed.IN_PROGRESS:
                self.stats.in_progress += 1
                return NotificationOutcome.IN_PROGRESS
            case Processed.FAILED | Processed.UNAVAILABLE:
                # No response to send: a re-sent notification (or the REST path) runs it again.
                self.stats.failed += 1
                return NotificationOutcome.FAILED
            case _:
                assert_never(processed)

    async def _reject(self, params: Any, error: ReceiverError) -> None:
        self.stats.rejected += 1
        event_id = params.get("event_id") if isinstance(params, Mapping) else None
        # Never log the signature itself: the error details name the key and the check, not it.
        logger.warning(
            "rejected usp_webhook notification (event_id %s): %s: %s",
            _short(event_id) if isinstance(event_id, str) else "absent",
            error.reason,
            error.detail,
        )
        if self._on_rejected is None:
            return
        try:
            result = self._on_rejected(params, error)
            if inspect.isawaitable(result):
                await result
        except Exception:
            logger.exception("on_rejected hook raised")


class USPWebhookExtension(ClientExtension):
    """Carries a :class:`NotificationBinding` into ``mcp.Client(extensions=[...])``.

    It also advertises ``dev.usp-protocol/webhooks`` in the client capabilities, telling the server
    that this client consumes ``usp_webhook`` notifications.

    >>> client = Client(server, extensions=[USPWebhookExtension(binding)])  # doctest: +SKIP
    """

    identifier = EXTENSION_IDENTIFIER

    def __init__(self, binding: NotificationBinding) -> None:
        self._binding = binding

    def notifications(self) -> Sequence[_SDKNotificationBinding[Any]]:
        """The one binding: ``usp_webhook`` (or the binding's ``method``)."""
        return (self._binding.sdk_binding,)


async def listen(session: ClientSession, *, profile: str, after: str | None = None) -> None:
    """Hear this platform's webhooks on an MCP 2026-07-28 connection: one ``subscriptions/listen``
    stream, opted in with :data:`LISTEN_FILTER_KEY` and naming ``profile`` (``_meta.usp.profile``),
    held until the server ends it (returns) or the caller cancels the task. Each ``usp_webhook``
    on it reaches the session's :class:`NotificationBinding` (pass ``binding.extension`` to the
    ``Client``). ``after``: the last ``event_id`` received, to hear what was missed since first.

    The SDK's own ``Client.listen()`` takes only MCP's four change flags, so this sends the
    request itself, through the session's public ``send_request``; the acknowledgment reaches the
    client's ``message_handler``. The stream is held as long as the session's read timeout allows
    (none by default). A transport failure raises the SDK's ``MCPError``: listen again with
    ``after`` set.

    >>> async with Client(transport, extensions=[binding.extension]) as client:  # doctest: +SKIP
    ...     await listen(client.session, profile="https://platform.example/profile")
    """
    meta: dict[str, Any] = {"usp": {"profile": profile}}
    if after is not None:
        meta[CURSOR_META_KEY] = after
    request = types.SubscriptionsListenRequest(
        params=types.SubscriptionsListenRequestParams(
            notifications=types.SubscriptionFilter.model_validate({LISTEN_FILTER_KEY: True}), _meta=meta
        )
    )
    await session.send_request(request, types.SubscriptionsListenResult)


def _short(text: str) -> str:
    return repr(text[:64] + ("…" if len(text) > 64 else ""))
