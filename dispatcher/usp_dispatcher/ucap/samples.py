"""Realistic ``content.*`` events for ``usp-webhooks trigger``: the demo publication's paid post,
a USDC subscription to its Pro tier, and the entitlement it grants, shaped for the event type."""

from __future__ import annotations

from typing import Any

__all__ = ["content_sample"]

_PRICE = {"amount": 800, "currency": "USD", "interval": "month"}
_AGENT = {
    "key_directory": "https://registry.example/jwks/research-bot.json",
    "key_thumbprint": "poqkLGiymh_W0uP6PZFw-dvez3QJT5SolqXBCW38r0U",
}
_SUBSCRIPTION_STATUS = {"created": "pending_payment", "activated": "active", "canceled": "cancelled"}


def content_sample(event_type: str, now: str) -> dict[str, Any]:
    """The subject ids and ``data`` of a ``content.*`` event at ``now`` (RFC 3339)."""
    body: dict[str, Any] = {"publisher_id": "pub_ai_weekly"}
    if event_type.startswith("content.post."):
        post = {
            "id": "post_agents_that_pay",
            "publisher_id": "pub_ai_weekly",
            "title": "Deep dive: agents that pay for what they read",
            "author": "Ada Lovelace",
            "excerpt": "How HTTP 402, x402 and Web Bot Auth fit together.",
            "categories": ["analysis", "agents", "payments"],
            "language": "en",
            "word_count": 1200,
            "access": "paid",
            "tier_ids": ["tier_ai_weekly_pro"],
            "published_at": now,
            "updated_at": now,
        }
        return body | {"post_id": post["id"], "data": post}
    if event_type == "content.publication.updated":
        tier = {
            "tier_id": "tier_ai_weekly_pro",
            "tier_name": "Pro",
            "price": _PRICE,
            "features": ["Every deep dive"],
        }
        publication = {"id": "pub_ai_weekly", "slug": "ai-weekly", "name": "AI Weekly", "tiers": [tier]}
        return body | {"data": publication}
    subscription = {
        "id": "csub_sample",
        "publisher_id": "pub_ai_weekly",
        "tier_id": "tier_ai_weekly_pro",
        "agent": _AGENT,
        "payment_method": "usdc",
        "price": _PRICE,
        "created_at": now,
    }
    if event_type.startswith("content.subscription."):
        status = _SUBSCRIPTION_STATUS[event_type.rsplit(".", 1)[1]]
        return body | {"subscription_id": "csub_sample", "data": subscription | {"status": status}}
    entitlement = {
        "id": "ent_sample",
        "publisher_id": "pub_ai_weekly",
        "tier_id": "tier_ai_weekly_pro",
        "subscription_id": "csub_sample",
        "agent": _AGENT,
        "status": "active" if event_type.endswith("granted") else "cancelled",
        "price": _PRICE,
        "granted_at": now,
    }
    return body | {"entitlement_id": "ent_sample", "subscription_id": "csub_sample", "data": entitlement}
