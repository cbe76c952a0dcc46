"""UCAP's HTTP API (``/v1``, every request signed by the agent), its discovery document, the
checkout pages and payment webhooks, and the publisher's admin routes.

Each ``/v1`` route authenticates the request's signature and hands the JSON to
:class:`usp_dispatcher.ucap.service.UcapService`, which the MCP tools call too. Refusals are
problems whose ``reason`` is UCAP's code, with UCAP's ``error`` object beside it.
"""

from __future__ import annotations

import html
import json
from typing import Annotated, Any, cast

from fastapi import APIRouter, Body, FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from sqlmodel import Session, col, select

from usp_dispatcher.errors import HTTPProblem, UcapError
from usp_dispatcher.ucap.agents import Agent
from usp_dispatcher.ucap.answers import Answer
from usp_dispatcher.ucap.catalog import tier_view
from usp_dispatcher.ucap.publishing import (
    PostIn,
    PublicationIn,
    TierIn,
    add_post,
    add_publication,
    add_tier,
    update_post,
)
from usp_dispatcher.ucap.service import UcapService
from usp_dispatcher.ucap.subscriptions import checkout_of
from usp_dispatcher.ucap.tables import (
    CheckoutRow,
    PublicationRow,
    SubscriptionRow,
    SubscriptionStatus,
    TierRow,
)
from usp_dispatcher.ucap.tools import UCAP_TOOLS
from usp_dispatcher.web.auth import AdminDep
from usp_dispatcher.web.deps import SessionDep, SettingsDep
from usp_dispatcher.web.problems import problem_response

__all__ = ["admin_router", "install_ucap_errors", "router", "service_of"]

UCAP_VERSION = "1.1.0-draft"
MCP_PATH = "/mcp"

router = APIRouter(tags=["ucap"])
admin_router = APIRouter(prefix="/admin/ucap", tags=["ucap-admin"], dependencies=[AdminDep])


def service_of(request: Request) -> UcapService:
    service = getattr(request.app.state, "ucap", None)
    if service is None:
        raise HTTPProblem(503, "not_ready", "Not ready", "The content service is starting.")
    return cast(UcapService, service)


def install_ucap_errors(app: FastAPI) -> None:
    app.add_exception_handler(UcapError, _on_ucap_error)  # type: ignore[arg-type]


async def _on_ucap_error(_request: Request, exc: UcapError) -> JSONResponse:
    return problem_response(
        exc.status,
        exc.code,
        exc.code.replace("_", " ").capitalize(),
        exc.detail,
        headers=exc.headers,
        extra={"error": {"code": exc.code, "message": exc.detail}},
    )


async def _agent(request: Request) -> tuple[UcapService, Agent, bytes]:
    service = service_of(request)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > service.ucap.max_body_bytes:
        raise UcapError(
            413, "payload_too_large", f"The body is larger than {service.ucap.max_body_bytes} bytes."
        )
    body = await request.body()
    if len(body) > service.ucap.max_body_bytes:
        raise UcapError(
            413, "payload_too_large", f"The body is larger than {service.ucap.max_body_bytes} bytes."
        )
    agent = await service.authenticate(request.method, _target(request), request.headers, body)
    return service, agent, body


def _target(request: Request) -> str:
    """The URL as the agent sent it: ``@path`` covers the path as sent, percent-encoding and all
    (Starlette's ``request.url`` has it decoded)."""
    raw = request.scope.get("raw_path")
    if not raw:
        return str(request.url)
    query = f"?{request.url.query}" if request.url.query else ""
    return f"{request.url.scheme}://{request.url.netloc}{raw.decode('latin-1')}{query}"


def _json(body: bytes) -> Any:
    if not body:
        return {}
    try:
        return json.loads(body)
    except ValueError:
        raise UcapError(400, "invalid_request", "The body is not JSON.") from None


def _send(answer: Answer) -> JSONResponse:
    return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers)


# ------------------------------------------------------------------------------------ /v1


