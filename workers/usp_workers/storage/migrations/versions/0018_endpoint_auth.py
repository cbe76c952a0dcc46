"""endpoint authentication: OAuth 2.0 client credentials or a client certificate per subscription

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07 06:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("endpoint_auth", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("usp_subscriptions", schema=None) as batch_op:
        batch_op.drop_column("endpoint_auth")
