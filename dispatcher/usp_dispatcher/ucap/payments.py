"""Payment providers behind one interface: :func:`open_checkout` starts a payment for a pending
subscription; whichever way it completes, :func:`usp_dispatcher.ucap.subscriptions.fulfil` grants
it (one fulfilment path). USDC is paid over x402 (:mod:`usp_dispatcher.ucap.x402`), verified and
settled by a facilitator: one over HTTP, or the built-in sandbox.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.ucap.payments``.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from usp_dispatcher.errors import PaymentRefused
from usp_dispatcher.ucap.settings import UcapSettings
from usp_dispatcher.ucap.tables import PublicationRow, SubscriptionRow, TierRow
from usp_dispatcher.ucap.x402 import (
    PAYMENT_REQUIRED,
    Payment,
    as_v1,
    caip2,
    check_exact,
    encode,
    payment_required,
    read_payment,
    requirement_from,
)

__all__ = [
    "USDC_DECIMALS",
    "Facilitator",
    "HttpFacilitator",
    "OpenedCheckout",
    "PaymentRefused",
    "SandboxFacilitator",
    "StoredOffer",
    "facilitator_for",
    "open_checkout",
    "payment_requirements",
    "sandbox_facilitator_app",
    "stored_offer",
    "usdc_requirement",
]

#: USDC has 6 decimals: one cent is 10,000 base units.
USDC_DECIMALS: Final = 6
_CENT_IN_BASE_UNITS: Final = 10 ** (USDC_DECIMALS - 2)
_MAX_TIMEOUT_SECONDS: Final = 300


@dataclass(frozen=True, slots=True)
class OpenedCheckout:
    url: str
    provider_ref: str | None = None
    requirements: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class StoredOffer:
    """What a USDC checkout asks for: the resource paid and its one requirement (x402 v2's shape;
    :func:`usp_dispatcher.ucap.x402.as_v1` gives version 1's)."""

    resource: dict[str, Any]
    requirement: dict[str, Any]

    def v1(self) -> dict[str, Any]:
        return as_v1(self.requirement, self.resource)

    def asked(self, error: str) -> tuple[dict[str, Any], dict[str, str]]:
        """How a 402 asks for it in both versions: v1's body fields, v2's ``PAYMENT-REQUIRED``."""
        body = {"x402Version": 1, "error": error, "accepts": [self.v1()]}
        document = payment_required(self.resource, [self.requirement], error)
        return body, {PAYMENT_REQUIRED: encode(document)}


def open_checkout(
    provider: str,
    settings: UcapSettings,
    *,
    base_url: str,
    checkout_id: str,
    subscription: SubscriptionRow,
    tier: TierRow,
    publication: PublicationRow,
    expires_at: int,
) -> OpenedCheckout:
    """Start paying for ``subscription`` with ``provider`` (``sandbox``, ``stripe``, ``usdc``)."""
    page = f"{base_url.rstrip('/')}/ucap/checkout/{checkout_id}"
    if provider == "usdc":
        return OpenedCheckout(
            page, requirements=payment_requirements(settings, base_url, checkout_id, tier, publication)
        )
    if provider == "stripe":
        return _stripe_session(settings, page, checkout_id, subscription, tier, publication, expires_at)
    return OpenedCheckout(page)


def payment_requirements(
    settings: UcapSettings, base_url: str, checkout_id: str, tier: TierRow, publication: PublicationRow
) -> dict[str, Any]:
    """A checkout's x402 offer, as stored: v2's ``{resource, accepts: [requirement]}``."""
    return {
        "resource": {
            "url": f"{base_url.rstrip('/')}/v1/checkout/{checkout_id}/pay",
            "description": f"{publication.name}: {tier.name} ({tier.interval})",
            "mimeType": "application/json",
        },
        "accepts": [usdc_requirement(settings, tier)],
    }


def usdc_requirement(settings: UcapSettings, tier: TierRow) -> dict[str, Any]:
    """x402 v2 ``PaymentRequirements`` for one tier (USD prices only: USDC is a dollar). ``extra``
    carries the token's EIP-712 domain (``name``, ``version``) and the tier, so a v2 payment's
    ``accepted`` names what it buys."""
    return {
        "scheme": "exact",
        "network": settings.x402_network,
        "amount": str(tier.price_amount * _CENT_IN_BASE_UNITS),
        "asset": settings.x402_asset,
        "payTo": settings.x402_pay_to,
        "maxTimeoutSeconds": _MAX_TIMEOUT_SECONDS,
        "extra": {"name": settings.x402_asset_name, "version": settings.x402_asset_version, "tier": tier.id},
    }


def stored_offer(text: str) -> StoredOffer:
    """A checkout's stored requirements; rows written before version 2 hold a list of one v1
    requirement."""
    document = json.loads(text)
    if isinstance(document, list):
        v1 = document[0]
        resource = {"url": v1["resource"], "description": v1["description"], "mimeType": v1["mimeType"]}
        return StoredOffer(resource, requirement_from(v1))
    return StoredOffer(document["resource"], document["accepts"][0])


def _stripe_session(
    settings: UcapSettings,
    page: str,
    checkout_id: str,
    subscription: SubscriptionRow,
    tier: TierRow,
    publication: PublicationRow,
    expires_at: int,
) -> OpenedCheckout:
    import stripe

    if not tier.stripe_price_id:
        raise PaymentRefused("stripe_price_missing", f"The tier {tier.id} has no Stripe price.")
    assert settings.stripe_api_key is not None
    options: dict[str, Any] = {"max_network_retries": 2}
    if settings.stripe_api_base:
        options["base_addresses"] = {"api": settings.stripe_api_base}
    client = stripe.StripeClient(settings.stripe_api_key.get_secret_value(), **options)
    try:
        session = client.v1.checkout.sessions.create(
            params={
                "mode": "subscription",
                "line_items": [{"price": tier.stripe_price_id, "quantity": 1}],
                "client_reference_id": subscription.id,
                "metadata": {
                    "publisher_id": publication.id,
                    "tier_id": tier.id,
                    "agent": subscription.agent_id,
                    "checkout_id": checkout_id,
                },
                "success_url": f"{page}?done=1",
                "cancel_url": page,
                "expires_at": expires_at,
            }
        )
    except stripe.StripeError as exc:
        raise PaymentRefused(
            "stripe_unavailable", f"Stripe refused the checkout ({type(exc).__name__})."
        ) from None
    return OpenedCheckout(url=str(session.url), provider_ref=str(session.id))


# ------------------------------------------------------------------------------------ x402


class Facilitator(Protocol):
    """An x402 facilitator: ``verify`` then ``settle`` a payment (a ``PaymentPayload`` of either
    version) against requirements in the same version's shape; each answers the facilitator's JSON
    (``isValid``/``invalidReason``; ``success``/``errorReason``/``transaction``)."""

    async def verify(self, payload: Mapping[str, Any], requirements: Mapping[str, Any]) -> dict[str, Any]: ...

    async def settle(self, payload: Mapping[str, Any], requirements: Mapping[str, Any]) -> dict[str, Any]: ...


class HttpFacilitator:
    """A facilitator over HTTP (``POST {url}/verify`` and ``/settle``), as Coinbase's is."""

    def __init__(self, url: str, *, timeout: float = 15.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    async def verify(self, payload: Mapping[str, Any], requirements: Mapping[str, Any]) -> dict[str, Any]:
        return await self._post("verify", payload, requirements)

    async def settle(self, payload: Mapping[str, Any], requirements: Mapping[str, Any]) -> dict[str, Any]:
        return await self._post("settle", payload, requirements)

    async def _post(
        self, step: str, payload: Mapping[str, Any], requirements: Mapping[str, Any]
    ) -> dict[str, Any]:
        body = {
            "x402Version": payload.get("x402Version"),
            "paymentPayload": dict(payload),
            "paymentRequirements": dict(requirements),
        }
        try:
            async with httpx.AsyncClient(timeout=self.timeout, follow_redirects=False) as client:
                response = await client.post(f"{self.url}/{step}", json=body)
            answer = response.json()
        except (httpx.HTTPError, ValueError):
            raise PaymentRefused(
                f"unexpected_{step}_error", f"The payment facilitator did not {step} it."
            ) from None
        if not isinstance(answer, dict):
            raise PaymentRefused(f"unexpected_{step}_error", "The payment facilitator answered nonsense.")
        return answer


class SandboxFacilitator:
    """The built-in facilitator: checks what a real one checks before it settles (scheme, network,
    asset, recipient, amount, validity window, the EIP-712 signature's signer, reuse of the nonce)
    and settles by remembering the nonce. It moves no money and reads no chain: a smart wallet's
    signature (ERC-1271, ERC-6492), which needs the chain, is refused."""

    def __init__(self) -> None:
        self._settled: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    async def verify(self, payload: Mapping[str, Any], requirements: Mapping[str, Any]) -> dict[str, Any]:
        try:
            payment, payer = _checked(payload, requirements)
        except PaymentRefused as exc:
            return {"isValid": False, "invalidReason": exc.reason, "payer": _payer(payload)}
        with self._lock:
            if payment.nonce in self._settled:
                reused = "invalid_exact_evm_nonce_already_used"
                return {"isValid": False, "invalidReason": reused, "payer": payer}
        return {"isValid": True, "payer": payer}

    async def settle(self, payload: Mapping[str, Any], requirements: Mapping[str, Any]) -> dict[str, Any]:
        try:
            payment, payer = _checked(payload, requirements)
        except PaymentRefused as exc:
            return {"success": False, "errorReason": exc.reason, "transaction": "", "network": ""}
        settled = {
            "success": True,
            "transaction": "0x" + hashlib.sha256(payment.nonce.encode()).hexdigest(),
            "network": caip2(payment.network),
            "payer": payer,
        }
        resource = _resource(payload, requirements)
        with self._lock:
            earlier = self._settled.setdefault(payment.nonce, settled | {"resource": resource})
        if earlier.get("resource") != resource:
            return {
                "success": False,
                "errorReason": "invalid_exact_evm_nonce_already_used",
                "transaction": "",
                "network": "",
            }
        return {k: v for k, v in earlier.items() if k != "resource"}


def facilitator_for(settings: UcapSettings, sandbox: SandboxFacilitator) -> Facilitator:
    return HttpFacilitator(settings.x402_facilitator_url) if settings.x402_facilitator_url else sandbox


def sandbox_facilitator_app(facilitator: SandboxFacilitator | None = None) -> Starlette:
    """The sandbox facilitator over HTTP, with a real facilitator's routes (for local stand-ins)."""
    inner = facilitator or SandboxFacilitator()

    async def step(request: Request) -> JSONResponse:
        try:
            body = await request.json()
            payload, requirements = body["paymentPayload"], body["paymentRequirements"]
            if not isinstance(payload, dict) or not isinstance(requirements, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"isValid": False, "invalidReason": "invalid_payload"}, status_code=400)
        if request.url.path.endswith("/verify"):
            return JSONResponse(await inner.verify(payload, requirements))
        return JSONResponse(await inner.settle(payload, requirements))

    return Starlette(
        routes=[Route("/verify", step, methods=["POST"]), Route("/settle", step, methods=["POST"])]
    )


def _checked(payload: Mapping[str, Any], requirements: Mapping[str, Any]) -> tuple[Payment, str]:
    payment = read_payment(payload)
    return payment, check_exact(payment, requirement_from(requirements), time.time())


def _resource(payload: Mapping[str, Any], requirements: Mapping[str, Any]) -> str | None:
    """What a payment pays for: v1's requirements name it, v2's payload does."""
    named = payload.get("resource")
    if isinstance(named, dict):
        return str(named.get("url"))
    return str(requirements["resource"]) if "resource" in requirements else None


def _payer(payload: Mapping[str, Any]) -> str:
    inner = payload.get("payload")
    authorization = inner.get("authorization") if isinstance(inner, dict) else None
    return str(authorization.get("from", "")) if isinstance(authorization, dict) else ""
