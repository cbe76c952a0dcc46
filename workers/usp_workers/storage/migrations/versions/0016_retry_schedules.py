"""retry schedules: a subscription's own waits between tries and maximum age

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 05:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("retry_schedule", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.drop_column("retry_schedule")
