"""``docker-compose.yml`` and ``Dockerfile``: the stack they describe is one this code can run.

(a) Structure, checked on every run: each app service runs a real ``usp-webhooks`` command with
options that command accepts, the worker can be scaled, images are the official ones, services
wait for what they need. (b) ``docker compose config -q``, Compose's own validation, when Docker
Compose is installed; otherwise that one test is skipped and says why.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from usp_dispatcher.cli import app as cli_app

REPO = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"

INFRA_IMAGES = {"redis": "redis:7-alpine", "postgres": "postgres:16-alpine"}
APP_SERVICES = ("migrate", "api", "worker", "scheduler")
LONG_RUNNING = ("api", "worker", "scheduler")


def _load_compose() -> dict[str, Any]:
    document: Any = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(document, dict), "docker-compose.yml is not a mapping"
    return document


COMPOSE = _load_compose()
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]


def test_exactly_the_expected_services() -> None:
    assert set(SERVICES) == set(INFRA_IMAGES) | set(APP_SERVICES)


@pytest.mark.parametrize("name", sorted(INFRA_IMAGES))
def test_infrastructure_uses_official_images(name: str) -> None:
    assert SERVICES[name]["image"] == INFRA_IMAGES[name]
    assert SERVICES[name]["healthcheck"]["test"][0] == "CMD"


@pytest.mark.parametrize("name", APP_SERVICES)
def test_app_service_runs_a_real_cli_command(name: str) -> None:
    """Fails until the CLI has the command compose runs (``worker``/``scheduler`` land separately)."""
    command = SERVICES[name]["command"]
    assert isinstance(command, list), f"{name}: use the exec form (a list) for command"
    program, subcommand, *args = command
    assert program == "usp-webhooks"
    group = typer.main.get_command(cli_app)
    assert isinstance(group, typer.core.TyperGroup)
    known = sorted(group.commands)
    assert subcommand in known, (
        f"compose service {name!r} runs `usp-webhooks {subcommand}`, CLI has only {known}"
    )
    help_run = CliRunner().invoke(cli_app, [subcommand, "--help"])
    assert help_run.exit_code == 0, help_run.output
    # The arguments must parse as that command's options (parsing only: nothing runs).
    group.commands[subcommand].make_context(subcommand, list(args))


@pytest.mark.parametrize("name", APP_SERVICES)
def test_app_services_share_one_image_built_here(name: str) -> None:
    service = SERVICES[name]
    assert service["build"] == "."
    assert service["image"] == SERVICES["api"]["image"]


@pytest.mark.parametrize("name", APP_SERVICES)
def test_app_services_use_postgres_and_redis(name: str) -> None:
    env = SERVICES[name]["environment"]
    assert env["USP_DATABASE_URL"].startswith("postgresql+psycopg://")
    assert "@postgres:5432/" in env["USP_DATABASE_URL"]
    assert env["USP_BROKER_URL"] == "redis://redis:6379/0"
    depends = SERVICES[name]["depends_on"]
    assert depends["postgres"] == {"condition": "service_healthy"}


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_long_running_services_wait_for_migrations_and_redis(name: str) -> None:
    depends = SERVICES[name]["depends_on"]
    assert depends["migrate"] == {"condition": "service_completed_successfully"}
    assert depends["redis"] == {"condition": "service_healthy"}


def test_every_health_condition_has_a_healthcheck() -> None:
    for name, service in SERVICES.items():
        for dependency, rule in (service.get("depends_on") or {}).items():
            assert dependency in SERVICES, f"{name} depends on unknown {dependency}"
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in SERVICES[dependency], f"{name} waits for {dependency}'s health"


def test_worker_can_be_scaled() -> None:
    worker = SERVICES["worker"]
    assert "container_name" not in worker
    assert "ports" not in worker
    assert all("container_name" not in s for s in SERVICES.values())


def test_api_listens_on_all_interfaces_and_publishes_its_port() -> None:
    assert SERVICES["api"]["command"][2:4] == ["--host", "0.0.0.0"]
    assert SERVICES["api"]["ports"] == ["8000:8000"]


def test_postgres_data_is_a_named_volume() -> None:
    assert "pgdata" in COMPOSE["volumes"]
    assert "pgdata:/var/lib/postgresql/data" in SERVICES["postgres"]["volumes"]


def test_dockerfile_installs_the_locked_workspace() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.MULTILINE)
    assert re.search(r"^RUN pip install .*\buv\b", text, re.MULTILINE), "uv comes from PyPI via pip"
    assert re.search(r"^RUN uv sync --frozen --no-dev$", text, re.MULTILINE)
    assert text.index("uv.lock") < text.index("uv sync"), "the lock is copied before syncing"


def test_docker_compose_config_accepts_the_file() -> None:
    """Compose's own validation, run only where Docker Compose exists."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker is not installed: `docker compose config -q` could not be run")
    version = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, check=False)
    if version.returncode != 0:
        pytest.skip(
            "docker is installed but the compose plugin is not "
            f"(`docker compose version`: {version.stderr.strip() or version.returncode}); "
            "`docker compose config -q` could not be run"
        )
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE_FILE), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("name", LONG_RUNNING)
def test_long_running_services_have_a_readiness_health_check(name: str) -> None:
    """The API probes /readyz (database and broker); the worker and the scheduler, which serve no
    HTTP, run ``usp-webhooks ready``, the same checks."""
    test = SERVICES[name]["healthcheck"]["test"]
    assert test[0] == "CMD"
    if name == "api":
        assert "/readyz" in " ".join(test)
        return
    assert test[1:] == ["usp-webhooks", "ready"]
    group = typer.main.get_command(cli_app)
    assert isinstance(group, typer.core.TyperGroup)
    assert "ready" in group.commands


def test_the_readmes_compose_line_sets_the_admin_token_and_builds() -> None:
    readme = (REPO / "README.md").read_text()
    (line,) = [line for line in readme.splitlines() if "docker compose up" in line and "```" not in line]
    assert line.startswith("USP_ADMIN_TOKEN=$(openssl rand -hex 32) docker compose up --build")
