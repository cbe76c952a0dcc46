"""The content server's own settings (``USP_*`` environment, like the engine's), kept apart from
:mod:`usp_dispatcher.settings` (the API's) and the engine's, because the delivery engine has no
business knowing about payment providers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from usp_dispatcher.ucap.x402 import caip2

__all__ = ["UcapSettings"]


class UcapSettings(BaseSettings):
    """Payments, checkout and the publisher's identity in discovery.

    Stripe is used for ``payment_method: "stripe"`` when both of its secrets are set; otherwise
    the sandbox checkout page stands in for it. USDC goes through the x402 facilitator at
    ``x402_facilitator_url``; unset, the built-in sandbox facilitator answers.
    """

    model_config = SettingsConfigDict(env_prefix="USP_", env_file=".env", extra="ignore")

    publisher_id: str = Field(
        default="usp-webhooks-demo",
        description="this server's UCAP publisher id (in `/.well-known/ucap.json`)",
    )
    publisher_name: str = Field(default="usp-webhooks demo publisher", description="its display name")
    stripe_api_key: SecretStr | None = Field(
        default=None,
        description='Stripe secret key; with `USP_STRIPE_WEBHOOK_SECRET`, `payment_method: "stripe"` opens '
        "Stripe Checkout sessions (else the sandbox checkout page)",
    )
    stripe_webhook_secret: SecretStr | None = Field(
        default=None,
        description="`whsec_…`: `POST /ucap/stripe/webhook` grants only on a `checkout.session.completed` "
        "whose `Stripe-Signature` verifies",
    )
    stripe_api_base: str | None = Field(
        default=None, description="another Stripe API host (a local stand-in)"
    )
    x402_facilitator_url: str | None = Field(
        default=None,
        description="an x402 facilitator (`/verify`, `/settle`); unset: the built-in sandbox facilitator",
    )
    x402_network: str = Field(
        default="eip155:84532",
        description="the network USDC payments are asked on, as a CAIP-2 id (`eip155:8453` is Base); "
        "an x402 v1 name (`base-sepolia`) is translated",
    )
    x402_asset: str = Field(
        default="0x036CbD53842c5426634e7929541eC2318f3dCF7e", description="USDC's contract there"
    )
    x402_asset_name: str = Field(
        default="USDC",
        description="the token's EIP-712 domain name, which payments are signed under (`USD Coin` on Base)",
    )
    x402_asset_version: str = Field(default="2", description="the token's EIP-712 domain version")
    x402_pay_to: str = Field(
        default="0x209693Bc6afc0C5328bA36FaF03C514EF312287C", description="the business's receiving address"
    )
    checkout_ttl_seconds: int = Field(
        default=3600, ge=60, description="how long a checkout session (and an offer's link) stays open"
    )
    checkout_secret: SecretStr | None = Field(
        default=None,
        description="signs the 402's offer links; unset: derived from the admin token "
        "(else random per process)",
    )
    max_body_bytes: int = Field(
        default=64 * 1024, ge=1024, description="the largest `/v1` request body (413 beyond)"
    )
    rate_limit_per_minute: int = Field(
        default=600,
        ge=1,
        description="`/v1` requests per agent per minute, per API process (429 with `Retry-After` beyond)",
    )

    @field_validator("x402_network")
    @classmethod
    def _caip2(cls, value: str) -> str:
        return caip2(value)

    @property
    def stripe_enabled(self) -> bool:
        return self.stripe_api_key is not None and self.stripe_webhook_secret is not None

    def provider_for(self, method: Literal["stripe", "usdc"]) -> Literal["sandbox", "stripe", "usdc"]:
        """Which provider takes a payment method here."""
        if method == "usdc":
            return "usdc"
        return "stripe" if self.stripe_enabled else "sandbox"
