"""What the console's and the portal's pages share: templates, security headers, static files."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Final, TypeVar
from urllib.parse import urlsplit

from fastapi import Form, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates

from usp_dispatcher.console import session as login
from usp_dispatcher.console.session import Login
from usp_dispatcher.errors import HTTPProblem
from usp_dispatcher.settings import ApiSettings
from usp_dispatcher.web.deps import SettingsDep
from usp_workers import FAILURES, DeliveryStatus
from usp_workers.operations import short_id

__all__ = [
    "HEADERS",
    "STATIC_PATH",
    "UNSETTLED",
    "admin_token",
    "call",
    "redirect",
    "render",
    "session_dependencies",
    "static_files",
    "utc",
]

STATIC_PATH: Final = "/console/static"
_HERE = Path(__file__).parent
_T = TypeVar("_T")
#: Delivery states a page keeps refreshing for.
UNSETTLED: Final = frozenset({DeliveryStatus.PENDING.value, DeliveryStatus.IN_FLIGHT.value})
#: Every page and redirect: no framing, no inline script, nothing cached, no referrer elsewhere.
HEADERS: Final = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

templates = Jinja2Templates(directory=_HERE / "templates")


def admin_token(settings: ApiSettings) -> str:
    """What every session and link is signed under ("" when none is set: nothing opens)."""
    return settings.admin_token.get_secret_value() if settings.admin_token is not None else ""


def session_dependencies(
    *, cookie: str, purpose: str, lifetime: float, entry: str, without: str
) -> tuple[Callable[..., Awaitable[Login]], Callable[..., Awaitable[Login]]]:
    """The page and action dependencies of a surface whose session is the ``cookie`` token of
    ``purpose``: a page without a session redirects to ``entry``; an action needs the session,
    its CSRF token in the form and, when the browser says where it was posted from, this host
    (refusals are problems; ``without``: what to do when there is no session)."""

    def current(request: Request, settings: ApiSettings) -> Login | None:
        return login.read(
            request.cookies.get(cookie), admin_token(settings), purpose=purpose, lifetime=lifetime
        )

    async def page(request: Request, settings: SettingsDep) -> Login:
        found = current(request, settings)
        if found is None:
            raise HTTPException(303, "no session", headers={"Location": entry, **HEADERS})
        return found

    async def action(
        request: Request, settings: SettingsDep, csrf: Annotated[str | None, Form(max_length=128)] = None
    ) -> Login:
        found = current(request, settings)
        if found is None:
            raise HTTPProblem(401, "session_required", "Unauthorized", without)
        origin = request.headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
            raise HTTPProblem(403, "cross_origin", "Forbidden", "The form was not posted from this site.")
        if not found.csrf_ok(csrf):
            detail = "The form's CSRF token is missing or wrong: reload the page."
            raise HTTPProblem(403, "csrf_token_invalid", "Forbidden", detail)
        return found

    return page, action


def utc(moment: datetime) -> datetime:
    """A stored time (naive: UTC) or an input's, in UTC."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _when(moment: datetime | None) -> str:
    return "" if moment is None else utc(moment).strftime("%Y-%m-%d %H:%M:%S UTC")


def _failure(error_class: str | None) -> str:
    """What a try without an answer ran into, in words (``connection refused``, ``timed out``)."""
    return FAILURES.get(error_class or "", error_class or "no answer")


templates.env.filters["when"] = _when
templates.env.filters["failure"] = _failure
templates.env.filters["short"] = short_id


def static_files() -> StaticFiles:
    """The stylesheet, the script and the vendored chart library, shipped in the package."""
    return StaticFiles(directory=_HERE / "static")


async def call(function: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
    """A blocking operation (database work) off the event loop."""
    return await run_in_threadpool(function, *args, **kwargs)


def render(request: Request, name: str, context: dict[str, Any], *, status_code: int = 200) -> Response:
    return templates.TemplateResponse(request, name, context, status_code=status_code, headers=HEADERS)


def redirect(location: str) -> Response:
    return RedirectResponse(location, status_code=303, headers=HEADERS)
