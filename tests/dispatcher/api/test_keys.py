"""The published keys (JWKS and Web Bot Auth directory), the keys' schedule as the engine tells it,
and the ``keys`` CLI commands against a running service's admin API (uvicorn on a free port)."""

from __future__ import annotations

import json
from datetime import timedelta

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import select
from typer.testing import CliRunner, Result

from tests.dispatcher.conftest import ADMIN_TOKEN, MakeClient, MakeSettings, Serve
from usp_core import db, keys
from usp_core.clock import utcnow
from usp_core.keys import SigningKeyRecord
from usp_dispatcher.api.app import create_app
from usp_dispatcher.cli import app as cli
from usp_receiver import JWKS
from usp_workers.storage import migrate

JWKS_PATH = "/.well-known/usp/jwks.json"
DIRECTORY_PATH = "/.well-known/http-message-signatures-directory"


@pytest.fixture
def base(make_settings: MakeSettings, serve: Serve) -> str:
    """A running service (its lifespan made the first key); its API's base URL."""
    return serve(create_app(make_settings()))


def run(base: str, *args: str, token: str = ADMIN_TOKEN) -> Result:
    env = {"USP_ADMIN_URL": base, "USP_ADMIN_TOKEN": token, "COLUMNS": "80"}
    return CliRunner().invoke(cli, list(args), env=env)


def published(base: str) -> JWKS:
    return JWKS.from_dict(httpx.get(base + JWKS_PATH).json())


def test_jwks_publishes_the_key_that_signs(
    client: TestClient, engine: Engine, make_settings: MakeSettings
) -> None:
    response = client.get(JWKS_PATH)
    assert response.status_code == 200
    assert response.headers["cache-control"] == "public, max-age=300"
    assert response.headers["content-type"] == "application/jwk-set+json"
    published = JWKS.from_dict(response.json())
    assert len(published) == 1

    with db.session(engine) as session:
        signer = keys.signing_keys(session, make_settings())[0]
    message = b"@method: POST\n@path: /hooks/usp"
    trusted = published.get(signer.kid)
    assert trusted is not None
    assert trusted.verify(signer.sign(message), message)
    assert not trusted.verify(signer.sign(message), message + b"x")
    for member in response.json()["keys"]:
        assert "d" not in member


def test_cache_age_follows_the_publish_lead(make_client: MakeClient) -> None:
    client = make_client(key_publish_lead_seconds=1234.9)
    assert client.get(JWKS_PATH).headers["cache-control"] == "public, max-age=1234"


def test_directory_serves_the_same_keys(client: TestClient) -> None:
    directory = client.get(DIRECTORY_PATH)
    assert directory.status_code == 200
    assert directory.headers["content-type"] == "application/http-message-signatures-directory+json"
    assert directory.headers["cache-control"] == "public, max-age=300"
    assert directory.json() == client.get(JWKS_PATH).json()
    assert len(JWKS.from_dict(directory.json())) == 1


def test_start_up_keeps_the_existing_key(make_client: MakeClient) -> None:
    first = make_client().get(JWKS_PATH).json()
    second = make_client().get(JWKS_PATH).json()
    assert first == second


def test_rotate_publishes_a_second_key_before_it_signs(
    base: str, engine: Engine, make_settings: MakeSettings
) -> None:
    before = published(base)
    result = run(base, "keys", "rotate")
    assert result.exit_code == 0, result.output
    after = published(base)
    assert len(before) == 1
    assert len(after) == 2
    (new_kid,) = {key.kid for key in after} - {key.kid for key in before}
    assert new_kid in result.output
    assert "starts signing at" in result.output
    with db.session(engine) as session:
        signing_now = [key.kid for key in keys.signing_keys(session, make_settings())]
    assert signing_now == [next(iter(before)).kid]  # the new key waits for the publish lead


