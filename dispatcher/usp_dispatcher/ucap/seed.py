"""The demo content: two publications, free and paid posts, tiers in US dollars and euros, so a
fresh installation (``usp-webhooks up``) has something for an agent to find, pay for and read.

Seeded once, into a content catalog that has never had a publication, with fixed ids (a second
seeder racing the first collides on them and finds the work done), and without events, as the
scheduling demo is seeded.
"""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlmodel import Session, select

from usp_core import db
from usp_core.clock import utcnow
from usp_dispatcher.ucap.publishing import PostIn, PublicationIn, TierIn, add_post, add_publication
from usp_dispatcher.ucap.tables import PublicationRow

__all__ = ["DEMO_PAID_POST", "DEMO_PUBLICATION", "ensure_demo_content", "seed_demo_content"]

DEMO_PUBLICATION = "pub_ai_weekly"
DEMO_PAID_POST = "post_agents_that_pay"

_PUBLICATIONS = (
    PublicationIn(
        id=DEMO_PUBLICATION,
        slug="ai-weekly",
        name="AI Weekly",
        description="A weekly digest of AI research and the agent economy.",
        categories=["technology", "artificial-intelligence"],
        language="en",
        url="https://ai-weekly.example",
        external_ids=["patreon:10001"],
        tiers=[
            TierIn(
                id="tier_ai_weekly_pro",
                name="Pro",
                price_amount=800,
                currency="USD",
                features=["Every deep dive", "The full archive"],
            ),
            TierIn(
                id="tier_ai_weekly_annual",
                name="Pro, yearly",
                price_amount=8000,
                currency="USD",
                interval="year",
                features=["Every deep dive", "Two months free"],
            ),
        ],
    ),
    PublicationIn(
        id="pub_le_carnet",
        slug="le-carnet",
        name="Le Carnet de Cuisine",
        description="Recettes de saison et techniques de chef, chaque semaine.",
        categories=["food", "cooking"],
        language="fr",
        url="https://carnet.example",
        external_ids=["ghost:carnet"],
        tiers=[
            TierIn(
                id="tier_carnet_membre",
                name="Membre",
                price_amount=500,
                currency="EUR",
                features=["Toutes les recettes"],
            )
        ],
    ),
)

_POSTS: tuple[tuple[str, PostIn], ...] = (
    (
        DEMO_PUBLICATION,
        PostIn(
            id="post_weekly_roundup_208",
            title="Weekly roundup #208: agents learn to read the paywall",
            author="Ada Lovelace",
            excerpt="This week: signed agents, 402 responses, and who pays for content.",
            body_html="<p>Publishers started answering signed AI agents with <em>402 Payment Required</em> "
            "and a list of offers instead of a blank wall. This roundup collects the week's news on agent "
            "authentication, HTTP message signatures and content licensing.</p>",
            categories=["news", "agents"],
            url="https://ai-weekly.example/roundup-208",
        ),
    ),
    (
        DEMO_PUBLICATION,
        PostIn(
            id=DEMO_PAID_POST,
            title="Deep dive: agents that pay for what they read",
            author="Ada Lovelace",
            excerpt="How HTTP 402, x402 and Web Bot Auth fit together.",
            teaser="An agent signs its request, learns the price from a 402, subscribes with USDC or a card, "
            "and reads. We walk through each step and what can go wrong.",
            body_html="<h1>Agents that pay</h1><p>An agent holding only an Ed25519 key can find a paid "
            "post, learn what it costs, subscribe and read it. The publisher verifies the agent's RFC 9421 "
            "signature against its key directory, answers 402 with offers, and grants an entitlement once "
            "the payment settles. Every step emits a signed webhook event to the platforms that listen.</p>",
            categories=["analysis", "agents", "payments"],
            url="https://ai-weekly.example/agents-that-pay",
            tier_ids=["tier_ai_weekly_pro", "tier_ai_weekly_annual"],
        ),
    ),
    (
        "pub_le_carnet",
        PostIn(
            id="post_tarte_tatin",
            title="La tarte Tatin, pas à pas",
            author="Marie Curie",
            excerpt="Le caramel, les pommes, le retournement.",
            body_html="<p>Une tarte Tatin réussie tient à trois choses : un caramel blond, des pommes "
            "fermes et un retournement franc. Voici la méthode complète.</p>",
            categories=["recettes", "desserts"],
            tier_ids=["tier_carnet_membre"],
        ),
    ),
    (
        "pub_le_carnet",
        PostIn(
            id="post_bouillon",
            title="Le bouillon de légumes de base",
            author="Marie Curie",
            body_html="<p>Un bon bouillon de légumes se prépare en quarante minutes avec des épluchures.</p>",
            categories=["recettes", "bases"],
        ),
    ),
)


def seed_demo_content(session: Session) -> int:
    """Add the demo publications and posts when there has never been a publication; returns how
    many publications were added. The caller commits."""
    if session.exec(select(PublicationRow.id).limit(1)).first() is not None:
        return 0
    now = utcnow()
    for publication in _PUBLICATIONS:
        add_publication(session, publication, now=now, announce=False)
    for age, (publication_id, post) in enumerate(_POSTS):
        dated = post.model_copy(update={"published_at": now - timedelta(days=age + 1)})
        add_post(session, publication_id, dated, now=now, announce=False)
    return len(_PUBLICATIONS)


def ensure_demo_content(engine: Engine) -> int:
    """Seed and commit; a concurrent seeder winning the race counts as done."""
    with db.session(engine) as session:
        try:
            added = seed_demo_content(session)
            session.commit()
        except sa.exc.IntegrityError:
            session.rollback()
            return 0
        return added
