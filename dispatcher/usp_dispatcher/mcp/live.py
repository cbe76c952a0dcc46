"""Live webhooks: a platform's events pushed over the MCP sessions that speak for it.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.mcp.live``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

import anyio
import anyio.to_thread
import mcp_types as types
import sqlalchemy as sa
import sqlalchemy.orm
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.session import ServerSession
from sqlalchemy.engine import Engine
from sqlmodel import col, select

from usp_core import db
from usp_core.clock import utcnow
from usp_core.keycache import NoSigningKey, current_signing_keys
from usp_dispatcher.access.apikeys import still_authenticates
from usp_dispatcher.settings import ApiSettings
from usp_receiver import SigningKey, sign_notification_params
from usp_schemas import WEBHOOK_METHOD
from usp_workers import (
    EVENTS_CHANNEL,
    EVENTS_CHANNEL_SQL,
    EventRecord,
    Subscription,
    SubscriptionState,
    event_matches,
    reaches,
)

__all__ = [
    "DEFAULT_LOOKBACK",
    "DEFAULT_POLL_INTERVAL",
    "DEFAULT_QUEUE_SIZE",
    "LiveHub",
    "LiveSend",
    "missed_since",
    "notification_sender",
    "webhook_notification",
]

logger = logging.getLogger("usp_dispatcher.mcp")

#: Sends one notification's params to one session; raising means the session is gone.
LiveSend = Callable[[dict[str, Any]], Awaitable[None]]

DEFAULT_POLL_INTERVAL: Final = 0.2
DEFAULT_LOOKBACK: Final = 5.0
#: Seconds behind the newest event seen that every poll rereads (a transaction that commits
#: within this of its event's creation is seen at the next poll).
RECENT: Final = 0.5
#: Seconds between the polls that reread the whole ``lookback`` (the later commits).
SWEEP_INTERVAL: Final = 1.0
#: The least time between two polls' starts: a burst of commits wakes the hub once per gap.
MIN_POLL_GAP: Final = 0.02
DEFAULT_QUEUE_SIZE: Final = 1000

_UspWebhook = types.Notification[dict[str, Any], str]
#: Told after a commit the (event type, audience) of each event it inserted, and whether it
#: changed a subscription.
_Waker = Callable[[list[tuple[str, str | None]], bool], None]


def with_correlation(envelope: dict[str, Any]) -> dict[str, Any]:
    """The notification's ``params``: ``envelope`` with its join id also in
    ``_meta.usp.correlation_id``, where MCP participants carry it (the binding, section 9.7).

    >>> with_correlation({"event_id": "e", "correlation_id": "c"})["_meta"]
    {'usp': {'correlation_id': 'c'}}
    >>> "_meta" in with_correlation({"event_id": "e"})
    False
    """
    correlation_id = envelope.get("correlation_id")
    if not isinstance(correlation_id, str):
        return envelope
    return {**envelope, "_meta": {"usp": {"correlation_id": correlation_id}}}


def notification_sender(session: ServerSession) -> LiveSend:
    """A :data:`LiveSend` writing ``usp_webhook`` notifications on ``session``'s standalone
    channel (the SSE ``GET`` stream over HTTP, the pipe over stdio), outliving the request that
    produced ``session``.

    Why through ``send_notification`` with a ``type: ignore``: in mcp 2.3 it is annotated with the
    core ``ServerNotification`` union only, but at run time it sends any ``Notification`` model as
    its method and params on the connection's channel (``exclude_none`` does not reach into the
    params dict, so the signed envelope goes out as signed). The untyped alternative,
    ``Connection.notify``, is not reachable from a low-level handler: its context carries no
    connection and ``ServerSession`` keeps its own private. Without a ``related_request_id`` the
    notification rides the standalone channel, not the (finished) request's stream.
    """

    async def send(params: dict[str, Any]) -> None:
        await session.send_notification(webhook_notification(params))

    return send


def webhook_notification(params: dict[str, Any]) -> Any:
    """A ``usp_webhook`` notification model carrying ``params`` as signed (typed ``Any``: see
    :func:`notification_sender` on why ``send_notification`` takes it)."""
    return _UspWebhook(method=WEBHOOK_METHOD, params=params)


@dataclass(eq=False)
class _Attachment:
    key: str
    profiles: set[str]
    send: LiveSend
    attached_at: datetime
    outbox: MemoryObjectSendStream[dict[str, Any]]
    inbox: MemoryObjectReceiveStream[dict[str, Any]]
    swept: bool  # whether the transport's ``is_alive`` speaks for it (not for a listen stream)
    principal: str | None  # who opened it: pushes stop once it no longer authenticates
    on_drop: Callable[[], None] | None  # told when the hub drops it
    scope: anyio.CancelScope | None = None  # the pump's, once it runs
    started: bool = False
    dropped: bool = False


class LiveHub:
    """Which sessions speak for which profiles, and the loop that feeds them.

    ``is_alive(session_key)`` (optional) tells whether the transport still has that session; the
    hub sweeps out the ones it denies (the HTTP mount passes one; a stdio process has one session
    that lives as long as the hub). ``lookback`` and ``queue_size``: see the module docstring.

    >>> hub = LiveHub()
    >>> async def send(params): ...
    >>> hub.attach("stdio", "https://platform.example/profile", send)
    >>> hub.session_keys
    frozenset({'stdio'})
    >>> hub.detach("stdio")
    """

    def __init__(
        self,
        *,
        is_alive: Callable[[str], bool] | None = None,
        lookback: float = DEFAULT_LOOKBACK,
        queue_size: int = DEFAULT_QUEUE_SIZE,
    ) -> None:
        if lookback < 0 or queue_size < 1:
            raise ValueError("lookback must be >= 0 and queue_size >= 1")
        self._is_alive = is_alive
        self._lookback = timedelta(seconds=lookback)
        self._queue_size = queue_size
        self._attachments: dict[str, _Attachment] = {}
        self._task_group: TaskGroup | None = None
        self._wake: asyncio.Event | None = None
        # profile -> its active subscriptions' patterns, as the last poll that read them found them;
        # the count of subscription changes this process committed, so a read that started before
        # one does not put back what it made stale
        self._patterns: dict[str, list[list[str]]] = {}
        self._subscription_changes = 0

    @property
    def session_keys(self) -> frozenset[str]:
        """The sessions attached right now."""
        return frozenset(self._attachments)

    def attach(
        self,
        session_key: str,
        profile: str,
        send: LiveSend,
        *,
        principal: str | None = None,
        swept: bool = True,
        on_drop: Callable[[], None] | None = None,
    ) -> None:
        """From now on, send ``session_key`` the events of ``profile`` (idempotent; a session may
        speak for several profiles, and keeps the ``send`` it first attached with). ``principal``:
        who opened it, checked at every read that has events for it (a revoked key's sessions are
        dropped: an open stream outlives the key that opened it, a revocation must not).
        ``swept``: the transport's ``is_alive`` tells when it is gone; else the caller detaches
        it. ``on_drop`` is called when the hub drops it (revoked, failing, not keeping up)."""
        existing = self._attachments.get(session_key)
        if existing is not None:
            existing.profiles.add(profile)
            return
        outbox, inbox = anyio.create_memory_object_stream[dict[str, Any]](self._queue_size)
        attachment = _Attachment(
            session_key, {profile}, send, utcnow(), outbox, inbox, swept, principal, on_drop
        )
        self._attachments[session_key] = attachment
        if self._task_group is not None:
            self._start(attachment)
        if self._wake is not None:
            self._wake.set()

    def detach(self, session_key: str) -> None:
        """Stop sending to ``session_key`` (unknown keys are ignored)."""
        attachment = self._attachments.get(session_key)
        if attachment is not None:
            self._drop(attachment)

    async def run(
        self, engine: Engine, settings: ApiSettings, *, poll_interval: float = DEFAULT_POLL_INTERVAL
    ) -> None:
        """Tail ``engine``'s events and feed the attached sessions until cancelled (asyncio)."""
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        tail = _Tail(self._lookback)
        self._patterns = {}

        def committed(events: list[tuple[str, str | None]], subscriptions_changed: bool) -> None:
            if subscriptions_changed:
                self._patterns = {}
                self._subscription_changes += 1
            if subscriptions_changed or self._may_want(events):
                wake.set()

        def poke(events: list[tuple[str, str | None]], subscriptions_changed: bool) -> None:
            # Called by commits, from any thread: the decision is taken on the loop's.
            with contextlib.suppress(RuntimeError):  # the loop is closing: this hub is going away
                loop.call_soon_threadsafe(committed, events, subscriptions_changed)

        _commit_hook.add(poke)
        try:
            async with anyio.create_task_group() as task_group:
                self._task_group, self._wake = task_group, wake
                if engine.dialect.name == "postgresql":
                    task_group.start_soon(_hear_commits, engine, committed, wake.set)
                for attachment in list(self._attachments.values()):
                    self._start(attachment)
                while True:
                    wake.clear()
                    self._sweep()
                    if not self._attachments:
                        await wake.wait()
                        continue
                    started = loop.time()
                    await self._poll(engine, settings, tail, started)
                    with anyio.move_on_after(poll_interval):
                        await wake.wait()
                    await anyio.sleep(max(0.0, started + MIN_POLL_GAP - loop.time()))
        finally:
            _commit_hook.discard(poke)
            self._task_group = self._wake = None
            # The sessions outlive nothing of ours: a hub that stops forgets them.
            for attachment in list(self._attachments.values()):
                self._drop(attachment)

    # -- the loop's steps ---------------------------------------------------------------------

    async def _poll(self, engine: Engine, settings: ApiSettings, tail: _Tail, moment: float) -> None:
        attachments = list(self._attachments.values())
        read_from, forget_below = tail.floors(
            min(attachment.attached_at for attachment in attachments), moment
        )
        profiles = _profiles_of(attachments)
        principals: dict[str, set[str]] = {}  # who opened the attachments -> their profiles
        for attachment in attachments:
            if attachment.principal is not None:
                principals.setdefault(attachment.principal, set()).update(attachment.profiles)
        changes = self._subscription_changes
        try:
            batch = await anyio.to_thread.run_sync(
                _read_batch, engine, settings, read_from, tail.seen, profiles, principals
            )
        except Exception:
            logger.exception("live webhooks: reading new events failed; retrying at the next poll")
            return
        tail.advance(forget_below, batch.window)
        if batch.patterns is None:
            return  # nothing new
        if changes == self._subscription_changes:
            self._patterns = {profile: batch.patterns.get(profile, []) for profile in profiles}
        for attachment in attachments:
            if attachment.principal in batch.revoked:
                logger.info(
                    "live webhooks: session %s detached: its credential was revoked", _shown(attachment.key)
                )
                self._drop(attachment)
        attachments = [attachment for attachment in attachments if not attachment.dropped]
        for record in batch.events:
            targets = [attachment for attachment in attachments if _wants(attachment, record, batch.patterns)]
            if not targets:
                continue
            if batch.key is None:
                logger.error("live webhooks: no signing key; event %s not pushed to live sessions", record.id)
                continue
            try:
                params = sign_notification_params(with_correlation(json.loads(record.payload)), batch.key)
            except ValueError:  # not JSON, or outside what JCS can sign: the hub must go on
                logger.exception("live webhooks: event %s cannot be signed in-band; not pushed", record.id)
                continue
            for attachment in targets:
                self._enqueue(attachment, params)

    def _may_want(self, events: list[tuple[str, str | None]]) -> bool:
        """Whether one of these events (type, audience) this process committed may be for an
        attached session: so by the patterns the last poll read, or for a profile attached since
        (patterns not read yet)."""
        profiles = _profiles_of(self._attachments.values())
        if not profiles <= self._patterns.keys():
            return bool(events)
        mine = {profile: self._patterns[profile] for profile in profiles}
        return any(_profiles_want(mine, event_type, audience) for event_type, audience in events)

    def _enqueue(self, attachment: _Attachment, params: dict[str, Any]) -> None:
        try:
            attachment.outbox.send_nowait(params)
        except anyio.WouldBlock:
            logger.warning(
                "live webhooks: session %s is not keeping up (%d queued); detached",
                _shown(attachment.key),
                self._queue_size,
            )
            self._drop(attachment)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._drop(attachment)

    def _start(self, attachment: _Attachment) -> None:
        if not attachment.started and self._task_group is not None:
            attachment.started = True
            self._task_group.start_soon(self._pump, attachment)

    async def _pump(self, attachment: _Attachment) -> None:
        """Send one session its queue, in order; the first failure detaches it."""
        attachment.scope = anyio.CancelScope()
        if attachment.dropped:
            attachment.scope.cancel()
        with attachment.scope, attachment.inbox:
            try:
                async for params in attachment.inbox:
                    await attachment.send(params)
            except anyio.ClosedResourceError:
                pass  # dropped while waiting for the next one
            except Exception as exc:
                logger.warning(
                    "live webhooks: sending to session %s failed (%s); detached",
                    _shown(attachment.key),
                    type(exc).__name__,
                )
                self._drop(attachment)

    def _sweep(self) -> None:
        if self._is_alive is None:
            return
        for attachment in list(self._attachments.values()):
            if attachment.swept and not self._is_alive(attachment.key):
                self._drop(attachment)

    def _drop(self, attachment: _Attachment) -> None:
        if self._attachments.get(attachment.key) is attachment:
            del self._attachments[attachment.key]
        if not attachment.dropped and attachment.on_drop is not None:
            attachment.on_drop()
        attachment.dropped = True
        if attachment.scope is not None:
            attachment.scope.cancel()
        attachment.outbox.close()
        attachment.inbox.close()


