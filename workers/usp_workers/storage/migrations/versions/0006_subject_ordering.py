"""per-subject ordering: a subscription's ordering and dead-letter policy, a delivery's subject

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05 07:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("ordering", sa.String(length=16), server_default="none", nullable=False)
        )
        batch_op.add_column(
            sa.Column("on_dead", sa.String(length=16), server_default="block", nullable=False)
        )
    with op.batch_alter_table("usp_deliveries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("subject_key", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("subject_order", sa.String(length=128), nullable=True))
    op.create_index(
        "ix_usp_deliveries_subject",
        "usp_deliveries",
        ["subscription_id", "subject_key", "subject_order"],
        unique=False,
        postgresql_where=sa.text("subject_key IS NOT NULL"),
        sqlite_where=sa.text("subject_key IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_usp_deliveries_subject", table_name="usp_deliveries")
    with op.batch_alter_table("usp_deliveries", schema=None) as batch_op:
        batch_op.drop_column("subject_order")
        batch_op.drop_column("subject_key")
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.drop_column("on_dead")
        batch_op.drop_column("ordering")
