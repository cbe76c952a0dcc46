"""Agents' signature nonces, remembered where every API process sees them, so each refuses a replay.

A nonce is kept (hashed with the key's thumbprint) until a signature carrying it could no longer
be accepted. With a Redis broker it is a Redis key that expires then (one ``SET NX`` a request);
otherwise a row of ``access_nonces``, written in group commits: the nonces of the requests that
arrive while one insert runs go in the next, so a busy process commits once for many requests
and the table's unique key still refuses a nonce seen by any process. Expired rows are swept
now and then by the inserts themselves.
"""

from __future__ import annotations

import asyncio
import hashlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import anyio.to_thread
import redis.asyncio
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine

from usp_core.clock import utcnow
from usp_core.settings import CommonSettings
from usp_dispatcher.access.signatures import NonceCheck
from usp_dispatcher.access.tables import NonceRow
from usp_dispatcher.errors import NonceStoreUnavailable

__all__ = ["RedisNonces", "database_nonces", "nonces_for", "redis_nonces"]

#: Sweep expired rows after this many inserted nonces.
_SWEEP_EVERY = 200
_REDIS_PREFIX = "usp:nonce:"
_table = NonceRow.__table__  # type: ignore[attr-defined]
_checks: weakref.WeakKeyDictionary[Engine, dict[str, NonceCheck]] = weakref.WeakKeyDictionary()


def nonces_for(engine: Engine, settings: CommonSettings) -> NonceCheck:
    """The process's one nonce check for ``engine`` and ``settings``' broker: Redis where the
    broker is Redis, else the database (one per process, so concurrent requests share its group
    commits)."""
    url = settings.broker_url or ""
    on_redis = url.startswith(("redis://", "rediss://"))
    per_engine = _checks.setdefault(engine, {})
    key = url if on_redis else ""
    if key not in per_engine:
        per_engine[key] = redis_nonces(url) if on_redis else database_nonces(engine)
    return per_engine[key]


def _key(thumbprint: str, nonce: str) -> str:
    return hashlib.sha256(f"{thumbprint}\n{nonce}".encode()).hexdigest()


def redis_nonces(url: str) -> RedisNonces:
    """A :data:`~.signatures.NonceCheck` over the Redis at ``url``."""
    return RedisNonces(url)


class RedisNonces:
    """A key per nonce, set only if absent, expiring when the nonce may be forgotten; a client per
    event loop (a client's connections belong to one)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, redis.asyncio.Redis] = (
            weakref.WeakKeyDictionary()
        )

    async def __call__(self, thumbprint: str, nonce: str, keep_until: float) -> bool:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = redis.asyncio.Redis.from_url(self.url)
        try:
            first = await client.set(
                _REDIS_PREFIX + _key(thumbprint, nonce), b"1", nx=True, pxat=max(1, int(keep_until * 1000))
            )
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise NonceStoreUnavailable(f"the nonce store does not answer: {exc}") from exc
        return bool(first)

    async def aclose(self) -> None:
        """Close this event loop's client."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()


def database_nonces(engine: Engine) -> NonceCheck:
    """A :data:`~.signatures.NonceCheck` over ``engine``'s ``access_nonces`` table, in group
    commits per event loop."""
    groups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _GroupCommit] = weakref.WeakKeyDictionary()
    sweep = _Sweep()

    async def check(thumbprint: str, nonce: str, keep_until: float) -> bool:
        loop = asyncio.get_running_loop()
        group = groups.get(loop)
        if group is None:
            group = groups[loop] = _GroupCommit(engine, sweep)
        return await group.remember(_key(thumbprint, nonce), datetime.fromtimestamp(keep_until, UTC))

    return check


@dataclass
class _Sweep:
    """Nonces inserted since the last sweep of expired rows (by any of the check's groups)."""

    inserted: int = 0

    def due(self) -> bool:
        if self.inserted < _SWEEP_EVERY:
            return False
        self.inserted = 0
        return True


class _GroupCommit:
    """The nonces waiting for the next insert, and the task that inserts them (one at a time)."""

    def __init__(self, engine: Engine, sweep: _Sweep) -> None:
        self.engine = engine
        self.sweep = sweep
        self._waiting: list[tuple[str, datetime, asyncio.Future[bool]]] = []
        self._task: asyncio.Task[None] | None = None

    async def remember(self, key: str, expires: datetime) -> bool:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((key, expires, future))
        if self._task is None:
            self._task = asyncio.create_task(self._insert_waiting())
        return await future

    async def _insert_waiting(self) -> None:
        try:
            while self._waiting:
                group, self._waiting = self._waiting, []
                rows = [(key, expires) for key, expires, _ in group]
                try:
                    new = await anyio.to_thread.run_sync(_insert_new, self.engine, rows, self.sweep.due())
                except Exception as exc:
                    for _, _, future in group:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                self.sweep.inserted += len(new)
                for key, _, future in group:
                    # A key twice in one group: the first is new, the second a replay.
                    first = key in new
                    new.discard(key)
                    if not future.done():
                        future.set_result(first)
        finally:
            self._task = None


def _insert_new(engine: Engine, rows: Sequence[tuple[str, datetime]], sweep: bool) -> set[str]:
    """Insert the rows whose key is not there yet, in one transaction; the keys inserted."""
    values = [{"key": key, "expires_at": expires} for key, expires in dict(rows).items()]
    with engine.begin() as connection:
        if sweep:
            connection.execute(sa.delete(_table).where(_table.c.expires_at < utcnow()))
        dialect = connection.dialect.name
        if dialect in ("postgresql", "sqlite"):
            insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(_table)
            # Parameters apart from the statement, so its compiled form is cached (SQLAlchemy
            # still sends one INSERT for the group: "insertmanyvalues").
            statement = insert.on_conflict_do_nothing().returning(_table.c.key)
            return {str(key) for key in connection.execute(statement, values).scalars()}
        new: set[str] = set()
        for row in values:  # other dialects: a savepoint per row
            try:
                with connection.begin_nested():
                    connection.execute(sa.insert(_table).values(row))
            except sa.exc.IntegrityError:
                continue
            new.add(str(row["key"]))
        return new
