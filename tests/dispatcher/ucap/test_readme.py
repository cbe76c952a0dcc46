"""The README's UCAP quick start runs as written: its script, copied verbatim out of the README,
finds a paid post, gets ``payment_required``, subscribes with USDC, confirms in the sandbox and
reads the post, against the API under a real uvicorn (SQLite, development mode, as it says)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.dispatcher.conftest import Serve
from tests.readme_blocks import block_after
from usp_dispatcher.api.app import create_app
from usp_dispatcher.cli.config import Settings

SECTION = "### The content server (UCAP)"


def readme_script() -> str:
    return block_after(SECTION + "\n", "python")


def test_the_readme_agent_script_runs(serve: Serve, tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'usp-webhooks.sqlite3'}"
    settings = Settings(
        _env_file=None,
        database_url=database_url,
        allow_private_targets=True,  # `USP_ALLOW_PRIVATE_TARGETS=true`, as the README says
        broker_url=f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}",
    )
    base = serve(create_app(settings))
    script = tmp_path / "ucap_agent.py"
    script.write_text(readme_script(), encoding="utf-8")
    config = tmp_path / "config"
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(config),
        "UCAP_API": base,
        "USP_DATABASE_URL": database_url,
        "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    }
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "payment_required"
    assert "granted" in lines[1]  # payments confirm
    assert lines[2] == "ok"
    assert "agent" in lines[3].lower()
    key_file = config / "usp-webhooks" / "agents" / "my-agent.pem"
    assert key_file.stat().st_mode & 0o777 == 0o600, "readable by its owner alone"
    assert key_file.parent.stat().st_mode & 0o777 == 0o700
    assert not [p.name for p in tmp_path.iterdir() if p.suffix in (".pem", ".key")], "no key in the folder"
