"""In-process dedupe store: a bounded, TTL'd dict behind a lock.

It sits on the hot verify path, so it does the least work that keeps the contract: no I/O, no
per-entry objects beyond a tuple, O(1) claim/commit/release, and eviction that never scans.
It only deduplicates within one process: behind several workers or hosts, use the Redis or SQL
store.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from usp_receiver.dedupe._protocol import DEFAULT_LEASE_SECONDS, DEFAULT_TTL_SECONDS, Claim, ClaimState

__all__ = ["MemoryDedupe"]

_DUPLICATE = ClaimState.DUPLICATE
_IN_PROGRESS = ClaimState.IN_PROGRESS
_NEW = ClaimState.NEW


class MemoryDedupe:
    """Dedupe within one process, bounded to ``max_entries`` ids.

    Two ordered dicts hold the ids: ``_pending`` (claimed, ``event_id -> (token,
    expires_at)``) and ``_done`` (committed, ``event_id -> expires_at``). Because ``lease`` and
    ``ttl`` are fixed per store, insertion order is also expiry order: the oldest entry of each
    dict is always the first one to expire, and eviction looks at the front only, never scans.
    (``OrderedDict``, not ``dict``: a plain dict used as a FIFO makes ``next(iter(d))`` skip every
    deleted slot at its front, which measured ~100 µs per claim on a full 100k store.)

    When full, a new claim evicts, in this order: an in-progress claim whose lease already ran out
    (it is garbage), else the oldest done id (forgetting it can at worst re-run a very old event
    if it is redelivered), else the oldest in-progress claim (last resort: a concurrent redelivery
    of that event could then run twice). Size ``max_entries`` above the number of events you
    receive per ``ttl`` to keep the full guarantee.

    ``clock`` must be monotonic; it is injectable so tests can move time without sleeping.
    """

    __slots__ = ("_clock", "_counter", "_done", "_lease", "_lock", "_max_entries", "_pending", "_ttl")

    def __init__(
        self,
        max_entries: int = 100_000,
        lease: float = DEFAULT_LEASE_SECONDS,
        ttl: float = DEFAULT_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        if lease <= 0 or ttl <= 0:
            raise ValueError(f"lease and ttl must be positive, got lease={lease}, ttl={ttl}")
        self._max_entries = max_entries
        self._lease = lease
        self._ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._done: OrderedDict[str, float] = OrderedDict()
        # Tokens only need to be unique within this store: a counter is cheaper than randomness.
        self._counter = itertools.count(1)

    def __len__(self) -> int:
        """Ids currently held (done or in progress), including expired ones not yet dropped."""
        return len(self._pending) + len(self._done)

    def claim(self, event_id: str) -> Claim:
        """NEW (run the handler), DUPLICATE (already processed) or IN_PROGRESS (held elsewhere)."""
        with self._lock:
            now = self._clock()
            done = self._done
            pending = self._pending
            expires = done.get(event_id)
            if expires is not None:
                if expires > now:
                    return Claim(event_id, _DUPLICATE)
                del done[event_id]
            held = pending.get(event_id)
            if held is not None:
                if held[1] > now:
                    return Claim(event_id, _IN_PROGRESS)
                # The holder's lease ran out (it crashed or hung): take the event over.
                del pending[event_id]
            if len(pending) + len(done) >= self._max_entries:
                self._evict(now)
            token = str(next(self._counter))
            pending[event_id] = (token, now + self._lease)
            return Claim(event_id, _NEW, token)

    def _evict(self, now: float) -> None:
        """Make room for one entry; see the class docstring for the order. Caller holds the lock."""
        pending = self._pending
        if pending and pending[next(iter(pending))][1] <= now:
            pending.popitem(last=False)
        elif self._done:
            self._done.popitem(last=False)
        else:
            pending.popitem(last=False)

    def commit(self, claim: Claim) -> None:
        """Remember the id as done for ``ttl``.

        A no-op unless ``claim`` is this store's current claim on the id: a non-NEW claim, or one
        whose lease ran out and was taken over by another claim, changes nothing. A claim whose
        lease ran out but that nobody took over still commits.
        """
        with self._lock:
            held = self._pending.get(claim.event_id)
            if held is None or held[0] != claim.token or not claim.token:
                return
            del self._pending[claim.event_id]
            self._done[claim.event_id] = self._clock() + self._ttl

    def release(self, claim: Claim) -> None:
        """Forget the claim so that the sender's retry runs the handler again.

        The same token check as ``commit``: a stale claim cannot free someone else's, and a
        committed id stays done.
        """
        with self._lock:
            held = self._pending.get(claim.event_id)
            if held is not None and held[0] == claim.token and claim.token:
                del self._pending[claim.event_id]

    # No I/O: the async variants run inline (the lock is held for microseconds, never across an
    # await), which is cheaper than a thread hop.
    async def aclaim(self, event_id: str) -> Claim:
        """Same as ``claim``."""
        return self.claim(event_id)

    async def acommit(self, claim: Claim) -> None:
        """Same as ``commit``."""
        self.commit(claim)

    async def arelease(self, claim: Claim) -> None:
        """Same as ``release``."""
        self.release(claim)