def test_rotate_with_ecdsa(base: str) -> None:
    result = run(base, "keys", "rotate", "--alg", "ecdsa-p256-sha256")
    assert result.exit_code == 0, result.output
    assert sorted(key.alg for key in published(base)) == ["ecdsa-p256-sha256", "ed25519"]


def test_keys_list_shows_schedule_but_no_private_members(base: str, engine: Engine) -> None:
    assert run(base, "keys", "rotate").exit_code == 0
    result = run(base, "keys", "list")
    assert result.exit_code == 0, result.output
    with db.session(engine) as session:
        records = session.exec(select(SigningKeyRecord)).all()
    assert len(records) == 2
    for record in records:
        assert record.kid in result.output
        private = json.loads(record.private_jwk)
        assert private["d"] not in result.output
    assert "signing" in result.output
    assert "not signing yet" in result.output
    as_json = run(base, "keys", "list", "--json")
    assert as_json.exit_code == 0, as_json.output
    listed = json.loads(as_json.output)["items"]
    assert sorted(item["kid"] for item in listed) == sorted(record.kid for record in records)
    assert all("d" not in item for item in listed)


def test_keys_commands_need_the_admin_token(base: str) -> None:
    missing = run(base, "keys", "list", token="")
    assert missing.exit_code == 2
    assert "no admin token" in missing.output
    for args in (("keys", "list"), ("keys", "rotate")):
        wrong = run(base, *args, token="not-the-token")
        assert wrong.exit_code == 1
        assert "401" in wrong.output
        assert "not-the-token" not in wrong.output
    assert len(published(base)) == 1  # the refused rotation added nothing


def test_keys_commands_say_when_the_api_is_unreachable() -> None:
    result = run("http://127.0.0.1:9", "keys", "list")
    assert result.exit_code == 2
    assert "cannot reach the API" in result.output
    assert ADMIN_TOKEN not in result.output


def test_rotate_on_an_empty_database_signs_at_once(
    database_url: str, engine: Engine, make_settings: MakeSettings
) -> None:
    settings = make_settings()
    assert CliRunner().invoke(cli, ["migrate"], env={"USP_DATABASE_URL": database_url}).exit_code == 0
    with db.session(engine) as session:
        record, first = keys.rotate_or_first(session, settings)
        session.commit()
        assert first
        assert [key.kid for key in keys.signing_keys(session, settings)] == [record.kid]
        second, first = keys.rotate_or_first(session, settings, alg="ecdsa-p256-sha256")
        session.commit()
        assert not first
        assert second.signs_from > utcnow()
        assert [key.kid for key in keys.signing_keys(session, settings)] == [record.kid]


def test_a_keys_state_follows_its_schedule_and_the_jwks(engine: Engine, make_settings: MakeSettings) -> None:
    settings = make_settings(key_publish_lead_seconds=60.0, key_overlap_seconds=120.0)
    lead, overlap = timedelta(seconds=60), timedelta(seconds=120)
    migrate.upgrade(engine)
    with db.session(engine) as session:
        old, _ = keys.rotate_or_first(session, settings)
        session.commit()
        start = utcnow()
        new = keys.rotate(session, settings, now=start)
        session.commit()

        def states(at: timedelta) -> dict[str, tuple[str, bool]]:
            moment = start + at
            facts = keys.describe_keys(session, settings, now=moment)
            in_jwks = {k.kid for k in JWKS.from_dict(keys.published_jwks(session, settings, now=moment))}
            assert {f.kid for f in facts if f.published} == in_jwks  # one rule for both
            return {f.kid: (f.state, f.published) for f in facts}

        assert states(timedelta(0)) == {
            old.kid: ("signing", True),
            new.kid: ("published, not signing yet", True),
        }
        assert states(lead + overlap / 2) == {old.kid: ("signing", True), new.kid: ("signing", True)}
        after_overlap = lead + overlap + timedelta(seconds=1)
        assert states(after_overlap)[old.kid] == ("retired, still published", True)
        assert states(after_overlap + lead) == {old.kid: ("retired", False), new.kid: ("signing", True)}
