"""``usp-webhooks`` commands other than ``keys``: migrate and api."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from typer.testing import CliRunner

from usp_dispatcher import cli
from usp_workers.storage import migrate


@pytest.mark.empty_database
def test_migrate_creates_the_schema(database_url: str, engine: Engine) -> None:
    assert "usp_events" not in sa.inspect(engine).get_table_names()
    result = CliRunner().invoke(cli.app, ["migrate"], env={"USP_DATABASE_URL": database_url})
    assert result.exit_code == 0, result.output
    engine.dispose()  # forget cached metadata
    tables = set(sa.inspect(engine).get_table_names())
    assert {"usp_events", "usp_subscriptions", "usp_deliveries", "usp_attempts", "usp_signing_keys"} <= tables
    # It says what it created: every table, and where each chain now stands.
    said = " ".join(result.output.split())
    assert said.startswith("created the schema on ")
    for table in ("usp_events", "usp_deliveries", "sched_bookings", "ucap_posts"):
        assert table in said
    assert f"{len(tables - {'alembic_version', 'alembic_version_dispatcher'})} tables" in said
    # Idempotent: a second run changes nothing, succeeds and says so.
    again = CliRunner().invoke(cli.app, ["migrate"], env={"USP_DATABASE_URL": database_url})
    assert again.exit_code == 0, again.output
    assert "up to date" in again.output
    assert "nothing to do" in again.output


@pytest.mark.empty_database
def test_migrate_names_the_revisions_it_applied(database_url: str, engine: Engine) -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(migrate.MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    migrate.upgrade(engine, "0004")
    result = CliRunner().invoke(cli.app, ["migrate"], env={"USP_DATABASE_URL": database_url})
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "upgraded the schema" in said
    assert f"engine 0004 → {head}" in said


def test_api_serves_create_app_on_the_given_address(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, dict[str, Any]]] = []
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: calls.append((app, kwargs)))
    result = CliRunner().invoke(
        cli.app, ["api", "--host", "0.0.0.0", "--port", "8123"], env={"USP_ADMIN_TOKEN": "t0k"}
    )
    assert result.exit_code == 0, result.output
    ((app, kwargs),) = calls
    assert kwargs["host"] == "0.0.0.0"
    assert kwargs["port"] == 8123
    assert app.state.settings.admin_token.get_secret_value() == "t0k"
    assert "t0k" not in result.output


def test_api_defaults_to_localhost(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: calls.append(kwargs))
    assert CliRunner().invoke(cli.app, ["api"]).exit_code == 0
    assert (calls[0]["host"], calls[0]["port"]) == ("127.0.0.1", 8000)


def test_help_lists_the_commands() -> None:
    result = CliRunner().invoke(cli.app, ["--help"])
    assert result.exit_code == 0
    for command in ("migrate", "api", "keys"):
        assert command in result.output


def test_worker_help_gives_the_default_concurrency_the_worker_runs_with() -> None:
    from usp_workers.runtime.worker import DEFAULT_CONCURRENCY

    result = CliRunner().invoke(cli.app, ["worker", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert f"default {DEFAULT_CONCURRENCY})" in result.output
