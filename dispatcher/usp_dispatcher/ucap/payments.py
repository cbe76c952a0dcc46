"""Payment providers behind one interface: :func:`open_checkout` starts a payment for a pending
subscription; whichever way it completes, :func:`usp_dispatcher.ucap.subscriptions.fulfil` grants
it (one fulfilment path).

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.ucap.payments``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Final, Protocol

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from usp_dispatcher.ucap.settings import UcapSettings
from usp_dispatcher.ucap.tables import PublicationRow, SubscriptionRow, TierRow

__all__ = [
    "USDC_DECIMALS",
    "Facilitator",
    "HttpFacilitator",
    "OpenedCheckout",
    "PaymentRefused",
    "SandboxFacilitator",
    "decode_payment_header",
    "facilitator_for",
    "open_checkout",
    "payment_requirements",
    "sandbox_facilitator_app",
]

#: USDC has 6 decimals: one cent is 10,000 base units.
USDC_DECIMALS: Final = 6
_CENT_IN_BASE_UNITS: Final = 10 ** (USDC_DECIMALS - 2)
X402_VERSION: Final = 1
_MAX_TIMEOUT_SECONDS: Final = 300


class PaymentRefused(Exception):
    """A payment that does not pay: ``reason`` is x402's code (``invalid_exact_evm_payload_…``)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class OpenedCheckout:
    url: str
    provider_ref: str | None = None
    requirements: dict[str, Any] | None = None


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
    """x402 v1 ``PaymentRequirements`` for one tier (USD prices only: USDC is a dollar)."""
    return {
        "scheme": "exact",
        "network": settings.x402_network,
        "maxAmountRequired": str(tier.price_amount * _CENT_IN_BASE_UNITS),
        "resource": f"{base_url.rstrip('/')}/v1/checkout/{checkout_id}/pay",
        "description": f"{publication.name}: {tier.name} ({tier.interval})",
        "mimeType": "application/json",
        "payTo": settings.x402_pay_to,
        "maxTimeoutSeconds": _MAX_TIMEOUT_SECONDS,
        "asset": settings.x402_asset,
        "extra": {"name": "USDC", "version": "2"},
    }


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


def decode_payment_header(value: str) -> dict[str, Any]:
    """An ``X-PAYMENT`` header: base64 of the x402 ``PaymentPayload`` JSON."""
    try:
        document = json.loads(base64.b64decode(value, validate=True))
    except (ValueError, binascii.Error):
        raise PaymentRefused("invalid_payload", "X-PAYMENT is not base64 of a JSON payment payload") from None
    if not isinstance(document, dict):
        raise PaymentRefused("invalid_payload", "X-PAYMENT must hold a JSON object")
    return document


class Facilitator(Protocol):
    """An x402 facilitator: ``verify`` then ``settle`` a payment against requirements; each answers
    the facilitator's JSON (``isValid``/``invalidReason``; ``success``/``errorReason``/``transaction``)."""

    async def verify(self, payload: dict[str, Any], requirements: dict[str, Any]) -> dict[str, Any]: ...

    async def settle(self, payload: dict[str, Any], requirements: dict[str, Any]) -> dict[str, Any]: ...


