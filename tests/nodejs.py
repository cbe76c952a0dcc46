"""Node.js for the tests that run other people's npm packages against the service: ``tests/node``'s
pinned packages (installed from its lockfile, ``npm ci``) and its ``*.test.mjs`` files, run under
Node's own test runner (``node --test``)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

__all__ = ["NODE", "NODE_MODULES", "install_node_packages", "node_test"]

NODE = Path(__file__).resolve().parent / "node"
NODE_MODULES = NODE / "node_modules"


def _installed() -> bool:
    wanted = json.loads((NODE / "package.json").read_text())["dependencies"]
    return all((NODE_MODULES / name / "package.json").is_file() for name in wanted)


def install_node_packages() -> None:
    """``tests/node``'s pinned npm packages, installed from its lockfile (``npm ci``) the first
    time a test needs them, so that ``uv run pytest`` in a fresh clone needs no step of its own
    (``.ci/run`` installs them ahead). A file lock keeps two test processes from installing at once."""
    if _installed():
        return
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("the Node.js tests need `npm` (and `node`) on the PATH")
    with open(Path(tempfile.gettempdir()) / "usp-tests-npm-ci.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed():
            return  # another test process installed them meanwhile
        command = [npm, "ci", "--prefix", str(NODE), "--no-audit", "--no-fund", "--loglevel=error"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            pytest.fail(f"`npm ci --prefix tests/node` failed ({done.returncode}):\n{done.stderr}")


def node_test(name: str, environment: dict[str, str], *, timeout: float = 120) -> str:
    """Run ``tests/node/<name>`` under ``node --test`` with ``environment`` added; its report,
    after asserting every test in it passed."""
    install_node_packages()
    node = shutil.which("node")
    assert node is not None, "the Node.js tests need `node` on the PATH"
    done = subprocess.run(
        [node, "--test", "--test-reporter=tap", name],
        cwd=NODE,
        env=os.environ | environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    assert "# fail 0" in report, report
    return report
