"""UCAP content domain (publications, tiers, posts, subscriptions, entitlements, checkouts), its
search index (tsvector on PostgreSQL, FTS5 on SQLite), and agents' signature nonces

Revision ID: d0003
Revises: d0002
Create Date: 2026-12-04 17:39:41.981025
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import usp_core.clock

revision = "d0003"
down_revision = "d0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "access_nonces",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("expires_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    with op.batch_alter_table("access_nonces", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_access_nonces_expires_at"), ["expires_at"], unique=False)

    op.create_table(
        "ucap_publications",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("slug", sa.String(length=120), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("categories", sa.Text(), nullable=False),
        sa.Column("language", sa.String(length=35), nullable=True),
        sa.Column("url", sa.String(length=2048), nullable=True),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("slug"),
    )
    op.create_table(
        "ucap_posts",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("publication_id", sa.String(length=128), nullable=False),
        sa.Column("title", sa.String(length=500), nullable=False),
        sa.Column("author", sa.String(length=200), nullable=True),
        sa.Column("excerpt", sa.Text(), nullable=True),
        sa.Column("teaser", sa.Text(), nullable=True),
        sa.Column("body_html", sa.Text(), nullable=False),
        sa.Column("body_text", sa.Text(), nullable=False),
        sa.Column("categories", sa.Text(), nullable=False),
        sa.Column("language", sa.String(length=35), nullable=True),
        sa.Column("url", sa.String(length=2048), nullable=True),
        sa.Column("word_count", sa.Integer(), nullable=False),
        sa.Column("free", sa.Boolean(), nullable=False),
        sa.Column("published_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["publication_id"],
            ["ucap_publications.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("ucap_posts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ucap_posts_language"), ["language"], unique=False)
        batch_op.create_index(
            "ix_ucap_posts_publication_published", ["publication_id", "published_at"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_ucap_posts_published_at"), ["published_at"], unique=False)

    op.create_table(
        "ucap_tiers",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("publication_id", sa.String(length=128), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("price_amount", sa.Integer(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("interval", sa.String(length=8), nullable=False),
        sa.Column("features", sa.Text(), nullable=False),
        sa.Column("stripe_price_id", sa.String(length=255), nullable=True),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["publication_id"],
            ["ucap_publications.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("ucap_tiers", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ucap_tiers_publication_id"), ["publication_id"], unique=False)

    op.create_table(
        "ucap_aliases",
        sa.Column("alias", sa.String(length=2100), nullable=False),
        sa.Column("publication_id", sa.String(length=128), nullable=False),
        sa.Column("post_id", sa.String(length=128), nullable=True),
        sa.ForeignKeyConstraint(
            ["post_id"],
            ["ucap_posts.id"],
        ),
        sa.ForeignKeyConstraint(
            ["publication_id"],
            ["ucap_publications.id"],
        ),
        sa.PrimaryKeyConstraint("alias"),
    )
    with op.batch_alter_table("ucap_aliases", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ucap_aliases_post_id"), ["post_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_ucap_aliases_publication_id"), ["publication_id"], unique=False)

    op.create_table(
        "ucap_categories",
        sa.Column("doc_id", sa.String(length=128), nullable=False),
        sa.Column("category", sa.String(length=100), nullable=False),
        sa.PrimaryKeyConstraint("doc_id", "category"),
    )
    with op.batch_alter_table("ucap_categories", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ucap_categories_category"), ["category"], unique=False)

    op.create_table(
        "ucap_post_tiers",
        sa.Column("post_id", sa.String(length=128), nullable=False),
        sa.Column("tier_id", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(
            ["post_id"],
            ["ucap_posts.id"],
        ),
        sa.ForeignKeyConstraint(
            ["tier_id"],
            ["ucap_tiers.id"],
        ),
        sa.PrimaryKeyConstraint("post_id", "tier_id"),
    )
    with op.batch_alter_table("ucap_post_tiers", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ucap_post_tiers_tier_id"), ["tier_id"], unique=False)

    op.create_table(
        "ucap_subscriptions",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("publication_id", sa.String(length=128), nullable=False),
        sa.Column("tier_id", sa.String(length=128), nullable=False),
        sa.Column("agent_id", sa.String(length=44), nullable=False),
        sa.Column("agent_directory", sa.String(length=2048), nullable=False),
        sa.Column("agent_thumbprint", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("payment_method", sa.String(length=16), nullable=False),
        sa.Column("price_amount", sa.Integer(), nullable=False),
        sa.Column("currency", sa.String(length=3), nullable=False),
        sa.Column("interval", sa.String(length=8), nullable=False),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("activated_at", usp_core.clock.UtcDateTime(timezone=True), nullable=True),
        sa.Column("renews_at", usp_core.clock.UtcDateTime(timezone=True), nullable=True),
        sa.Column("cancelled_at", usp_core.clock.UtcDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["publication_id"],
            ["ucap_publications.id"],
        ),
        sa.ForeignKeyConstraint(
            ["tier_id"],
            ["ucap_tiers.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("ucap_subscriptions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_ucap_subscriptions_agent_id"), ["agent_id"], unique=False)

    op.create_table(
        "ucap_checkouts",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("subscription_id", sa.String(length=128), nullable=False),
        sa.Column("provider", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("provider_ref", sa.String(length=255), nullable=True),
        sa.Column("payment_nonce", sa.String(length=80), nullable=True),
        sa.Column("requirements", sa.Text(), nullable=True),
        sa.Column("expires_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("completed_at", usp_core.clock.UtcDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["subscription_id"],
            ["ucap_subscriptions.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("payment_nonce"),
        sa.UniqueConstraint("provider_ref"),
    )
    with op.batch_alter_table("ucap_checkouts", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_ucap_checkouts_subscription_id"), ["subscription_id"], unique=False
        )

    op.create_table(
        "ucap_entitlements",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("subscription_id", sa.String(length=128), nullable=False),
        sa.Column("publication_id", sa.String(length=128), nullable=False),
        sa.Column("tier_id", sa.String(length=128), nullable=False),
        sa.Column("agent_id", sa.String(length=44), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("granted_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("renews_at", usp_core.clock.UtcDateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", usp_core.clock.UtcDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["publication_id"],
            ["ucap_publications.id"],
        ),
        sa.ForeignKeyConstraint(
            ["subscription_id"],
            ["ucap_subscriptions.id"],
        ),
        sa.ForeignKeyConstraint(
            ["tier_id"],
            ["ucap_tiers.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("subscription_id"),
    )
    with op.batch_alter_table("ucap_entitlements", schema=None) as batch_op:
        batch_op.create_index("ix_ucap_entitlements_agent_status", ["agent_id", "status"], unique=False)

    _create_search_index()


def _create_search_index() -> None:
    """``ucap_search``: one row per publication and post, with what the filters read (see
    ``usp_dispatcher.ucap.search``). On PostgreSQL both ``tsvector`` columns live out of line
    (``toast_tuple_target``), so a row is ~100 bytes and a scan of every match of a common word
    reads few pages; what the filters read stays in the row (``categories`` never moves)."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE TABLE ucap_search (doc_id varchar(128) PRIMARY KEY, kind varchar(16) NOT NULL, "
            "publication_id varchar(128) NOT NULL, published_at timestamptz NOT NULL, "
            "language varchar(35), free boolean NOT NULL, categories text[] NOT NULL, "
            "tier_ids text[] NOT NULL, "
            "headline tsvector NOT NULL, document tsvector NOT NULL) WITH (toast_tuple_target = 128)"
        )
        op.execute("ALTER TABLE ucap_search ALTER COLUMN document SET STORAGE EXTERNAL")
        op.execute("ALTER TABLE ucap_search ALTER COLUMN headline SET STORAGE EXTERNAL")
        op.execute("ALTER TABLE ucap_search ALTER COLUMN categories SET STORAGE PLAIN")
        op.execute("ALTER TABLE ucap_search ALTER COLUMN tier_ids SET STORAGE PLAIN")
        op.execute("CREATE INDEX ix_ucap_search_document ON ucap_search USING gin (document)")
        op.execute("CREATE INDEX ix_ucap_search_published_at ON ucap_search (published_at DESC)")
    else:
        op.execute(
            "CREATE VIRTUAL TABLE ucap_search USING fts5(doc_id UNINDEXED, kind UNINDEXED, "
            "publication_id UNINDEXED, published_at UNINDEXED, language UNINDEXED, free UNINDEXED, "
            "title, summary, body, tokenize='porter unicode61')"
        )