# -- reading the events table ---------------------------------------------------------------------


@dataclass
class _Tail:
    """Where the hub stands in the events table: the newest ``created_at`` seen and the ids handled
    within the lookback window behind it."""

    lookback: timedelta
    newest: datetime | None = None
    seen: dict[str, datetime] = field(default_factory=dict)
    expiry: list[tuple[datetime, str]] = field(default_factory=list)  # ``seen`` as a heap
    swept_at: float = float("-inf")  # the event loop's clock

    def floors(self, earliest_attach: datetime, moment: float) -> tuple[datetime, datetime]:
        """Where the poll at ``moment`` reads from, and the oldest ``created_at`` that can still be
        unseen: nobody wants events from before they attached, and nothing older than the
        lookback behind the newest event is looked for. Most polls read only the :data:`RECENT`
        end of that window; one every :data:`SWEEP_INTERVAL` reads all of it, so a poll's cost
        follows the events since the last one, not the whole window's."""
        if self.newest is None:
            return earliest_attach, earliest_attach
        oldest = max(earliest_attach, self.newest - self.lookback)
        if moment - self.swept_at >= SWEEP_INTERVAL:
            self.swept_at = moment
            return oldest, oldest
        return max(oldest, self.newest - timedelta(seconds=RECENT)), oldest

    def advance(self, floor: datetime, window: Iterable[tuple[str, datetime]]) -> None:
        for event_id, created_at in window:
            if event_id not in self.seen:
                self.seen[event_id] = created_at
                heapq.heappush(self.expiry, (created_at, event_id))
            if self.newest is None or created_at > self.newest:
                self.newest = created_at
        # The floor never moves back (attach times and the newest event only grow), so what is
        # below it now will never be read again: forgotten oldest first, without a scan.
        while self.expiry and self.expiry[0][0] < floor:
            del self.seen[heapq.heappop(self.expiry)[1]]


