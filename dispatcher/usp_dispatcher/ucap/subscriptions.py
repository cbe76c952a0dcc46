"""Subscribing, paying and entitlements: ``POST /v1/subscribe``, the one :func:`fulfil` every
provider's completion goes through, ``GET /v1/entitlements`` and ``DELETE /v1/entitlements/{id}``.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.ucap.subscriptions``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field
from sqlmodel import Session, col, select

from usp_core.clock import utcnow
from usp_dispatcher.errors import UcapError
from usp_dispatcher.ucap.agents import Agent
from usp_dispatcher.ucap.answers import Answer, invalid, not_found
from usp_dispatcher.ucap.catalog import tier_view
from usp_dispatcher.ucap.events import emit_entitlement_event, emit_subscription_event
from usp_dispatcher.ucap.payments import OpenedCheckout, PaymentRefused, StoredOffer, open_checkout
from usp_dispatcher.ucap.settings import UcapSettings
from usp_dispatcher.ucap.tables import (
    CheckoutRow,
    CheckoutStatus,
    EntitlementRow,
    PublicationRow,
    SubscriptionRow,
    SubscriptionStatus,
    TierRow,
)
from usp_schemas import (
    EntitlementGranted,
    EntitlementRevoked,
    SubscriptionActivated,
    SubscriptionCancelled,
    SubscriptionCreated,
)

__all__ = [
    "Fulfilment",
    "OfferLinks",
    "SubscribeIn",
    "cancel_entitlement",
    "checkout_by_provider_ref",
    "checkout_of",
    "fulfil",
    "list_entitlements",
    "open_usdc_checkout",
    "subscribe",
]

_INTERVALS: Final = {"month": timedelta(days=30), "year": timedelta(days=365), "once": timedelta(days=36500)}
_checkouts = CheckoutRow.__table__  # type: ignore[attr-defined]


class SubscribeIn(BaseModel):
    """``subscribe``'s arguments, the body of ``POST /v1/subscribe``."""

    model_config = ConfigDict(extra="forbid")

    publisher_id: str = Field(min_length=1, max_length=128)
    tier_id: str = Field(min_length=1, max_length=128)
    payment_method: Literal["stripe", "usdc"] = Field(
        default="stripe", description="Payment method preference"
    )


def subscribe(
    session: Session, agent: Agent, args: SubscribeIn, *, settings: UcapSettings, base_url: str
) -> Answer:
    """A pending subscription and its checkout session (x402 requirements too, for ``usdc``);
    emits ``content.subscription.created``. Commits."""
    publication = (
        session.get(PublicationRow, args.publisher_id)
        or session.exec(select(PublicationRow).where(PublicationRow.slug == args.publisher_id)).first()
    )
    if publication is None:
        raise not_found("No such publisher.")
    tier = session.get(TierRow, args.tier_id)
    if tier is None or tier.publication_id != publication.id:
        raise invalid(f"The publisher {publication.id} has no tier {args.tier_id[:128]!r}.")
    if args.payment_method == "usdc" and tier.currency != "USD":
        raise invalid(f"The tier is priced in {tier.currency}; USDC pays US dollar prices only.")
    provider = settings.provider_for(args.payment_method)
    now = utcnow()
    subscription = SubscriptionRow(
        publication_id=publication.id,
        tier_id=tier.id,
        agent_id=agent.id,
        agent_directory=agent.key_directory,
        agent_thumbprint=agent.key_thumbprint,
        payment_method=args.payment_method,
        price_amount=tier.price_amount,
        currency=tier.currency,
        interval=tier.interval,
        created_at=now,
    )
    expires = now + timedelta(seconds=settings.checkout_ttl_seconds)
    checkout = CheckoutRow(
        subscription_id=subscription.id, provider=provider, url="", expires_at=expires, created_at=now
    )
    try:
        opened: OpenedCheckout = open_checkout(
            provider,
            settings,
            base_url=base_url,
            checkout_id=checkout.id,
            subscription=subscription,
            tier=tier,
            publication=publication,
            expires_at=int(expires.timestamp()),
        )
    except PaymentRefused as exc:
        raise UcapError(
            502 if exc.reason == "stripe_unavailable" else 400, "payment_unavailable", exc.detail
        ) from None
    checkout.url = opened.url
    checkout.provider_ref = opened.provider_ref
    checkout.requirements = json.dumps(opened.requirements) if opened.requirements else None
    session.add(subscription)
    session.flush()
    session.add(checkout)
    emit_subscription_event(session, SubscriptionCreated, subscription, now=now)
    session.commit()
    body: dict[str, Any] = {
        "status": "pending_payment",
        "checkout": {"session_id": checkout.id, "url": checkout.url, "expires_at": _time(expires)},
        "subscription": _subscription_view(subscription, tier),
        "message": _message(provider),
    }
    if opened.requirements is None:
        return Answer(body)
    # USDC is asked for as x402 asks (402, PAYMENT-REQUIRED): an x402 client pays by sending the
    # same request again with its payment (see open_usdc_checkout), a checkout-reading one reads on.
    offer = StoredOffer(opened.requirements["resource"], opened.requirements["accepts"][0])
    fields, headers = offer.asked("X-PAYMENT header is required")
    return Answer(body | fields, status=402, headers=headers)


