"""SQL dedupe store (SQLAlchemy Core): for deployments that have a database and no Redis.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_receiver.dedupe.sql``.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio.to_thread

try:
    import sqlalchemy as sa
    from sqlalchemy.dialects import postgresql as pg_dialect
    from sqlalchemy.dialects import sqlite as sqlite_dialect
    from sqlalchemy.pool import StaticPool
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError("usp_receiver.dedupe.sql needs SQLAlchemy: install usp-receiver[sql]") from exc

from usp_receiver.dedupe._protocol import DEFAULT_LEASE_SECONDS, DEFAULT_TTL_SECONDS, Claim, ClaimState

__all__ = ["SqlDedupe"]

_IN_PROGRESS = "in_progress"
_DONE = "done"
#: The column is varchar(255): refuse longer ids instead of letting each database truncate or fail
#: in its own way.
MAX_EVENT_ID_LENGTH = 255
#: A claim re-reads the row when it loses a race (the row vanished or was taken over in between).
#: Each lost race means another claim made progress, so a handful of rounds is plenty; after that
#: the answer is IN_PROGRESS, which is always safe (the sender retries later).
_MAX_ROUNDS = 5


def _is_memory_sqlite(url: sa.URL) -> bool:
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")


class SqlDedupe:
    """Dedupe across processes through any SQLAlchemy database (tested: PostgreSQL, SQLite).

    Pass an ``Engine`` (yours: this store never disposes it) or a URL (the store creates the engine
    and ``close()`` disposes it). ``sqlite://`` gets a single shared connection usable from any
    thread (``StaticPool``), and calls are then serialized by a lock, since one connection cannot
    run two transactions. ``create_table`` creates the table if it is missing; turn it off when
    migrations own the schema.

    Rows are not deleted when they expire: call ``prune()`` from time to time (a cron job, or every
    N claims) to keep the table small. Expiry uses this host's wall clock, so keep the clocks of
    the hosts sharing a table in sync (NTP); a skew of seconds is harmless against the default
    lease and ttl.
    """

    def __init__(
        self,
        engine_or_url: sa.Engine | str,
        *,
        table_name: str = "usp_receiver_dedupe",
        lease: float = DEFAULT_LEASE_SECONDS,
        ttl: float = DEFAULT_TTL_SECONDS,
        create_table: bool = True,
    ) -> None:
        if lease <= 0 or ttl <= 0:
            raise ValueError(f"lease and ttl must be positive, got lease={lease}, ttl={ttl}")
        if isinstance(engine_or_url, str):
            url = sa.make_url(engine_or_url)
            if _is_memory_sqlite(url):
                engine = sa.create_engine(
                    url, poolclass=StaticPool, connect_args={"check_same_thread": False}
                )
            else:
                engine = sa.create_engine(url)
            self._owns_engine = True
        else:
            engine = engine_or_url
            self._owns_engine = False
        self.engine: sa.Engine = engine
        self.lease = lease
        self.ttl = ttl
        self.table = sa.Table(
            table_name,
            sa.MetaData(),
            sa.Column("event_id", sa.String(MAX_EVENT_ID_LENGTH), primary_key=True),
            sa.Column("state", sa.String(16), nullable=False),
            sa.Column("token", sa.String(64), nullable=False),
            # Indexed for prune().
            sa.Column("expires_at", sa.Double(), nullable=False, index=True),
        )
        self._serial: contextlib.AbstractContextManager[Any] = (
            threading.Lock() if isinstance(engine.pool, StaticPool) else contextlib.nullcontext()
        )
        self._dialect = engine.dialect.name
        if create_table:
            self._create_table()

    def _create_table(self) -> None:
        try:
            with self._serial:
                self.table.create(self.engine, checkfirst=True)
        except sa.exc.DBAPIError:
            # Another process created it between our check and our CREATE: that's fine.
            if not sa.inspect(self.engine).has_table(self.table.name):
                raise

    def close(self) -> None:
        """Dispose the engine if this store created it."""
        if self._owns_engine:
            self.engine.dispose()

    @contextlib.contextmanager
    def _begin(self) -> Iterator[sa.Connection]:
        with self._serial, self.engine.begin() as conn:
            yield conn

    # -- claim -----------------------------------------------------------------------------------

    def _insert(self, conn: sa.Connection, event_id: str, token: str, expires_at: float) -> bool:
        """Insert a fresh in-progress row; False if a row for the id already exists."""
        values = {"event_id": event_id, "state": _IN_PROGRESS, "token": token, "expires_at": expires_at}
        if self._dialect in ("postgresql", "sqlite"):
            dialect = pg_dialect if self._dialect == "postgresql" else sqlite_dialect
            stmt = (
                dialect.insert(self.table)
                .values(values)
                .on_conflict_do_nothing(index_elements=["event_id"])
                # SQLAlchemy only keeps rowcount for UPDATE/DELETE unless asked to.
                .execution_options(preserve_rowcount=True)
            )
            return conn.execute(stmt).rowcount == 1
        try:
            with conn.begin_nested():
                conn.execute(sa.insert(self.table).values(values))
        except sa.exc.IntegrityError:
            return False
        return True

    def claim(self, event_id: str) -> Claim:
        """NEW (run the handler), DUPLICATE (already processed) or IN_PROGRESS (held elsewhere)."""
        if len(event_id) > MAX_EVENT_ID_LENGTH:
            raise ValueError(f"event_id is longer than {MAX_EVENT_ID_LENGTH} characters")
        t = self.table
        token = secrets.token_hex(16)
        with self._begin() as conn:
            for _ in range(_MAX_ROUNDS):
                now = time.time()
                if self._insert(conn, event_id, token, now + self.lease):
                    return Claim(event_id, ClaimState.NEW, token)
                row = conn.execute(
                    sa.select(t.c.state, t.c.token, t.c.expires_at).where(t.c.event_id == event_id)
                ).first()
                if row is None:
                    continue  # released or pruned since our insert: insert again
                if row.expires_at > now:
                    state = ClaimState.DUPLICATE if row.state == _DONE else ClaimState.IN_PROGRESS
                    return Claim(event_id, state)
                # Expired (a crashed holder's lease, or a done id past its ttl): take it over, but
                # only if nobody changed the row since we read it.
                took = conn.execute(
                    sa.update(t)
                    .where(
                        t.c.event_id == event_id,
                        t.c.state == row.state,
                        t.c.token == row.token,
                        t.c.expires_at == row.expires_at,
                    )
                    .values(state=_IN_PROGRESS, token=token, expires_at=now + self.lease)
                )
                if took.rowcount == 1:
                    return Claim(event_id, ClaimState.NEW, token)
        return Claim(event_id, ClaimState.IN_PROGRESS)

    # -- commit / release ------------------------------------------------------------------------

    def commit(self, claim: Claim) -> None:
        """Mark the id done for ``ttl``; a no-op unless ``claim`` still holds the id.

        A claim whose lease ran out still commits if nobody took the event over.
        """
        if claim.state is not ClaimState.NEW or not claim.token:
            return
        t = self.table
        with self._begin() as conn:
            conn.execute(
                sa.update(t)
                .where(t.c.event_id == claim.event_id, t.c.token == claim.token, t.c.state == _IN_PROGRESS)
                .values(state=_DONE, expires_at=time.time() + self.ttl)
            )

    def release(self, claim: Claim) -> None:
        """Forget the id so the sender's retry runs again; a no-op unless ``claim`` still holds it."""
        if claim.state is not ClaimState.NEW or not claim.token:
            return
        t = self.table
        with self._begin() as conn:
            conn.execute(
                sa.delete(t).where(
                    t.c.event_id == claim.event_id, t.c.token == claim.token, t.c.state == _IN_PROGRESS
                )
            )

    # -- maintenance -----------------------------------------------------------------------------

    def prune(self, limit: int = 1000) -> int:
        """Delete every expired row, ``limit`` rows per transaction; returns how many were deleted.

        Small batches keep each transaction's locks short, so pruning a large backlog does not stall
        concurrent claims.
        """
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        t = self.table
        total = 0
        while True:
            now = time.time()
            with self._begin() as conn:
                ids = list(
                    conn.execute(sa.select(t.c.event_id).where(t.c.expires_at <= now).limit(limit)).scalars()
                )
                if not ids:
                    return total
                # Re-check expiry: a claim may have taken a row over since the select.
                deleted = conn.execute(sa.delete(t).where(t.c.event_id.in_(ids), t.c.expires_at <= now))
                total += deleted.rowcount
            if len(ids) < limit:
                return total

    # -- async -----------------------------------------------------------------------------------
    # The sync engine in a worker thread: no async driver needed, and each thread gets its own
    # pooled connection, so concurrent async claims really run concurrently in the database.

    async def aclaim(self, event_id: str) -> Claim:
        """``claim`` in a worker thread."""
        return await anyio.to_thread.run_sync(self.claim, event_id)

    async def acommit(self, claim: Claim) -> None:
        """``commit`` in a worker thread."""
        await anyio.to_thread.run_sync(self.commit, claim)

    async def arelease(self, claim: Claim) -> None:
        """``release`` in a worker thread."""
        await anyio.to_thread.run_sync(self.release, claim)

    async def aprune(self, limit: int = 1000) -> int:
        """``prune`` in a worker thread."""
        return await anyio.to_thread.run_sync(self.prune, limit)
