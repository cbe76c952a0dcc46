"""Admin authentication: a static bearer token from ``USP_ADMIN_TOKEN``.

Fail closed: with no token configured every admin call is refused, so a fresh deployment is not
an open admin API. The comparison is constant-time (``hmac.compare_digest``) so response timing
does not leak how much of a guess was right. The token is never logged or echoed.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from usp_dispatcher.errors import HTTPProblem
from usp_dispatcher.web.deps import SettingsDep

__all__ = ["AdminDep", "require_admin"]

# auto_error=False: we answer with our own problem body instead of FastAPI's 403.
_bearer = HTTPBearer(auto_error=False, scheme_name="AdminToken", description="USP_ADMIN_TOKEN")
_CHALLENGE = 'Bearer realm="usp-webhooks-admin"'


async def require_admin(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Let the request through only with ``Authorization: Bearer <USP_ADMIN_TOKEN>``."""
    configured = settings.admin_token.get_secret_value() if settings.admin_token is not None else ""
    if not configured:
        raise _unauthorized(
            "admin_disabled", "No admin token is configured (USP_ADMIN_TOKEN): admin calls are refused."
        )
    if credentials is None:
        raise _unauthorized("unauthenticated", "Send Authorization: Bearer <admin token>.")
    if not hmac.compare_digest(credentials.credentials.encode(), configured.encode()):
        raise _unauthorized(
            "invalid_token",
            "The bearer token is not valid.",
            challenge=_CHALLENGE + ', error="invalid_token"',
        )


def _unauthorized(reason: str, detail: str, *, challenge: str = _CHALLENGE) -> HTTPProblem:
    return HTTPProblem(401, reason, "Unauthorized", detail, headers={"WWW-Authenticate": challenge})


AdminDep = Depends(require_admin)
