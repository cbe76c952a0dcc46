"""The content domain's events, emitted through the transactional outbox in the caller's session
(the change and its event commit together or not at all).

Why it works this way: docs/architecture.md, "Notes by module", ``usp_dispatcher.ucap.events``.
"""

from __future__ import annotations

import json
from datetime import datetime

from sqlmodel import Session, col, select

from usp_dispatcher.ucap.tables import (
    EntitlementRow,
    PostRow,
    PostTierRow,
    PublicationRow,
    SubscriptionRow,
    SubscriptionStatus,
    TierRow,
)
from usp_schemas import (
    ContentSubscription,
    Entitlement,
    EntitlementGranted,
    EntitlementRevoked,
    Post,
    PostPublished,
    PostUpdated,
    Publication,
    PublicationUpdated,
    SubscriptionActivated,
    SubscriptionCancelled,
    SubscriptionCreated,
    Tier,
    new_event_id,
)
from usp_workers import emit

__all__ = [
    "emit_entitlement_event",
    "emit_post_event",
    "emit_publication_updated",
    "emit_subscription_event",
    "post_model",
    "publication_model",
]

_PRIVATE = ""  # the business's own subscriptions only


def publication_model(session: Session, publication: PublicationRow) -> Publication:
    tiers = session.exec(
        select(TierRow).where(TierRow.publication_id == publication.id).order_by(col(TierRow.position))
    ).all()
    from usp_dispatcher.ucap.tables import AliasRow

    aliases = session.exec(
        select(AliasRow.alias)
        .where(AliasRow.publication_id == publication.id)
        .where(col(AliasRow.post_id).is_(None))
    ).all()
    return Publication(
        id=publication.id,
        slug=publication.slug,
        name=publication.name,
        description=publication.description,
        categories=json.loads(publication.categories),
        language=publication.language,
        url=publication.url,
        external_ids=sorted(a for a in aliases if not a.startswith("url:")),
        tiers=[
            Tier(
                tier_id=t.id,
                tier_name=t.name,
                price={"amount": t.price_amount, "currency": t.currency, "interval": t.interval},
                features=json.loads(t.features),
            )
            for t in tiers
        ],
    )


def post_model(session: Session, post: PostRow) -> Post:
    tier_ids = session.exec(
        select(PostTierRow.tier_id).where(PostTierRow.post_id == post.id).order_by(col(PostTierRow.tier_id))
    ).all()
    return Post(
        id=post.id,
        publisher_id=post.publication_id,
        title=post.title,
        author=post.author,
        excerpt=post.excerpt,
        categories=json.loads(post.categories),
        language=post.language,
        url=post.url,
        word_count=post.word_count,
        access="free" if post.free else "paid",
        tier_ids=list(tier_ids),
        published_at=post.published_at,
        updated_at=post.updated_at,
    )


def emit_post_event(
    session: Session, kind: type[PostPublished | PostUpdated], post: PostRow, *, now: datetime
) -> None:
    emit(
        session,
        kind(
            event_id=new_event_id(),
            timestamp=now,
            publisher_id=post.publication_id,
            post_id=post.id,
            data=post_model(session, post),
        ),
    )


def emit_publication_updated(session: Session, publication: PublicationRow, *, now: datetime) -> None:
    emit(
        session,
        PublicationUpdated(
            event_id=new_event_id(),
            timestamp=now,
            publisher_id=publication.id,
            data=publication_model(session, publication),
        ),
    )


def subscription_model(row: SubscriptionRow) -> ContentSubscription:
    return ContentSubscription(
        id=row.id,
        publisher_id=row.publication_id,
        tier_id=row.tier_id,
        agent={"key_directory": row.agent_directory, "key_thumbprint": row.agent_thumbprint},
        status=SubscriptionStatus(row.status).value,
        payment_method=row.payment_method,
        price={"amount": row.price_amount, "currency": row.currency, "interval": row.interval},
        created_at=row.created_at,
        activated_at=row.activated_at,
        renews_at=row.renews_at,
        cancelled_at=row.cancelled_at,
    )


def entitlement_model(row: EntitlementRow, subscription: SubscriptionRow) -> Entitlement:
    return Entitlement(
        id=row.id,
        publisher_id=row.publication_id,
        tier_id=row.tier_id,
        subscription_id=row.subscription_id,
        agent={
            "key_directory": subscription.agent_directory,
            "key_thumbprint": subscription.agent_thumbprint,
        },
        status=row.status,
        price={
            "amount": subscription.price_amount,
            "currency": subscription.currency,
            "interval": subscription.interval,
        },
        granted_at=row.granted_at,
        renews_at=row.renews_at,
        revoked_at=row.revoked_at,
    )


def emit_subscription_event(
    session: Session,
    kind: type[SubscriptionCreated | SubscriptionActivated | SubscriptionCancelled],
    row: SubscriptionRow,
    *,
    now: datetime,
) -> None:
    emit(
        session,
        kind(
            event_id=new_event_id(),
            timestamp=now,
            publisher_id=row.publication_id,
            subscription_id=row.id,
            data=subscription_model(row),
        ),
        audience=_PRIVATE,
    )


def emit_entitlement_event(
    session: Session,
    kind: type[EntitlementGranted | EntitlementRevoked],
    row: EntitlementRow,
    subscription: SubscriptionRow,
    *,
    now: datetime,
) -> None:
    emit(
        session,
        kind(
            event_id=new_event_id(),
            timestamp=now,
            publisher_id=row.publication_id,
            subscription_id=row.subscription_id,
            entitlement_id=row.id,
            data=entitlement_model(row, subscription),
        ),
        audience=_PRIVATE,
    )
