"""Event ids: ``evt_`` + the 32 hex digits of a UUIDv7 (RFC 9562), time-ordered and monotonic.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_schemas._event_id``.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["event_id_millis", "new_event_id"]

_RAND_BITS = 74
_RAND_MASK = (1 << _RAND_BITS) - 1


def new_event_id() -> str:
    """A fresh, time-ordered event id. Generate it once per event and store it with the event:
    retries and replays must reuse it, since it is what receivers deduplicate on.

    >>> a, b = new_event_id(), new_event_id()
    >>> a.startswith("evt_") and len(a) == 36 and a < b
    True
    """
    millis, rand = _STATE.next()
    rand_a, rand_b = rand >> 62, rand & ((1 << 62) - 1)
    value = (millis << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    return f"evt_{value:032x}"


def event_id_millis(event_id: str) -> int:
    """The Unix time in milliseconds an id from ``new_event_id`` was made at (for age metrics).

    >>> event_id_millis("evt_019a2b3c4d5e7000800000000000000a")
    1761661963614
    """
    hex_part = event_id.removeprefix("evt_")
    if len(hex_part) != 32 or hex_part[12] != "7":
        raise ValueError(f"{event_id!r} is not a UUIDv7 event id")
    return int(hex_part[:12], 16)


class _MonotonicState:
    """The last (millisecond, random) pair handed out, guarded for threads and reset after fork.

    Without the reset a forked child would continue from its parent's state and, within the same
    millisecond, hand out the very ids the parent hands out next.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._millis = 0
        self._rand = 0

    def next(self) -> tuple[int, int]:
        with self._lock:
            millis = time.time_ns() // 1_000_000
            if millis > self._millis:
                rand = _fresh_random()
            else:  # same millisecond, or the clock stepped back: stay ordered
                millis, rand = self._millis, self._rand + 1
                if rand > _RAND_MASK:  # 2**74 ids in one millisecond: borrow the next one
                    millis, rand = millis + 1, _fresh_random()
            self._millis, self._rand = millis, rand
            return millis, rand

    def reset(self) -> None:
        self._lock = threading.Lock()
        self._millis = 0
        self._rand = 0


def _fresh_random() -> int:
    # Start in the lower half so that increments practically never overflow into the next ms.
    return int.from_bytes(os.urandom(10), "big") & (_RAND_MASK >> 1)


_STATE = _MonotonicState()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_STATE.reset)
