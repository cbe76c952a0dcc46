"""The published keys (JWKS and Web Bot Auth directory) and the ``keys`` CLI commands."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import select
from typer.testing import CliRunner

from usp_dispatcher.cli import app as cli
from usp_receiver import JWKS
from usp_workers import db, keys
from usp_workers.models import SigningKeyRecord
from usp_workers.settings import Settings

from .conftest import MakeClient, MakeSettings

JWKS_PATH = "/.well-known/usp/jwks.json"
DIRECTORY_PATH = "/.well-known/http-message-signatures-directory"


def cli_env(settings: Settings) -> dict[str, str]:
    return {
        "USP_DATABASE_URL": settings.database_url,
        "USP_KEY_PUBLISH_LEAD_SECONDS": str(settings.key_publish_lead_seconds),
    }


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
    client: TestClient, engine: Engine, make_settings: MakeSettings
) -> None:
    settings = make_settings()
    before = JWKS.from_dict(client.get(JWKS_PATH).json())
    result = CliRunner().invoke(cli, ["keys", "rotate"], env=cli_env(settings))
    assert result.exit_code == 0, result.output
    after = JWKS.from_dict(client.get(JWKS_PATH).json())
    assert len(before) == 1
    assert len(after) == 2
    (new_kid,) = {key.kid for key in after} - {key.kid for key in before}
    assert new_kid in result.output
    with db.session(engine) as session:
        signing_now = [key.kid for key in keys.signing_keys(session, settings)]
    assert signing_now == [next(iter(before)).kid]  # the new key waits for the publish lead


def test_rotate_with_ecdsa(client: TestClient, database_url: str) -> None:
    env = {"USP_DATABASE_URL": database_url}
    result = CliRunner().invoke(cli, ["keys", "rotate", "--alg", "ecdsa-p256-sha256"], env=env)
    assert result.exit_code == 0, result.output
    algs = sorted(key.alg for key in JWKS.from_dict(client.get(JWKS_PATH).json()))
    assert algs == ["ecdsa-p256-sha256", "ed25519"]


def test_keys_list_shows_schedule_but_no_private_members(
    client: TestClient, engine: Engine, make_settings: MakeSettings
) -> None:
    env = cli_env(make_settings())
    assert CliRunner().invoke(cli, ["keys", "rotate"], env=env).exit_code == 0
    result = CliRunner().invoke(cli, ["keys", "list"], env=env | {"COLUMNS": "200"})
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


def test_rotate_on_an_empty_database_signs_at_once(
    database_url: str, engine: Engine, make_settings: MakeSettings
) -> None:
    env = {"USP_DATABASE_URL": database_url}
    assert CliRunner().invoke(cli, ["migrate"], env=env).exit_code == 0
    result = CliRunner().invoke(cli, ["keys", "rotate"], env=env)
    assert result.exit_code == 0, result.output
    with db.session(engine) as session:
        assert len(keys.signing_keys(session, make_settings())) == 1
