"""``usp-webhooks up``: the whole service on one machine, as three supervised child processes.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.cli.supervisor``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import httpx
from kombu.utils.url import maybe_sanitize_url
from rich.console import Console

from usp_core import db, keys
from usp_dispatcher import database
from usp_dispatcher.cli.config import Settings
from usp_workers import make_celery, prepare_broker

__all__ = ["READY_TIMEOUT", "STOP_TIMEOUT", "Child", "child_environment", "display_host", "run_up"]

#: Seconds the API gets to answer its JWKS after starting.
READY_TIMEOUT = 60.0
#: Seconds each child gets to exit after SIGTERM before it is killed.
STOP_TIMEOUT = 20.0
_JWKS_PATH = "/.well-known/usp/jwks.json"
_PR_SET_PDEATHSIG = 1


@dataclass
class Child:
    """One supervised process."""

    name: str
    process: subprocess.Popen[bytes]

    def alive(self) -> bool:
        return self.process.poll() is None


def run_up(
    settings: Settings,
    *,
    host: str,
    port: int,
    concurrency: int | None,
    console: Console,
    stop: threading.Event | None = None,
    dev: bool = False,
) -> int:
    """Prepare, start the three processes, print where to reach them, supervise until stopped;
    return the exit code. ``stop`` replaces the signal handlers (tests); ``dev`` allows webhook
    targets on loopback and private networks (said in the banner)."""
    _prepare(settings)
    env, generated_token = child_environment(settings, os.environ, host=host, port=port, dev=dev)
    command = [sys.executable, "-m", "usp_dispatcher.cli"]
    worker_args = ["worker"] + ([f"--concurrency={concurrency}"] if concurrency else [])
    specs: list[tuple[str, list[str], Mapping[str, str]]] = [
        ("api", [*command, "api", "--host", host, "--port", str(port)], env),
        # Only the API needs the admin token: the others never see it.
        ("worker", [*command, *worker_args], _without(env, "USP_ADMIN_TOKEN")),
        ("scheduler", [*command, "scheduler"], _without(env, "USP_ADMIN_TOKEN")),
    ]
    stopping = stop if stop is not None else threading.Event()
    restore = _stop_on_signals(stopping) if stop is None else _nothing
    children: list[Child] = []
    try:
        for name, argv, child_env in specs:
            children.append(Child(name, _spawn(argv, child_env)))
        base = f"http://{display_host(host)}:{port}"
        if not _wait_ready(base + _JWKS_PATH, children, stopping):
            if stopping.is_set():
                return 0
            console.print("[red]the API did not come up; stopping[/red]")
            return 1
        _announce(console, settings, base, generated_token, dev=dev)
        return _supervise(children, stopping, console)
    finally:
        _stop_all(children, console)
        restore()


def child_environment(
    settings: Settings, environ: Mapping[str, str], *, host: str, port: int, dev: bool = False
) -> tuple[dict[str, str], str | None]:
    """The children's environment, and the admin token generated for this session (``None``
    when one is configured). ``USP_PUBLIC_BASE_URL`` follows ``--host``/``--port`` unless set;
    ``dev`` sets ``USP_ALLOW_PRIVATE_TARGETS=true`` (a receiver on this machine can subscribe)."""
    env = dict(environ)
    if dev:
        env["USP_ALLOW_PRIVATE_TARGETS"] = "true"
    env.setdefault("PYTHONUNBUFFERED", "1")  # children's lines appear as they are written
    generated = None
    if settings.admin_token is None:
        generated = secrets.token_urlsafe(32)
        env["USP_ADMIN_TOKEN"] = generated
    if "public_base_url" not in settings.model_fields_set:
        env["USP_PUBLIC_BASE_URL"] = f"http://{display_host(host)}:{port}"
    if settings.secrets_key is None:
        env["USP_SECRETS_KEY"] = local_secrets_key(Path(SECRETS_KEY_FILE))
    return env, generated


#: Where ``up`` keeps the key that seals Standard Webhooks secrets when none is configured, beside
#: its SQLite files: the secrets must open again after a restart, so it cannot be per session.
SECRETS_KEY_FILE = "usp-webhooks-secrets.key"


def local_secrets_key(path: Path) -> str:
    """The key in ``path``, made (readable by its owner alone) the first time."""
    if not path.exists():
        with contextlib.suppress(FileExistsError):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as out:
                out.write(secrets.token_hex(32) + "\n")
    return path.read_text().strip()


def display_host(host: str) -> str:
    """Where a browser on this machine reaches a server bound to ``host``."""
    if host in ("0.0.0.0", "::", ""):  # noqa: S104 - comparing, not binding
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def _prepare(settings: Settings) -> None:
    """Migrate (both chains), make the first signing key, create the embedded broker's tables:
    once, here. The API seeds the demo catalog itself, at its start-up."""
    engine = db.make_engine(settings)
    try:
        database.upgrade(engine)
        with db.session(engine) as session:
            keys.ensure_signing_key(session, settings)
            session.commit()
    finally:
        engine.dispose()
    if settings.uses_embedded_broker:
        celery = make_celery(settings)
        try:
            prepare_broker(celery)
        finally:
            celery.close()


def _spawn(argv: list[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    # Our own interpreter and module, with arguments we built: nothing comes from a shell.
    return subprocess.Popen(  # noqa: S603
        argv,
        env=dict(env),
        start_new_session=True,
        # Safe here: `up` has started no threads of its own when it spawns.
        preexec_fn=_die_with_parent if sys.platform == "linux" else None,
    )


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux for SIGTERM when the parent dies (no orphans)."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return
    ctypes.CDLL(libc_name, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _wait_ready(url: str, children: list[Child], stop: threading.Event) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline and not stop.is_set():
        if not all(child.alive() for child in children):
            return False
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        stop.wait(0.2)
    return False


def _announce(
    console: Console, settings: Settings, base: str, generated_token: str | None, *, dev: bool = False
) -> None:
    lines = [
        "",
        "[bold green]USP webhooks is up[/bold green]",
        f"  API        {base}",
        f"  JWKS       {base}{_JWKS_PATH}",
        f"  API docs   {base}/docs",
        f"  database   {_masked(settings.database_url)}",
        f"  broker     {_masked(settings.broker_url_resolved)}",
    ]
    if generated_token is not None:
        lines += [
            f"  admin token (this session only): [bold]{generated_token}[/bold]",
            "    send it as 'Authorization: Bearer <token>'; set USP_ADMIN_TOKEN for a lasting one",
        ]
    else:
        lines.append("  admin token: the configured USP_ADMIN_TOKEN")
    if dev:
        lines.append(
            "  [yellow]development mode[/yellow]: webhook targets on loopback and private networks are "
            "allowed (cloud metadata addresses never); never use --dev in production"
        )
    lines += ["Ctrl-C stops everything.", ""]
    for line in lines:
        # Never wrapped: a token or URL cut in two cannot be copied.
        console.print(line, soft_wrap=True)


def _supervise(children: list[Child], stop: threading.Event, console: Console) -> int:
    while not stop.wait(0.5):
        for child in children:
            if not child.alive():
                console.print(
                    f"[red]{child.name} exited (code {child.process.returncode}); stopping the others[/red]"
                )
                return 1
    return 0


def _stop_all(children: list[Child], console: Console) -> None:
    live = [child for child in children if child.alive()]
    if live:
        console.print(f"stopping {', '.join(child.name for child in live)}…")
    for child in live:
        child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for child in live:
        try:
            child.process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            console.print(f"[yellow]{child.name} did not stop in {STOP_TIMEOUT:.0f} s; killing it[/yellow]")
            child.process.kill()
            child.process.wait()


def _stop_on_signals(stop: threading.Event) -> Callable[[], None]:
    def handle(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def _nothing() -> None:
    return None


def _without(env: Mapping[str, str], name: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k != name}


def _masked(url: str) -> str:
    return str(maybe_sanitize_url(url))
