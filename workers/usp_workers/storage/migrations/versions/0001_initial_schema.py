"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-12-02 10:53:02.925273
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import usp_core.clock

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "usp_events",
        sa.Column("id", sa.String(length=80), nullable=False),
        sa.Column("event_type", sa.String(length=64), nullable=False),
        sa.Column("subject_id", sa.String(length=128), nullable=True),
        sa.Column("correlation_id", sa.String(length=128), nullable=True),
        sa.Column("order_id", sa.String(length=128), nullable=True),
        sa.Column("occurred_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("usp_events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_usp_events_correlation_id"), ["correlation_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_usp_events_created_at"), ["created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_usp_events_event_type"), ["event_type"], unique=False)
        batch_op.create_index(batch_op.f("ix_usp_events_occurred_at"), ["occurred_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_usp_events_subject_id"), ["subject_id"], unique=False)

    op.create_table(
        "usp_signing_keys",
        sa.Column("kid", sa.String(length=64), nullable=False),
        sa.Column("alg", sa.String(length=32), nullable=False),
        sa.Column("private_jwk", sa.Text(), nullable=False),
        sa.Column("public_jwk", sa.Text(), nullable=False),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("signs_from", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("retires_at", usp_core.clock.UtcDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("kid"),
    )
    op.create_table(
        "usp_subscriptions",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("transport", sa.String(length=16), nullable=False),
        sa.Column("event_types", sa.Text(), nullable=False),
        sa.Column("platform_profile", sa.String(length=2048), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("disabled_reason", sa.String(length=256), nullable=True),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_usp_subscriptions_platform_profile"), ["platform_profile"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_usp_subscriptions_state"), ["state"], unique=False)

    op.create_table(
        "usp_deliveries",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("event_id", sa.String(length=80), nullable=False),
        sa.Column("subscription_id", sa.String(length=40), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempt_count", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("enqueued_at", usp_core.clock.UtcDateTime(timezone=True), nullable=True),
        sa.Column("lease_until", usp_core.clock.UtcDateTime(timezone=True), nullable=True),
        sa.Column("last_status_code", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(length=512), nullable=True),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("completed_at", usp_core.clock.UtcDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["usp_events.id"],
        ),
        sa.ForeignKeyConstraint(
            ["subscription_id"],
            ["usp_subscriptions.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("usp_deliveries", schema=None) as batch_op:
        batch_op.create_index("ix_usp_deliveries_due", ["status", "next_attempt_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_usp_deliveries_event_id"), ["event_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_usp_deliveries_subscription_id"), ["subscription_id"], unique=False
        )

    op.create_table(
        "usp_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("delivery_id", sa.String(length=40), nullable=False),
        sa.Column("attempt_number", sa.Integer(), nullable=False),
        sa.Column("started_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("response_excerpt", sa.String(length=1024), nullable=True),
        sa.Column("error_class", sa.String(length=64), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(
            ["delivery_id"],
            ["usp_deliveries.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("usp_attempts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_usp_attempts_delivery_id"), ["delivery_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_usp_attempts_started_at"), ["started_at"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("usp_attempts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_usp_attempts_started_at"))
        batch_op.drop_index(batch_op.f("ix_usp_attempts_delivery_id"))

    op.drop_table("usp_attempts")
    with op.batch_alter_table("usp_deliveries", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_usp_deliveries_subscription_id"))
        batch_op.drop_index(batch_op.f("ix_usp_deliveries_event_id"))
        batch_op.drop_index("ix_usp_deliveries_due")

    op.drop_table("usp_deliveries")
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_usp_subscriptions_state"))
        batch_op.drop_index(batch_op.f("ix_usp_subscriptions_platform_profile"))

    op.drop_table("usp_subscriptions")
    op.drop_table("usp_signing_keys")
    with op.batch_alter_table("usp_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_usp_events_subject_id"))
        batch_op.drop_index(batch_op.f("ix_usp_events_occurred_at"))
        batch_op.drop_index(batch_op.f("ix_usp_events_event_type"))
        batch_op.drop_index(batch_op.f("ix_usp_events_created_at"))
        batch_op.drop_index(batch_op.f("ix_usp_events_correlation_id"))

    op.drop_table("usp_events")
