"""The content domain's tables (``ucap_*``): publications, tiers, posts, agents' subscriptions,
entitlements and checkout sessions.

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.ucap.tables``.
"""

from __future__ import annotations

import enum
import hashlib
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import Field

from usp_core.clock import UtcDateTime, utcnow
from usp_core.ids import new_id
from usp_dispatcher.tables import DispatcherTable

__all__ = [
    "AliasRow",
    "CategoryRow",
    "CheckoutRow",
    "CheckoutStatus",
    "EntitlementRow",
    "PostRow",
    "PostTierRow",
    "PublicationRow",
    "SubscriptionRow",
    "SubscriptionStatus",
    "TierRow",
    "agent_id",
]


def agent_id(key_directory: str, key_thumbprint: str) -> str:
    """The stable id of an agent: its key directory URL *and* key thumbprint, hashed to fit an
    indexed column (two agents of one registry differ in both directory path and key).

    >>> agent_id("https://r.example/jwks/a.json", "abc") != agent_id("https://r.example/jwks/b.json", "abc")
    True
    """
    digest = hashlib.sha256(f"{key_directory}\n{key_thumbprint}".encode()).hexdigest()
    return f"agt_{digest[:40]}"


class SubscriptionStatus(enum.StrEnum):
    PENDING_PAYMENT = "pending_payment"
    ACTIVE = "active"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class CheckoutStatus(enum.StrEnum):
    OPEN = "open"
    COMPLETE = "complete"
    EXPIRED = "expired"


class PublicationRow(DispatcherTable, table=True):
    """A publication: what an agent subscribes to (UCAP's ``publisher_id`` is its id)."""

    __tablename__ = "ucap_publications"

    id: str = Field(default_factory=lambda: new_id("pub"), primary_key=True, max_length=128)
    slug: str = Field(unique=True, max_length=120)
    name: str = Field(max_length=200)
    description: str | None = Field(default=None, sa_type=sa.Text)
    categories: str = Field(default="[]", sa_type=sa.Text, description="JSON list")
    language: str | None = Field(default=None, max_length=35)
    url: str | None = Field(default=None, max_length=2048)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)


class AliasRow(DispatcherTable, table=True):
    """Another id a publication or post is found by: ``patreon:…``, ``ghost:…``, ``url:<url>``."""

    __tablename__ = "ucap_aliases"

    alias: str = Field(primary_key=True, max_length=2100)
    publication_id: str = Field(foreign_key="ucap_publications.id", index=True, max_length=128)
    post_id: str | None = Field(default=None, foreign_key="ucap_posts.id", index=True, max_length=128)


class TierRow(DispatcherTable, table=True):
    """A way to subscribe to a publication, at a price per interval."""

    __tablename__ = "ucap_tiers"

    id: str = Field(default_factory=lambda: new_id("tier"), primary_key=True, max_length=128)
    publication_id: str = Field(foreign_key="ucap_publications.id", index=True, max_length=128)
    name: str = Field(max_length=200)
    price_amount: int = Field(description="minor units (cents)")
    currency: str = Field(max_length=3)
    interval: str = Field(default="month", max_length=8)
    features: str = Field(default="[]", sa_type=sa.Text, description="JSON list")
    stripe_price_id: str | None = Field(default=None, max_length=255)
    position: int = Field(default=0)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)


class PostRow(DispatcherTable, table=True):
    """A post. Free when no tier unlocks it (:class:`PostTierRow`); otherwise any of those tiers
    does."""

    __tablename__ = "ucap_posts"
    __table_args__ = (sa.Index("ix_ucap_posts_publication_published", "publication_id", "published_at"),)

    id: str = Field(default_factory=lambda: new_id("post"), primary_key=True, max_length=128)
    publication_id: str = Field(foreign_key="ucap_publications.id", max_length=128)
    title: str = Field(max_length=500)
    author: str | None = Field(default=None, max_length=200)
    excerpt: str | None = Field(default=None, sa_type=sa.Text)
    teaser: str | None = Field(default=None, sa_type=sa.Text, description="publisher-authored preview")
    body_html: str = Field(sa_type=sa.Text)
    body_text: str = Field(sa_type=sa.Text)
    categories: str = Field(default="[]", sa_type=sa.Text, description="JSON list")
    language: str | None = Field(default=None, max_length=35, index=True)
    url: str | None = Field(default=None, max_length=2048)
    word_count: int = Field(default=0)
    free: bool = Field(default=True)
    published_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime, index=True)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)