def downgrade() -> None:
    op.execute("DROP TABLE ucap_search")
    with op.batch_alter_table("ucap_entitlements", schema=None) as batch_op:
        batch_op.drop_index("ix_ucap_entitlements_agent_status")

    op.drop_table("ucap_entitlements")
    with op.batch_alter_table("ucap_checkouts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ucap_checkouts_subscription_id"))

    op.drop_table("ucap_checkouts")
    with op.batch_alter_table("ucap_subscriptions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ucap_subscriptions_agent_id"))

    op.drop_table("ucap_subscriptions")
    with op.batch_alter_table("ucap_post_tiers", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ucap_post_tiers_tier_id"))

    op.drop_table("ucap_post_tiers")
    with op.batch_alter_table("ucap_categories", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ucap_categories_category"))

    op.drop_table("ucap_categories")
    with op.batch_alter_table("ucap_aliases", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ucap_aliases_publication_id"))
        batch_op.drop_index(batch_op.f("ix_ucap_aliases_post_id"))

    op.drop_table("ucap_aliases")
    with op.batch_alter_table("ucap_tiers", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ucap_tiers_publication_id"))

    op.drop_table("ucap_tiers")
    with op.batch_alter_table("ucap_posts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_ucap_posts_published_at"))
        batch_op.drop_index("ix_ucap_posts_publication_published")
        batch_op.drop_index(batch_op.f("ix_ucap_posts_language"))

    op.drop_table("ucap_posts")
    op.drop_table("ucap_publications")
    with op.batch_alter_table("access_nonces", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_access_nonces_expires_at"))

    op.drop_table("access_nonces")
