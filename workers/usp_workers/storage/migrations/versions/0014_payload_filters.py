"""payload filters: a subscription's filter on the event's JSON, beside its event types

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07 05:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("payload_filter", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.drop_column("payload_filter")
