"""``/healthz``, ``/readyz`` and ``usp-webhooks ready``: liveness touches nothing, readiness
names the dependency that failed (database or broker, each made unreachable through a proxy),
and the API says at start when no admin token is set."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from tests.dispatcher.conftest import ADMIN, MakeClient, MakeSettings
from tests.dispatcher.support import assert_problem, event
from tests.faults import tcp_proxy
from usp_dispatcher.cli import app as cli_app


def through(proxy_port: int, url: str) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    return sa.make_url(url).set(host="127.0.0.1", port=proxy_port).render_as_string(hide_password=False)


def test_liveness_and_readiness_when_everything_answers(make_client: MakeClient) -> None:
    client = make_client()
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ready",
        "checks": {"database": {"ok": True, "error": None}, "broker": {"ok": True, "error": None}},
    }


def test_readiness_names_an_unreachable_broker(make_client: MakeClient, redis_url: str) -> None:
    parsed = sa.make_url(redis_url)
    with tcp_proxy(parsed.host or "127.0.0.1", parsed.port or 6379) as proxy:
        client = make_client(broker_url=f"redis://127.0.0.1:{proxy.port}/0")
        assert client.get("/readyz").status_code == 200
        proxy.cut()
        ready = client.get("/readyz")
        assert client.get("/healthz").status_code == 200, "liveness does not depend on the broker"
        proxy.restore()
        assert client.get("/readyz").status_code == 200, "ready again once the broker answers"
    assert ready.status_code == 503
    body: dict[str, Any] = ready.json()
    assert body["status"] == "unready"
    assert body["checks"]["database"] == {"ok": True, "error": None}
    assert body["checks"]["broker"]["ok"] is False
    assert body["checks"]["broker"]["error"]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_readiness_names_an_unreachable_database(make_client: MakeClient, database_url: str) -> None:
    parsed = sa.make_url(database_url)
    with tcp_proxy(parsed.host or "127.0.0.1", parsed.port or 5432) as proxy:
        client = make_client(database_url=through(proxy.port, database_url))
        assert client.get("/readyz").status_code == 200
        proxy.cut()
        ready = client.get("/readyz")
        alive = client.get("/healthz")
        proxy.restore()
        again = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["database"]["ok"] is False
    assert "OperationalError" in ready.json()["checks"]["database"]["error"]
    assert ready.json()["checks"]["broker"]["ok"] is True
    assert alive.status_code == 200
    assert again.status_code == 200, "ready again once the database answers"


def test_the_ready_command_exits_1_naming_what_failed(
    make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    settings = make_settings()
    monkeypatch.setenv("USP_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("USP_BROKER_URL", redis_url)
    ok = CliRunner().invoke(cli_app, ["ready"])
    assert ok.exit_code == 0, ok.output
    assert "database: ok" in ok.output
    assert "broker: ok" in ok.output
    with tcp_proxy("127.0.0.1", 1) as closed:
        closed.cut()
        monkeypatch.setenv("USP_BROKER_URL", f"redis://127.0.0.1:{closed.port}/0")
        failed = CliRunner().invoke(cli_app, ["ready"])
    assert failed.exit_code == 1
    assert "database: ok" in failed.output
    assert "broker: " in failed.output
    assert "broker: ok" not in failed.output


def test_the_api_warns_at_start_without_an_admin_token(
    make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="usp_dispatcher"):
        make_client(admin_token=None)
    (warning,) = [r for r in caplog.records if "USP_ADMIN_TOKEN" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    assert "refuses every call" in warning.getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="usp_dispatcher"):
        make_client()
    assert not [r for r in caplog.records if "USP_ADMIN_TOKEN" in r.getMessage()]


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_writes_while_the_database_is_down_are_503_with_retry_after_and_one_warning_per_outage(
    make_client: MakeClient, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Producers back off on 503 + Retry-After; the log says when the outage began and, when a
    write succeeds again, how many requests it refused; no traceback per request."""
    parsed = sa.make_url(database_url)
    with tcp_proxy(parsed.host or "127.0.0.1", parsed.port or 5432) as proxy:
        client = make_client(database_url=through(proxy.port, database_url))
        assert client.post("/events", json=event("booking.confirmed"), headers=ADMIN).status_code == 202
        proxy.cut()
        with caplog.at_level(logging.INFO):
            refused = [
                client.post("/events", json=event("booking.confirmed"), headers=ADMIN) for _ in range(5)
            ]
            proxy.restore()
            accepted = client.post("/events", json=event("booking.confirmed"), headers=ADMIN)
    for response in refused:
        assert_problem(response, 503, "database_unavailable")
        assert response.headers["retry-after"] == "5"
    assert accepted.status_code == 202, accepted.text
    said = [r for r in caplog.records if r.name == "usp_dispatcher" and r.levelno >= logging.WARNING]
    assert [r.getMessage().split(" (")[0].split(" after")[0] for r in said] == [
        "database unavailable",
        "database available again",
    ]
    assert "5 operations failed meanwhile" in said[1].getMessage()
    assert not [r for r in caplog.records if r.exc_info], "no traceback"
