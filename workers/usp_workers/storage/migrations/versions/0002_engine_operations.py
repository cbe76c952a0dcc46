"""engine operations: audience, endpoint health, jobs, notices

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 17:47:32.241310
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import usp_core.clock

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "usp_jobs",
        sa.Column("id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("params", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("processed", sa.Integer(), nullable=False),
        sa.Column("cursor", sa.String(length=128), nullable=True),
        sa.Column("error", sa.String(length=512), nullable=True),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("updated_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.Column("finished_at", usp_core.clock.UtcDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("usp_jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_usp_jobs_status"), ["status"], unique=False)

    op.create_table(
        "usp_notices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("subscription_id", sa.String(length=40), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("detail", sa.String(length=512), nullable=False),
        sa.Column("created_at", usp_core.clock.UtcDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("usp_notices", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_usp_notices_created_at"), ["created_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_usp_notices_subscription_id"), ["subscription_id"], unique=False)

    with op.batch_alter_table("usp_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("audience", sa.String(length=2048), nullable=True))

    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rate_limit", sa.Integer(), nullable=True))
        batch_op.add_column(
            sa.Column("consecutive_failures", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(
            sa.Column("failing_since", usp_core.clock.UtcDateTime(timezone=True), nullable=True)
        )
        batch_op.add_column(
            sa.Column("last_success_at", usp_core.clock.UtcDateTime(timezone=True), nullable=True)
        )
        batch_op.add_column(
            sa.Column("last_failure_at", usp_core.clock.UtcDateTime(timezone=True), nullable=True)
        )
        batch_op.add_column(
            sa.Column("breaker_state", sa.String(length=16), nullable=False, server_default="closed")
        )
        batch_op.add_column(
            sa.Column("breaker_until", usp_core.clock.UtcDateTime(timezone=True), nullable=True)
        )


def downgrade() -> None:

    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.drop_column("breaker_until")
        batch_op.drop_column("breaker_state")
        batch_op.drop_column("last_failure_at")
        batch_op.drop_column("last_success_at")
        batch_op.drop_column("failing_since")
        batch_op.drop_column("consecutive_failures")
        batch_op.drop_column("rate_limit")

    with op.batch_alter_table("usp_events", schema=None) as batch_op:
        batch_op.drop_column("audience")

    with op.batch_alter_table("usp_notices", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_usp_notices_subscription_id"))
        batch_op.drop_index(batch_op.f("ix_usp_notices_created_at"))

    op.drop_table("usp_notices")
    with op.batch_alter_table("usp_jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_usp_jobs_status"))

    op.drop_table("usp_jobs")
