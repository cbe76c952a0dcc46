"""The FastAPI application: ``create_app()`` wires settings, database and routes together.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.api.app``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import cache

import anyio.to_thread
from fastapi import APIRouter, FastAPI
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from sqlalchemy.engine import Engine

from usp_core import db, keys
from usp_dispatcher import console, database
from usp_dispatcher.api import admin, discovery, events, feed, health, scheduling, wellknown
from usp_dispatcher.api import metrics as metrics_routes
from usp_dispatcher.api import ucap as ucap_routes
from usp_dispatcher.mcp.http import MCP_PATH, mount_mcp
from usp_dispatcher.scheduling import ensure_demo_catalog
from usp_dispatcher.settings import ApiSettings
from usp_dispatcher.ucap.seed import ensure_demo_content
from usp_dispatcher.ucap.service import UcapService
from usp_dispatcher.ucap.settings import UcapSettings
from usp_dispatcher.web.problems import install_problem_handlers
from usp_dispatcher.web.request_guard import RefuseNul
from usp_dispatcher.webhooks.intake import Intake
from usp_workers import configure_logging, freeze_startup_heap, tasks, tracing

__all__ = ["create_app"]

logger = logging.getLogger("usp_dispatcher")


def create_app(
    settings: ApiSettings | None = None, *, engine: Engine | None = None, ucap: UcapSettings | None = None
) -> FastAPI:
    """The service as an ASGI app. ``settings`` (and the content server's ``ucap`` settings)
    default to the environment (``USP_*``); an ``engine`` passed in is used as is and left open
    at shutdown (the caller owns it)."""
    resolved = settings if settings is not None else ApiSettings()
    ucap_settings = ucap if ucap is not None else UcapSettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if resolved.log_format == "json":  # after the server set up its own loggers
            configure_logging(resolved)
        if resolved.admin_token is None:
            logger.warning(
                "USP_ADMIN_TOKEN is not set: the admin API (/admin: replay, recover, dead letter, "
                "keys) refuses every call; set it, e.g. to the output of `openssl rand -hex 32`"
            )
        own_engine = engine is None
        active = engine if engine is not None else db.make_engine(resolved)
        try:
            await anyio.to_thread.run_sync(_prepare_database, active, resolved)
            app.state.engine = active
            app.state.intake = Intake(active)
            app.state.ucap = UcapService(
                active, resolved, ucap_settings, resolver=lambda: getattr(app.state, "target_resolver", None)
            )
            # Committed events reach the broker at once, not at the scheduler's next pass.
            with tasks.handing_off(resolved):
                async with mcp_endpoint.serve(active):  # MCP at /mcp, and its live webhooks
                    # Started up: full collections skip what start-up made (usp_workers.runtime.heap),
                    # so they no longer stall requests and the hand-off for up to ~0.2 s each.
                    freeze_startup_heap()
                    yield
        finally:
            if own_engine:
                active.dispose()

    app = FastAPI(
        title="USP webhooks dispatcher",
        summary="Events in, signed webhooks out: subscriptions, platform profiles, signing keys.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = resolved
    app.state.target_resolver = None
    if tracing.enabled() or tracing.configure("usp-webhooks-api"):  # OTEL_EXPORTER_OTLP_ENDPOINT set
        FastAPIInstrumentor.instrument_app(
            app, excluded_urls="metrics,healthz,readyz,console/static", exclude_spans=["receive", "send"]
        )
    install_problem_handlers(app)
    ucap_routes.install_ucap_errors(app)
    app.add_middleware(RefuseNul, skip=(MCP_PATH,))  # MCP checks its arguments itself
    app.router.routes.extend(_routes().routes)
    app.mount(console.STATIC_PATH, console.static_files(), name="console-static")
    mcp_endpoint = mount_mcp(app, resolved, session_idle_timeout=resolved.mcp_session_idle_seconds)
    return app


@cache
def _routes() -> APIRouter:
    """Every router, included once per process: FastAPI builds an included router's request
    handling on its first request, so the apps of one process (the tests build hundreds) share
    it (docs/architecture.md)."""
    routes = APIRouter()
    for router in (
        health.router,
        events.router,
        feed.router,
        wellknown.router,
        discovery.router,
        scheduling.public_router,
        scheduling.router,
        metrics_routes.router,
        admin.router,
        ucap_routes.router,
        ucap_routes.admin_router,
        console.router,
        console.portal.router,
    ):
        routes.include_router(router)
    return routes


def _prepare_database(engine: Engine, settings: ApiSettings) -> None:
    """Migrate to head, make sure a signing key exists, seed the demo catalog on first start
    (blocking: run off the event loop)."""
    database.upgrade(engine)
    with db.session(engine) as session:
        keys.ensure_signing_key(session, settings)
        session.commit()
    if settings.seed_demo_catalog:
        ensure_demo_catalog(engine)
        ensure_demo_content(engine)
