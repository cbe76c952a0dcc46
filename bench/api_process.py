"""``usp-webhooks api`` in a subprocess for the benchmarks: its own process group, a free port on
127.0.0.1, the log in the bench's folder; yields it once ``ready`` answers 200, with what
/proc says of it (CPU, RSS, open files)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx

__all__ = [
    "ApiProcess",
    "api_server",
    "cpu_seconds",
    "group_cpu_seconds",
    "group_open_files",
    "group_rss_bytes",
    "open_files",
    "or_zero",
    "rss_bytes",
]

_N = TypeVar("_N", int, float)

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ApiProcess:
    base: str  #: ``http://127.0.0.1:PORT``
    pid: int


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid`` (``VmRSS`` in ``/proc/PID/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def open_files(pid: int) -> int:
    """File descriptors ``pid`` holds (sockets included)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def group_pids(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (a worker's children included)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            pids.append(int(stat.parent.name))
    return pids


def group_cpu_seconds(pgid: int) -> float:
    return sum(or_zero(cpu_seconds, pid) for pid in group_pids(pgid))


def group_rss_bytes(pgid: int) -> int:
    return sum(or_zero(rss_bytes, pid) for pid in group_pids(pgid))


def group_open_files(pgid: int) -> int:
    return sum(or_zero(open_files, pid) for pid in group_pids(pgid))


def or_zero(measure: Callable[[int], _N], pid: int) -> _N | int:
    """``measure(pid)``, or 0 for a process that exited meanwhile."""
    try:
        return measure(pid)
    except OSError:
        return 0


@contextmanager
def api_server(env: dict[str, str], folder: Path, *, ready: str) -> Iterator[ApiProcess]:
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
        yield ApiProcess(base, process.pid)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