class HttpFacilitator:
    """A facilitator over HTTP (``POST {url}/verify`` and ``/settle``)."""

    def __init__(self, url: str, *, timeout: float = 15.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    async def verify(self, payload: dict[str, Any], requirements: dict[str, Any]) -> dict[str, Any]:
        return await self._post("verify", payload, requirements)

    async def settle(self, payload: dict[str, Any], requirements: dict[str, Any]) -> dict[str, Any]:
        return await self._post("settle", payload, requirements)

    async def _post(self, step: str, payload: dict[str, Any], requirements: dict[str, Any]) -> dict[str, Any]:
        body = {"x402Version": X402_VERSION, "paymentPayload": payload, "paymentRequirements": requirements}
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
    """The built-in facilitator: checks what a real one checks about the authorization (scheme,
    network, asset, recipient, exact amount, validity window, reuse) and settles by remembering the
    nonce. It cannot check the EIP-712 signature's signer without Ethereum's keccak, and moves no
    money: a sandbox."""

    def __init__(self) -> None:
        self._settled: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    async def verify(self, payload: dict[str, Any], requirements: dict[str, Any]) -> dict[str, Any]:
        try:
            payer = _check_exact(payload, requirements, time.time())
        except PaymentRefused as exc:
            return {"isValid": False, "invalidReason": exc.reason, "payer": _payer(payload)}
        nonce = payload["payload"]["authorization"]["nonce"].lower()
        with self._lock:
            if nonce in self._settled:
                return {"isValid": False, "invalidReason": "invalid_transaction_state", "payer": payer}
        return {"isValid": True, "payer": payer}

    async def settle(self, payload: dict[str, Any], requirements: dict[str, Any]) -> dict[str, Any]:
        try:
            payer = _check_exact(payload, requirements, time.time())
        except PaymentRefused as exc:
            return {"success": False, "errorReason": exc.reason, "transaction": "", "network": ""}
        nonce = payload["payload"]["authorization"]["nonce"].lower()
        settled = {
            "success": True,
            "transaction": "0x" + hashlib.sha256(nonce.encode()).hexdigest(),
            "network": requirements["network"],
            "payer": payer,
        }
        with self._lock:
            earlier = self._settled.setdefault(nonce, settled | {"resource": requirements.get("resource")})
        if earlier.get("resource") != requirements.get("resource"):
            return {
                "success": False,
                "errorReason": "invalid_transaction_state",
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
        except (ValueError, KeyError, TypeError):
            return JSONResponse({"isValid": False, "invalidReason": "invalid_payload"}, status_code=400)
        if request.url.path.endswith("/verify"):
            return JSONResponse(await inner.verify(payload, requirements))
        return JSONResponse(await inner.settle(payload, requirements))

    return Starlette(
        routes=[Route("/verify", step, methods=["POST"]), Route("/settle", step, methods=["POST"])]
    )


def _check_exact(payload: dict[str, Any], requirements: dict[str, Any], now: float) -> str:
    """The payer, when ``payload`` is an ``exact`` EVM payment meeting ``requirements``."""
    if payload.get("x402Version") != X402_VERSION:
        raise PaymentRefused("invalid_x402_version", "x402Version must be 1")
    if payload.get("scheme") != "exact" or requirements.get("scheme") != "exact":
        raise PaymentRefused("invalid_scheme", "only the exact scheme is accepted")
    if payload.get("network") != requirements.get("network"):
        raise PaymentRefused("invalid_network", "the payment is for another network")
    inner = payload.get("payload")
    authorization = inner.get("authorization") if isinstance(inner, dict) else None
    signature = inner.get("signature") if isinstance(inner, dict) else None
    fields = ("from", "to", "value", "validAfter", "validBefore", "nonce")
    if not isinstance(authorization, dict) or not all(isinstance(authorization.get(f), str) for f in fields):
        raise PaymentRefused("invalid_payload", "the payment has no complete EIP-3009 authorization")
    if not isinstance(signature, str) or not signature.startswith("0x") or len(signature) < 4:
        raise PaymentRefused("invalid_exact_evm_payload_signature", "the authorization is not signed")
    if authorization["to"].lower() != str(requirements.get("payTo", "")).lower():
        raise PaymentRefused(
            "invalid_exact_evm_payload_recipient_mismatch", "the payment goes to someone else"
        )
    try:
        value, after, before = (int(authorization[k]) for k in ("value", "validAfter", "validBefore"))
    except ValueError:
        raise PaymentRefused("invalid_payload", "value and validity must be integers") from None
    if str(value) != str(requirements.get("maxAmountRequired")):
        raise PaymentRefused("invalid_exact_evm_payload_authorization_value", "the payment is not the price")
    if now < after:
        raise PaymentRefused(
            "invalid_exact_evm_payload_authorization_valid_after", "the payment is not valid yet"
        )
    if now >= before:
        raise PaymentRefused(
            "invalid_exact_evm_payload_authorization_valid_before", "the payment authorization expired"
        )
    nonce = authorization["nonce"]
    if not (nonce.startswith("0x") and len(nonce) == 66):
        raise PaymentRefused("invalid_payload", "the authorization nonce must be 32 bytes of hex")
    return str(authorization["from"])


def _payer(payload: dict[str, Any]) -> str:
    inner = payload.get("payload")
    authorization = inner.get("authorization") if isinstance(inner, dict) else None
    return str(authorization.get("from", "")) if isinstance(authorization, dict) else ""
