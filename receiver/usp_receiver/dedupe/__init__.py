"""Deduplication on ``event_id`` that never loses an event.

The sender delivers at least once, so a receiver sees repeats. A naive "seen set" marks an event
as seen *before* the handler runs, and a handler that then fails makes the sender's retry look like
a duplicate: the event is lost. Here an id moves through three states:

* ``claim(event_id)`` → ``NEW`` (you own it, run the handler), ``DUPLICATE`` (already processed:
  answer 2xx, do nothing) or ``IN_PROGRESS`` (someone else is handling it right now: answer a
  retryable non-2xx, the sender comes back later).
* ``commit(claim)`` after the handler succeeded: the id is remembered as done for ``ttl``
  (``DEFAULT_TTL_SECONDS``: 31 days, longer than the service keeps events for replay).
* ``release(claim)`` when the handler failed: the id is forgotten, the sender's retry runs again.

A claim that is neither committed nor released (the process died) expires after ``lease`` seconds,
so a crash loses nothing either. Claims carry a token: a handler whose lease ran out cannot commit
or release the claim of whoever took the event over.

:func:`process_once` wraps the three steps around a piece of work (claim, run, commit or release)
and answers a :class:`Processed`; every receiver in this package goes through it.

Stores: ``MemoryDedupe`` (here; one process), ``usp_receiver.dedupe.redis.RedisDedupe`` (extra
``redis``) and ``usp_receiver.dedupe.sql.SqlDedupe`` (extra ``sql``). The last two are imported
from their own modules so that this package never imports an extra.
"""

from usp_receiver.dedupe._once import Processed, process_once
from usp_receiver.dedupe._protocol import (
    DEFAULT_LEASE_SECONDS,
    DEFAULT_TTL_SECONDS,
    Claim,
    ClaimState,
    DedupeStore,
)
from usp_receiver.dedupe.memory import MemoryDedupe

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "DEFAULT_TTL_SECONDS",
    "Claim",
    "ClaimState",
    "DedupeStore",
    "MemoryDedupe",
    "Processed",
    "process_once",
]