@dataclass(frozen=True)
class _Batch:
    window: list[tuple[str, datetime]]  # every (id, created_at) read
    events: list[EventRecord]  # the unseen ones some attached profile wants, oldest first
    # profile -> each active subscription's patterns (None: not read, no event was new)
    patterns: dict[str, list[list[str]]] | None
    key: SigningKey | None
    revoked: frozenset[str] = frozenset()  # the attached principals that no longer authenticate


def _read_batch(
    engine: Engine,
    settings: ApiSettings,
    floor: datetime,
    seen: dict[str, datetime],
    profiles: set[str],
    principals: dict[str, set[str]],
) -> _Batch:
    """The events at or after ``floor`` the hub has not handled and an attached profile wants,
    those profiles' subscriptions, the signing key, and which of ``principals`` (each with the
    profiles its attachments speak for) no longer authenticate, among those the events are for
    (blocking: run in a thread; ``seen`` is only read). Only the events wanted are read whole."""
    with db.session(engine) as session:
        rows = session.exec(
            select(
                EventRecord.id, EventRecord.created_at, EventRecord.event_type, EventRecord.audience
            ).where(EventRecord.created_at >= floor)
        ).all()
        window = [(event_id, created_at) for event_id, created_at, _, _ in rows]
        unseen = [row for row in rows if row[0] not in seen]
        if not unseen:
            return _Batch(window, [], None, None)
        patterns: dict[str, list[list[str]]] = {}
        subscriptions = session.exec(
            select(Subscription.platform_profile, Subscription.event_types).where(
                Subscription.state == SubscriptionState.ACTIVE,
                col(Subscription.platform_profile).in_(sorted(profiles)),
            )
        ).all()
        for profile, event_types in subscriptions:
            if profile is not None:
                patterns.setdefault(profile, []).append(json.loads(event_types))
        wanted = [row for row in unseen if _profiles_want(patterns, row[2], row[3])]
        events: list[EventRecord] = []
        for chunk in _chunks([event_id for event_id, *_ in wanted], 500):
            events.extend(session.exec(select(EventRecord).where(col(EventRecord.id).in_(chunk))).all())
        # The profiles these events are for: only the principals speaking for them are checked.
        touched: set[str] = set()
        for _, _, kind, to in wanted if principals else ():
            touched.update(
                p for p in profiles - touched if _profiles_want({p: patterns.get(p, [])}, kind, to)
            )
            if len(touched) == len(profiles):
                break
        revoked = frozenset(
            principal
            for principal, theirs in principals.items()
            if theirs & touched and not still_authenticates(session, principal)
        )
    if not events:
        return _Batch(window, [], patterns, None)
    events.sort(key=lambda record: (record.created_at, record.id))
    try:
        key: SigningKey | None = current_signing_keys(engine, settings)[0]
    except NoSigningKey:
        key = None
    return _Batch(window, events, patterns, key, revoked)


