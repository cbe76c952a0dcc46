"""authorize(): the access-class matrix, profile binding, booking-scoped credentials (with and
without proofs) and the in-band bearer; may_touch_booking / may_touch_waitlist_entry."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session

from tests.dispatcher.access.conftest import OTHER_PROFILE, PROFILE
from tests.dispatcher.conftest import ADMIN_TOKEN, MakeSettings
from tests.dispatcher.scheduling.support import ALICE, NOW, build_catalog, ok
from usp_core import db
from usp_core.clock import utcnow
from usp_dispatcher.access import (
    Access,
    AccessError,
    Caller,
    Identity,
    authorize,
    issue_api_key,
    issue_booking_credential,
    make_pop_proof,
)
from usp_dispatcher.cli.config import Settings
from usp_dispatcher.scheduling import create_booking, join_waitlist
from usp_dispatcher.scheduling.ownership import may_touch_booking, may_touch_waitlist_entry
from usp_receiver import SigningKey, jwk_thumbprint
from usp_schemas import TimeWindow

KEY = Identity("key:acme", "bearer")
BUSINESS = Identity("business", "bearer")
AGENT = Identity("agent:https://agent.example", "http_message_signatures", key_thumbprint="thumb")


def call(
    session: Session,
    settings: Settings,
    tool: str,
    access: Access,
    *,
    identity: Identity | None = None,
    profile: str | None = PROFILE,
    authorization: dict[str, Any] | None = None,
    **arguments: Any,
) -> Caller:
    usp: dict[str, Any] = {}
    if profile is not None:
        usp["profile"] = profile
    if authorization is not None:
        usp["authorization"] = authorization
    args = {**arguments, "_meta": {"usp": usp}}
    params = {"name": tool, "arguments": args}
    return authorize(
        session, settings, tool=tool, access=access, arguments=args, params=params, identity=identity
    )


def refused(code: int, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(AccessError) as caught:
        call(*args, **kwargs)
    assert caught.value.code == code, caught.value.detail
    return caught.value.detail


# ------------------------------------------------------------------------------ public


def test_public_needs_nothing(session: Session, settings: Settings) -> None:
    caller = call(session, settings, "usp_catalog_list", Access.PUBLIC, profile=None)
    assert caller == Caller(None, None, None, False, None, None)


def test_public_keeps_the_identity(session: Session, settings: Settings) -> None:
    caller = call(session, settings, "usp_catalog_list", Access.PUBLIC, identity=KEY)
    assert (caller.principal, caller.profile, caller.is_business) == ("key:acme", PROFILE, False)


def test_public_with_an_invalid_bearer_is_refused(session: Session, settings: Settings) -> None:
    bad = {"mechanism": "bearer", "credential": "uspk_nope"}
    refused(-32001, session, settings, "usp_catalog_list", Access.PUBLIC, authorization=bad)


# ------------------------------------------------------------------------------ privileged


@pytest.mark.parametrize("access", [Access.PRIVILEGED_PLATFORM, Access.PRIVILEGED_SCOPED])
def test_privileged_needs_a_profile(session: Session, settings: Settings, access: Access) -> None:
    detail = refused(-32602, session, settings, "usp_bookings_create", access, identity=KEY, profile=None)
    assert "_meta.usp.profile" in detail
    # Who calls is asked first: an anonymous caller learns it must authenticate.
    refused(-32001, session, settings, "usp_bookings_create", access, identity=None, profile=None)


@pytest.mark.parametrize("access", [Access.PRIVILEGED_PLATFORM, Access.PRIVILEGED_SCOPED])
def test_the_business_needs_no_profile(session: Session, settings: Settings, access: Access) -> None:
    caller = authorize(
        session,
        settings,
        tool="usp_bookings_create",
        access=access,
        arguments={},
        params={},
        identity=BUSINESS,
    )
    assert caller.is_business
    assert caller.profile is None


@pytest.mark.parametrize("access", [Access.PRIVILEGED_PLATFORM, Access.PRIVILEGED_SCOPED])
def test_privileged_unauthenticated_is_refused(session: Session, settings: Settings, access: Access) -> None:
    refused(-32001, session, settings, "usp_bookings_create", access, booking_id="bkg_1")


def test_anonymous_platforms_when_authentication_is_not_required(
    session: Session, make_settings: MakeSettings
) -> None:
    settings = make_settings(require_authentication=False)
    caller = call(session, settings, "usp_bookings_create", Access.PRIVILEGED_PLATFORM)
    assert caller == Caller(None, PROFILE, None, False, None, None)
    refused(-32001, session, settings, "usp_bookings_confirm", Access.BUSINESS_ONLY)


@pytest.mark.parametrize("identity", [KEY, AGENT])
def test_privileged_binds_the_principal(session: Session, settings: Settings, identity: Identity) -> None:
    caller = call(session, settings, "usp_bookings_create", Access.PRIVILEGED_PLATFORM, identity=identity)
    assert caller == Caller(
        identity.principal, PROFILE, identity.mechanism, False, None, identity.key_thumbprint
    )
    detail = refused(
        -32003,
        session,
        settings,
        "usp_bookings_create",
        Access.PRIVILEGED_PLATFORM,
        identity=identity,
        profile=OTHER_PROFILE,
    )
    assert "profile" in detail
    # Public calls do not bind, nor refuse.
    call(session, settings, "usp_catalog_list", Access.PUBLIC, identity=identity, profile=OTHER_PROFILE)


def test_shared_profile(session: Session, settings: Settings) -> None:
    for identity in (KEY, AGENT, Identity("key:globex", "bearer")):
        call(session, settings, "usp_waitlist_join", Access.PRIVILEGED_PLATFORM, identity=identity)


def test_business_may_do_anything(session: Session, settings: Settings) -> None:
    for tool, access in (
        ("usp_bookings_create", Access.PRIVILEGED_PLATFORM),
        ("usp_bookings_get", Access.PRIVILEGED_SCOPED),
        ("usp_bookings_confirm", Access.BUSINESS_ONLY),
    ):
        caller = call(session, settings, tool, access, identity=BUSINESS, booking_id="bkg_1")
        assert caller.is_business
        assert caller.principal == "business"
    # ... for any profile: the business is not bound to one.
    call(
        session,
        settings,
        "usp_bookings_create",
        Access.PRIVILEGED_PLATFORM,
        identity=BUSINESS,
        profile=OTHER_PROFILE,
    )


def test_business_only(session: Session, settings: Settings) -> None:
    refused(-32001, session, settings, "usp_bookings_confirm", Access.BUSINESS_ONLY, booking_id="bkg_1")
    refused(
        -32003, session, settings, "usp_bookings_confirm", Access.BUSINESS_ONLY, identity=KEY, booking_id="b"
    )
    refused(
        -32003,
        session,
        settings,
        "usp_bookings_confirm",
        Access.BUSINESS_ONLY,
        identity=AGENT,
        booking_id="b",
    )
    # business_only is not "privileged" in the binding's sense: no profile needed.
    assert call(
        session, settings, "usp_bookings_confirm", Access.BUSINESS_ONLY, identity=BUSINESS, profile=None
    )


# ------------------------------------------------------------------------------ in-band bearer


def test_stdio_bearer_api_key(session: Session, settings: Settings) -> None:
    token = issue_api_key(session, "acme")
    bearer = {"mechanism": "bearer", "credential": token}
    caller = call(session, settings, "usp_bookings_create", Access.PRIVILEGED_PLATFORM, authorization=bearer)
    assert (caller.principal, caller.mechanism, caller.profile) == ("key:acme", "bearer", PROFILE)


def test_stdio_admin_token(session: Session, settings: Settings) -> None:
    bearer = {"mechanism": "bearer", "credential": ADMIN_TOKEN}
    caller = call(session, settings, "usp_bookings_confirm", Access.BUSINESS_ONLY, authorization=bearer)
    assert caller.is_business


def test_stdio_bad_bearer(session: Session, settings: Settings) -> None:
    bearer = {"mechanism": "bearer", "credential": "uspk_" + "x" * 43}
    refused(
        -32001, session, settings, "usp_bookings_create", Access.PRIVILEGED_PLATFORM, authorization=bearer
    )


def test_header_identity_wins_over_in_band_bearer(session: Session, settings: Settings) -> None:
    bearer = {"mechanism": "bearer", "credential": ADMIN_TOKEN}
    caller = call(
        session,
        settings,
        "usp_bookings_create",
        Access.PRIVILEGED_PLATFORM,
        identity=KEY,
        authorization=bearer,
    )
    assert caller.principal == "key:acme"
    assert not caller.is_business


def test_api_keys_refused_when_bearer_is_not_offered(session: Session, make_settings: MakeSettings) -> None:
    settings = make_settings(auth_mechanisms=("http_message_signatures",))
    bearer = {"mechanism": "bearer", "credential": issue_api_key(session, "acme")}
    refused(
        -32001, session, settings, "usp_bookings_create", Access.PRIVILEGED_PLATFORM, authorization=bearer
    )


@pytest.mark.parametrize(
    "meta",
    [
        "not an object",
        {"usp": []},
        {"usp": {"profile": 42}},
        {"usp": {"profile": "has space"}},
        {"usp": {"profile": PROFILE, "authorization": "token"}},
        {"usp": {"profile": PROFILE, "authorization": {"mechanism": "mtls", "credential": "x"}}},
        {"usp": {"profile": PROFILE, "authorization": {"mechanism": "bearer"}}},
    ],
)
def test_malformed_meta_is_invalid_params(session: Session, settings: Settings, meta: Any) -> None:
    arguments = {"_meta": meta}
    with pytest.raises(AccessError) as caught:
        authorize(
            session,
            settings,
            tool="usp_bookings_create",
            access=Access.PRIVILEGED_PLATFORM,
            arguments=arguments,
            params={"name": "usp_bookings_create", "arguments": arguments},
            identity=KEY,
        )
    assert caught.value.code == -32602


# ------------------------------------------------------------------------------ scoped credentials


def scoped_call(
    session: Session,
    settings: Settings,
    credential: str,
    *,
    tool: str = "usp_bookings_get",
    access: Access = Access.PRIVILEGED_SCOPED,
    booking_id: str = "bkg_1",
    mechanism: str = "booking_scoped_credential",
    prove_with: SigningKey | None = None,
    identity: Identity | None = None,
    profile: str = PROFILE,
    now: datetime | None = None,
) -> Caller:
    authorization: dict[str, Any] = {"mechanism": mechanism, "credential": credential}
    arguments: dict[str, Any] = {
        "booking_id": booking_id,
        "_meta": {"usp": {"profile": profile, "authorization": authorization}},
    }
    params: dict[str, Any] = {"name": tool, "arguments": arguments}
    if prove_with is not None:
        params = copy.deepcopy(params)
        params["arguments"]["_meta"]["usp"]["authorization"]["proof"] = make_pop_proof(params, prove_with)
    return authorize(
        session,
        settings,
        tool=tool,
        access=access,
        arguments=params["arguments"],
        params=params,
        identity=identity,
        now=now,
    )


def credential(
    session: Session, settings: Settings, *, jkt: str | None = None, booking_id: str = "bkg_1"
) -> str:
    issued = issue_booking_credential(session, settings, booking_id=booking_id, profile=PROFILE, jkt=jkt)
    token: str = issued["credential"]
    return token


@pytest.mark.parametrize("tool", ["usp_bookings_get", "usp_bookings_cancel", "usp_bookings_reschedule"])
def test_credential_authorizes_its_booking(session: Session, settings: Settings, tool: str) -> None:
    caller = scoped_call(session, settings, credential(session, settings), tool=tool)
    assert caller == Caller(None, PROFILE, "booking_scoped_credential", False, "bkg_1", None)


def test_credential_for_another_booking_is_forbidden(session: Session, settings: Settings) -> None:
    token = credential(session, settings)
    with pytest.raises(AccessError) as caught:
        scoped_call(session, settings, token, booking_id="bkg_2")
    assert caught.value.code == -32003


def test_credential_for_another_profile_is_forbidden(session: Session, settings: Settings) -> None:
    with pytest.raises(AccessError) as caught:
        scoped_call(session, settings, credential(session, settings), profile=OTHER_PROFILE)
    assert caught.value.code == -32003


def test_credential_outside_its_scope_is_forbidden(session: Session, settings: Settings) -> None:
    token = credential(session, settings)
    with pytest.raises(AccessError) as caught:
        scoped_call(session, settings, token, tool="usp_waitlist_leave")
    assert caught.value.code == -32003
    with pytest.raises(AccessError) as caught:
        scoped_call(session, settings, token, tool="usp_bookings_create", access=Access.PRIVILEGED_PLATFORM)
    assert caught.value.code == -32003


def test_credential_never_authorizes_confirm(session: Session, settings: Settings) -> None:
    platform = SigningKey.generate()
    token = credential(session, settings, jkt=jwk_thumbprint(platform.public.jwk))
    with pytest.raises(AccessError) as caught:
        scoped_call(
            session,
            settings,
            token,
            tool="usp_bookings_confirm",
            access=Access.BUSINESS_ONLY,
            prove_with=platform,
        )
    assert caught.value.code == -32003
    assert "business_only" in caught.value.detail


def test_expired_credential_is_unauthenticated(session: Session, settings: Settings) -> None:
    token = credential(session, settings)
    later = utcnow() + timedelta(seconds=settings.booking_credential_ttl_seconds + 1)
    with pytest.raises(AccessError) as caught:
        scoped_call(session, settings, token, now=later)
    assert caught.value.code == -32001


def test_bound_credential_with_proof(session: Session, settings: Settings) -> None:
    platform = SigningKey.generate()
    jkt = jwk_thumbprint(platform.public.jwk)
    caller = scoped_call(session, settings, credential(session, settings, jkt=jkt), prove_with=platform)
    assert caller.scoped_booking_id == "bkg_1"
    assert caller.key_thumbprint == jkt


@pytest.mark.parametrize("mechanism", ["booking_scoped_credential", "bearer"])
def test_bound_credential_without_proof_is_absent(
    session: Session, settings: Settings, mechanism: str
) -> None:
    platform = SigningKey.generate()
    token = credential(session, settings, jkt=jwk_thumbprint(platform.public.jwk))
    with pytest.raises(AccessError) as caught:
        scoped_call(session, settings, token, mechanism=mechanism)
    assert caught.value.code == -32001
    assert "platform_key_pop" in caught.value.detail


def test_bound_credential_with_another_keys_proof_is_absent(session: Session, settings: Settings) -> None:
    platform, thief = SigningKey.generate(), SigningKey.generate()
    token = credential(session, settings, jkt=jwk_thumbprint(platform.public.jwk))
    with pytest.raises(AccessError) as caught:
        scoped_call(session, settings, token, prove_with=thief)
    assert caught.value.code == -32001


def test_absent_credential_leaves_the_transport_identity(session: Session, settings: Settings) -> None:
    """Without its proof the credential is ignored: the platform acts as itself, unscoped."""
    platform = SigningKey.generate()
    token = credential(session, settings, jkt=jwk_thumbprint(platform.public.jwk))
    caller = scoped_call(session, settings, token, identity=KEY)
    assert caller == Caller("key:acme", PROFILE, "bearer", False, None, None)


def test_credential_with_identity_scopes_the_call(session: Session, settings: Settings) -> None:
    caller = scoped_call(session, settings, credential(session, settings), identity=AGENT)
    assert caller.scoped_booking_id == "bkg_1"
    assert caller.principal == AGENT.principal
    assert caller.mechanism == "booking_scoped_credential"


def test_unbound_credential_declared_as_bearer_still_counts_as_a_credential(
    session: Session, settings: Settings
) -> None:
    caller = scoped_call(session, settings, credential(session, settings), mechanism="bearer")
    assert caller.scoped_booking_id == "bkg_1"


def test_credentials_ignored_when_not_offered(session: Session, make_settings: MakeSettings) -> None:
    settings = make_settings(auth_mechanisms=("bearer",))
    with pytest.raises(AccessError) as caught:
        scoped_call(session, settings, credential(session, settings))
    assert caught.value.code == -32001


# ------------------------------------------------------------------------------ may_touch_*


@pytest.fixture
def rows(migrated: Engine) -> dict[str, str]:
    """Bookings and waitlist entries owned by PROFILE, OTHER_PROFILE and the business."""
    catalog = build_catalog(migrated)
    made: dict[str, str] = {}
    with db.session(migrated) as session:
        for name, owner, slot in (("mine", PROFILE, 0), ("theirs", OTHER_PROFILE, 1), ("business", None, 2)):
            booking = ok(
                create_booking(
                    session, catalog.cut, catalog.cut_slots[slot], ALICE, platform_profile=owner, now=NOW
                )
            )
            window = TimeWindow(start=NOW + timedelta(days=1), end=NOW + timedelta(days=3))
            entry = ok(join_waitlist(session, catalog.yoga, window, ALICE, platform_profile=owner, now=NOW))
            made[name], made[f"wl_{name}"] = booking.id, entry.id
        session.commit()
    return made


def test_may_touch_booking(session: Session, rows: dict[str, str]) -> None:
    platform = Caller("key:acme", PROFILE, "bearer", False, None, None)
    business = Caller("business", None, "bearer", True, None, None)
    scoped = Caller(None, PROFILE, "booking_scoped_credential", False, rows["theirs"], None)
    anonymous = Caller(None, PROFILE, None, False, None, None)
    assert may_touch_booking(session, platform, rows["mine"])
    assert not may_touch_booking(session, platform, rows["theirs"])
    assert not may_touch_booking(session, platform, rows["business"])
    assert not may_touch_booking(session, anonymous, rows["mine"])  # naming a profile proves nothing
    for name in ("mine", "theirs", "business"):
        assert may_touch_booking(session, business, rows[name])
    assert may_touch_booking(session, scoped, rows["theirs"])
    assert not may_touch_booking(session, scoped, rows["mine"])
    for caller in (platform, business, scoped):
        assert not may_touch_booking(session, caller, "bkg_missing")


def test_may_touch_waitlist_entry(session: Session, rows: dict[str, str]) -> None:
    platform = Caller("key:acme", PROFILE, "bearer", False, None, None)
    business = Caller("business", None, "bearer", True, None, None)
    scoped = Caller(None, PROFILE, "booking_scoped_credential", False, rows["mine"], None)
    assert may_touch_waitlist_entry(session, platform, rows["wl_mine"])
    assert not may_touch_waitlist_entry(session, platform, rows["wl_theirs"])
    assert not may_touch_waitlist_entry(session, platform, rows["wl_business"])
    assert all(
        may_touch_waitlist_entry(session, business, rows[f"wl_{n}"]) for n in ("mine", "theirs", "business")
    )
    assert not may_touch_waitlist_entry(session, scoped, rows["wl_mine"])
    assert not may_touch_waitlist_entry(session, business, "wl_missing")
