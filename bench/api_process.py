"""``usp-webhooks api`` in a subprocess for the benchmarks: its own process group, a free port on
127.0.0.1, the log in the bench's folder; yields the base URL once ``ready`` answers 200."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

__all__ = ["api_server"]


@contextmanager
def api_server(env: dict[str, str], folder: Path, *, ready: str) -> Iterator[str]:
    """Run the API with ``env`` (on top of this process's environment) until the block ends."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (folder / "api.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "usp_dispatcher.cli", "api", "--port", str(port)],
        env={**os.environ, **env},
        cwd=folder,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the API did not start; see {folder / 'api.log'}")
            try:
                if httpx.get(f"{base}{ready}", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield base
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