class PostTierRow(DispatcherTable, table=True):
    """A tier that unlocks a paid post."""

    __tablename__ = "ucap_post_tiers"

    post_id: str = Field(foreign_key="ucap_posts.id", primary_key=True, max_length=128)
    tier_id: str = Field(foreign_key="ucap_tiers.id", primary_key=True, max_length=128, index=True)


class CategoryRow(DispatcherTable, table=True):
    """A publication's or post's category, lower-cased, for the search filter."""

    __tablename__ = "ucap_categories"

    doc_id: str = Field(primary_key=True, max_length=128, description="a pub_ or post_ id")
    category: str = Field(primary_key=True, max_length=100, index=True)


class SubscriptionRow(DispatcherTable, table=True):
    """An agent's subscription to a tier: ``pending_payment`` until its checkout completes."""

    __tablename__ = "ucap_subscriptions"

    id: str = Field(default_factory=lambda: new_id("csub"), primary_key=True, max_length=128)
    publication_id: str = Field(foreign_key="ucap_publications.id", max_length=128)
    tier_id: str = Field(foreign_key="ucap_tiers.id", max_length=128)
    agent_id: str = Field(index=True, max_length=44)
    agent_directory: str = Field(max_length=2048)
    agent_thumbprint: str = Field(max_length=64)
    status: SubscriptionStatus = Field(default=SubscriptionStatus.PENDING_PAYMENT, sa_type=sa.String(16))
    payment_method: str = Field(max_length=16)
    price_amount: int
    currency: str = Field(max_length=3)
    interval: str = Field(max_length=8)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)
    activated_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    renews_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    cancelled_at: datetime | None = Field(default=None, sa_type=UtcDateTime)


class EntitlementRow(DispatcherTable, table=True):
    """What an active subscription grants; one per subscription (the unique constraint is what
    makes a twice-confirmed payment grant once)."""

    __tablename__ = "ucap_entitlements"
    __table_args__ = (sa.Index("ix_ucap_entitlements_agent_status", "agent_id", "status"),)

    id: str = Field(default_factory=lambda: new_id("ent"), primary_key=True, max_length=128)
    subscription_id: str = Field(foreign_key="ucap_subscriptions.id", unique=True, max_length=128)
    publication_id: str = Field(foreign_key="ucap_publications.id", max_length=128)
    tier_id: str = Field(foreign_key="ucap_tiers.id", max_length=128)
    agent_id: str = Field(max_length=44)
    status: str = Field(default="active", max_length=16)
    granted_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)
    renews_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
    revoked_at: datetime | None = Field(default=None, sa_type=UtcDateTime)


class CheckoutRow(DispatcherTable, table=True):
    """A checkout session for a pending subscription: sandbox page, Stripe Checkout or x402.

    ``provider_ref`` is the provider's id for it (a Stripe session id); ``payment_nonce`` the x402
    authorization's nonce once paid (unique: one authorization pays once).
    """

    __tablename__ = "ucap_checkouts"

    id: str = Field(default_factory=lambda: new_id("chk"), primary_key=True, max_length=128)
    subscription_id: str = Field(foreign_key="ucap_subscriptions.id", index=True, max_length=128)
    provider: str = Field(max_length=16)
    status: CheckoutStatus = Field(default=CheckoutStatus.OPEN, sa_type=sa.String(16))
    url: str = Field(max_length=2048)
    provider_ref: str | None = Field(default=None, max_length=255, unique=True)
    payment_nonce: str | None = Field(default=None, max_length=80, unique=True)
    requirements: str | None = Field(default=None, sa_type=sa.Text, description="x402 accepts[] as JSON")
    expires_at: datetime = Field(sa_type=UtcDateTime)
    created_at: datetime = Field(default_factory=utcnow, sa_type=UtcDateTime)
    completed_at: datetime | None = Field(default=None, sa_type=UtcDateTime)
