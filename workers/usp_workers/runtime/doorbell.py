"""A doorbell for the embedded broker: producers ring it after a commit, idle consumers on the
same machine wake at once instead of at their next poll.

One datagram socket per waiting consumer, in a folder of the machine's temporary directory named
after the broker's URL; a ring sends one byte to each. Nothing is written to the broker's file, so
a ring takes no SQLite lock. A missed ring costs only latency: consumers still poll.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import select
import socket
import stat
import tempfile
import threading
from pathlib import Path

__all__ = ["Doorbell", "doorbell_folder"]

logger = logging.getLogger("usp_workers")


def doorbell_folder(url: str) -> Path:
    """Where the consumers of ``url`` wait. A SQLite file is named by its absolute path, so two
    spellings of one file share a doorbell; the name is a hash because a socket's path must stay
    under ~100 bytes."""
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        url = "sqlite:///" + os.path.realpath(url.removeprefix("sqlite:///"))
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"usp-doorbell-{digest}"


class Doorbell:
    """``ring()`` wakes every ``wait()`` on the same broker URL on this machine. Where Unix
    datagram sockets or the folder are not available, ``ring`` does nothing and ``wait`` sleeps."""

    def __init__(self, url: str) -> None:
        self.folder = doorbell_folder(url)
        self._lock = threading.Lock()
        self._sender: socket.socket | None = None
        self._inbox: socket.socket | None = None
        self._address: Path | None = None
        self._usable = hasattr(socket, "AF_UNIX")

    def ring(self) -> None:
        """One byte to every consumer waiting; a full inbox has been rung already, and a socket
        nobody listens on any more (a killed consumer's) is removed."""
        if not self._usable:
            return
        try:
            names = os.listdir(self.folder)
        except OSError:
            return  # no consumer has ever waited here
        with self._lock:
            if self._sender is None:
                self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sender.setblocking(False)
            for name in names:
                path = self.folder / name
                try:
                    self._sender.sendto(b"\0", str(path))
                except BlockingIOError:
                    pass
                except (ConnectionRefusedError, FileNotFoundError):
                    with contextlib.suppress(OSError):
                        path.unlink()
                except OSError:
                    pass

    def wait(self, timeout: float) -> bool:
        """Wait until rung or ``timeout`` seconds pass; True if rung. Rings that came while
        nobody waited count: the first wait after them returns at once."""
        inbox = self.listen()
        if inbox is None:
            select.select([], [], [], timeout)
            return False
        readable, _, _ = select.select([inbox], [], [], timeout)
        if not readable:
            return False
        with contextlib.suppress(OSError):
            while inbox.recv(64):
                pass
        return True

    def close(self) -> None:
        with self._lock:
            for sock in (self._sender, self._inbox):
                if sock is not None:
                    sock.close()
            self._sender = self._inbox = None
            if self._address is not None:
                with contextlib.suppress(OSError):
                    self._address.unlink()
                self._address = None

    def listen(self) -> socket.socket | None:
        """Open this consumer's inbox (before its first fetch, so no ring in between is missed);
        ``None`` where there is none."""
        if self._inbox is not None or not self._usable:
            return self._inbox
        try:
            self.folder.mkdir(mode=0o700, exist_ok=True)
            info = self.folder.stat()
            if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
                # Someone else's folder: their sockets, not ours to trust or to delete.
                raise PermissionError(f"{self.folder} is not this user's own")
            address = self.folder / f"{os.getpid()}-{secrets.token_hex(4)}"
            inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            inbox.bind(str(address))
            inbox.setblocking(False)
        except OSError as exc:
            logger.info("embedded broker: no doorbell (%s); polling only", exc)
            self._usable = False
            return None
        self._inbox, self._address = inbox, address
        return inbox
