"""The signing keys of the moment, cached in-process for a few seconds.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_core.keycache``.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.engine import Engine
from sqlmodel import col, select

from usp_core.clock import utcnow
from usp_core.db import session
from usp_core.keys import SigningKeyRecord, signing_keys
from usp_core.settings import CommonSettings
from usp_receiver import SigningKey

__all__ = [
    "DEFAULT_MAX_AGE",
    "NoSigningKey",
    "SigningKeyCache",
    "clear_signing_key_cache",
    "current_signing_keys",
]

DEFAULT_MAX_AGE = 5.0


class NoSigningKey(RuntimeError):
    """No key signs at this moment: nothing can be delivered (run ``ensure_signing_key`` first)."""


@dataclass(frozen=True, slots=True)
class _Entry:
    keys: tuple[SigningKey, ...]
    valid_until: datetime
    loaded_at: datetime


class SigningKeyCache:
    """Keys that sign now, per (engine, key store), reloaded at rotation boundaries.

    Entries are keyed by the engine object, not its URL: two engines on one URL may see different
    schemas (``search_path``). Thread-safe; a miss may load twice under contention, harmlessly.
    """

    def __init__(self, max_age: float = DEFAULT_MAX_AGE) -> None:
        self.max_age = max_age
        self._entries: weakref.WeakKeyDictionary[Engine, dict[str | None, _Entry]] = (
            weakref.WeakKeyDictionary()
        )
        self._lock = threading.Lock()

    def get(
        self, engine: Engine, settings: CommonSettings, *, now: datetime | None = None
    ) -> tuple[SigningKey, ...]:
        """The keys that sign at ``now``, newest first; :class:`NoSigningKey` when there are none."""
        moment = now or utcnow()
        store = None if settings.key_store_path is None else str(settings.key_store_path)
        with self._lock:
            entry = self._entries.get(engine, {}).get(store)
        if entry is None or not entry.loaded_at <= moment < entry.valid_until:
            entry = self._load(engine, settings, moment)
            if not entry.keys:  # not cached: the first key may be created any moment now
                raise NoSigningKey("no key signs now; create one with usp_core.keys.ensure_signing_key")
            with self._lock:
                self._entries.setdefault(engine, {})[store] = entry
        return entry.keys

    def clear(self) -> None:
        """Forget everything (after a rotation made in this process, or in tests)."""
        with self._lock:
            self._entries.clear()

    def _load(self, engine: Engine, settings: CommonSettings, moment: datetime) -> _Entry:
        with session(engine) as s:
            keys = tuple(signing_keys(s, settings, now=moment))
            boundaries = s.exec(
                select(SigningKeyRecord.signs_from, SigningKeyRecord.retires_at).where(
                    (col(SigningKeyRecord.signs_from) > moment) | (col(SigningKeyRecord.retires_at) > moment)
                )
            ).all()
        valid_until = moment + timedelta(seconds=self.max_age)
        for signs_from, retires_at in boundaries:
            for boundary in (signs_from, retires_at):
                if boundary is not None and moment < boundary < valid_until:
                    valid_until = boundary
        return _Entry(keys, valid_until, moment)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()


_shared = SigningKeyCache()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_shared._after_fork)


def current_signing_keys(
    engine: Engine, settings: CommonSettings, *, now: datetime | None = None
) -> tuple[SigningKey, ...]:
    """The process-wide :class:`SigningKeyCache`'s keys for ``engine`` at ``now``."""
    return _shared.get(engine, settings, now=now)


def clear_signing_key_cache() -> None:
    """Drop the process-wide cache (after a rotation made in this process, or in tests)."""
    _shared.clear()