@router.post("/v1/catalog/search")
async def catalog_search(request: Request) -> JSONResponse:
    """Ranked search of publications and posts (``search_catalog``)."""
    service, agent, body = await _agent(request)
    return _send(await service.search(agent, _json(body)))


@router.get("/v1/catalog/item/{item_id:path}")
async def catalog_item(request: Request, item_id: str) -> JSONResponse:
    """A publication or post by any id form (``get_catalog_item``)."""
    service, agent, _ = await _agent(request)
    return _send(await service.lookup(agent, {"id": item_id}))


@router.post("/v1/catalog/lookup")
async def catalog_lookup(request: Request) -> JSONResponse:
    """The same, with the id and context in the body."""
    service, agent, body = await _agent(request)
    return _send(await service.lookup(agent, _json(body)))


@router.get("/v1/content/{publisher_id}/{post_id}")
async def content(request: Request, publisher_id: str, post_id: str) -> JSONResponse:
    """The post (200) or what it costs (402 ``payment_required`` with offers, and x402's
    ``PAYMENT-REQUIRED``); a ``PAYMENT-SIGNATURE`` for one of them pays and reads at once."""
    service, agent, _ = await _agent(request)
    return _send(await service.read(agent, publisher_id, post_id, request.headers))


@router.get("/v1/content")
async def content_by_url(request: Request, url: Annotated[str, Query(max_length=2000)]) -> JSONResponse:
    """The post whose original URL is ``url``."""
    service, agent, _ = await _agent(request)
    return _send(await service.read_url(agent, url))


@router.post("/v1/subscribe")
async def subscribe_route(request: Request) -> JSONResponse:
    """A pending subscription and its checkout; for ``usdc``, 402 with x402's requirements, and
    the same request with an x402 payment pays it."""
    service, agent, body = await _agent(request)
    return _send(await service.subscribe(agent, _json(body), request.headers))


@router.get("/v1/entitlements")
async def entitlements(request: Request) -> JSONResponse:
    """The signing agent's subscriptions."""
    service, agent, _ = await _agent(request)
    return _send(await service.entitlements(agent))


@router.delete("/v1/entitlements/{entitlement_id}")
async def cancel(request: Request, entitlement_id: str) -> JSONResponse:
    """Cancel one of the agent's subscriptions."""
    service, agent, _ = await _agent(request)
    return _send(await service.cancel(agent, entitlement_id))


@router.post("/v1/checkout/{checkout_id}/pay")
async def pay(request: Request, checkout_id: str) -> JSONResponse:
    """Pay a USDC checkout with x402 (``PAYMENT-SIGNATURE``, or v1's ``X-PAYMENT``); 402 with the
    requirements in both versions without one."""
    service = (await _agent(request))[0]
    return _send(await service.pay(checkout_id, request.headers))


@router.get("/.well-known/ucap.json")
async def discovery(request: Request, settings: SettingsDep) -> JSONResponse:
    """UCAP discovery, with this server's MCP endpoint and tools (a documented extension)."""
    service = service_of(request)
    base = settings.public_base_url.rstrip("/")
    return JSONResponse(
        {
            "ucap_version": UCAP_VERSION,
            "publisher_id": service.ucap.publisher_id,
            "publisher_name": service.ucap.publisher_name,
            "ucap_server": base,
            "catalog_url": f"{base}/v1/catalog/search",
            "subscribe_url": f"{base}/v1/subscribe",
            "authentication": {
                "type": "http-message-signatures",
                "profile": "web-bot-auth",
                "signature_agent": "an origin, or a JWKS URL (OpenBotAuth)",
            },
            "payment_methods": ["stripe", "usdc"],
            "mcp": {
                "endpoint": f"{base}{MCP_PATH}",
                "transport": "streamable-http",
                "tools": [tool.name for tool in UCAP_TOOLS],
            },
        },
        headers={"Cache-Control": "public, max-age=300"},
    )


# ------------------------------------------------------------------------------------ checkout pages


