"""standard webhooks: the signature schemes a subscription asked for, and its sealed secrets

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 03:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("signatures", sa.String(length=128), server_default='["rfc9421"]', nullable=False)
        )
        batch_op.add_column(sa.Column("webhook_secrets", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.drop_column("webhook_secrets")
        batch_op.drop_column("signatures")