def missed_since(engine: Engine, profile: str, event_id: str, limit: int) -> list[dict[str, Any]] | None:
    """The notification params (unsigned) of the events after ``event_id`` that ``profile``'s
    active subscriptions want, oldest first, at most ``limit``; ``None`` when ``event_id`` is not
    an event here (unknown, or purged by retention). Blocking: run it in a thread."""
    with db.session(engine) as session:
        cursor = session.get(EventRecord, event_id)
        if cursor is None:
            return None
        patterns = [
            json.loads(event_types)
            for event_types in session.exec(
                select(Subscription.event_types).where(
                    Subscription.state == SubscriptionState.ACTIVE, Subscription.platform_profile == profile
                )
            )
        ]
        later = session.exec(
            select(EventRecord)
            .where(
                sa.or_(
                    col(EventRecord.created_at) > cursor.created_at,
                    sa.and_(
                        col(EventRecord.created_at) == cursor.created_at, col(EventRecord.id) > cursor.id
                    ),
                )
            )
            .order_by(col(EventRecord.created_at), col(EventRecord.id))
        )
        wanted: list[dict[str, Any]] = []
        for record in later:
            if _profiles_want({profile: patterns}, record.event_type, record.audience):
                wanted.append(with_correlation(json.loads(record.payload)))
                if len(wanted) >= limit:
                    break
        return wanted


