"""UCAP content objects carried in ``data`` of the ``content.*`` events: publication, post, tier,
subscription, entitlement.

Field names follow the public UCAP specification where it names them (``publisher_id``,
``tier_id``, prices in cents with an ISO 4217 currency and an ``interval``). A post's body is never
in an event: events reach every subscribed platform, the body only entitled agents.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from usp_schemas._base import WireModel
from usp_schemas._types import UtcTimestamp

__all__ = [
    "AgentRef",
    "ContentSubscription",
    "ContentSubscriptionStatus",
    "Entitlement",
    "EntitlementStatus",
    "Interval",
    "PaymentMethod",
    "Post",
    "PostId",
    "Price",
    "Publication",
    "PublicationId",
    "Tier",
]

_ID_BODY = r"[0-9A-Za-z_-]{1,120}$"
PublicationId = Annotated[str, StringConstraints(pattern=rf"^pub_{_ID_BODY}")]
PostId = Annotated[str, StringConstraints(pattern=rf"^post_{_ID_BODY}")]
SubscriptionId = Annotated[str, StringConstraints(pattern=rf"^csub_{_ID_BODY}")]
EntitlementId = Annotated[str, StringConstraints(pattern=rf"^ent_{_ID_BODY}")]
Currency = Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")]

Interval = Literal["month", "year", "once"]
PaymentMethod = Literal["stripe", "usdc"]
ContentSubscriptionStatus = Literal["pending_payment", "active", "expired", "cancelled"]
EntitlementStatus = Literal["active", "expired", "cancelled"]


class Price(WireModel):
    """What a tier costs: ``amount`` in the currency's minor units (cents), per ``interval``.

    >>> Price(amount=500, currency="USD", interval="month").amount
    500
    """

    amount: int = Field(ge=0)
    currency: Currency
    interval: Interval


class Tier(WireModel):
    """A way to subscribe to a publication."""

    tier_id: str = Field(min_length=1, max_length=128)
    tier_name: str = Field(min_length=1, max_length=200)
    price: Price
    features: list[str] = Field(default_factory=list)


class Publication(WireModel):
    """A publisher's publication (the UCAP "publisher" an agent subscribes to)."""

    id: PublicationId
    slug: str = Field(min_length=1, max_length=120)
    name: str = Field(min_length=1, max_length=200)
    description: str | None = None
    categories: list[str] = Field(default_factory=list)
    language: str | None = Field(default=None, description="BCP 47")
    url: str | None = Field(default=None, description="canonical URL")
    external_ids: list[str] = Field(default_factory=list, description="patreon:…, ghost:…")
    tiers: list[Tier] = Field(default_factory=list)


class Post(WireModel):
    """A post's metadata (never its body)."""

    id: PostId
    publisher_id: PublicationId
    title: str = Field(min_length=1, max_length=500)
    author: str | None = None
    excerpt: str | None = None
    categories: list[str] = Field(default_factory=list)
    language: str | None = None
    url: str | None = None
    word_count: int = Field(ge=0)
    access: Literal["free", "paid"]
    tier_ids: list[str] = Field(default_factory=list, description="the tiers that unlock it (paid posts)")
    published_at: UtcTimestamp
    updated_at: UtcTimestamp


class AgentRef(WireModel):
    """An agent as UCAP servers know it: its key directory and the thumbprint of its key. Two agents
    of one registry share an origin, never both."""

    key_directory: str
    key_thumbprint: str


class ContentSubscription(WireModel):
    """An agent's subscription to a tier of a publication."""

    id: SubscriptionId
    publisher_id: PublicationId
    tier_id: str
    agent: AgentRef
    status: ContentSubscriptionStatus
    payment_method: PaymentMethod
    price: Price
    created_at: UtcTimestamp
    activated_at: UtcTimestamp | None = None
    renews_at: UtcTimestamp | None = None
    cancelled_at: UtcTimestamp | None = None


class Entitlement(WireModel):
    """What an active subscription grants: reading the tier's posts until ``renews_at``."""

    id: EntitlementId
    publisher_id: PublicationId
    tier_id: str
    subscription_id: SubscriptionId
    agent: AgentRef
    status: EntitlementStatus
    price: Price
    granted_at: UtcTimestamp
    renews_at: UtcTimestamp | None = None
    revoked_at: UtcTimestamp | None = None
