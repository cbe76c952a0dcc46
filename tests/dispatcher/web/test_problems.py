"""Every error is an RFC 9457 problem with a stable reason, and none leaks exception text."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.dispatcher.conftest import ADMIN, MakeClient, MakeSettings
from tests.dispatcher.support import assert_problem
from usp_dispatcher.api.app import create_app

SECRET_TEXT = "connection string postgresql://admin:hunter2@db"


def test_unhandled_exception_is_a_bare_500_problem(
    make_client: MakeClient, make_settings: MakeSettings, caplog: pytest.LogCaptureFixture
) -> None:
    app = create_app(make_settings())

    async def explode() -> None:
        raise RuntimeError(SECRET_TEXT)

    app.add_api_route("/explode", explode)
    client = make_client(app=app)
    response = client.get("/explode")
    problem = assert_problem(response, 500, "internal_error")
    assert SECRET_TEXT not in response.text
    assert "RuntimeError" not in response.text
    assert "Traceback" not in problem["detail"]
    # The operator still gets the whole story in the log.
    assert any(record.exc_info and record.levelno == logging.ERROR for record in caplog.records)


def test_unknown_route_and_wrong_method(client: TestClient) -> None:
    assert_problem(client.get("/nowhere"), 404, "not_found")
    assert_problem(client.put("/events", headers=ADMIN), 405, "method_not_allowed")


def test_validation_error_names_the_field_not_the_value(client: TestClient) -> None:
    response = client.post("/services/feed/subscriptions", json={"url": 12345678}, headers=ADMIN)
    problem = assert_problem(response, 422, "invalid_request")
    assert "url" in problem["detail"]
    assert "12345678" not in problem["detail"]


def test_a_client_that_disconnects_mid_body_is_logged_at_info_without_a_traceback(
    make_settings: MakeSettings, serve: Any, caplog: pytest.LogCaptureFixture
) -> None:
    import socket
    import time
    from urllib.parse import urlsplit

    base = urlsplit(serve(create_app(make_settings())))
    caplog.set_level(logging.INFO)
    with socket.create_connection((base.hostname, base.port)) as sock:
        sock.sendall(
            b"POST /events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + ADMIN["Authorization"].split()[1].encode() + b"\r\n"
            b'Content-Length: 5000\r\n\r\n{"event": "booking'
        )
        time.sleep(0.3)
    for _ in range(50):  # the server notices the close on its own schedule
        if any("client disconnected" in r.getMessage() for r in caplog.records):
            break
        time.sleep(0.1)
    disconnected = [r for r in caplog.records if "client disconnected" in r.getMessage()]
    assert disconnected
    assert all(r.levelno == logging.INFO for r in disconnected)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [
        r.getMessage() for r in caplog.records
    ]
    assert not any(r.exc_info for r in caplog.records)
