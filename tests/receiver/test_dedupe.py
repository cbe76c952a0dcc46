"""The dedupe contract, run against every store: memory, Redis, SQLite and PostgreSQL.

Redis and PostgreSQL are real servers (see ``tests/conftest.py``): races are only meaningful
against the real thing. Each test gets its own key prefix / table and removes it afterwards.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
import redis
import sqlalchemy as sa

from usp_receiver.dedupe import Claim, ClaimState, DedupeStore, MemoryDedupe, Processed, process_once
from usp_receiver.dedupe.redis import RedisDedupe
from usp_receiver.dedupe.sql import SqlDedupe

NEW, DUPLICATE, IN_PROGRESS = ClaimState.NEW, ClaimState.DUPLICATE, ClaimState.IN_PROGRESS

#: Short enough to keep the suite fast, long enough that a claim+check fits well inside it even on
#: a loaded CI machine.
SHORT = 0.3
#: Comfortably past SHORT, so expiry has happened on the server (Redis expires keys lazily or
#: within ~100 ms actively; a lookup of an expired key never returns it).
PAST_SHORT = 0.45


class FakeClock:
    """A monotonic clock that only moves when told to, so memory tests never sleep."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Backend:
    """One store kind, with helpers the tests need on top of the contract.

    ``store()`` makes a store in this test's private namespace; ``peer(store)`` a second store on
    the same data with its own connection (for memory: the same object, since its data lives in
    it); ``sleep()`` lets time pass (real time, or the fake clock for memory).
    """

    def __init__(
        self,
        name: str,
        make: Callable[[float, float], DedupeStore],
        make_peer: Callable[[DedupeStore], DedupeStore],
        sleep: Callable[[float], None],
    ) -> None:
        self.name = name
        self._make = make
        self._make_peer = make_peer
        self.sleep = sleep
        self.stores: list[DedupeStore] = []

    def store(self, lease: float = 60.0, ttl: float = 3600.0) -> DedupeStore:
        store = self._make(lease, ttl)
        self.stores.append(store)
        return store

    def peer(self, store: DedupeStore) -> DedupeStore:
        other = self._make_peer(store)
        if other is not store:
            self.stores.append(other)
        return other

    def fresh_peer(self, store: DedupeStore) -> DedupeStore:
        """A peer with the default (long) lease, to take over from a short-lease store.

        Its own lease must not run out while the test still checks on it. Memory has no separate
        peer, but its fake clock only moves when told, so the short lease cannot run out either.
        """
        return store if self.name == "memory" else self.store()

    async def aclose(self) -> None:
        """Close async clients; they belong to the test's event loop, so the test must do it."""
        for store in self.stores:
            if isinstance(store, RedisDedupe):
                await store.aclose()


def _memory_backend() -> Backend:
    clock = FakeClock()

    def make(lease: float, ttl: float) -> DedupeStore:
        return MemoryDedupe(lease=lease, ttl=ttl, clock=clock)

    def sleep(seconds: float) -> None:
        clock.now += seconds

    return Backend("memory", make, lambda store: store, sleep)


def _redis_prefix() -> str:
    return f"usp:test:dedupe:{uuid.uuid4().hex}:"


def _drop_prefix(client: redis.Redis, prefix: str) -> None:
    keys = list(client.scan_iter(match=prefix + "*"))
    if keys:
        client.delete(*keys)


@dataclass
class LiveStore:
    """A store on the real Redis (URL only: it owns its clients), in a key prefix of its own, and
    an admin client on the same server."""

    store: RedisDedupe
    admin: redis.Redis
    prefix: str


@pytest.fixture
async def live(redis_url: str) -> AsyncIterator[LiveStore]:
    """Closed on the test's own event loop, its keys dropped."""
    prefix = _redis_prefix()
    admin = redis.Redis.from_url(redis_url)
    store = RedisDedupe(url=redis_url, prefix=prefix)
    try:
        yield LiveStore(store, admin, prefix)
    finally:
        await store.aclose()
        _drop_prefix(admin, prefix)
        admin.close()


