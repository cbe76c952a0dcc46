"""One background event loop and one shared ``AsyncClient`` per process, for synchronous callers.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_workers.engine.background``.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import httpx

from usp_core.settings import CommonSettings
from usp_workers.engine.transport import make_client

__all__ = ["BackgroundRuntime", "background_runtime", "close_background_runtime"]

T = TypeVar("T")

_STOP_TIMEOUT = 10.0


class BackgroundRuntime:
    """An event loop running in a daemon thread, and the ``AsyncClient`` that lives on it."""

    def __init__(self, settings: CommonSettings) -> None:
        self.pid = os.getpid()
        self._closed = False
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="usp-delivery-loop", daemon=True)
        self._thread.start()
        self.client: httpx.AsyncClient = self.run(_build_client(settings))

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for its result (from any other thread)."""
        return self.submit(coroutine).result()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coroutine`` on the loop (from any other thread); its future."""
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("BackgroundRuntime.run called from its own loop: await the coroutine")
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def close(self) -> None:
        """Close the client, stop the loop and its thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.run(self._shutdown())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(_STOP_TIMEOUT)
            if not self._thread.is_alive():
                self.loop.close()

    async def _shutdown(self) -> None:
        await self.client.aclose()
        await self.loop.shutdown_asyncgens()
        await self.loop.shutdown_default_executor()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()


async def _build_client(settings: CommonSettings) -> httpx.AsyncClient:
    return make_client(settings)  # built on the loop it will serve


_lock = threading.Lock()
_runtime: BackgroundRuntime | None = None
#: Runtimes inherited across a fork: kept alive, never closed in the child (see module doc).
_inherited: list[BackgroundRuntime] = []


def background_runtime(settings: CommonSettings) -> BackgroundRuntime:
    """The process's runtime, created on first use (its client from the first caller's
    ``settings``: timeouts are set per request anyway)."""
    global _runtime
    runtime = _runtime
    if runtime is not None and runtime.pid == os.getpid():
        return runtime
    with _lock:
        if _runtime is None or _runtime.pid != os.getpid():
            _runtime = BackgroundRuntime(settings)
        return _runtime


def close_background_runtime() -> None:
    """Close the process's runtime (at exit, and in tests); the next use builds a new one."""
    global _runtime
    with _lock:
        runtime, _runtime = _runtime, None
    if runtime is not None and runtime.pid == os.getpid():
        runtime.close()


def _forget_after_fork() -> None:
    global _lock, _runtime
    _lock = threading.Lock()  # it may have been held by another thread at the fork
    if _runtime is not None:
        _inherited.append(_runtime)
    _runtime = None


atexit.register(close_background_runtime)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