def _profiles_of(attachments: Iterable[_Attachment]) -> set[str]:
    return {profile for attachment in attachments for profile in attachment.profiles}


def _wants(attachment: _Attachment, record: EventRecord, patterns: dict[str, list[list[str]]]) -> bool:
    if record.created_at < attachment.attached_at:
        return False
    mine = {profile: patterns.get(profile, []) for profile in attachment.profiles}
    return _profiles_want(mine, record.event_type, record.audience)


def _profiles_want(patterns: dict[str, list[list[str]]], event_type: str, audience: str | None) -> bool:
    """Whether an active subscription of one of ``patterns``' profiles asks for the event and its
    audience lets it reach that profile (the rule of REST deliveries)."""
    return any(
        reaches(profile, audience)
        and any(event_matches(event_type, subscription) for subscription in subscriptions)
        for profile, subscriptions in patterns.items()
    )


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _shown(session_key: str) -> str:
    """A session key for logs: a digest, since an HTTP session id lets its holder use the session."""
    return hashlib.sha256(session_key.encode()).hexdigest()[:12]


# -- waking up when any process commits an event ------------------------------------------------


async def _hear_commits(engine: Engine, committed: _Waker, wake: Callable[[], None]) -> None:
    """Tell the hub of every commit that emitted events in any process on this PostgreSQL
    database (the outbox's ``NOTIFY`` on :data:`~usp_workers.engine.outbox.EVENTS_CHANNEL`, with
    the events' types and audiences), as this process's own commits tell it: a listener on one
    API process hears an event committed by another, or by a worker, as soon as one committed
    here. A lost connection is made again; meanwhile (and for what committed then) the polls go
    on."""
    import psycopg
    from psycopg import sql

    conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    while True:
        try:
            connection = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
            try:
                found = await (await connection.execute(f"SELECT {EVENTS_CHANNEL_SQL}")).fetchone()
                assert found is not None
                await connection.execute(sql.SQL("LISTEN {}").format(sql.Identifier(found[0])))
                async for notification in connection.notifies():
                    events = _notified(notification.payload)
                    if events is None:
                        wake()
                    else:
                        committed(events, False)
            finally:
                with anyio.CancelScope(shield=True):  # the hub stopping cancels us: close all the same
                    await connection.close()
        except (psycopg.Error, OSError) as exc:
            logger.warning("live webhooks: LISTEN %s lost (%s); polling meanwhile", EVENTS_CHANNEL, exc)
        await anyio.sleep(1.0)


