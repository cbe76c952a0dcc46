"""Node.js for the tests that run other people's npm packages against the service: ``tests/node``'s
pinned packages (installed from its lockfile, ``npm ci``) and its ``*.test.mjs`` files, run under
Node's own test runner (``node --test``); and our own TypeScript receiver, ``receiver-js/``
(installed from its lockfile, built with ``tsc``, its ``test/*.test.mjs`` run the same way)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

__all__ = [
    "NODE",
    "NODE_MODULES",
    "RECEIVER_JS",
    "build_receiver_js",
    "install_node_packages",
    "node_test",
    "receiver_js_test",
]

NODE = Path(__file__).resolve().parent / "node"
NODE_MODULES = NODE / "node_modules"
RECEIVER_JS = Path(__file__).resolve().parents[1] / "receiver-js"


def _installed() -> bool:
    wanted = json.loads((NODE / "package.json").read_text())["dependencies"]
    return all((NODE_MODULES / name / "package.json").is_file() for name in wanted)


def _npm() -> str:
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("the Node.js tests need `npm` (and `node`) on the PATH")
    return npm


def _run_npm(*args: str, prefix: Path) -> None:
    command = [_npm(), *args, "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        pytest.fail(f"`{' '.join(command[1:])}` failed ({done.returncode}):\n{done.stdout}{done.stderr}")


def install_node_packages() -> None:
    """``tests/node``'s pinned npm packages, installed from its lockfile (``npm ci``) the first
    time a test needs them, so that ``uv run pytest`` in a fresh clone needs no step of its own
    (``.ci/run`` installs them ahead). A file lock keeps two test processes from installing at once."""
    if _installed():
        return
    with open(Path(tempfile.gettempdir()) / "usp-tests-npm-ci.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed():
            return  # another test process installed them meanwhile
        _run_npm("ci", prefix=NODE)


def _built() -> bool:
    """``receiver-js/dist`` is there and newer than every source file and the lockfile."""
    stamp = RECEIVER_JS / "dist" / "index.js"
    if not stamp.is_file() or not (RECEIVER_JS / "node_modules" / ".package-lock.json").is_file():
        return False
    sources = [*(RECEIVER_JS / "src").rglob("*.ts"), RECEIVER_JS / "package-lock.json"]
    built = stamp.stat().st_mtime
    return all(source.stat().st_mtime <= built for source in sources)


def build_receiver_js() -> None:
    """``receiver-js`` installed from its lockfile and built, the first time a test needs it
    (``.ci/run`` does both ahead), and again when a source file changed since."""
    if _built():
        return
    with open(Path(tempfile.gettempdir()) / "usp-tests-receiver-js.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _built():
            return
        if not (RECEIVER_JS / "node_modules" / ".package-lock.json").is_file():
            _run_npm("ci", prefix=RECEIVER_JS)
        _run_npm("run", "build", prefix=RECEIVER_JS)
        (RECEIVER_JS / "dist" / "index.js").touch()


def receiver_js_test(name: str, environment: dict[str, str] | None = None, *, timeout: float = 120) -> str:
    """Run ``receiver-js/test/<name>`` under ``node --test`` with ``environment`` added; its
    report, after asserting every test in it passed."""
    build_receiver_js()
    return _node_test(RECEIVER_JS, f"test/{name}", environment or {}, timeout)


def node_test(name: str, environment: dict[str, str], *, timeout: float = 120) -> str:
    """Run ``tests/node/<name>`` under ``node --test`` with ``environment`` added; its report,
    after asserting every test in it passed."""
    install_node_packages()
    return _node_test(NODE, name, environment, timeout)


def _node_test(cwd: Path, name: str, environment: dict[str, str], timeout: float) -> str:
    node = shutil.which("node")
    assert node is not None, "the Node.js tests need `node` on the PATH"
    done = subprocess.run(
        [node, "--test", "--test-reporter=tap", name],
        cwd=cwd,
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
