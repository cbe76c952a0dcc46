"""subscription leases: a listener's temporary subscription lapses when it stops renewing

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07 03:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import usp_core.clock

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("lease_until", usp_core.clock.UtcDateTime(timezone=True), nullable=True)
        )
        batch_op.create_index("ix_usp_subscriptions_lease_until", ["lease_until"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.drop_index("ix_usp_subscriptions_lease_until")
        batch_op.drop_column("lease_until")