@router.get("/ucap/offers/{token}", include_in_schema=False)
async def offer(request: Request, token: str) -> Response:
    """An offer's checkout link from a 402: starts a checkout for its agent and tier, then sends
    the human to it."""
    service = service_of(request)
    agent, publication_id, tier_id = service.offers.open(token)
    answer = await service.subscribe(
        agent, {"publisher_id": publication_id, "tier_id": tier_id, "payment_method": "stripe"}
    )
    return RedirectResponse(answer.body["checkout"]["url"], status_code=303)


@router.get("/ucap/checkout/{checkout_id}", include_in_schema=False)
async def checkout_page(request: Request, checkout_id: str, session: SessionDep) -> Response:
    """The checkout page: a Pay button (sandbox), the x402 requirements (USDC), or Stripe's page."""
    checkout, _, tier, publication = await run_in_threadpool(_checkout_rows, session, checkout_id)
    if checkout.provider == "stripe" and checkout.status == "open":
        return RedirectResponse(checkout.url, status_code=303)
    price = tier_view(tier)["price"]
    title = f"{html.escape(publication.name)}: {html.escape(tier.name)}"
    amount = f"{price['amount'] / 100:.2f} {price['currency']} / {price['interval']}"
    if checkout.status == "complete":
        action = "<p id='status'>Paid. The subscription is active.</p>"
    elif checkout.provider == "usdc":
        requirements = html.escape(json.dumps(json.loads(checkout.requirements or "[]"), indent=2))
        action = (
            "<p id='status'>Waiting for a USDC payment (x402). The agent pays these requirements:</p>"
            f"<pre>{requirements}</pre>"
        )
    else:
        action = (
            f"<form method='post' action='/ucap/checkout/{html.escape(checkout.id)}/pay'>"
            "<p id='status'>Sandbox checkout: no money moves.</p>"
            "<button type='submit' id='pay'>Pay</button></form>"
        )
    page = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Checkout</title></head><body>"
        f"<h1>{title}</h1><p>{html.escape(amount)}</p>{action}</body></html>"
    )
    return HTMLResponse(
        page, headers={"Cache-Control": "no-store", "Content-Security-Policy": "default-src 'none'"}
    )


@router.post("/ucap/checkout/{checkout_id}/pay", include_in_schema=False)
async def sandbox_pay(request: Request, checkout_id: str, session: SessionDep) -> Response:
    """The sandbox page's Pay button: completes the session as a provider's webhook would."""
    checkout, *_ = await run_in_threadpool(_checkout_rows, session, checkout_id)
    if checkout.provider != "sandbox":
        raise UcapError(409, "not_a_sandbox_checkout", "Only sandbox checkouts are paid on this page.")
    await service_of(request).confirm(checkout_id)
    return RedirectResponse(f"/ucap/checkout/{checkout_id}", status_code=303)


@router.post("/ucap/stripe/webhook", include_in_schema=False)
async def stripe_webhook(request: Request) -> JSONResponse:
    """Stripe's ``checkout.session.completed``: the entitlement is granted only for a paid session
    whose ``Stripe-Signature`` verifies."""
    import stripe

    service = service_of(request)
    secret = service.ucap.stripe_webhook_secret
    if secret is None:
        raise UcapError(404, "not_found", "Stripe is not configured here.")
    payload = await request.body()
    try:
        event = stripe.Webhook.construct_event(
            payload, request.headers.get("stripe-signature"), secret.get_secret_value()
        )
    except (ValueError, stripe.SignatureVerificationError):
        raise UcapError(400, "invalid_signature", "The Stripe-Signature does not verify.") from None
    if event["type"] != "checkout.session.completed":
        return JSONResponse({"received": True, "handled": False})
    stripe_session = event["data"]["object"].to_dict()
    if stripe_session.get("payment_status") != "paid":
        return JSONResponse({"received": True, "handled": False, "reason": "not paid"})
    done = await service.confirm_provider_ref(str(stripe_session["id"]))
    return JSONResponse({"received": True, "handled": True, "granted": done.granted})


