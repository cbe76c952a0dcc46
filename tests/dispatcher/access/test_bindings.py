"""Principal → profile binding: the first profile wins, others are forbidden, sharing is fine,
and two first calls racing agree on one winner (SQLite and PostgreSQL)."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from tests.dispatcher.access.conftest import OTHER_PROFILE, PROFILE
from usp_core import db
from usp_dispatcher.access import AccessError, bind_profile, bound_profile, issue_api_key
from usp_dispatcher.access.tables import PrincipalProfileRow


def test_first_pairing_is_recorded_and_committed(session: Session, migrated: Engine) -> None:
    bind_profile(session, "key:acme", PROFILE)
    with db.session(migrated) as other:  # visible to another connection: committed
        assert bound_profile(other, "key:acme") == PROFILE
    bind_profile(session, "key:acme", PROFILE)  # the same again is fine


def test_a_different_profile_is_forbidden(session: Session) -> None:
    bind_profile(session, "key:acme", PROFILE)
    with pytest.raises(AccessError) as caught:
        bind_profile(session, "key:acme", OTHER_PROFILE)
    assert caught.value.code == -32003
    assert caught.value.reason == "forbidden"
    assert bound_profile(session, "key:acme") == PROFILE


def test_many_principals_share_a_profile(session: Session) -> None:
    for principal in ("key:acme", "key:globex", "agent:https://agent.example"):
        bind_profile(session, principal, PROFILE)
    rows = session.exec(select(PrincipalProfileRow)).all()
    assert {row.profile for row in rows} == {PROFILE}
    assert len(rows) == 3


@pytest.mark.parametrize("same_profile", [True, False])
def test_concurrent_first_pairings_agree(migrated: Engine, same_profile: bool) -> None:
    profiles = [PROFILE, PROFILE if same_profile else OTHER_PROFILE] * 3
    barrier = threading.Barrier(len(profiles))
    outcomes: list[str | None] = [None] * len(profiles)

    def pair(index: int) -> None:
        with db.session(migrated) as session:
            barrier.wait()
            try:
                bind_profile(session, "key:racer", profiles[index])
                outcomes[index] = "bound"
            except AccessError as exc:
                outcomes[index] = exc.reason

    threads = [threading.Thread(target=pair, args=(i,)) for i in range(len(profiles))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    with db.session(migrated) as session:
        winner = bound_profile(session, "key:racer")
        assert len(session.exec(select(PrincipalProfileRow)).all()) == 1
    assert winner in (PROFILE, OTHER_PROFILE)
    expected = ["bound" if profile == winner else "forbidden" for profile in profiles]
    assert outcomes == expected


def test_a_key_issued_for_a_profile_is_bound_before_its_first_call(session: Session) -> None:
    """First-contact binding would let a new key claim any unbound profile; an operator who
    names the platform when issuing the key closes that window."""
    issue_api_key(session, "acme", profile=PROFILE)
    assert bound_profile(session, "key:acme") == PROFILE
    with pytest.raises(AccessError) as caught:
        bind_profile(session, "key:acme", OTHER_PROFILE)
    assert caught.value.code == -32003
    with pytest.raises(ValueError, match="bound to another profile"):
        issue_api_key(session, "acme", profile=OTHER_PROFILE)
    with pytest.raises(ValueError, match="profile"):
        issue_api_key(session, "globex", profile="not a uri")
