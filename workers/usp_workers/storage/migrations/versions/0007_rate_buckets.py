"""rate limits as token buckets (one row per subscription replaces the one-second start slots);
a recover job counts the deliveries it back-filled

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 08:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import usp_core.clock

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usp_rate_buckets",
        sa.Column("subscription_id", sa.String(length=40), nullable=False),
        sa.Column("tat", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("subscription_id"),
    )
    op.drop_table("usp_rate_slots")  # start stamps only: a bucket starts full
    with op.batch_alter_table("usp_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("backfilled", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("usp_jobs", schema=None) as batch_op:
        batch_op.drop_column("backfilled")
    op.create_table(
        "usp_rate_slots",
        sa.Column("subscription_id", sa.String(length=40), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("last_start_at", usp_core.clock.UtcDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("subscription_id", "slot"),
    )
    op.drop_table("usp_rate_buckets")
