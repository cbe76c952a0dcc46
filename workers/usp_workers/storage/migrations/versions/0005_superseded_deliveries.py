"""a dead delivery delivered again is marked superseded, with the delivery that took its place

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-05 04:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usp_deliveries", schema=None) as batch_op:
        batch_op.add_column(sa.Column("superseded_by", sa.String(length=40), nullable=True))
    # Dead deliveries already followed by a newer delivery of the same event to the same
    # subscription (replays and redrives so far kept the dead row and added one).
    op.execute(
        """
        UPDATE usp_deliveries SET status = 'superseded', superseded_by = (
            SELECT min(newer.id) FROM usp_deliveries AS newer
            WHERE newer.event_id = usp_deliveries.event_id
              AND newer.subscription_id = usp_deliveries.subscription_id
              AND newer.id > usp_deliveries.id
        )
        WHERE status = 'dead' AND EXISTS (
            SELECT 1 FROM usp_deliveries AS newer
            WHERE newer.event_id = usp_deliveries.event_id
              AND newer.subscription_id = usp_deliveries.subscription_id
              AND newer.id > usp_deliveries.id
        )
        """
    )


def downgrade() -> None:
    op.execute("UPDATE usp_deliveries SET status = 'dead' WHERE status = 'superseded'")
    with op.batch_alter_table("usp_deliveries", schema=None) as batch_op:
        batch_op.drop_column("superseded_by")
