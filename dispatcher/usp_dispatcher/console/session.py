"""The console's login session: a signed cookie, and the CSRF token its forms carry.

Both are MACs under a key derived from the admin token, so nothing is stored server-side and
changing ``USP_ADMIN_TOKEN`` ends every session.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Final

__all__ = ["COOKIE", "LIFETIME_SECONDS", "ConsoleSession", "issue", "read"]

COOKIE: Final = "usp_console"
LIFETIME_SECONDS: Final = 12 * 3600


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    issued: int
    csrf: str  #: what every form of this session posts back as ``csrf``

    def csrf_ok(self, posted: str | None) -> bool:
        return posted is not None and hmac.compare_digest(posted.encode(), self.csrf.encode())


def issue(admin_token: str, *, now: float | None = None) -> str:
    """A fresh session cookie value: ``issued.nonce.mac``."""
    body = f"{int(time.time() if now is None else now)}.{secrets.token_urlsafe(16)}"
    return f"{body}.{_mac(admin_token, 'session.' + body)}"


def read(value: str | None, admin_token: str, *, now: float | None = None) -> ConsoleSession | None:
    """The session ``value`` proves, or ``None`` (absent, forged, expired, or signed under another
    admin token)."""
    if not value or not admin_token:
        return None
    body, _, mac = value.rpartition(".")
    issued_text, _, nonce = body.partition(".")
    if not nonce or not issued_text.isdigit():
        return None
    if not hmac.compare_digest(mac.encode(), _mac(admin_token, "session." + body).encode()):
        return None
    issued = int(issued_text)
    moment = time.time() if now is None else now
    if not issued <= moment + 60 or moment - issued > LIFETIME_SECONDS:
        return None
    return ConsoleSession(issued, _mac(admin_token, "csrf." + nonce))


def _mac(admin_token: str, message: str) -> str:
    key = hmac.new(admin_token.encode(), b"usp-console-v1", hashlib.sha256).digest()
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()
