"""Signed, stateless tokens for the browser surfaces: the console's and the portal's session
cookies, the CSRF token their forms carry, and the portal's short-lived links.

Each is a MAC under a key derived from the admin token and a ``purpose``, so nothing is stored
server-side, a token of one purpose is never accepted for another, and changing
``USP_ADMIN_TOKEN`` ends every session and link.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Final

__all__ = ["COOKIE", "LIFETIME_SECONDS", "Login", "issue", "read"]

COOKIE: Final = "usp_console"
LIFETIME_SECONDS: Final = 12 * 3600
_CLOCK_SKEW: Final = 60


@dataclass(frozen=True, slots=True)
class Login:
    issued: int
    subject: str  #: whom it is for: "" for the operator, a platform's profile URI in the portal
    csrf: str  #: what every form of this session posts back as ``csrf``

    def csrf_ok(self, posted: str | None) -> bool:
        return posted is not None and hmac.compare_digest(posted.encode(), self.csrf.encode())


def issue(admin_token: str, *, purpose: str = "console", subject: str = "", now: float | None = None) -> str:
    """A fresh token: ``issued.nonce.subject.mac`` (the subject base64url-encoded)."""
    moment = int(time.time() if now is None else now)
    encoded = base64.urlsafe_b64encode(subject.encode()).decode().rstrip("=")
    body = f"{moment}.{secrets.token_urlsafe(16)}.{encoded}"
    return f"{body}.{_mac(admin_token, purpose, body)}"


def read(
    value: str | None,
    admin_token: str,
    *,
    purpose: str = "console",
    lifetime: float = LIFETIME_SECONDS,
    now: float | None = None,
) -> Login | None:
    """What ``value`` proves, or ``None``: absent, forged, of another purpose, expired, or signed
    under another admin token."""
    if not value or not admin_token:
        return None
    body, _, mac = value.rpartition(".")
    issued_text, _, rest = body.partition(".")
    nonce, _, encoded = rest.partition(".")
    if not nonce or not issued_text.isdigit():
        return None
    if not hmac.compare_digest(mac.encode(), _mac(admin_token, purpose, body).encode()):
        return None
    issued = int(issued_text)
    moment = time.time() if now is None else now
    if issued > moment + _CLOCK_SKEW or moment - issued > lifetime:
        return None
    try:
        subject = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return Login(issued, subject, _mac(admin_token, purpose + ".csrf", nonce))


def _mac(admin_token: str, purpose: str, message: str) -> str:
    key = hmac.new(admin_token.encode(), f"usp-console-v2.{purpose}".encode(), hashlib.sha256).digest()
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()