def _checkout_rows(
    session: Session, checkout_id: str
) -> tuple[CheckoutRow, SubscriptionRow, TierRow, PublicationRow]:
    checkout = checkout_of(session, checkout_id)
    subscription = session.get(SubscriptionRow, checkout.subscription_id)
    assert subscription is not None
    tier = session.get(TierRow, subscription.tier_id)
    publication = session.get(PublicationRow, subscription.publication_id)
    assert tier is not None
    assert publication is not None
    return checkout, subscription, tier, publication


# ------------------------------------------------------------------------------------ admin


@admin_router.post("/publications", status_code=201)
async def create_publication(session: SessionDep, data: Annotated[PublicationIn, Body()]) -> dict[str, Any]:
    """Add a publication (with its tiers)."""
    row = await run_in_threadpool(_commit, session, lambda: add_publication(session, data))
    return {"id": row.id, "slug": row.slug}


@admin_router.post("/publications/{publication_id}/tiers", status_code=201)
async def create_tier(
    session: SessionDep, publication_id: str, data: Annotated[TierIn, Body()]
) -> dict[str, Any]:
    """Add a tier to a publication."""
    row = await run_in_threadpool(_commit, session, lambda: add_tier(session, publication_id, data))
    return {"id": row.id, "publication_id": row.publication_id}


@admin_router.post("/publications/{publication_id}/posts", status_code=201)
async def create_post(
    session: SessionDep, publication_id: str, data: Annotated[PostIn, Body()]
) -> dict[str, Any]:
    """Publish a post (free, or unlocked by the given tiers)."""
    row = await run_in_threadpool(_commit, session, lambda: add_post(session, publication_id, data))
    return {"id": row.id, "publication_id": row.publication_id, "free": row.free}


@admin_router.put("/posts/{post_id}")
async def replace_post(session: SessionDep, post_id: str, data: Annotated[PostIn, Body()]) -> dict[str, Any]:
    """Replace a post's content and metadata."""
    row = await run_in_threadpool(_commit, session, lambda: update_post(session, post_id, data))
    return {"id": row.id, "publication_id": row.publication_id, "free": row.free}


@admin_router.get("/subscriptions")
async def list_subscriptions(
    session: SessionDep,
    status: Annotated[str | None, Query(pattern="^(pending_payment|active|expired|cancelled)$")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> dict[str, Any]:
    """Agents' subscriptions, newest first."""

    def work() -> list[dict[str, Any]]:
        query = select(SubscriptionRow).order_by(col(SubscriptionRow.created_at).desc()).limit(limit)
        if status is not None:
            query = query.where(SubscriptionRow.status == status)
        return [
            {
                "id": row.id,
                "publisher_id": row.publication_id,
                "tier_id": row.tier_id,
                "agent": {"key_directory": row.agent_directory, "key_thumbprint": row.agent_thumbprint},
                "status": SubscriptionStatus(row.status).value,
                "payment_method": row.payment_method,
                "price": {"amount": row.price_amount, "currency": row.currency, "interval": row.interval},
                "created_at": row.created_at.isoformat(),
                "renews_at": row.renews_at.isoformat() if row.renews_at else None,
            }
            for row in session.exec(query).all()
        ]

    return {"subscriptions": await run_in_threadpool(work)}


@admin_router.post("/checkouts/{checkout_id}/confirm")
async def confirm_checkout(request: Request, checkout_id: str) -> dict[str, Any]:
    """Complete a checkout session by hand (the sandbox's stand-in for a provider's webhook)."""
    done = await service_of(request).confirm(checkout_id)
    return {
        "checkout_id": done.checkout_id,
        "subscription_id": done.subscription_id,
        "entitlement_id": done.entitlement_id,
        "granted": done.granted,
    }


def _commit(session: Session, work: Any) -> Any:
    row = work()
    session.commit()
    session.refresh(row)
    return row
