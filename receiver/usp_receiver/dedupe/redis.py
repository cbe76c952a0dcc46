"""Redis dedupe store: one key per event id, shared by every worker that talks to the same Redis.

The key holds ``"p:<token>"`` while a handler runs (expiring after ``lease``) and ``"d"`` once it
succeeded (expiring after ``ttl``); Redis' own key expiry does the cleanup, so there is nothing to
prune. Each operation is a single Lua script, so it is atomic on the server: there is no window
between "SET NX failed" and "GET" in which the key could change, and commit/release compare the
token and write in one step.

Import it explicitly (``from usp_receiver.dedupe.redis import RedisDedupe``): the package itself
never imports ``redis``, which is an extra (``usp-receiver[redis]``).
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread

try:
    import redis
    import redis.asyncio
    from redis.commands.core import AsyncScript, Script
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "usp_receiver.dedupe.redis needs the redis package: install usp-receiver[redis]"
    ) from exc

from ._protocol import DEFAULT_LEASE_SECONDS, DEFAULT_TTL_SECONDS, Claim, ClaimState

__all__ = ["RedisDedupe"]

_A = TypeVar("_A")
_T = TypeVar("_T")

_DONE = "d"
_PENDING_PREFIX = "p:"

# KEYS[1] = key, ARGV[1] = "p:<token>", ARGV[2] = lease in ms.
# Returns 1 if we took the key, else the value that is there ("d" or "p:<other token>").
_CLAIM = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return 1
end
return redis.call('GET', KEYS[1])
"""

# KEYS[1] = key, ARGV[1] = "p:<token>", ARGV[2] = ttl in ms. Returns 1 if committed.
_COMMIT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('SET', KEYS[1], 'd', 'PX', ARGV[2])
    return 1