def _notified(payload: str) -> list[tuple[str, str | None]] | None:
    """The ``(event type, audience)`` pairs a ``NOTIFY`` names; ``None`` when it names none (too
    many to fit, or not ours): then anything may be wanted."""
    try:
        pairs = json.loads(payload)
        return [
            (str(event_type), None if audience is None else str(audience)) for event_type, audience in pairs
        ]
    except (ValueError, TypeError):
        return None


# -- waking up when this process commits an event ------------------------------------------------


class _CommitHook:
    """Tells the running hubs, after any commit in this process, which events it inserted and
    whether it changed a subscription.

    Installed on first use and left in place: with no hub running it costs a flag check per
    inserted row and per commit. The wake-ups are kept in a tuple swapped as a whole, so a
    commit in a worker thread never iterates a set another thread is changing.
    """

    _EVENTS: Final = "usp_dispatcher.live.events_inserted"
    _SUBSCRIPTIONS: Final = "usp_dispatcher.live.subscriptions_changed"

    def __init__(self) -> None:
        self._wakers: tuple[_Waker, ...] = ()
        self._installed = False

    def add(self, waker: _Waker) -> None:
        if not self._installed:
            sa.event.listen(EventRecord, "after_insert", self._inserted)
            for change in ("after_insert", "after_update", "after_delete"):
                sa.event.listen(Subscription, change, self._subscription_changed)
            sa.event.listen(sqlalchemy.orm.Session, "after_commit", self._committed)
            sa.event.listen(sqlalchemy.orm.Session, "after_rollback", self._rolled_back)
            self._installed = True
        self._wakers = (*self._wakers, waker)

    def discard(self, waker: _Waker) -> None:
        self._wakers = tuple(known for known in self._wakers if known is not waker)

    def _inserted(self, _mapper: Any, _connection: Any, target: EventRecord) -> None:
        session = sqlalchemy.orm.object_session(target) if self._wakers else None
        if session is not None:
            session.info.setdefault(self._EVENTS, []).append((target.event_type, target.audience))

    def _subscription_changed(self, _mapper: Any, _connection: Any, target: Subscription) -> None:
        session = sqlalchemy.orm.object_session(target) if self._wakers else None
        if session is not None:
            session.info[self._SUBSCRIPTIONS] = True

    def _committed(self, session: sqlalchemy.orm.Session) -> None:
        events = session.info.pop(self._EVENTS, None)
        changed = session.info.pop(self._SUBSCRIPTIONS, False)
        if events or changed:
            for waker in self._wakers:
                waker(events or [], changed)

    def _rolled_back(self, session: sqlalchemy.orm.Session) -> None:
        session.info.pop(self._EVENTS, None)
        session.info.pop(self._SUBSCRIPTIONS, None)


_commit_hook = _CommitHook()