def open_usdc_checkout(
    session: Session, agent: Agent, args: SubscribeIn, checkout_id: str | None = None
) -> str | None:
    """The open USDC checkout of ``agent`` for ``args``' tier that a payment sent with a repeated
    ``subscribe`` pays: ``checkout_id`` (the one a v2 payment names) when it is such a checkout,
    else the newest; None when there is none (a new one is opened)."""
    query = (
        select(CheckoutRow.id)
        .join(SubscriptionRow, col(SubscriptionRow.id) == col(CheckoutRow.subscription_id))
        .where(SubscriptionRow.agent_id == agent.id)
        .where(SubscriptionRow.tier_id == args.tier_id)
        .where(CheckoutRow.provider == "usdc")
        .where(CheckoutRow.status == CheckoutStatus.OPEN.value)
        .where(col(CheckoutRow.expires_at) > utcnow())
    )
    if checkout_id is not None and session.exec(query.where(CheckoutRow.id == checkout_id)).first():
        return checkout_id
    newest: str | None = session.exec(query.order_by(col(CheckoutRow.created_at).desc())).first()
    return newest


def _message(provider: str) -> str:
    if provider == "usdc":
        return (
            "Pay with USDC: send this request again, or one to accepts[0].resource, with an x402 payment "
            "(PAYMENT-SIGNATURE for the PAYMENT-REQUIRED header, or X-PAYMENT for accepts[0]); or ask "
            "the human to open checkout.url."
        )
    return "Complete payment at checkout.url to activate the subscription."


# ------------------------------------------------------------------------------------ fulfil


@dataclass(frozen=True, slots=True)
class Fulfilment:
    """What :func:`fulfil` did: ``granted`` False when the session was already complete."""

    checkout_id: str
    subscription_id: str
    entitlement_id: str | None
    granted: bool


def checkout_of(session: Session, checkout_id: str) -> CheckoutRow:
    row = session.get(CheckoutRow, checkout_id)
    if row is None:
        raise not_found("No such checkout session.")
    return row


def checkout_by_provider_ref(session: Session, provider_ref: str) -> CheckoutRow:
    row = session.exec(select(CheckoutRow).where(CheckoutRow.provider_ref == provider_ref)).first()
    if row is None:
        raise UcapError(404, "checkout_not_found", "No checkout has that provider reference.")
    return row


