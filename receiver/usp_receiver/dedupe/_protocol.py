"""The contract every dedupe store keeps (memory, Redis, SQL)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["DEFAULT_LEASE_SECONDS", "DEFAULT_TTL_SECONDS", "Claim", "ClaimState", "DedupeStore"]

#: How long an in-progress claim lives without commit/release. Longer than any handler should run
#: (the sender gives up on a request after 15 s), short enough that a crashed receiver's claim
#: frees itself before the sender's second retry (5 min).
DEFAULT_LEASE_SECONDS = 60.0
#: How long a processed id is remembered: 31 days, a day longer than the service keeps events
#: (``USP_RETENTION_DAYS``, 30), so every delivery the sender can still make or an operator can
#: still replay is recognised. Raise it with the service's retention.
DEFAULT_TTL_SECONDS = 31 * 24 * 3600.0


class ClaimState(enum.Enum):
    NEW = "new"
    DUPLICATE = "duplicate"
    IN_PROGRESS = "in_progress"


@dataclass(frozen=True)
class Claim:
    """The answer to ``claim``; pass it back to ``commit``/``release``. ``token`` is set only for NEW."""

    event_id: str
    state: ClaimState
    token: str = ""


@runtime_checkable
class DedupeStore(Protocol):
    """Claim / commit / release, sync and async. Implementations must be safe under concurrency:
    of two simultaneous claims of one id, exactly one is NEW."""

    def claim(self, event_id: str) -> Claim: ...
    def commit(self, claim: Claim) -> None: ...
    def release(self, claim: Claim) -> None: ...
    async def aclaim(self, event_id: str) -> Claim: ...
    async def acommit(self, claim: Claim) -> None: ...
    async def arelease(self, claim: Claim) -> None: ...
