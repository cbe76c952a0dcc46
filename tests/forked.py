"""Python child processes forked from a server that has already imported the heavy libraries.

A worker or scheduler started as ``python -c`` spends about 0.75 s of CPU importing SQLAlchemy,
kombu, Celery, pydantic models before it does anything, and the suite starts ~85 of them: on two
cores that is most of a minute. :func:`start` runs the same code in a process forked from
``multiprocessing``'s fork server, which imported those once (:data:`PRELOAD`). The child is
otherwise what ``subprocess.Popen`` would give: its own session (``killpg`` reaches it and only
it), the working directory and environment it was given (read when its code runs: nothing that
reads settings at import time is preloaded), its output unbuffered into a file, ``atexit`` run on
the way out. What a fresh interpreter does (``usp-webhooks worker``, ``celery -A … worker``) is
tested by the tests that run those commands.
"""

from __future__ import annotations

import atexit
import io
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from multiprocessing.context import ForkServerContext, ForkServerProcess
from pathlib import Path

#: Imported once by the fork server. Only modules that read no settings or environment when
#: imported: ``usp_workers.runtime.celery_app`` builds its app from the environment at import, so it
#: (and what imports it) is left to each child.
PRELOAD = (
    "tests.forked",
    "sqlmodel",
    "httpx",
    "anyio",
    "redis",
    "celery",
    "celery.apps.worker",
    "celery.concurrency.thread",
    "celery.worker.consumer",
    "kombu.transport.redis",
    "kombu.transport.pyamqp",
    "kombu.transport.sqlalchemy",
    "usp_schemas",
    "usp_receiver",
    "usp_workers.engine.delivery",
    "usp_workers.operations",
    "usp_workers.storage.retention",
    "usp_workers.runtime.embedded_broker",
    "usp_workers.runtime.heap",
    "usp_workers.runtime.logs",
)

_context: ForkServerContext | None = None


def _fork_server() -> ForkServerContext:
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        assert isinstance(context, ForkServerContext)
        context.set_forkserver_preload(list(PRELOAD))
        _context = context
    return _context


class Child:
    """The part of ``subprocess.Popen`` the tests use, for a forked child."""

    def __init__(self, process: ForkServerProcess) -> None:
        self._process = process
        assert process.pid is not None
        self.pid: int = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(f"forked child {self.pid}", timeout or 0.0)
        return code

    def send_signal(self, signum: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, signum)


def start(code: str, *, cwd: Path, env: Mapping[str, str], log: Path) -> Child:
    """Run ``code`` as ``python -c code`` would, in a forked child; its output appended to ``log``."""
    process = _fork_server().Process(target=_run, args=(code, str(cwd), dict(env), str(log)), daemon=True)
    process.start()
    assert isinstance(process, ForkServerProcess)
    assert process.pid is not None
    while process.exitcode is None and _group_of(process.pid) != process.pid:
        time.sleep(0.001)  # until its first step (setsid) is done: a killpg from now on reaches it
    return Child(process)


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _run(code: str, cwd: str, env: dict[str, str], log: str) -> None:
    os.setsid()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["-c"]
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # Unbuffered, as PYTHONUNBUFFERED makes a fresh interpreter's: a SIGKILL loses nothing written.
    sys.stdout = _unbuffered(1)
    sys.stderr = _unbuffered(2)
    sys.__stdout__ = sys.stdout  # type: ignore[misc]  # Celery's log handler writes to sys.__stderr__
    sys.__stderr__ = sys.stderr  # type: ignore[misc]
    try:
        exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102 (as `python -c`)
    finally:
        atexit._run_exitfuncs()


def _unbuffered(fd: int) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace", write_through=True)
