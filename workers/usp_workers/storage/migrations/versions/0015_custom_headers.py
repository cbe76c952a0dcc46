"""custom headers: a subscription's own headers on every delivery, secret values sealed

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 05:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("custom_headers", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.drop_column("custom_headers")
