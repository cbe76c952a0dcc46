"""The receiver library's base install stays light.

``usp-receiver`` without extras must not pull in (or import) a web framework, an ORM, a
broker client, the MCP SDK or a CLI toolkit: those belong to the extras. The repo's own venv has
every extra installed, so this is only provable in a fresh venv built from the two member
directories (non-editable), which is what these tests do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[1]

#: Packages that only an extra (or nothing at all) may bring in.
HEAVY = ("celery", "sqlmodel", "fastapi", "redis", "sqlalchemy", "mcp", "typer")

# Runs inside the fresh venv (python -I: no cwd, no PYTHON* variables, no user site).
_PROBE = r"""
import importlib, importlib.util, json, sys

heavy = json.loads(sys.argv[1])
report = {"errors": []}

def load(name):
    try:
        mod = importlib.import_module(name)
    except Exception as exc:
        report["errors"].append(f"import {name}: {type(exc).__name__}: {exc}")
        return None
    for public in getattr(mod, "__all__", ()):
        try:
            getattr(mod, public)
        except Exception as exc:
            report["errors"].append(f"{name}.{public}: {type(exc).__name__}: {exc}")
    return mod

receiver = load("usp_receiver")
load("usp_receiver.dedupe")
report["receiver_file"] = getattr(receiver, "__file__", None)
report["prefix"] = sys.prefix
report["imported"] = sorted(
    {m.partition(".")[0] for m in sys.modules} & set(heavy)
)
report["findable"] = sorted(m for m in heavy if importlib.util.find_spec(m) is not None)
print(json.dumps(report))
"""


def _uv() -> str:
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("`uv` is not on PATH: the isolation tests build venvs with it (pip install uv)")
    return uv


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # Don't let the outer `uv run` venv leak into the inner one.
    for var in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "UV_PROJECT_ENVIRONMENT", "UV_PYTHON"):
        env.pop(var, None)
    env["UV_LINK_MODE"] = "copy"  # tmp_path is often on another filesystem than the cache
    return env


def _run(cmd: list[str], cwd: Path) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc.stdout


def _fresh_venv(where: Path, *requirements: str) -> Path:
    uv = _uv()
    venv = where / "venv"
    _run([uv, "venv", "--quiet", "--python", "3.11", str(venv)], cwd=where)
    python = venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    # From the repo root so that "./schemas" and "./receiver" are the workspace members; both in one
    # command so that usp-receiver's dependency on usp-schemas resolves to the local one.
    _run([uv, "pip", "install", "--quiet", "--python", str(python), *requirements], cwd=REPO_ROOT)
    return python


def _probe(python: Path, cwd: Path) -> dict[str, Any]:
    out = _run([str(python), "-I", "-c", _PROBE, json.dumps(HEAVY)], cwd=cwd)
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return report


def _assert_installed_copy(report: dict[str, Any]) -> None:
    receiver_file = report["receiver_file"]
    assert receiver_file is not None
    # A real install in the venv, not the repo's source tree (no editable install, no sys.path leak).
    assert Path(receiver_file).resolve().is_relative_to(Path(report["prefix"]).resolve()), report
    assert not Path(receiver_file).resolve().is_relative_to(REPO_ROOT / "receiver"), report


def test_base_install_pulls_in_no_extra(tmp_path: Path) -> None:
    python = _fresh_venv(tmp_path, "./schemas", "./receiver")
    report = _probe(python, tmp_path)

    assert report["errors"] == [], "importing the base library failed:\n" + "\n".join(report["errors"])
    _assert_installed_copy(report)
    assert report["findable"] == [], f"base install of usp-receiver brought in {report['findable']}"
    assert report["imported"] == [], f"importing usp_receiver imported {report['imported']}"


def test_redis_extra_brings_redis_only(tmp_path: Path) -> None:
    python = _fresh_venv(tmp_path, "./schemas", "./receiver[redis]")
    report = _probe(python, tmp_path)

    assert report["errors"] == [], "importing the library failed:\n" + "\n".join(report["errors"])
    _assert_installed_copy(report)
    assert report["findable"] == ["redis"], f"usp-receiver[redis] brought in {report['findable']}"
    assert set(report["imported"]) <= {"redis"}, f"importing usp_receiver imported {report['imported']}"