def fulfil(
    session: Session, checkout_id: str, *, payment_nonce: str | None = None, now: datetime | None = None
) -> Fulfilment:
    """Complete a checkout session and grant what it paid for, once. Commits.

    A session completed before answers ``granted=False`` with its entitlement; an expired one is
    refused (409 ``checkout_expired``), as is a payment nonce already used by another session.
    """
    moment = now or utcnow()
    checkout = checkout_of(session, checkout_id)
    won = (
        session.connection()
        .execute(
            sa.update(_checkouts)
            .where(_checkouts.c.id == checkout_id)
            .where(_checkouts.c.status == CheckoutStatus.OPEN.value)
            .where(_checkouts.c.expires_at > moment)
            .values(status=CheckoutStatus.COMPLETE.value, completed_at=moment, payment_nonce=payment_nonce)
        )
        .rowcount
    )
    if not won:
        session.rollback()
        session.refresh(checkout)
        if checkout.status == CheckoutStatus.COMPLETE:
            granted = session.exec(
                select(EntitlementRow).where(EntitlementRow.subscription_id == checkout.subscription_id)
            ).first()
            return Fulfilment(checkout.id, checkout.subscription_id, granted.id if granted else None, False)
        raise UcapError(409, "checkout_expired", "The checkout session expired; subscribe again.")
    subscription = session.get(SubscriptionRow, checkout.subscription_id)
    assert subscription is not None  # foreign key
    subscription.status = SubscriptionStatus.ACTIVE
    subscription.activated_at = moment
    subscription.renews_at = moment + _INTERVALS.get(subscription.interval, _INTERVALS["month"])
    session.add(subscription)
    entitlement = EntitlementRow(
        subscription_id=subscription.id,
        publication_id=subscription.publication_id,
        tier_id=subscription.tier_id,
        agent_id=subscription.agent_id,
        granted_at=moment,
        renews_at=subscription.renews_at,
    )
    session.add(entitlement)
    session.flush()
    emit_subscription_event(session, SubscriptionActivated, subscription, now=moment)
    emit_entitlement_event(session, EntitlementGranted, entitlement, subscription, now=moment)
    try:
        session.commit()
    except sa.exc.IntegrityError:  # another process won with the same payment nonce
        session.rollback()
        raise UcapError(409, "payment_reused", "That payment authorization was already used.") from None
    return Fulfilment(checkout.id, subscription.id, entitlement.id, True)


# ------------------------------------------------------------------------------------ entitlements


def list_entitlements(session: Session, agent: Agent, *, now: datetime | None = None) -> Answer:
    """The agent's entitlements, newest first, with their status as of now."""
    moment = now or utcnow()
    rows = session.exec(
        select(EntitlementRow, SubscriptionRow, TierRow, PublicationRow)
        .join(SubscriptionRow, col(SubscriptionRow.id) == col(EntitlementRow.subscription_id))
        .join(TierRow, col(TierRow.id) == col(EntitlementRow.tier_id))
        .join(PublicationRow, col(PublicationRow.id) == col(EntitlementRow.publication_id))
        .where(EntitlementRow.agent_id == agent.id)
        .order_by(col(EntitlementRow.granted_at).desc(), col(EntitlementRow.id))
    ).all()
    return Answer(
        {
            "entitlements": [
                {
                    "id": ent.id,
                    "subscription_id": ent.subscription_id,
                    "publisher_id": pub.id,
                    "publisher_name": pub.name,
                    "tier_id": tier.id,
                    "tier_name": tier.name,
                    "status": _status(ent, moment),
                    "created_at": _time(ent.granted_at),
                    "renews_at": _time(ent.renews_at) if ent.renews_at and ent.status == "active" else None,
                    "price": {"amount": sub.price_amount, "currency": sub.currency, "interval": sub.interval},
                }
                for ent, sub, tier, pub in rows
            ]
        }
    )


