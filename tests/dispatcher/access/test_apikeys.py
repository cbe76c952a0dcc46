"""API keys: issued once in plaintext, stored hashed, found by hash, revoked at once; the admin
token is the business. And the ``usp-webhooks api-keys`` commands."""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy.engine import Engine
from sqlmodel import Session, select
from typer.testing import CliRunner

from tests.dispatcher.conftest import ADMIN_TOKEN, MakeSettings
from usp_dispatcher import cli
from usp_dispatcher.access import (
    AccessError,
    authenticate_bearer,
    bound_profile,
    issue_api_key,
    list_api_keys,
    revoke_api_key,
)
from usp_dispatcher.access.apikeys import create_api_key, hash_api_key, lookup_api_key
from usp_dispatcher.access.tables import ApiKeyRow
from usp_dispatcher.cli.config import Settings

KEY_SHAPE = re.compile(r"uspk_[A-Za-z0-9_-]{43}")


def test_issued_key_authenticates_as_its_principal(session: Session, settings: Settings) -> None:
    plaintext = issue_api_key(session, "acme", label="prod")
    assert KEY_SHAPE.fullmatch(plaintext)
    identity = authenticate_bearer(session, settings, plaintext)
    assert identity.principal == "key:acme"
    assert identity.mechanism == "bearer"
    assert not identity.is_business


def test_only_the_hash_is_stored(session: Session) -> None:
    row, plaintext = create_api_key(session, "acme")
    stored = session.exec(select(ApiKeyRow)).one()
    assert stored.token_hash == hash_api_key(plaintext) != plaintext
    assert plaintext not in repr(stored.model_dump())
    assert row.id == stored.id


def test_unknown_and_near_miss_keys_are_refused(session: Session, settings: Settings) -> None:
    plaintext = issue_api_key(session, "acme")
    for token in ("uspk_" + "A" * 43, plaintext[:-1] + ("A" if plaintext[-1] != "A" else "B"), "not-a-key"):
        with pytest.raises(AccessError) as caught:
            authenticate_bearer(session, settings, token)
        assert caught.value.code == -32001
        assert token not in caught.value.detail


def test_revoked_key_stops_working(session: Session, settings: Settings) -> None:
    row, plaintext = create_api_key(session, "acme")
    assert revoke_api_key(session, row.id) is True
    assert lookup_api_key(session, plaintext) is None
    with pytest.raises(AccessError):
        authenticate_bearer(session, settings, plaintext)
    assert revoke_api_key(session, row.id) is False  # already revoked
    assert revoke_api_key(session, "key_nope") is False


def test_keys_are_independent(session: Session, settings: Settings) -> None:
    first, second = issue_api_key(session, "acme"), issue_api_key(session, "globex")
    assert first != second
    assert authenticate_bearer(session, settings, second).principal == "key:globex"


def test_principal_names_are_checked(session: Session) -> None:
    for bad in ("", "two words", "x" * 201, "tab\there"):
        with pytest.raises(ValueError, match="principal name"):
            issue_api_key(session, bad)


def test_admin_token_is_the_business(session: Session, settings: Settings) -> None:
    identity = authenticate_bearer(session, settings, ADMIN_TOKEN)
    assert identity.principal == "business"
    assert identity.is_business


def test_admin_token_counts_even_when_api_keys_are_not_offered(session: Session, settings: Settings) -> None:
    plaintext = issue_api_key(session, "acme")
    assert authenticate_bearer(session, settings, ADMIN_TOKEN, keys_offered=False).is_business
    with pytest.raises(AccessError):
        authenticate_bearer(session, settings, plaintext, keys_offered=False)


def test_without_admin_token_nothing_is_the_business(session: Session, make_settings: MakeSettings) -> None:
    settings = make_settings(admin_token=None)
    with pytest.raises(AccessError):
        authenticate_bearer(session, settings, "")
    with pytest.raises(AccessError):
        authenticate_bearer(session, settings, ADMIN_TOKEN)


def test_cli_creates_lists_and_revokes(migrated: Engine, database_url: str, session: Session) -> None:
    env = {"USP_DATABASE_URL": database_url, "COLUMNS": "200"}
    created = CliRunner().invoke(cli.app, ["api-keys", "create", "acme", "--label", "laptop"], env=env)
    assert created.exit_code == 0, created.output
    (plaintext,) = KEY_SHAPE.findall(created.output)
    assert lookup_api_key(session, plaintext) == "acme"
    (row,) = list_api_keys(session)
    assert row.token_hash == hash_api_key(plaintext)
    assert row.principal == "acme"
    assert row.label == "laptop"
    assert row.id in created.output

    listed = CliRunner().invoke(cli.app, ["api-keys", "list"], env=env)
    assert listed.exit_code == 0, listed.output
    assert row.id in listed.output
    assert "key:acme" in listed.output
    assert plaintext not in listed.output
    as_json = CliRunner().invoke(cli.app, ["api-keys", "list", "--json"], env=env)
    assert as_json.exit_code == 0, as_json.output
    assert [(k["id"], k["principal"], k["label"]) for k in json.loads(as_json.output)] == [
        (row.id, "key:acme", "laptop")
    ]
    assert plaintext not in as_json.output

    revoked = CliRunner().invoke(cli.app, ["api-keys", "revoke", row.id], env=env)
    assert revoked.exit_code == 0, revoked.output
    session.expire_all()
    assert lookup_api_key(session, plaintext) is None
    again = CliRunner().invoke(cli.app, ["api-keys", "revoke", row.id], env=env)
    assert again.exit_code == 1


def test_cli_refuses_a_bad_principal(migrated: Engine, database_url: str) -> None:
    result = CliRunner().invoke(
        cli.app, ["api-keys", "create", "two words"], env={"USP_DATABASE_URL": database_url}
    )
    assert result.exit_code == 2
    assert not KEY_SHAPE.search(result.output)


def test_cli_binds_a_key_to_the_profile_it_names(
    migrated: Engine, database_url: str, session: Session
) -> None:
    env = {"USP_DATABASE_URL": database_url}
    profile = "https://acme.example/profiles/agent.json"
    created = CliRunner().invoke(cli.app, ["api-keys", "create", "acme", "--profile", profile], env=env)
    assert created.exit_code == 0, created.output
    assert bound_profile(session, "key:acme") == profile
    other = CliRunner().invoke(
        cli.app, ["api-keys", "create", "acme", "--profile", "https://other.example/p.json"], env=env
    )
    assert other.exit_code == 2
    assert not KEY_SHAPE.search(other.output)
