"""breaker cool-down growth and fleet-wide rate-limit slots

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02 18:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import usp_core.clock

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "usp_rate_slots",
        sa.Column("subscription_id", sa.String(length=40), nullable=False),
        sa.Column("slot", sa.Integer(), nullable=False),
        sa.Column("last_start_at", usp_core.clock.UtcDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("subscription_id", "slot"),
    )
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("breaker_opens", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.drop_column("breaker_opens")
    op.drop_table("usp_rate_slots")
