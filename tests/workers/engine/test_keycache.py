"""The signing-key cache: fast between rotations, exact at a rotation's boundaries."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.engine import Engine

from tests.workers.conftest import MakeSettings
from usp_core.clock import utcnow
from usp_core.db import session
from usp_core.keycache import NoSigningKey, SigningKeyCache
from usp_core.keys import ensure_signing_key, rotate
from usp_dispatcher.cli.config import Settings
from usp_receiver import JWKS


def test_without_a_key_nothing_is_cached_and_the_first_key_is_seen_at_once(
    database: Engine, settings: Settings
) -> None:
    cache = SigningKeyCache(max_age=60)
    with pytest.raises(NoSigningKey):
        cache.get(database, settings)
    with session(database) as s:
        record = ensure_signing_key(s, settings)
        s.commit()
    assert [k.kid for k in cache.get(database, settings)] == [record.kid]


def test_keys_are_reused_within_max_age(database: Engine, settings: Settings, jwks: JWKS) -> None:
    cache = SigningKeyCache(max_age=60)
    now = utcnow()
    first = cache.get(database, settings, now=now)
    with session(database) as s:
        rotate(s, settings, now=now)  # signs from now: a cache loaded before does not know it
        s.commit()
    assert cache.get(database, settings, now=now + timedelta(seconds=1)) is first
    cache.clear()
    assert len(cache.get(database, settings, now=now + timedelta(seconds=1))) == 2


def test_a_rotation_boundary_ends_the_cached_entry_exactly(
    database: Engine, make_settings: MakeSettings, jwks: JWKS
) -> None:
    settings = make_settings(key_publish_lead_seconds=2.0, key_overlap_seconds=3.0)
    cache = SigningKeyCache(max_age=60)
    [old] = list(jwks)
    now = utcnow()
    with session(database) as s:
        new = rotate(s, settings, now=now)  # signs from now+2 s, the old key retires at now+5 s
        s.commit()

    def kids(offset: float) -> list[str]:
        return [k.kid for k in cache.get(database, settings, now=now + timedelta(seconds=offset))]

    assert kids(0.1) == [old.kid]
    assert kids(1.9) == [old.kid]
    assert kids(2.0) == [new.kid, old.kid]  # the moment it starts signing, not max_age later
    assert kids(4.9) == [new.kid, old.kid]
    assert kids(5.0) == [new.kid]


def test_entries_are_per_engine_even_on_one_url(database: Engine, settings: Settings, jwks: JWKS) -> None:
    cache = SigningKeyCache(max_age=60)
    assert len(cache.get(database, settings)) == 1
    other = database.execution_options()  # a second Engine object over the same pool
    with session(database) as s:
        rotate(s, settings, now=utcnow() - timedelta(seconds=1))
        s.commit()
    assert len(cache.get(other, settings)) == 2