@pytest.fixture
def memory_backend() -> Backend:
    return _memory_backend()


@pytest.fixture
def redis_backend(redis_url: str) -> Iterator[Backend]:
    prefix = _redis_prefix()
    clients: list[redis.Redis] = []

    def make(lease: float, ttl: float) -> DedupeStore:
        # A client of its own (own connection pool); async methods get their own client from url.
        client = redis.Redis.from_url(redis_url)
        clients.append(client)
        return RedisDedupe(client, url=redis_url, prefix=prefix, lease=lease, ttl=ttl)

    def make_peer(store: DedupeStore) -> DedupeStore:
        assert isinstance(store, RedisDedupe)
        return make(store.lease, store.ttl)

    backend = Backend("redis", make, make_peer, time.sleep)
    yield backend
    cleaner = redis.Redis.from_url(redis_url)
    try:
        _drop_prefix(cleaner, prefix)
    finally:
        cleaner.close()
    for store in backend.stores:
        assert isinstance(store, RedisDedupe)
        store.close()
    for client in clients:  # handed in, so the stores leave them open
        client.close()


def _sql_backend(name: str, url: str) -> Iterator[Backend]:
    table = f"usp_test_dedupe_{uuid.uuid4().hex[:16]}"

    def make(lease: float, ttl: float) -> DedupeStore:
        return SqlDedupe(url, table_name=table, lease=lease, ttl=ttl)

    def make_peer(store: DedupeStore) -> DedupeStore:
        assert isinstance(store, SqlDedupe)
        # Its own engine, hence its own connections; the table exists already.
        return SqlDedupe(url, table_name=table, lease=store.lease, ttl=store.ttl, create_table=False)

    backend = Backend(name, make, make_peer, time.sleep)
    yield backend
    engine = sa.create_engine(url)
    try:
        for store in backend.stores:
            assert isinstance(store, SqlDedupe)
            store.close()
        with engine.begin() as conn:
            conn.execute(sa.text(f'DROP TABLE IF EXISTS "{table}"'))
    finally:
        engine.dispose()


@pytest.fixture
def sqlite_backend(tmp_path: Path) -> Iterator[Backend]:
    yield from _sql_backend("sqlite", f"sqlite:///{tmp_path / 'dedupe.db'}")


@pytest.fixture
def postgresql_backend(postgres_url: str) -> Iterator[Backend]:
    yield from _sql_backend("postgresql", postgres_url)


ALL = ["memory", "redis", "sqlite", "postgresql"]
#: Stores backed by a server that several processes share: there, "concurrent" means separate
#: connections racing on the server, which is what the race tests must exercise.
SHARED = ["redis", "postgresql"]


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> Backend:
    name: str = request.param
    result: Backend = request.getfixturevalue(f"{name}_backend")
    return result


