"""held deliveries: ordered deliveries waiting behind their subject leave the relay's scan

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06 13:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usp_deliveries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("held", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.create_index(
        "ix_usp_deliveries_sendable",
        "usp_deliveries",
        ["next_attempt_at"],
        unique=False,
        postgresql_where=sa.text("status = 'pending' AND NOT held"),
        sqlite_where=sa.text("status = 'pending' AND held = 0"),
    )


def downgrade() -> None:
    op.drop_index("ix_usp_deliveries_sendable", table_name="usp_deliveries")
    with op.batch_alter_table("usp_deliveries", schema=None) as batch_op:
        batch_op.drop_column("held")
