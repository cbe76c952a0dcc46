"""Resumability for Streamable HTTP sessions (``Last-Event-ID``), scoped to one session.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.mcp.event_store``.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage

__all__ = ["DEFAULT_MAX_AGE", "DEFAULT_MAX_EVENTS", "SessionEventStore"]

#: Messages kept per session (the standalone stream and every request stream together): with the
#: age bound, far more than a platform gets in five minutes, and a ceiling on what a session costs.
DEFAULT_MAX_EVENTS: Final = 500
#: Seconds a message is kept: the receivers' default replay window for signed notifications.
DEFAULT_MAX_AGE: Final = 300.0


@dataclass(frozen=True, slots=True)
class _Stored:
    sequence: int
    stream_id: StreamId
    message: JSONRPCMessage | None  # None: a priming event (a cursor with nothing to replay)
    stored_at: float


class SessionEventStore(EventStore):
    """The replay buffer of one Streamable HTTP session.

    >>> import anyio
    >>> mine, theirs = SessionEventStore(), SessionEventStore()
    >>> event_id = anyio.run(mine.store_event, "_GET_stream", None)
    >>> anyio.run(theirs.replay_events_after, event_id, print) is None
    True
    """

    def __init__(
        self,
        *,
        max_events: int = DEFAULT_MAX_EVENTS,
        max_age: float = DEFAULT_MAX_AGE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_events < 1 or not max_age > 0:
            raise ValueError("max_events must be at least 1 and max_age positive")
        self.max_events = max_events
        self.max_age = max_age
        self._clock = clock
        # Unguessable, so an id is ours only if we minted it; not a secret (the session id and
        # its owner's credential gate the replay).
        self._token = secrets.token_hex(8)
        self._next_sequence = 0
        self._events: deque[_Stored] = deque()

    @property
    def held(self) -> int:
        """Messages held right now (after evicting the expired ones).

        Not ``__len__``: the SDK tests the store's truthiness to decide whether to store at all,
        and an empty store must not read as "no store".
        """
        self._evict()
        return len(self._events)

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        """Keep ``message`` for replay on ``stream_id``; return its SSE event id."""
        sequence = self._next_sequence
        self._next_sequence += 1
        self._events.append(_Stored(sequence, stream_id, message, self._clock()))
        self._evict()
        return self._event_id(sequence, stream_id)

    async def replay_events_after(
        self, last_event_id: EventId, send_callback: EventCallback
    ) -> StreamId | None:
        """Send what ``last_event_id``'s stream got after it; return that stream's id, or ``None``
        for an id this store did not mint (nothing is sent)."""
        cursor = self._parse(last_event_id)
        if cursor is None:
            return None
        last_sequence, stream_id = cursor
        # Until caught up: the stream keeps growing while the replay waits on the client, and what
        # arrives before the transport puts the live stream back is sent by nobody else (the SDK's
        # replay-to-live window; looping narrows it to the moment after the return).
        while missed := self._after(last_sequence, stream_id):
            for stored in missed:
                assert stored.message is not None
                await send_callback(EventMessage(stored.message, self._event_id(stored.sequence, stream_id)))
                last_sequence = stored.sequence
        return stream_id

    def _after(self, sequence: int, stream_id: StreamId) -> list[_Stored]:
        self._evict()
        return [
            stored
            for stored in self._events
            if stored.sequence > sequence and stored.stream_id == stream_id and stored.message is not None
        ]

    def _event_id(self, sequence: int, stream_id: StreamId) -> EventId:
        stream = base64.urlsafe_b64encode(stream_id.encode("utf-8")).rstrip(b"=").decode("ascii")
        return f"{self._token}.{sequence}.{stream}"

    def _parse(self, event_id: str) -> tuple[int, StreamId] | None:
        """``(sequence, stream id)`` of an id this store minted and that is not from the future."""
        token, _, rest = event_id.partition(".")
        sequence_text, _, stream = rest.partition(".")
        if not secrets.compare_digest(token.encode(), self._token.encode()) or not (
            sequence_text.isascii() and sequence_text.isdigit()
        ):
            return None
        sequence = int(sequence_text)
        if sequence >= self._next_sequence:
            return None
        try:
            stream_id = base64.urlsafe_b64decode(stream + "=" * (-len(stream) % 4)).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
        return sequence, stream_id

    def _evict(self) -> None:
        oldest_kept = self._clock() - self.max_age
        events = self._events
        while events and (len(events) > self.max_events or events[0].stored_at < oldest_kept):
            events.popleft()