def _params(names: list[str]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("backend", names, indirect=True)


# -- the contract, on every store ---------------------------------------------------------------


@_params(ALL)
def test_store_satisfies_protocol(backend: Backend) -> None:
    assert isinstance(backend.store(), DedupeStore)


@_params(ALL)
def test_new_then_duplicate_after_commit(backend: Backend) -> None:
    store = backend.store()
    first = store.claim("evt-1")
    assert first.state is NEW
    assert first.token
    assert first.event_id == "evt-1"
    store.commit(first)
    again = store.claim("evt-1")
    assert again == Claim("evt-1", DUPLICATE)
    # Ids are independent.
    assert store.claim("evt-2").state is NEW


@_params(ALL)
def test_in_progress_while_held(backend: Backend) -> None:
    store = backend.store()
    held = store.claim("evt")
    assert held.state is NEW
    assert store.claim("evt") == Claim("evt", IN_PROGRESS)
    assert backend.peer(store).claim("evt").state is IN_PROGRESS


@_params(ALL)
def test_release_lets_the_retry_run(backend: Backend) -> None:
    """The handler failed and released: the sender's retry must be processed, not dropped."""
    store = backend.store()
    failed = store.claim("evt")
    store.release(failed)
    retry = store.claim("evt")
    assert retry.state is NEW
    assert retry.token != failed.token
    store.commit(retry)
    assert store.claim("evt").state is DUPLICATE


@_params(ALL)
def test_lease_expiry_frees_a_crashed_claim(backend: Backend) -> None:
    store = backend.store(lease=SHORT)
    assert store.claim("evt").state is NEW  # ... and the process "dies": no commit, no release
    assert store.claim("evt").state is IN_PROGRESS
    backend.sleep(PAST_SHORT)
    assert store.claim("evt").state is NEW


@_params(ALL)
def test_ttl_expiry_forgets_done_ids(backend: Backend) -> None:
    store = backend.store(ttl=SHORT)
    store.commit(store.claim("evt"))
    assert store.claim("evt").state is DUPLICATE
    backend.sleep(PAST_SHORT)
    assert store.claim("evt").state is NEW


@_params(ALL)
def test_stale_token_cannot_touch_the_new_holder(backend: Backend) -> None:
    store = backend.store(lease=SHORT)
    stale = store.claim("evt")
    backend.sleep(PAST_SHORT)
    current = backend.fresh_peer(store).claim("evt")
    assert current.state is NEW
    assert current.token != stale.token

    store.commit(stale)  # the slow handler finally finishes: too late, changes nothing
    assert store.claim("evt").state is IN_PROGRESS
    store.release(stale)
    assert store.claim("evt").state is IN_PROGRESS

    store.commit(current)
    assert store.claim("evt").state is DUPLICATE


@_params(ALL)
def test_forged_and_non_new_claims_are_no_ops(backend: Backend) -> None:
    store = backend.store()
    held = store.claim("evt")
    store.commit(Claim("evt", NEW, "not-the-token"))
    store.release(Claim("evt", NEW, "not-the-token"))
    store.commit(Claim("evt", IN_PROGRESS))
    store.release(Claim("evt", IN_PROGRESS))
    assert store.claim("evt").state is IN_PROGRESS
    store.commit(held)
    # Neither a release nor a second commit after the commit undoes it.
    store.release(held)
    store.commit(held)
    store.release(Claim("evt", DUPLICATE))
    assert store.claim("evt").state is DUPLICATE


@_params(ALL)
def test_commit_after_lease_without_takeover(backend: Backend) -> None:
    """Documented difference: Redis drops the key at lease end, the others still hold the row."""
    store = backend.store(lease=SHORT)
    slow = store.claim("evt")
    backend.sleep(PAST_SHORT)
    store.commit(slow)
    expected = NEW if backend.name == "redis" else DUPLICATE
    assert store.claim("evt").state is expected


@pytest.mark.anyio
@_params(ALL)
async def test_async_flow(backend: Backend) -> None:
    store = backend.store()
    try:
        first = await store.aclaim("evt")
        assert first.state is NEW
        assert (await store.aclaim("evt")).state is IN_PROGRESS
        await store.arelease(first)
        retry = await store.aclaim("evt")
        assert retry.state is NEW
        await store.acommit(retry)
        assert (await store.aclaim("evt")).state is DUPLICATE
        # Sync and async views agree.
        assert store.claim("evt").state is DUPLICATE
    finally:
        await backend.aclose()


# -- races --------------------------------------------------------------------------------------

RACE_IDS = 50


def _race(stores: list[DedupeStore], ids: list[str]) -> dict[str, list[ClaimState]]:
    """Every store claims every id, all at once per id (a barrier releases the threads together)."""
    barrier = threading.Barrier(len(stores))
    results: dict[str, list[ClaimState]] = {event_id: [] for event_id in ids}
    lock = threading.Lock()

    def worker(store: DedupeStore) -> None:
        for event_id in ids:
            barrier.wait(timeout=30)
            state = store.claim(event_id).state
            with lock:
                results[event_id].append(state)

    with ThreadPoolExecutor(max_workers=len(stores)) as pool:
        futures = [pool.submit(worker, store) for store in stores]
        for future in futures:
            future.result(timeout=120)  # re-raises a worker's exception
    return results


def _assert_one_new_each(results: dict[str, list[ClaimState]]) -> None:
    for event_id, states in results.items():
        assert sorted(s.value for s in states) == ["in_progress", "new"], (event_id, states)


@_params(ALL)
def test_concurrent_claims_exactly_one_new(backend: Backend) -> None:
    first = backend.store()
    stores = [first, backend.peer(first)]
    _assert_one_new_each(_race(stores, [f"race-{i}" for i in range(RACE_IDS)]))


@_params(ALL)
def test_concurrent_takeover_exactly_one_new(backend: Backend) -> None:
    """Two claims of an id whose holder crashed: exactly one takes it over (SQL: the UPDATE path)."""
    first = backend.store(lease=SHORT)
    ids = [f"expired-{i}" for i in range(RACE_IDS)]
    for event_id in ids:
        assert first.claim(event_id).state is NEW
    backend.sleep(PAST_SHORT)
    # The winners' leases must outlive the check.
    stores = [backend.fresh_peer(first), backend.fresh_peer(first)]
    _assert_one_new_each(_race(stores, ids))


@pytest.mark.anyio
@_params(SHARED)
async def test_concurrent_aclaims_exactly_one_new(backend: Backend) -> None:
    first = backend.store()
    stores = [first, backend.peer(first)]
    try:
        for i in range(RACE_IDS):
            states: list[ClaimState] = []

            async def claim(store: DedupeStore, event_id: str, into: list[ClaimState]) -> None:
                into.append((await store.aclaim(event_id)).state)

            async with anyio.create_task_group() as tg:
                for store in stores:
                    tg.start_soon(claim, store, f"arace-{i}", states)
            _assert_one_new_each({f"arace-{i}": states})
    finally:
        await backend.aclose()


# -- memory -------------------------------------------------------------------------------------


def test_memory_bound_evicts_oldest_done_first() -> None:
    store = MemoryDedupe(max_entries=3)
    in_flight = store.claim("in-flight")
    for event_id in ("a", "b"):
        store.commit(store.claim(event_id))
    assert len(store) == 3
    store.commit(store.claim("c"))  # full: "a" (oldest done) goes, not the older in-flight claim
    assert len(store) == 3
    assert store.claim("in-flight").state is IN_PROGRESS
    assert store.claim("b").state is DUPLICATE
    assert store.claim("a").state is NEW  # forgotten; this claim evicted "b"
    assert store.claim("b").state is NEW  # evicted "c", the only done one left
    store.commit(in_flight)
    assert store.claim("in-flight").state is DUPLICATE


def test_memory_bound_evicts_expired_claims_first_then_in_progress() -> None:
    clock = FakeClock()
    store = MemoryDedupe(max_entries=2, lease=10, clock=clock)
    store.claim("crashed")
    clock.now += 11
    store.commit(store.claim("done"))
    store.claim("held")  # full: the expired claim goes before the done id
    assert store.claim("done").state is DUPLICATE
    store.claim("x")  # full: the done id goes before any live claim
    assert store.claim("held").state is IN_PROGRESS
    # Only live claims left: the oldest one goes as a last resort.
    store.claim("y")
    assert store.claim("x").state is IN_PROGRESS
    assert store.claim("held").state is NEW
    assert len(store) == 2


def test_memory_is_bounded_under_load() -> None:
    store = MemoryDedupe(max_entries=100)
    for i in range(1000):
        claim = store.claim(str(i))
        if i % 2:
            store.commit(claim)
    assert len(store) == 100


@pytest.mark.parametrize(
    "kwargs", [{"max_entries": 0}, {"lease": 0}, {"ttl": -1.0}], ids=["max_entries", "lease", "ttl"]
)
def test_memory_rejects_bad_settings(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be"):
        MemoryDedupe(**kwargs)


# -- Redis --------------------------------------------------------------------------------------


def test_redis_keys_expire_on_the_server(redis_url: str) -> None:
    """Redis does the cleanup: claims carry the lease, done ids the ttl, as PEXPIRE on the key."""
    prefix = _redis_prefix()
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        store = RedisDedupe(client, prefix=prefix, lease=30, ttl=600)
        claim = store.claim("evt")
        assert client.get(prefix + "evt") == "p:" + claim.token
        assert 0 < client.pttl(prefix + "evt") <= 30_000
        assert store.claim("evt").state is IN_PROGRESS  # works with decode_responses too
        store.commit(claim)
        assert client.get(prefix + "evt") == "d"
        assert 30_000 < client.pttl(prefix + "evt") <= 600_000
        assert store.claim("evt").state is DUPLICATE
    finally:
        store.close()
        _drop_prefix(client, prefix)
        client.close()


def test_redis_url_only_store_owns_its_clients(redis_url: str) -> None:
    prefix = _redis_prefix()
    store = RedisDedupe(url=redis_url, prefix=prefix)
    try:
        store.commit(store.claim("evt"))
        assert store.claim("evt").state is DUPLICATE
    finally:
        store.close()
        cleaner = redis.Redis.from_url(redis_url)
        _drop_prefix(cleaner, prefix)
        cleaner.close()


@pytest.mark.anyio
async def test_redis_async_client_only(redis_url: str) -> None:
    prefix = _redis_prefix()
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        store = RedisDedupe(async_client=client, prefix=prefix)
        claim = await store.aclaim("evt")
        assert claim.state is NEW
        await store.acommit(claim)
        assert (await store.aclaim("evt")).state is DUPLICATE
        with pytest.raises(RuntimeError, match="only an async_client"):
            store.claim("evt")
        await store.aclose()  # not ours to close: the client must still work
        assert await client.exists(prefix + "evt") == 1
    finally:
        keys = [key async for key in client.scan_iter(match=prefix + "*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


@pytest.mark.anyio
async def test_redis_sync_client_only_async_runs_in_a_thread(redis_url: str) -> None:
    prefix = _redis_prefix()
    client = redis.Redis.from_url(redis_url)
    try:
        store = RedisDedupe(client, prefix=prefix)
        claim = await store.aclaim("evt")
        assert claim.state is NEW
        await store.arelease(claim)
        claim = await store.aclaim("evt")
        await store.acommit(claim)
        assert store.claim("evt").state is DUPLICATE
    finally:
        store.close()
        _drop_prefix(client, prefix)
        client.close()


def _kill_line(admin: redis.Redis, address: tuple[str, int]) -> None:
    """Close one connection from the server's side, as a Redis restart or a proxy would."""
    assert admin.client_kill(f"{address[0]}:{address[1]}")


def test_redis_sync_line_outlives_a_script_flush_and_a_killed_connection(redis_url: str) -> None:
    prefix = _redis_prefix()
    admin = redis.Redis.from_url(redis_url)
    store = RedisDedupe(url=redis_url, prefix=prefix)
    try:
        first = store.claim("evt-1")
        store.commit(first)  # written, its reply still unread
        admin.script_flush()  # the next EVALSHA gets NOSCRIPT
        assert store.claim("evt-1").state is DUPLICATE
        second = store.claim("evt-2")
        store.commit(second)
        line = store._line
        assert line is not None
        assert line._socket is not None
        _kill_line(admin, line._socket.getsockname())
        # The unread commit and the claim are sent again on a new connection; both are idempotent.
        assert store.claim("evt-2").state is DUPLICATE
        assert store.claim("evt-3").state is NEW
        assert admin.get(prefix + "evt-2") == b"d"
    finally:
        store.close()
        _drop_prefix(admin, prefix)
        admin.close()


@pytest.mark.anyio
async def test_redis_async_line_outlives_a_script_flush_and_a_killed_connection(live: LiveStore) -> None:
    store, admin, prefix = live.store, live.admin, live.prefix
    await store.acommit(await store.aclaim("evt-1"))
    admin.script_flush()
    assert (await store.aclaim("evt-1")).state is DUPLICATE
    await store.acommit(await store.aclaim("evt-2"))
    line = store._async_line
    assert line is not None
    assert line._writer is not None
    _kill_line(admin, line._writer.get_extra_info("sockname"))
    assert (await store.aclaim("evt-2")).state is DUPLICATE
    assert (await store.aclaim("evt-3")).state is NEW
    assert admin.get(prefix + "evt-2") == b"d"


@pytest.mark.anyio
async def test_redis_async_line_keeps_call_order_when_a_script_is_refused(live: LiveStore) -> None:
    """After a script flush the claim script is cached again first; a release refused (NOSCRIPT)
    must still take effect before the claim written after it, which Redis already ran."""
    store, admin, prefix = live.store, live.admin, live.prefix
    first = await store.aclaim("evt")
    admin.script_flush()
    assert (await store.aclaim("other")).state is NEW  # refused, sent again: claim cached
    await store.arelease(first)  # not written yet: the next turn writes it with the claim
    retry = await store.aclaim("evt")
    assert retry.state is NEW
    await store.acommit(retry)
    assert (await store.aclaim("evt")).state is DUPLICATE
    assert admin.get(prefix + "evt") == b"d"


@pytest.mark.anyio
async def test_redis_async_calls_are_pipelined_and_commits_land_by_close(live: LiveStore) -> None:
    """Many tasks at once share the one connection; every reply reaches its own caller."""
    store, admin, prefix = live.store, live.admin, live.prefix
    ids = [f"evt-{i}" for i in range(300)]
    claims = await _gather([store.aclaim(event_id) for event_id in ids])
    assert [c.state for c in claims] == [NEW] * len(ids)
    assert [c.event_id for c in claims] == ids
    again = await _gather([store.aclaim(event_id) for event_id in ids[:50]])
    assert {c.state for c in again} == {IN_PROGRESS}
    await _gather([store.acommit(claim) for claim in claims[:150]])
    await _gather([store.arelease(claim) for claim in claims[150:]])
    await store.aclose()  # reads what is unanswered before it lets go
    values = admin.mget([prefix + event_id for event_id in ids])
    assert values == [b"d"] * 150 + [None] * 150
    assert (await store.aclaim(ids[0])).state is DUPLICATE  # a closed store opens again


@pytest.mark.anyio
async def test_redis_line_authenticates_and_selects_its_database(redis_url: str) -> None:
    """AUTH with a username (an ACL user made for the test) and SELECT come from the URL."""
    admin = redis.Redis.from_url(redis_url)
    user, password = f"usp-test-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    prefix = _redis_prefix()
    admin.acl_setuser(user, enabled=True, passwords=[f"+{password}"], keys=["usp:test:*"], commands=["+@all"])
    host = admin.connection_pool.connection_kwargs.get("host", "127.0.0.1")
    port = admin.connection_pool.connection_kwargs.get("port", 6379)
    good = RedisDedupe(url=f"redis://{user}:{password}@{host}:{port}/14", prefix=prefix)
    bad = RedisDedupe(url=f"redis://{user}:wrong@{host}:{port}/14", prefix=prefix)
    db14 = redis.Redis(host=host, port=port, db=14)
    try:
        assert (await good.aclaim("evt")).state is NEW
        assert db14.exists(prefix + "evt") == 1
        same_db = admin.connection_pool.connection_kwargs.get("db") == 14
        assert admin.exists(prefix + "evt") == int(same_db)
        with pytest.raises(redis.ResponseError, match="AUTH"):
            await bad.aclaim("evt")
        # The sync line connects on its own, with the same settings.
        assert good.claim("evt").state is IN_PROGRESS
        assert good.claim("evt-sync").state is NEW
        assert db14.exists(prefix + "evt-sync") == 1
        with pytest.raises(redis.ResponseError, match="AUTH"):
            bad.claim("evt")
        with pytest.raises(redis.ResponseError, match="AUTH"):
            bad.claim("evt")  # nothing of the refused call is left to read
    finally:
        await good.aclose()
        await bad.aclose()
        _drop_prefix(db14, prefix)
        db14.close()
        admin.acl_deluser(user)
        admin.close()


async def _gather(calls: list[Any]) -> list[Any]:
    results: list[Any] = [None] * len(calls)

    async def run(i: int, call: Any) -> None:
        results[i] = await call

    async with anyio.create_task_group() as tg:
        for i, call in enumerate(calls):
            tg.start_soon(run, i, call)
    return results


def test_redis_needs_a_connection() -> None:
    with pytest.raises(ValueError, match="needs a client"):
        RedisDedupe()


# -- SQL ----------------------------------------------------------------------------------------


@_params(["sqlite", "postgresql"])
def test_sql_prune_deletes_only_expired_rows(backend: Backend) -> None:
    store = backend.store(lease=SHORT, ttl=SHORT)
    assert isinstance(store, SqlDedupe)
    for i in range(7):
        store.commit(store.claim(f"done-{i}"))
    for i in range(5):
        store.claim(f"crashed-{i}")
    backend.sleep(PAST_SHORT)
    live = backend.store()  # default lease/ttl, same table: these rows must survive
    live.commit(live.claim("kept-done"))
    live.claim("kept-held")

    assert store.prune(limit=3) == 12  # four batches: 3 + 3 + 3 + 3
    assert store.prune() == 0
    with store.engine.connect() as conn:
        left = conn.execute(sa.select(store.table.c.event_id).order_by(store.table.c.event_id)).scalars()
        assert list(left) == ["kept-done", "kept-held"]
    assert live.claim("kept-done").state is DUPLICATE
    assert live.claim("kept-held").state is IN_PROGRESS
    assert store.claim("done-0").state is NEW


@pytest.mark.anyio
async def test_sql_aprune(sqlite_backend: Backend) -> None:
    store = sqlite_backend.store(ttl=SHORT)
    assert isinstance(store, SqlDedupe)
    await store.acommit(await store.aclaim("evt"))
    await anyio.sleep(PAST_SHORT)
    assert await store.aprune() == 1


def test_sql_in_memory_sqlite_is_shared_across_threads() -> None:
    """``sqlite://`` is one database per connection: the store must pin one and serialize on it."""
    store = SqlDedupe("sqlite://")
    try:
        _assert_one_new_each(_race([store, store], [f"m-{i}" for i in range(20)]))
        with ThreadPoolExecutor(max_workers=1) as pool:
            assert pool.submit(store.claim, "m-0").result().state is IN_PROGRESS
    finally:
        store.close()


def test_sql_table_creation_is_idempotent_and_optional(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'd.db'}"
    engine = sa.create_engine(url)
    try:
        first = SqlDedupe(engine, table_name="t")
        second = SqlDedupe(engine, table_name="t")  # table exists: no error
        first.commit(first.claim("evt"))
        assert second.claim("evt").state is DUPLICATE
        second.close()  # not its engine: must not dispose it
        assert first.claim("evt").state is DUPLICATE
        missing = SqlDedupe(engine, table_name="nope", create_table=False)
        with pytest.raises(sa.exc.OperationalError):
            missing.claim("evt")
        assert set(sa.inspect(engine).get_table_names()) == {"t"}
    finally:
        engine.dispose()


def test_sql_rejects_overlong_ids(sqlite_backend: Backend) -> None:
    store = sqlite_backend.store()
    assert store.claim("x" * 255).state is NEW
    with pytest.raises(ValueError, match="longer than 255"):
        store.claim("x" * 256)


# -- packaging ----------------------------------------------------------------------------------

_WITHOUT_EXTRAS = r"""
import json, sys
sys.modules["redis"] = None
sys.modules["sqlalchemy"] = None
import usp_receiver.dedupe as d
report = {"all": d.__all__, "errors": {}}
for name in ("usp_receiver.dedupe.redis", "usp_receiver.dedupe.sql"):
    try:
        __import__(name)
    except ImportError as exc:
        report["errors"][name] = str(exc)
print(json.dumps(report))
"""


def test_package_imports_without_extras_and_stores_say_what_to_install() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRAS], capture_output=True, text=True, timeout=60, check=True
    )
    report = json.loads(proc.stdout)
    assert "MemoryDedupe" in report["all"]
    errors = report["errors"]
    assert "install usp-receiver[redis]" in errors["usp_receiver.dedupe.redis"]
    assert "install usp-receiver[sql]" in errors["usp_receiver.dedupe.sql"]


def test_the_default_dedupe_window_outlasts_the_services_retention() -> None:
    """An operator can replay any event the service still keeps; the receiver's default memory of
    handled ids must cover that whole age, or the replay is processed twice."""
    from usp_dispatcher.cli.config import Settings
    from usp_receiver.dedupe import DEFAULT_TTL_SECONDS

    retention_seconds = Settings.model_fields["retention_days"].default * 86400
    assert retention_seconds < DEFAULT_TTL_SECONDS
    assert MemoryDedupe()._ttl == DEFAULT_TTL_SECONDS
    assert _default(RedisDedupe.__init__, "ttl") == DEFAULT_TTL_SECONDS
    assert _default(SqlDedupe.__init__, "ttl") == DEFAULT_TTL_SECONDS


def _default(function: Callable[..., Any], name: str) -> Any:
    import inspect

    return inspect.signature(function).parameters[name].default


@pytest.mark.anyio
async def test_redis_async_line_times_out_on_a_server_that_never_answers() -> None:
    """A Redis that accepts and then says nothing (a hung server, a black-holing proxy): the
    claim fails within ``socket_timeout`` and ``process_once`` reports the store unavailable, so
    the receiver answers a retryable error instead of hanging the sender's request."""
    accepted: list[anyio.abc.SocketStream] = []

    async def hold(stream: anyio.abc.SocketStream) -> None:
        accepted.append(stream)
        await anyio.sleep_forever()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)  # noqa: S610 (anyio, not Django)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hold)
        store = RedisDedupe(url=f"redis://127.0.0.1:{port}/0?socket_timeout=0.3", prefix="p:")
        ran: list[int] = []

        async def work() -> None:
            ran.append(1)

        started = time.monotonic()
        assert await process_once(store, "evt", work) is Processed.UNAVAILABLE
        assert time.monotonic() - started < 5
        assert ran == []
        assert accepted, "it did connect"
        await store.aclose()
        tg.cancel_scope.cancel()
    for stream in accepted:
        await stream.aclose()
    await listener.aclose()


def test_a_sync_claim_on_a_silent_redis_fails_within_its_timeout() -> None:
    """The sync line waits ``socket_timeout`` for a reply, once more on a new connection, then
    raises: a receiver answers a retryable error rather than hanging; nothing stays queued."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def hold() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(listener.accept()[0])

    threading.Thread(target=hold, daemon=True).start()
    port = listener.getsockname()[1]
    store = RedisDedupe(url=f"redis://127.0.0.1:{port}/0?socket_timeout=0.3", prefix="p:")
    try:
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            store.claim("evt")
        assert time.monotonic() - started < 5
        assert len(accepted) == 2, "it connected, and reconnected once"
        assert store._line is not None
        assert store._line._unread == []
    finally:
        store.close()
        listener.close()
        for connection in accepted:
            connection.close()


@pytest.mark.anyio
async def test_a_call_given_up_on_is_not_sent_again_after_the_reconnect(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A commit that timed out was logged as lost (its claim expires with its lease); the
    reconnect that follows must not send it again, or it would time out and be logged, and the
    fresh connection dropped, again after every later call."""
    accepted: list[anyio.abc.SocketStream] = []

    async def hold(stream: anyio.abc.SocketStream) -> None:
        accepted.append(stream)
        await anyio.sleep_forever()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)  # noqa: S610 (anyio, not Django)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, hold)
        store = RedisDedupe(url=f"redis://127.0.0.1:{port}/0?socket_timeout=0.3", prefix="p:")
        with caplog.at_level(logging.WARNING, logger="usp_receiver"):
            await store.acommit(Claim("evt-0", NEW, "token"))
            for number in (1, 2):
                with pytest.raises(redis.TimeoutError):
                    await store.aclaim(f"evt-{number}")
        lost = [r for r in caplog.records if "a commit or release failed" in r.getMessage()]
        assert len(lost) == 1
        await store.aclose()
        tg.cancel_scope.cancel()
    for stream in accepted:
        await stream.aclose()
    await listener.aclose()
