"""How the API starts: it freezes its start-up heap once started (see ``usp_workers.runtime.heap``:
the process that hands committed deliveries to the broker is the one whose full collections would
stall it), and apps built in one process share their routes, not their settings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pydantic import SecretStr

from tests.dispatcher.conftest import MakeClient


def test_the_api_freezes_its_start_up_heap_once_started(tmp_path: Path) -> None:
    code = (
        "import gc\n"
        "from fastapi.testclient import TestClient\n"
        "from usp_dispatcher.api.app import create_app\n"
        "from usp_dispatcher.cli.config import Settings\n"
        f"settings = Settings(_env_file=None, database_url='sqlite:///{tmp_path}/db.sqlite3',"
        f" broker_url='sqla+sqlite:///{tmp_path}/broker.sqlite3')\n"
        "app = create_app(settings)\n"
        "created = gc.get_freeze_count()\n"
        "with TestClient(app) as client:\n"
        "    started = gc.get_freeze_count()\n"
        "    status = client.get('/.well-known/usp/jwks.json').status_code\n"
        "print(created, started > 0, status)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120, cwd=tmp_path
    )
    assert out.stdout.split() == ["0", "True", "200"]


def test_apps_of_one_process_share_routes_but_each_answers_with_its_own_settings(
    make_client: MakeClient,
) -> None:
    # The routers are included once per process (usp_dispatcher.api.app._routes); what a route
    # reads comes from the app serving the request.
    first = make_client(admin_token=SecretStr("first-token"))
    second = make_client(admin_token=SecretStr("second-token"))
    assert first.get("/admin/events", headers=_bearer("first-token")).status_code == 200
    assert second.get("/admin/events", headers=_bearer("first-token")).status_code == 401
    assert second.get("/admin/events", headers=_bearer("second-token")).status_code == 200
    assert first.get("/admin/events", headers=_bearer("second-token")).status_code == 401


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
