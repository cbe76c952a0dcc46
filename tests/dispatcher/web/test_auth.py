"""Admin bearer auth: fail closed, constant-time compare, problem bodies, the token never logged."""

from __future__ import annotations

import logging

import pytest
from pydantic import SecretStr

from tests.dispatcher.conftest import ADMIN, ADMIN_TOKEN, MakeClient
from tests.dispatcher.support import assert_problem

ADMIN_ROUTES = [
    ("GET", "/services/feed/subscriptions"),
    ("POST", "/services/feed/subscriptions"),
    ("GET", "/services/feed/subscriptions/sub_x"),
    ("DELETE", "/services/feed/subscriptions/sub_x"),
    ("POST", "/services/feed/profiles"),
    ("POST", "/events"),
]


@pytest.mark.parametrize(("method", "path"), ADMIN_ROUTES)
def test_missing_token_is_refused(make_client: MakeClient, method: str, path: str) -> None:
    response = make_client().request(method, path, json={})
    assert_problem(response, 401, "unauthenticated")
    assert response.headers["www-authenticate"].startswith("Bearer")


@pytest.mark.parametrize(("method", "path"), ADMIN_ROUTES)
def test_wrong_token_is_refused(make_client: MakeClient, method: str, path: str) -> None:
    response = make_client().request(method, path, json={}, headers={"Authorization": "Bearer nope"})
    assert_problem(response, 401, "invalid_token")
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_other_schemes_are_refused(make_client: MakeClient) -> None:
    client = make_client()
    response = client.get("/services/feed/subscriptions", headers={"Authorization": f"Basic {ADMIN_TOKEN}"})
    assert_problem(response, 401, "unauthenticated")


@pytest.mark.parametrize("configured", [None, SecretStr("")])
def test_without_a_configured_token_everyone_is_refused(
    make_client: MakeClient, configured: SecretStr | None
) -> None:
    client = make_client(admin_token=configured)
    for headers in ({}, ADMIN, {"Authorization": "Bearer "}):
        response = client.get("/services/feed/subscriptions", headers=headers)
        assert_problem(response, 401, "admin_disabled")
        assert response.headers["www-authenticate"].startswith("Bearer")


def test_right_token_is_let_through(make_client: MakeClient) -> None:
    response = make_client().get("/services/feed/subscriptions", headers=ADMIN)
    assert response.status_code == 200
    assert response.json() == {"items": [], "next_cursor": None}


def test_public_key_routes_need_no_token(make_client: MakeClient) -> None:
    client = make_client(admin_token=None)
    assert client.get("/.well-known/usp/jwks.json").status_code == 200
    assert client.get("/.well-known/http-message-signatures-directory").status_code == 200


def test_tokens_are_not_logged(make_client: MakeClient, caplog: pytest.LogCaptureFixture) -> None:
    client = make_client()
    caplog.set_level(logging.DEBUG)
    client.get("/services/feed/subscriptions", headers=ADMIN)
    client.get("/services/feed/subscriptions", headers={"Authorization": "Bearer guess-0451"})
    assert caplog.records, "expected the server to log something at DEBUG"
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert ADMIN_TOKEN not in logged
    assert "guess-0451" not in logged
