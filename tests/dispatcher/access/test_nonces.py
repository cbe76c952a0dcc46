"""Signature nonces: each is accepted once by every API process on the database or the Redis,
whether its requests come one at a time or many in one group commit."""

from __future__ import annotations

import time
import uuid

import anyio
import pytest
import redis
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tests.dispatcher.conftest import MakeSettings
from usp_core import db
from usp_dispatcher.access import nonces
from usp_dispatcher.access.signatures import NonceCheck
from usp_dispatcher.access.tables import NonceRow

_table = NonceRow.__table__  # type: ignore[attr-defined]


async def _all(check: NonceCheck, calls: list[tuple[str, str]], keep_until: float) -> list[bool]:
    results: list[bool] = [False] * len(calls)

    async def one(i: int, thumbprint: str, nonce: str) -> None:
        results[i] = await check(thumbprint, nonce, keep_until)

    async with anyio.create_task_group() as group:
        for i, (thumbprint, nonce) in enumerate(calls):
            group.start_soon(one, i, thumbprint, nonce)
    return results


def test_concurrent_nonces_are_remembered_in_group_commits_and_a_replay_is_refused(
    migrated: Engine, database_url: str
) -> None:
    """Fifty requests at once: a handful of inserts, every new nonce accepted, the same nonce
    twice in one group accepted once, and a second process (its own check) refuses them all."""
    check = nonces.database_nonces(migrated)
    keep_until = time.time() + 300
    calls = [("kA", f"n{i}") for i in range(50)] + [("kA", "n7"), ("kB", "n7")]
    statements: list[str] = []
    sa.event.listen(migrated, "before_cursor_execute", lambda *args: statements.append(args[2]))
    results = anyio.run(_all, check, calls, keep_until)
    assert results[:50] == [True] * 50
    assert results[50:] == [False, True], "n7 of kA twice is a replay; of kB another key's nonce"
    inserts = [s for s in statements if s.lstrip().upper().startswith("INSERT")]
    assert 1 <= len(inserts) < 10, f"{len(inserts)} inserts for 52 nonces: not grouped"
    other_process = db.make_engine(database_url)
    try:
        again = anyio.run(_all, nonces.database_nonces(other_process), calls[:3], keep_until)
        assert again == [False, False, False]
        with other_process.connect() as connection:
            assert connection.execute(sa.select(sa.func.count()).select_from(_table)).scalar() == 51
    finally:
        other_process.dispose()


def test_expired_nonces_are_swept_by_later_inserts(migrated: Engine) -> None:
    check = nonces.database_nonces(migrated)
    anyio.run(_all, check, [("k", "old")], time.time() - 1)
    fresh = [("k", f"n{i}") for i in range(nonces._SWEEP_EVERY + 1)]
    anyio.run(_all, check, fresh, time.time() + 300)
    anyio.run(_all, check, [("k", "last")], time.time() + 300)
    with migrated.connect() as connection:
        keys = set(connection.execute(sa.select(_table.c.key)).scalars())
    assert nonces._key("k", "old") not in keys
    assert nonces._key("k", "last") in keys


def test_on_a_redis_broker_nonces_are_redis_keys_that_expire(
    migrated: Engine, make_settings: MakeSettings, redis_url: str
) -> None:
    settings = make_settings(broker_url=redis_url)
    check = nonces.nonces_for(migrated, settings)
    assert check is nonces.nonces_for(migrated, settings), "one per process"
    assert check is not nonces.nonces_for(migrated, make_settings())
    assert isinstance(check, nonces.RedisNonces)
    thumbprint, nonce = f"k-{uuid.uuid4().hex}", "once"
    keep_until = time.time() + 120
    other_process = nonces.redis_nonces(redis_url)

    async def twice_then_elsewhere() -> tuple[list[bool], list[bool]]:
        try:
            here = await _all(check, [(thumbprint, nonce), (thumbprint, nonce)], keep_until)
            return here, await _all(other_process, [(thumbprint, nonce)], keep_until)
        finally:
            await check.aclose()
            await other_process.aclose()

    here, elsewhere = anyio.run(twice_then_elsewhere)
    assert sorted(here) == [False, True]
    assert elsewhere == [False]
    client = redis.Redis.from_url(redis_url)
    try:
        key = "usp:nonce:" + nonces._key(thumbprint, nonce)
        assert 110_000 < client.pttl(key) <= 120_000
        client.delete(key)
    finally:
        client.close()
    with migrated.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(_table)).scalar() == 0


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_failed_insert_fails_its_requests_and_the_next_group_goes_on(migrated: Engine) -> None:
    """A database error answers every request of the group with it (the caller refuses them);
    the nonces are not remembered, and the next group is inserted."""
    check = nonces.database_nonces(migrated)
    with migrated.begin() as connection:
        connection.execute(sa.text("ALTER TABLE access_nonces RENAME TO access_nonces_away"))

    async def failing() -> None:
        with pytest.raises(sa.exc.OperationalError):
            await check("k", "n1", time.time() + 300)

    anyio.run(failing)
    with migrated.begin() as connection:
        connection.execute(sa.text("ALTER TABLE access_nonces_away RENAME TO access_nonces"))
    assert anyio.run(_all, check, [("k", "n1")], time.time() + 300) == [True]