end
return 0
"""

# KEYS[1] = key, ARGV[1] = "p:<token>". Returns 1 if released.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


def _ms(seconds: float) -> int:
    """Redis wants whole milliseconds, and PX 0 is an error."""
    return max(1, round(seconds * 1000))


class RedisDedupe:
    """Dedupe across processes and hosts through Redis.

    Give it a sync ``client``, an ``async_client``, a ``url``, or a mix: the sync methods use
    ``client`` (created from ``url`` on first use if absent), the async methods use
    ``async_client`` (created from ``url`` on first use if absent). With a sync client and neither
    ``url`` nor ``async_client``, the async methods run the sync ones in a worker thread. Clients
    created here are closed by ``close()``/``aclose()``; clients passed in stay the caller's.

    Keys are ``prefix + event_id``. A commit after the lease ran out is a no-op even if nobody
    took the event over (Redis already dropped the key), so keep ``lease`` above your handler's
    worst-case run time.
    """

    def __init__(
        self,
        client: redis.Redis | None = None,
        *,
        url: str | None = None,
        async_client: redis.asyncio.Redis | None = None,
        prefix: str = "usp:dedupe:",
        lease: float = DEFAULT_LEASE_SECONDS,
        ttl: float = DEFAULT_TTL_SECONDS,
    ) -> None:
        if client is None and url is None and async_client is None:
            raise ValueError("RedisDedupe needs a client, an async_client or a url")
        if lease <= 0 or ttl <= 0:
            raise ValueError(f"lease and ttl must be positive, got lease={lease}, ttl={ttl}")
        self.prefix = prefix
        self.lease = lease
        self.ttl = ttl
        self._url = url
        self._lease_ms = _ms(lease)
        self._ttl_ms = _ms(ttl)
        self._lock = threading.Lock()
        self._client = client
        self._owns_client = False
        self._async_client = async_client
        self._owns_async_client = False
        self._scripts: tuple[Script, Script, Script] | None = None
        self._async_scripts: tuple[AsyncScript, AsyncScript, AsyncScript] | None = None
        if client is not None:
            self._scripts = self._register(client)
        if async_client is not None:
            self._async_scripts = self._register_async(async_client)

    # -- clients ---------------------------------------------------------------------------------

    @staticmethod
    def _register(client: redis.Redis) -> tuple[Script, Script, Script]:
        # Script objects use EVALSHA and fall back to EVAL (which loads the script) on NOSCRIPT.
        return (
            client.register_script(_CLAIM),
            client.register_script(_COMMIT),
            client.register_script(_RELEASE),
        )

    @staticmethod
    def _register_async(client: redis.asyncio.Redis) -> tuple[AsyncScript, AsyncScript, AsyncScript]:
        return (
            client.register_script(_CLAIM),
            client.register_script(_COMMIT),
            client.register_script(_RELEASE),
        )

    def _sync(self) -> tuple[Script, Script, Script]:
        scripts = self._scripts
        if scripts is not None:
            return scripts
        with self._lock:
            if self._scripts is None:
                if self._url is None:
                    raise RuntimeError(
                        "RedisDedupe was given only an async_client: use the async methods, "
                        "or pass client= or url="
                    )
                self._client = redis.Redis.from_url(self._url)
                self._owns_client = True
                self._scripts = self._register(self._client)
            return self._scripts

    def _async(self) -> tuple[AsyncScript, AsyncScript, AsyncScript] | None:
        """The async scripts, or None when async calls must fall back to a thread."""
        scripts = self._async_scripts
        if scripts is not None or self._url is None:
            return scripts
        # No await between check and set, so no other task can interleave; the lock guards
        # against another thread's event loop doing the same.
        with self._lock:
            if self._async_scripts is None:
                self._async_client = redis.asyncio.Redis.from_url(self._url)
                self._owns_async_client = True
                self._async_scripts = self._register_async(self._async_client)
            return self._async_scripts

    def close(self) -> None:
        """Close the sync client if this store created it."""
        with self._lock:
            if self._owns_client and self._client is not None:
                self._client.close()
                self._client = None
                self._scripts = None
                self._owns_client = False

    async def aclose(self) -> None:
        """Close every client this store created (the async one must be closed on its loop)."""
        with self._lock:
            client = self._async_client if self._owns_async_client else None
            if client is not None:
                self._async_client = None
                self._async_scripts = None
                self._owns_async_client = False
        if client is not None:
            await client.aclose()
        self.close()

    # -- helpers ---------------------------------------------------------------------------------

    def _key(self, event_id: str) -> str:
        return self.prefix + event_id

    @staticmethod
    def _claim_result(event_id: str, token: str, result: Any) -> Claim:
        if result == 1:
            return Claim(event_id, ClaimState.NEW, token)
        # bytes by default, str with decode_responses=True.
        value = result.decode() if isinstance(result, bytes) else result
        if value == _DONE:
            return Claim(event_id, ClaimState.DUPLICATE)
        return Claim(event_id, ClaimState.IN_PROGRESS)

    # -- sync ------------------------------------------------------------------------------------

    def claim(self, event_id: str) -> Claim:
        """NEW (run the handler), DUPLICATE (already processed) or IN_PROGRESS (held elsewhere)."""
        token = secrets.token_hex(8)
        result = self._sync()[0](keys=[self._key(event_id)], args=[_PENDING_PREFIX + token, self._lease_ms])
        return self._claim_result(event_id, token, result)

    def commit(self, claim: Claim) -> None:
        """Mark the id done for ``ttl``; a no-op unless ``claim`` still holds the id."""
        if claim.state is ClaimState.NEW and claim.token:
            self._sync()[1](
                keys=[self._key(claim.event_id)], args=[_PENDING_PREFIX + claim.token, self._ttl_ms]
            )

    def release(self, claim: Claim) -> None:
        """Forget the id so the sender's retry runs again; a no-op unless ``claim`` still holds it."""
        if claim.state is ClaimState.NEW and claim.token:
            self._sync()[2](keys=[self._key(claim.event_id)], args=[_PENDING_PREFIX + claim.token])

    # -- async -----------------------------------------------------------------------------------

    async def aclaim(self, event_id: str) -> Claim:
        """Async ``claim``."""
        scripts = self._async()
        if scripts is None:
            return await _in_thread(self.claim, event_id)
        token = secrets.token_hex(8)
        result = await scripts[0](keys=[self._key(event_id)], args=[_PENDING_PREFIX + token, self._lease_ms])
        return self._claim_result(event_id, token, result)

    async def acommit(self, claim: Claim) -> None:
        """Async ``commit``."""
        if claim.state is not ClaimState.NEW or not claim.token:
            return
        scripts = self._async()
        if scripts is None:
            await _in_thread(self.commit, claim)
            return
        await scripts[1](keys=[self._key(claim.event_id)], args=[_PENDING_PREFIX + claim.token, self._ttl_ms])

    async def arelease(self, claim: Claim) -> None:
        """Async ``release``."""
        if claim.state is not ClaimState.NEW or not claim.token:
            return
        scripts = self._async()
        if scripts is None:
            await _in_thread(self.release, claim)
            return
        await scripts[2](keys=[self._key(claim.event_id)], args=[_PENDING_PREFIX + claim.token])


async def _in_thread(func: Callable[[_A], _T], arg: _A) -> _T:
    """Run a blocking call off the event loop (only when no async client can be had)."""
    return await anyio.to_thread.run_sync(func, arg)