def cancel_entitlement(
    session: Session, agent: Agent, entitlement_id: str, *, now: datetime | None = None
) -> Answer:
    """Cancel one of the agent's entitlements (and its subscription); emits
    ``content.subscription.canceled`` and ``content.entitlement.revoked``. Commits. Another
    agent's entitlement is answered as one that does not exist."""
    moment = now or utcnow()
    entitlement = session.get(EntitlementRow, entitlement_id)
    if entitlement is None or entitlement.agent_id != agent.id:
        raise not_found("No such entitlement.")
    subscription = session.get(SubscriptionRow, entitlement.subscription_id)
    assert subscription is not None
    if entitlement.status == "active":
        entitlement.status = "cancelled"
        entitlement.revoked_at = moment
        subscription.status = SubscriptionStatus.CANCELLED
        subscription.cancelled_at = moment
        session.add(entitlement)
        session.add(subscription)
        session.flush()
        emit_subscription_event(session, SubscriptionCancelled, subscription, now=moment)
        emit_entitlement_event(session, EntitlementRevoked, entitlement, subscription, now=moment)
        session.commit()
    tier = session.get(TierRow, entitlement.tier_id)
    assert tier is not None
    return Answer(
        {
            "entitlement": {
                "id": entitlement.id,
                "publisher_id": entitlement.publication_id,
                "tier_id": tier.id,
                "tier_name": tier.name,
                "status": entitlement.status,
                "cancelled_at": _time(entitlement.revoked_at) if entitlement.revoked_at else None,
            },
            "message": "The subscription is cancelled.",
        }
    )


def _status(entitlement: EntitlementRow, now: datetime) -> str:
    if entitlement.status == "active" and entitlement.renews_at is not None and entitlement.renews_at <= now:
        return "expired"
    return entitlement.status


def _subscription_view(subscription: SubscriptionRow, tier: TierRow) -> dict[str, Any]:
    view = tier_view(tier)
    return {
        "id": subscription.id,
        "publisher_id": subscription.publication_id,
        "tier_id": tier.id,
        "tier_name": tier.name,
        "interval": tier.interval,
        "price": view["price"],
        "status": SubscriptionStatus(subscription.status).value,
    }


def _time(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------------ offer links


class OfferLinks:
    """Signed links for the 402's offers: a human who opens one starts a checkout for *that*
    agent and tier (the link carries both, HMAC-signed, valid for ``ttl`` seconds)."""

    def __init__(self, secret: bytes, base_url: str, *, ttl: int = 3600) -> None:
        self._secret = secret
        self.base_url = base_url.rstrip("/")
        self.ttl = ttl

    @classmethod
    def for_settings(cls, settings: UcapSettings, admin_token: str | None, base_url: str) -> OfferLinks:
        """The secret: ``USP_CHECKOUT_SECRET``, else one derived from the admin token, else a random
        one for this process (links then work only on the process that made them)."""
        if settings.checkout_secret is not None:
            secret = settings.checkout_secret.get_secret_value().encode()
        elif admin_token:
            secret = hashlib.sha256(b"usp-ucap-offer-links\n" + admin_token.encode()).digest()
        else:
            secret = secrets.token_bytes(32)
        return cls(secret, base_url, ttl=settings.checkout_ttl_seconds)

    def link(self, agent: Agent, publication_id: str, tier_id: str, *, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + self.ttl)
        claims = {
            "d": agent.key_directory,
            "t": agent.key_thumbprint,
            "p": publication_id,
            "r": tier_id,
            "e": expires,
        }
        raw = (
            base64.urlsafe_b64encode(json.dumps(claims, separators=(",", ":")).encode()).decode().rstrip("=")
        )
        return f"{self.base_url}/ucap/offers/{raw}.{self._mac(raw)}"

    def open(self, token: str, *, now: float | None = None) -> tuple[Agent, str, str]:
        """The agent, publication and tier of a link; 400 when it is forged or stale."""
        raw, _, mac = token.rpartition(".")
        if not raw or not hmac.compare_digest(mac, self._mac(raw)):
            raise invalid("This checkout link is not one this server made.")
        claims = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        if claims["e"] < (time.time() if now is None else now):
            raise invalid("This checkout link has expired; ask the agent for a new one.")
        return Agent(claims["d"], claims["t"]), claims["p"], claims["r"]

    def _mac(self, raw: str) -> str:
        digest = hmac.new(self._secret, raw.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")
