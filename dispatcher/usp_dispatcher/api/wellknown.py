"""The public signing keys, as a JWKS and as a Web Bot Auth key directory (no auth: they are public).

``Cache-Control: max-age`` is the key publish lead: a rotated-in key is published that long
before it signs, so any receiver honouring the header has fetched it by the time it is used.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from usp_core import keys
from usp_dispatcher.web.deps import SessionDep, SettingsDep

__all__ = ["DIRECTORY_MEDIA_TYPE", "JWKS_MEDIA_TYPE", "router"]

JWKS_MEDIA_TYPE = "application/jwk-set+json"
DIRECTORY_MEDIA_TYPE = "application/http-message-signatures-directory+json"

router = APIRouter(tags=["keys"])


@router.get("/.well-known/usp/jwks.json")
async def jwks(session: SessionDep, settings: SettingsDep) -> JSONResponse:
    """Every key that signs now, will sign soon, or signed recently (RFC 7517 JWK Set)."""
    return await _published(session, settings, JWKS_MEDIA_TYPE)


@router.get("/.well-known/http-message-signatures-directory")
async def signatures_directory(session: SessionDep, settings: SettingsDep) -> JSONResponse:
    """The same keys as a Web Bot Auth HTTP message signatures directory."""
    return await _published(session, settings, DIRECTORY_MEDIA_TYPE)


async def _published(session: SessionDep, settings: SettingsDep, media_type: str) -> JSONResponse:
    document = await run_in_threadpool(keys.published_jwks, session, settings)
    max_age = int(settings.key_publish_lead_seconds)
    return JSONResponse(
        document, media_type=media_type, headers={"Cache-Control": f"public, max-age={max_age}"}
    )
