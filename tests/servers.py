"""Real HTTP servers for tests: an ASGI app under uvicorn on a free 127.0.0.1 port, in a thread.

One helper for every suite (receivers, webhook hubs, profile hosts, key directories) so that
each starts and stops the same way: the socket is bound before the server starts (no port
race), start-up is awaited, and shutdown waits at most :data:`GRACE` seconds for requests still
running (a test that abandons a deliberately slow request must not pay for the rest of it).
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, NamedTuple

import uvicorn

__all__ = ["GRACE", "Served", "free_port", "running", "serving"]

#: Seconds a stopping server waits for requests still in progress.
GRACE = 1


class Served(NamedTuple):
    port: int
    url: str  #: ``http(s)://127.0.0.1:<port>``


@contextmanager
def serving(
    app: Any,
    *,
    lifespan: Literal["on", "off"] = "off",
    certfile: Path | None = None,
    keyfile: Path | None = None,
    client_ca: Path | None = None,
) -> Iterator[Served]:
    """Serve ``app`` until the block ends (with ``certfile``/``keyfile``: over TLS; with
    ``client_ca``, requiring a client certificate that CA issued)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan=lifespan,
        ws="none",
        http="h11",
        timeout_graceful_shutdown=GRACE,
        ssl_certfile=None if certfile is None else str(certfile),
        ssl_keyfile=None if keyfile is None else str(keyfile),
        ssl_ca_certs=None if client_ca is None else str(client_ca),
        ssl_cert_reqs=ssl.CERT_NONE if client_ca is None else ssl.CERT_REQUIRED,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        scheme = "http" if certfile is None else "https"
        yield Served(port, f"{scheme}://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
    assert not thread.is_alive(), "the test server did not stop"


@contextmanager
def running(app: Any) -> Iterator[str]:
    """Serve an application with its lifespan (start-up and shutdown hooks); yield its base URL."""
    with serving(app, lifespan="on") as served:
        yield served.url


def free_port() -> int:
    """A port free on 127.0.0.1 now, for a child process to listen on (it may be taken meanwhile:
    rare, and the child then fails to start, loudly)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
