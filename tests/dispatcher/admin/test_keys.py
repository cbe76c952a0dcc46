"""``/admin/keys``: the signing keys' public facts, and rotation (admin token; never private material).

The token guard for both routes is walked with every other admin route in ``test_api.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine
from sqlmodel import select

from tests.dispatcher.conftest import ADMIN, MakeClient
from tests.dispatcher.support import assert_problem
from usp_core import db
from usp_core.keys import SigningKeyRecord

STATES = {"published, not signing yet", "signing", "retired, still published", "retired"}
FACTS = {"kid", "alg", "created_at", "signs_from", "retires_at", "published", "state"}


def members(value: Any) -> Iterator[str]:
    """Every object member name anywhere in a JSON document."""
    if isinstance(value, dict):
        for name, item in value.items():
            yield name
            yield from members(item)
    elif isinstance(value, list):
        for item in value:
            yield from members(item)


def assert_public(engine: Engine, *texts: str) -> None:
    """No answer names a private member or holds any key's private value."""
    with db.session(engine) as session:
        secrets = [json.loads(r.private_jwk)["d"] for r in session.exec(select(SigningKeyRecord)).all()]
    assert secrets
    for text in texts:
        assert "d" not in set(members(json.loads(text)))
        assert "private_jwk" not in text
        for secret in secrets:
            assert secret not in text


@pytest.fixture
def client(make_client: MakeClient) -> TestClient:
    return make_client(key_publish_lead_seconds=60.0, key_overlap_seconds=120.0)


def test_keys_are_listed_with_their_schedule(client: TestClient, engine: Engine) -> None:
    response = client.get("/admin/keys", headers=ADMIN)
    assert response.status_code == 200, response.text
    (key,) = response.json()["items"]
    assert set(key) == FACTS
    assert (key["alg"], key["state"], key["published"], key["retires_at"]) == (
        "ed25519",
        "signing",
        True,
        None,
    )
    with db.session(engine) as session:
        (record,) = session.exec(select(SigningKeyRecord)).all()
    assert key["kid"] == record.kid
    assert_public(engine, response.text)


def test_rotate_answers_201_with_when_the_new_key_signs_and_the_old_retires(
    client: TestClient, engine: Engine
) -> None:
    old = client.get("/admin/keys", headers=ADMIN).json()["items"][0]
    before = datetime.now(UTC)
    response = client.post("/admin/keys/rotate", json={"alg": "ecdsa-p256-sha256"}, headers=ADMIN)
    after = datetime.now(UTC)
    assert response.status_code == 201, response.text
    rotated = response.json()
    new = rotated["key"]
    assert set(new) == FACTS
    assert (new["alg"], new["state"], new["published"]) == (
        "ecdsa-p256-sha256",
        "published, not signing yet",
        True,
    )
    assert rotated["first"] is False
    assert rotated["signs_from"] == new["signs_from"]
    starts = datetime.fromisoformat(new["signs_from"])
    assert before + timedelta(seconds=60) <= starts <= after + timedelta(seconds=60)  # the publish lead
    retire = datetime.fromisoformat(rotated["older_keys_retire_at"])
    assert retire == starts + timedelta(seconds=120)

    listed = client.get("/admin/keys", headers=ADMIN)
    by_kid = {k["kid"]: k for k in listed.json()["items"]}
    assert list(by_kid) == [old["kid"], new["kid"]]  # oldest schedule first
    assert datetime.fromisoformat(by_kid[old["kid"]]["retires_at"]) == retire
    assert by_kid[old["kid"]]["state"] == "signing"
    assert {k["kid"] for k in client.get("/.well-known/usp/jwks.json").json()["keys"]} == set(by_kid)
    assert_public(engine, response.text, listed.text)


def test_rotate_without_a_body_makes_an_ed25519_key(client: TestClient) -> None:
    response = client.post("/admin/keys/rotate", headers=ADMIN)
    assert response.status_code == 201, response.text
    assert response.json()["key"]["alg"] == "ed25519"
    assert len(client.get("/admin/keys", headers=ADMIN).json()["items"]) == 2


def test_rotate_refuses_an_unknown_algorithm(client: TestClient) -> None:
    assert_problem(
        client.post("/admin/keys/rotate", json={"alg": "rsa"}, headers=ADMIN), 422, "invalid_request"
    )
    assert len(client.get("/admin/keys", headers=ADMIN).json()["items"]) == 1


def test_openapi_documents_the_key_answers(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    rotate = spec["paths"]["/admin/keys/rotate"]["post"]["responses"]
    assert {"201", "401", "422"} <= set(rotate)
    key = spec["components"]["schemas"]["KeyOut"]["properties"]
    assert set(key) == FACTS
    assert set(key["state"]["enum"]) == STATES
